"""One worker of ``tune-model``: ``python -m evotune.model.worker OPTIONS_JSON INDEX WORKERS`` (started by the run,
one per GPU). Exit code 2 with one line for a bad input, 130 when interrupted (its claim given back)."""

from __future__ import annotations

import json
import os
import sys

from evotune.model.models import ModelError


def tune_worker_main(argv: list[str]) -> int:
    # imported here, not at the top: a build process the worker spawns imports this module again (as
    # ``__mp_main__``), and needs none of the run's machinery (Optuna, the storages)
    from evotune.model.runner import RunOptions, work

    options = RunOptions(**json.loads(argv[0]))
    try:
        work(options, int(argv[1]), int(argv[2]))
    except ModelError as exc:
        print(f"evotune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    code = tune_worker_main(sys.argv[1:])
    # everything the worker decided is in the storage; its build processes were told to stop (the tuner's close):
    # it ends now rather than wait for them to be reaped (seconds of CUDA teardown each)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
