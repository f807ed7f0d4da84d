"""``evotune.autotune``: a drop-in for ``triton.autotune`` (see :mod:`evotune.autotune.autotuner`).

Modules: ``autotuner.py`` (the decorator and the tuned kernel), ``configs.py`` (configurations as a search
space), ``pruning.py`` (constraints, then ``prune_configs_by``), ``toolchain.py`` (the build a decision is keyed
by: Triton, backend, tools, codegen knobs), ``plain.py`` (a plain jit kernel tuned from outside), ``hooks.py``
(``reset_to_zero``, ``restore_value`` and the user's hooks), ``search.py`` (one key: measure, confirm, decide),
``timers.py`` (Oracle, do_bench, wall clock), ``resources.py`` (building a configuration; shared memory and
registers of the compiled kernel), ``compile_ahead.py`` (a list built side by side), ``cache.py`` (the studies
and their location), ``neighbours.py`` (nearest keys, transfer sources), ``ahead.py`` (``tune-kernel``: keys
from a TOML file), ``export.py`` and ``commands.py`` (``export-configs``: JSON and vLLM's fused-MoE files).
"""

import inspect
import sys
import types
from typing import Any

from evotune.autotune.autotuner import MODES, Autotuner, autotune

__all__ = ["MODES", "Autotuner", "autotune"]
#: the decorator's signature, for this package where it stands in for the decorator (``inspect.signature``)
__signature__ = inspect.signature(autotune)


class _CallableModule(types.ModuleType):
    """This package stands where ``evotune.autotune`` (the decorator) is looked for once a submodule is imported
    first: calling it calls the decorator."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return autotune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
