"""A CPU space whose points are built only as fast as a test lets them: one token file per build.

A test fixture (``tests/test_kill_resume.py``). The environment variable
``EVOTUNE_TEST_GATE`` names a folder; every ``build`` waits there until it can
delete a token (any file but ``open``), so a run stores at most as many new
trials as the test has put tokens there, however fast or slow the machine. A file
``open`` in the folder lets every build through. 256 points, each an ``a @ b``.

Example::

    (gate / "0").touch()   # one more point may be built
    (gate / "open").touch()   # any number
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from evotune.authoring import Point, Problem, SearchSpace, ordinal

PARENT = os.getpid(), os.getppid()  # (this process, its parent) when the module was loaded


def _take_token() -> None:
    gate = Path(os.environ["EVOTUNE_TEST_GATE"])
    while not (gate / "open").exists():
        for name in sorted(os.listdir(gate)):
            if name == "open":
                break
            try:
                os.unlink(gate / name)
                return
            except FileNotFoundError:
                continue  # another process took it
        if os.getpid() == PARENT[0] and os.getppid() != PARENT[1]:
            os._exit(1)  # the tuner that started this worker is gone: nobody waits for the build
        time.sleep(0.002)


def build(point: Point, problem: Problem) -> Any:
    _take_token()
    return lambda a, b: a @ b


SPACE = SearchSpace("gated", [ordinal("x", range(16)), ordinal("y", range(16))], build=build,
                    description="points built one per token file of $EVOTUNE_TEST_GATE")
