"""A kernel named by reference, ``MODULE:KERNEL``, as ``tune-kernel`` takes it: ``MODULE`` a dotted module name
or a ``.py`` path, ``KERNEL`` a kernel in it decorated with ``evotune.autotune``, or a plain ``triton.jit``
kernel given its candidates (``FILE:NAME``) and key (argument names) from outside (:mod:`.plain`). Any
process can load it from the reference alone, which is what lets other processes build its configurations
(:mod:`.build_processes`)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from evotune.triton_tuning.autotuner import Autotuner
from evotune.triton_tuning.plain import PlainKernelError, is_plain, load_candidates, wrap


class AheadError(ValueError):
    """A bad kernel reference or keys file, in one line naming the file and the field."""


def load_module(name: str) -> ModuleType:
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise AheadError(f"{name}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # an import it needs, or an error in it
            del sys.modules[path.stem]
            raise AheadError(f"{name}: cannot load it ({type(exc).__name__}: {exc})") from None
        return module
    try:
        return importlib.import_module(name)
    except Exception as exc:  # not found, an import it needs, or an error in it
        raise AheadError(f"{name}: cannot import it ({type(exc).__name__}: {exc})") from None


def load_kernel(ref: str, space: str | None = None, key: str | None = None) -> tuple[Autotuner, ModuleType]:
    """The tuned kernel ``MODULE:KERNEL`` and its module; a plain jit kernel is wrapped with the candidates
    ``space`` names (``FILE:NAME``) and ``key`` (argument names, comma-separated)."""
    module_name, sep, kernel_name = ref.rpartition(":")
    if not sep or not module_name or not kernel_name:
        raise AheadError(f"MODULE:KERNEL: expected a module (or .py file) and a kernel name, got {ref!r}")
    module = load_module(module_name)
    kernel = getattr(module, kernel_name, None)
    if kernel is None:
        raise AheadError(f"{module_name}: no kernel named {kernel_name!r}")
    if isinstance(kernel, Autotuner):
        if space is not None or key is not None:
            raise AheadError(f"--space, --key: {kernel_name} is decorated with evotune.autotune, which gives both")
        return kernel, module
    if not is_plain(kernel):
        raise AheadError(f"{module_name}: {kernel_name} is not decorated with evotune.autotune")
    if space is None:
        raise AheadError(f"{module_name}: {kernel_name} is not decorated with evotune.autotune: give its "
                         "candidates with --space FILE:NAME and its key with --key NAMES")
    names = [k.strip() for k in (key or "").split(",") if k.strip()]
    if not names:
        raise AheadError(f"--key: the arguments of {kernel_name} that key a decision (comma-separated) are "
                         "required with --space")
    try:
        configs, candidates = load_candidates(space, lambda name: module if name == module_name else
                                              load_module(name))
        return wrap(kernel, configs, candidates, names), module
    except PlainKernelError as exc:
        raise AheadError(str(exc)) from None
