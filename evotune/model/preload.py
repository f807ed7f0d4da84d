"""What the server that ``tune-model``'s workers fork from imports, and its start ahead of the command line's imports.

The workers are forked from one server process that imported their modules once (:mod:`evotune.model.runner`):
torch, Triton, Optuna, the storage and the search, the tuner and its kernels, seven seconds or so on an H200 host,
which the first worker waits for. ``python -m evotune tune-model`` starts that server first of all
(:func:`start_for`): its imports then run beside the command line's own (about a second), the plan's and the
storage's opening, not after them. The run (:func:`evotune.model.runner.run`) asks for the same server and finds it
running.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_TUNER = "evotune.model.tuning:autotune_tuner"
#: what every run's server imports: the run's machinery and what its storage runs on (SQLAlchemy, Alembic: a storage
#: opened in memory once)
PRELOAD = ("optuna", "evotune.model.runner", "evotune.storage.study:load_rdb")
#: and for the default tuner, after what its build processes import (torch, Triton: its code generator and its key
#: of its own build, hashed once, a second in each worker otherwise): the search's GP (SciPy, its BLAS libraries
#: found once) and the kernels' modules (``tuning.SOURCES``); a module missing here is imported by each worker
#: itself, seconds when four workers import together
DEFAULT_TUNER_MODULES = ("evotune.model.tuning", "evotune.triton_tuning.search", "evotune.search.strategies.default",
                         "evotune.search.surrogate:one_blas_thread", "search_spaces._triton_fused_moe",
                         "search_spaces._triton_matmul_example")


def worker_preload(tuner: str) -> tuple[str, ...]:
    """The modules the workers' server imports for ``--tuner`` ``tuner``: :data:`PRELOAD`, the tuner's module where
    it is one (not a file), and for the default tuner its build processes' modules and :data:`DEFAULT_TUNER_MODULES`."""
    # from the build processes' module itself, not through autotune_api: that one imports the tuning loop, which the
    # command line's first step must not wait for
    from evotune.triton_tuning.build_processes import PRELOAD as BUILD_PRELOAD

    module = tuner.rpartition(":")[0]
    mine = () if module.endswith(".py") else (module,)
    return PRELOAD + mine + ((*BUILD_PRELOAD, *DEFAULT_TUNER_MODULES) if tuner == DEFAULT_TUNER else ())


def start_for(argv: Sequence[str]) -> bool:
    """Start the workers' server now for command line ``argv`` (after ``python -m evotune``) when it runs
    ``tune-model``'s workers with the default tuner (not ``--dry-run`` nor ``--help``; ``--tuner`` left out or the
    default): whether it did. Any other command line starts nothing here (a run with another tuner starts its server
    itself)."""
    args = list(argv[1:])
    if not argv or argv[0] != "tune-model" or any(a in ("-h", "--help", "--dry-run") for a in args):
        return False
    tuners = [args[i + 1] if a == "--tuner" and i + 1 < len(args) else a.partition("=")[2]
              for i, a in enumerate(args) if a == "--tuner" or a.startswith("--tuner=")]
    if any(t != DEFAULT_TUNER for t in tuners):
        return False
    from evotune.measurement.processes import start_method

    start_method(worker_preload(DEFAULT_TUNER))
    return True
