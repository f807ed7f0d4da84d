"""A pytest plugin: ``triton.autotune`` is ``evotune.autotune`` for the whole session, swapped from outside.

Loaded before any test module is imported (``python -m pytest -p evotune_swap FILE``, with this folder and the
repository on ``PYTHONPATH``), it replaces ``triton.autotune``, ``triton.runtime.autotune`` and
``triton.runtime.autotuner.autotune``, so that a test file written for Triton runs unmodified against evotune.
Decisions go to a fresh cache of the session's own (``$EVOTUNE_AUTOTUNE_CACHE`` when the caller set one), so
that nothing tuned earlier is read. ``benchmarks/autotune_dropin.py --triton-tests FILE`` runs a file both ways.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import triton
import triton.runtime
import triton.runtime.autotuner

from evotune import autotune

triton.autotune = autotune
triton.runtime.autotune = autotune
triton.runtime.autotuner.autotune = autotune


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("EVOTUNE_AUTOTUNE_CACHE", tempfile.mkdtemp(prefix="evotune_swap_"))


def pytest_report_header(config: pytest.Config) -> str:
    return f"triton.autotune is {triton.autotune.__module__}.autotune (cache {os.environ['EVOTUNE_AUTOTUNE_CACHE']})"
