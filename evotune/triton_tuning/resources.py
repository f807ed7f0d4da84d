"""After compiling: whether a configuration's kernel fits the device (shared memory, registers).

Triton compiles a configuration without launching it (``fn.warmup``); the compiled
kernel's metadata says how much shared memory it asks for and, once loaded, how
many registers each thread uses. A configuration over either limit of the device is
not timed: the tuner launches it once with the hooks around it, so that the user's
``post_hook`` gets the device's own refusal (Triton's ``OutOfResources``, raised when
the binary is loaded, before anything runs), as under ``triton.autotune``. The
binary is not loaded here: loading is the launch's, inside the hooks, and a limit
only the loader knows (threads per block, tensor memory) is refused there.

Under the Triton interpreter (``TRITON_INTERPRET=1``, the CPU) nothing is compiled,
so there is no metadata and this check is skipped: :func:`over_limits` answers None.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evotune.triton_tuning.configs import TritonConfig

WARP = 32


def compile_config(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], config: TritonConfig) -> Any:
    """Compile ``config`` of the jitted ``fn`` for this launch without running it (Triton's ``warmup``, which takes
    the launch's keyword arguments but its own ``warmup`` flag); the compiled kernel, or Triton's placeholder."""
    launch = {k: v for k, v in kwargs.items() if k != "warmup"}
    return fn.warmup(*args, **launch, **config.all_kwargs())


def over_limits(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], config: TritonConfig) -> str | None:
    """Why ``config``'s compiled kernel cannot run on this device, or None (it fits, or nothing to check)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or not hasattr(fn, "warmup"):
        return None  # the interpreter compiles nothing; a stand-in kernel without warmup cannot be built apart
    kernel = compile_config(fn, args, kwargs, config)
    if kernel is None or not hasattr(kernel, "metadata"):
        return None
    props = device_limits()
    shared = int(getattr(kernel.metadata, "shared", 0) or 0)
    if shared > int(props.get("max_shared_mem", shared)):
        return f"shared memory: {shared} bytes, the device allows {props['max_shared_mem']}"
    regs = int(getattr(kernel, "n_regs", 0) or 0) * WARP * int(config.num_warps or 4)  # known once loaded
    if regs > int(props.get("max_num_regs", regs)):
        return (f"registers: {kernel.n_regs} per thread x {config.num_warps} warps = {regs}, the device has "
                f"{props['max_num_regs']} per block")
    return None


def device_limits() -> dict[str, Any]:
    """The current device's properties as Triton's driver reports them (``max_shared_mem``, ``max_num_regs``...)."""
    from triton.runtime.driver import driver

    return dict(driver.active.utils.get_device_properties(driver.active.get_current_device()))
