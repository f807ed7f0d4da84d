"""One configuration measured at one launch, as ``triton.autotune`` benchmarks it, with evotune's checks.

:func:`launch_call` is one launch of a configuration with the hooks around it (the configuration's own
``pre_hook``, then the kernel's ``pre_hook``; the ``post_hook`` after it, given the launch's exception if it
raised). :func:`measure` builds the configuration first and checks the compiled kernel against the device
(:mod:`evotune.triton_tuning.resources`): one that exceeds the device's shared memory or registers is launched
once, with the hooks, so that its ``post_hook`` gets the launch's own ``OutOfResources``, and is then a refused
(INFEASIBLE) configuration with Triton's message; one the device refuses at its first timed launch (threads,
shared or tensor memory) is refused too. A build error is a COMPILE_ERROR, any other error of a launch a
RUNTIME_ERROR of this configuration only.

Example::

    call = launch_call(kernel, args, {"grid": grid}, config, nargs, hooks.pre, hooks.post)
    measure(kernel, args, {"grid": grid}, config, call, make_timer(None, 3, 100.0), "matmul").time_ms
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from evotune.core.result import EvalResult, Status
from evotune.triton_tuning.resources import over_limits
from evotune.triton_tuning.timers import Timer

if TYPE_CHECKING:
    from evotune.triton_tuning.configs import TritonConfig

log = logging.getLogger("evotune.autotune")


def launch_call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], config: TritonConfig,
                nargs: dict[str, Any],
                pre_hook: Callable[..., Any], post_hook: Callable[..., Any]) -> Callable[[], None]:
    """One launch of ``config`` with the hooks around it, as ``triton.autotune`` benchmarks it."""
    conflicts = kwargs.keys() & config.kwargs.keys()
    if conflicts:
        raise ValueError(f"Conflicting meta-parameters: {', '.join(conflicts)}. Make sure that you don't "
                         "re-define auto-tuned symbols.")
    current = dict(kwargs, **config.all_kwargs())
    full_nargs = {**nargs, **current}

    def call() -> None:
        if config.pre_hook:
            config.pre_hook(full_nargs)
        pre_hook(full_nargs)
        try:
            fn.run(*args, **current)
        except Exception as e:
            try:
                post_hook(full_nargs, exception=e)
            finally:
                raise
        post_hook(full_nargs, exception=None)

    return call


def measure(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], config: TritonConfig, call: Callable[[], None],
            timer: Timer, name: str) -> EvalResult:
    """``config`` built, checked against the device and timed by ``timer`` through ``call`` (its launch with the
    hooks); ``name`` is the kernel's, for the log."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources, PTXASError

    started = time.perf_counter()
    try:
        reason = over_limits(fn, args, kwargs, config)
    except OutOfResources as exc:
        reason = str(exc)
    except (CompilationError, PTXASError) as exc:
        return EvalResult(Status.COMPILE_ERROR, message=f"{type(exc).__name__}: {exc}",
                          compile_s=time.perf_counter() - started)
    compile_s = time.perf_counter() - started
    if reason is not None:
        why = refused(call)
        if why is not None:
            log.info("%s: %s refused by the device: %s", name, config, why)
            return EvalResult(Status.INFEASIBLE, message=why, compile_s=compile_s)
        log.info("%s: %s ran although %s: timed", name, config, reason)
    try:
        ms, samples = timer.measure(call)
    except OutOfResources as exc:  # refused at its first launch (threads, shared or tensor memory)
        return EvalResult(Status.INFEASIBLE, message=f"{type(exc).__name__}: {exc}", compile_s=compile_s)
    except (CompilationError, PTXASError) as exc:
        return EvalResult(Status.COMPILE_ERROR, message=f"{type(exc).__name__}: {exc}", compile_s=compile_s)
    except Exception as exc:  # a launch that fails fails this configuration only
        return EvalResult(Status.RUNTIME_ERROR, message=f"{type(exc).__name__}: {exc}", compile_s=compile_s)
    return EvalResult(Status.OK, ms, samples, compile_s=compile_s, bench_s=time.perf_counter() - started - compile_s)


def refused(call: Callable[[], None]) -> str | None:
    """Launch a configuration whose compiled kernel exceeds the device once, with the hooks around it: the
    device refuses it (Triton's ``OutOfResources``, raised when the binary is loaded, before anything runs)
    and the ``post_hook`` gets that exception, as it does under ``triton.autotune``. Its text, or None when
    the launch ran."""
    try:
        call()
    except Exception as exc:  # the launch's own error, which the post_hook has been given
        return f"{type(exc).__name__}: {exc}"
    return None
