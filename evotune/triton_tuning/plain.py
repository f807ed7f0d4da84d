"""Kernels nobody decorated: a plain ``triton.jit`` kernel tuned with its candidates given from outside.

Serving code launches its kernels undecorated, the configuration passed as keyword arguments and read from
a JSON file (vLLM's fused MoE: ``fused_moe_kernel[grid](..., top_k=top_k, **config)``, the config holding
``BLOCK_SIZE_M``, ..., ``num_warps``, ``num_stages``). ``tune-kernel MODULE:KERNEL --space FILE:NAME --key
NAMES`` tunes such a kernel without editing its module: ``NAME`` in ``FILE`` (a ``.py`` path or a dotted
module) is a :class:`~evotune.core.space.SearchSpace` or a list of ``triton.Config``, ``NAMES`` the kernel's
arguments that key a decision (Triton's ``key``), and the kernel is wrapped as
``evotune.autotune(configs=... or space=..., key=NAMES)(KERNEL)``, which is what the same line does in code.
A launch built for the plain kernel carries a configuration; :func:`without_config` drops it, since the
tuner chooses it.

Example::

    kernel = wrap(module.fused_moe_kernel, "vllm_spaces.py:FUSED_MOE", ["N", "K", "EM"])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from evotune.core.space import SearchSpace
from evotune.triton_tuning.autotuner import Autotuner
from evotune.triton_tuning.configs import LAUNCH_OPTIONS


class PlainKernelError(ValueError):
    """A bad ``--space`` or ``--key`` for a plain kernel, in one line naming the reference and the field."""


def is_plain(kernel: Any) -> bool:
    """Whether ``kernel`` is a jit kernel (or a wrapper of one, ``triton.heuristics``) that evotune does not tune."""
    return not isinstance(kernel, Autotuner) and callable(getattr(kernel, "run", None)) \
        and isinstance(getattr(kernel, "arg_names", None), list)


def load_candidates(ref: str, load_module: Callable[[str], Any]) -> tuple[list[Any] | None, SearchSpace | None]:
    """(configs, space) named by ``FILE:NAME``: one of them, the other None."""
    module_name, sep, name = ref.rpartition(":")
    if not sep or not module_name or not name:
        raise PlainKernelError(f"--space: expected FILE:NAME (a module or .py file and a SearchSpace or a list of "
                               f"triton.Config in it), got {ref!r}")
    module = load_module(module_name)
    value = getattr(module, name, None)
    if isinstance(value, SearchSpace):
        return None, value
    if isinstance(value, (list, tuple)) and value and all(_is_config(c) for c in value):
        return list(value), None
    what = "nothing" if value is None else type(value).__name__
    raise PlainKernelError(f"{module_name}: {name}: expected a SearchSpace or a list of triton.Config, found {what}")


def wrap(kernel: Any, configs: Sequence[Any] | None, space: SearchSpace | None, key: Sequence[str],
         **options: Any) -> Autotuner:
    """``evotune.autotune(configs=... or space=..., key=key, **options)(kernel)``, its errors as one line."""
    unknown = [k for k in key if k not in kernel.arg_names]
    if unknown:
        raise PlainKernelError(f"--key: {', '.join(unknown)}: not an argument of the kernel (its arguments: "
                               f"{', '.join(kernel.arg_names)})")
    return Autotuner(kernel, kernel.arg_names, configs, list(key), space=space, **options)


def without_config(kernel: Autotuner, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A launch's keyword arguments less the configuration a plain kernel is launched with: the parameters the
    tuner chooses (its candidates' meta-parameters) and Triton's launch options."""
    chosen = set(kernel.candidates.space.names) | set(LAUNCH_OPTIONS)
    return {k: v for k, v in kwargs.items() if k not in chosen}


def _is_config(value: Any) -> bool:
    return hasattr(value, "kwargs") and callable(getattr(value, "all_kwargs", None))
