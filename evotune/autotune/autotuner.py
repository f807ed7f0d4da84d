"""``evotune.autotune``: a drop-in for ``triton.autotune`` that searches, confirms and remembers.

The decorated kernel is launched as before (``kernel[grid](*args)``, ``grid`` a tuple
or a function of the META dict); ``kernel.best_config`` is the ``triton.Config`` of the
last launch. The key is what Triton's is: the values of the ``key`` arguments, then
the dtype of every tensor argument. On a key's first call (``mode="online"``):

1. candidates: the ``configs`` list, or every point of ``space`` its named constraints
   keep (they may read the launch's arguments as ``ctx.args``), then
   ``prune_configs_by`` (``early_config_prune``, then ``perf_model`` with ``top_k``);
2. each configuration to time is compiled first and pruned with its reason when its
   shared memory or registers exceed the device's (skipped under the interpreter);
3. timing and the decision: :mod:`evotune.autotune.search`;
4. the decision is kept per key in memory: a cached launch is a dict lookup, then the launch.

``mode="cache-only"`` never times: a key with no decision takes the nearest tuned key's
(logged on the ``evotune.autotune`` logger), or the first candidate when none is tuned.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from evotune.autotune.cache import KernelCache, KernelId, cache_url
from evotune.autotune.compile_ahead import compile_ahead
from evotune.autotune.configs import Candidates, LaunchContext
from evotune.autotune.hooks import Hooks
from evotune.autotune.neighbours import nearest_tuned
from evotune.autotune.pruning import PruneBy, prune
from evotune.autotune.resources import build, over_limits
from evotune.autotune.search import KeyJob, tune
from evotune.autotune.timers import make_timer
from evotune.core.result import EvalResult, Status
from evotune.core.space import FeasibleSet, Point, SearchSpace
from evotune.search import launch

log = logging.getLogger("evotune.autotune")
MODES = ("online", "cache-only")


class Autotuner:
    """The tuned kernel: ``run`` looks the key up and launches; a key not looked up before is resolved once."""

    def __init__(self, fn: Any, arg_names: list[str], *, configs: Sequence[Any] | None, key: Sequence[str],
                 space: SearchSpace | None, prune_configs_by: dict[str, Any] | None,
                 reset_to_zero: Sequence[str] | None, restore_value: Sequence[str] | None,
                 pre_hook: Callable[..., Any] | None, post_hook: Callable[..., Any] | None, warmup: int, rep: float,
                 do_bench: Callable[..., Any] | None, budget: int, mode: str, cache: Any, confirm: int):
        import triton

        if mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
        if configs and space is not None:
            raise ValueError("give configs or space, not both")
        if budget < 1:
            raise ValueError(f"budget: expected an integer >= 1, got {budget!r}")
        self.fn, self.arg_names, self.keys = fn, list(arg_names), list(key)
        self.base_fn = fn
        while not callable(getattr(self.base_fn, "__code__", None)) and hasattr(self.base_fn, "fn"):
            self.base_fn = self.base_fn.fn
        self.reset_to_zero, self.restore_value = list(reset_to_zero or []), list(restore_value or [])
        for param, names in (("key", self.keys), ("reset_to_zero", self.reset_to_zero),
                             ("restore_value", self.restore_value)):
            unknown = [n for n in names if n not in self.arg_names]
            if unknown:
                raise ValueError(f"{param} contains names that are not kernel arguments: {', '.join(unknown)}. "
                                 f"Valid argument names are: {', '.join(self.arg_names)}.")
        name = self.base_fn.__name__
        if space is not None:
            self.candidates = Candidates.from_space(space)
        else:
            self.candidates = Candidates.from_configs(name, list(configs or [triton.Config({})]))
        hooks = Hooks(self.reset_to_zero, self.restore_value, pre_hook, post_hook)
        self.pre_hook, self.post_hook = hooks.pre, hooks.post
        prune = prune_configs_by or {}
        self.perf_model, self.top_k = prune.get("perf_model"), prune.get("top_k", 1.0)
        self.early_config_prune = prune.get("early_config_prune")
        self.budget, self.mode, self.confirm = int(budget), mode, int(confirm)
        self.timer = make_timer(do_bench, warmup, rep)
        self.cache: dict[tuple[Any, ...], Any] = {}  # key -> triton.Config, as triton.autotune keeps it
        self._launch: dict[tuple[Any, ...], tuple[Any, dict[str, Any]]] = {}  # key -> (config, its launch options)
        self._arg_set = frozenset(self.arg_names)
        self._key_pos = [self.arg_names.index(k) for k in self.keys]
        self._last_key_pos = max(self._key_pos, default=-1)
        self.decisions: dict[tuple[Any, ...], Any] = {}  # key fields' values -> the Decision it came from
        self.last_decision: Any = None  # the decision of the last key resolved (None: a single config)
        self.best_config: Any = None
        self.configs = list(configs) if configs else None  # as triton.autotune keeps them (None with a space)
        self.configs_timings: dict[Any, list[float]] = {}  # the last key tuned here: config -> [time in ms]
        self.bench_time = 0.0  # seconds the last key's tuning took
        self.nargs: dict[str, Any] | None = None
        self._cache_arg = cache
        self._kernel_cache: KernelCache | None = None

    # -- launching --------------------------------------------------------------------------------
    def key_of(self, nargs: dict[str, Any], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Triton's key: the ``key`` arguments' values, then ``str(dtype)`` of every argument that has one."""
        all_args = {**nargs, **kwargs}
        args = {k: v for k, v in all_args.items() if k in self._arg_set}
        key = [args[k] for k in self.keys if k in args]
        key += [str(a.dtype) for a in args.values() if hasattr(a, "dtype")]
        return tuple(key)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > self._last_key_pos and self._arg_set.isdisjoint(kwargs):  # every argument positional
            key = (*[args[i] for i in self._key_pos], *[str(a.dtype) for a in args if hasattr(a, "dtype")])
        else:
            key = self.key_of(dict(zip(self.arg_names, args, strict=False)), kwargs)
        launch = self._launch.get(key)
        if launch is None:
            self.nargs = dict(zip(self.arg_names, args, strict=False))
            try:
                config = self._resolve(key, args, kwargs)
            finally:
                self.nargs = None
            launch = self._launch[key] = (config, config.all_kwargs())
        config, options = launch
        self.best_config = config
        if config.pre_hook is not None:
            config.pre_hook({**dict(zip(self.arg_names, args, strict=False)), **kwargs, **options})
        return self.fn.run(*args, **kwargs, **options)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        """``kernel[grid](*args)``, as a Triton kernel is launched."""
        return lambda *args, **kwargs: self.run(*args, grid=grid, warmup=False, **kwargs)

    def warmup(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Compile every candidate left after pruning (as ``triton.autotune``'s ``warmup``)."""
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        try:
            fs = self._candidates({k: v for k, v in kwargs.items() if k != "grid"})
        finally:
            self.nargs = None
        return [build(self.fn, args, kwargs, self.candidates.config(fs.point(r))) for r in range(len(fs))]

    # -- resolving a key --------------------------------------------------------------------------
    def use_cache(self, cache: Any) -> None:
        """Keep decisions in ``cache`` from now on (a storage URL or a folder); keys resolved so far stay."""
        self._cache_arg, self._kernel_cache = cache, None

    @property
    def kernel_cache(self) -> KernelCache:
        if self._kernel_cache is None:
            self._kernel_cache = KernelCache(cache_url(self._cache_arg), KernelId.of(self.base_fn, self._jit()))
        return self._kernel_cache

    def _jit(self) -> Any:
        """The ``triton.jit`` object under any other wrapper (``triton.heuristics``), if there is one."""
        fn = self.fn
        while fn is not None and not hasattr(fn, "cache_key"):
            fn = getattr(fn, "fn", None)
        return fn

    def key_fields(self, nargs: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The key as named fields (stored with the study): the key arguments, then ``ARG.dtype`` of each tensor."""
        args = {k: v for k, v in {**nargs, **kwargs}.items() if k in self.arg_names}
        out = {k: _plain(args[k]) for k in self.keys if k in args}
        out.update({f"{k}.dtype": str(v.dtype) for k, v in args.items() if hasattr(v, "dtype")})
        return out

    def _resolve(self, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        points = self.candidates.points
        if self.candidates.listed is not None and len(points) == 1:  # one config: nothing to tune
            config = self.candidates.config(points[0])
        else:
            fields = self.key_fields(self.nargs or {}, kwargs)
            config = (self._from_cache(fields, kwargs) if self.mode == "cache-only"
                      else self._tune(fields, args, kwargs))
        self.cache[key] = config
        return config

    def _candidates(self, kwargs: dict[str, Any]) -> FeasibleSet:
        args = {**(self.nargs or {}), **kwargs}
        return prune(self.candidates, args, self.nargs or {}, kwargs,
                     PruneBy(self.early_config_prune, self.perf_model, self.top_k), self.base_fn.__name__)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any], config: Any) -> Callable[[], None]:
        """One launch of ``config`` with the hooks around it, as ``triton.autotune`` benchmarks it."""
        conflicts = kwargs.keys() & config.kwargs.keys()
        if conflicts:
            raise ValueError(f"Conflicting meta-parameters: {', '.join(conflicts)}. Make sure that you don't "
                             "re-define auto-tuned symbols.")
        current = dict(kwargs, **config.all_kwargs())
        full_nargs = {**(self.nargs or {}), **current}

        def call() -> None:
            if config.pre_hook:
                config.pre_hook(full_nargs)
            self.pre_hook(full_nargs)
            try:
                self.fn.run(*args, **current)
            except Exception as e:
                try:
                    self.post_hook(full_nargs, exception=e)
                finally:
                    raise
            self.post_hook(full_nargs, exception=None)

        return call

    def _measure(self, args: tuple[Any, ...], kwargs: dict[str, Any], point: Point) -> EvalResult:
        from triton.compiler.errors import CompilationError
        from triton.runtime.errors import OutOfResources, PTXASError

        config = self.candidates.config(point)
        started = time.perf_counter()
        try:
            reason = over_limits(self.fn, args, kwargs, config)
        except (CompilationError, PTXASError, OutOfResources) as exc:
            return EvalResult(Status.COMPILE_ERROR, message=f"{type(exc).__name__}: {exc}",
                              compile_s=time.perf_counter() - started)
        compile_s = time.perf_counter() - started
        if reason is not None:
            log.info("%s: %s pruned after compiling: %s", self.base_fn.__name__, config, reason)
            return EvalResult(Status.INFEASIBLE, message=reason, compile_s=compile_s)
        try:
            ms, samples = self.timer.measure(self._call(args, kwargs, config))
        except (CompilationError, PTXASError, OutOfResources) as exc:
            return EvalResult(Status.COMPILE_ERROR, message=f"{type(exc).__name__}: {exc}", compile_s=compile_s)
        except Exception as exc:  # a launch that fails fails this configuration only
            return EvalResult(Status.RUNTIME_ERROR, message=f"{type(exc).__name__}: {exc}", compile_s=compile_s)
        return EvalResult(Status.OK, ms, samples, compile_s=compile_s,
                          bench_s=time.perf_counter() - started - compile_s)

    def _tune(self, fields: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        space = self.candidates.space
        fs = self._candidates(kwargs)
        timings_before = self.timer.calls
        counts = self._programs(fs, kwargs)
        job = KeyJob(self.kernel_cache, fields, space, fs, self.candidates.listed, self.budget,
                     lambda p: self._measure(args, kwargs, p),
                     lambda p: self._call(args, kwargs, self.candidates.config(p)), self.timer, self.confirm,
                     compile_ahead=lambda points: compile_ahead(self.fn, args, kwargs,
                                                                [self.candidates.config(p) for p in points]),
                     programs=None if counts is None else (lambda p: counts[space.key(p)]), sms=_sms(args))
        started = time.perf_counter()
        decision = tune(job)
        self.bench_time = time.perf_counter() - started
        self.decisions[tuple(fields.values())] = self.last_decision = decision
        config = self.candidates.config(space.from_storage(decision.config))
        store = self.kernel_cache.existing(fields, space)
        self.configs_timings = {self.candidates.config(r.point): [r.value if r.value is not None else float("inf")]
                                for r in (store.history() if store is not None else []) if r.point in fs}
        if os.environ.get("TRITON_PRINT_AUTOTUNING") == "1":
            print(f"evotune autotuning for function {self.base_fn.__name__},\nwith key as {fields},\nfinished "
                  f"after {self.bench_time:.2f}s,\nbest config selected: {config} ({decision.how});")
        if self.timer.calls > timings_before:  # outputs touched by timing: reset them, as triton.autotune does
            self.pre_hook({**(self.nargs or {}), **kwargs, **config.all_kwargs()}, reset_only=True)
        return config

    def _programs(self, fs: FeasibleSet, kwargs: dict[str, Any]) -> dict[str, int] | None:
        """Each candidate's program count at this launch (its grid at the configuration), for the search's
        launch features; None when the launch has no grid or the grid function fails for a candidate."""
        grid = kwargs.get("grid")
        if grid is None:
            return None
        others = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
        out = {}
        for r in range(len(fs)):
            point = fs.point(r)
            meta = {**(self.nargs or {}), **others, **self.candidates.config(point).all_kwargs()}
            try:
                out[self.candidates.space.key(point)] = launch.programs_of(grid(meta) if callable(grid) else grid)
            except Exception as exc:  # a grid function that cannot take this configuration: no launch features
                log.info("%s: no launch features (the grid failed for %s: %s)", self.base_fn.__name__, point, exc)
                return None
        return out

    def _from_cache(self, fields: dict[str, Any], kwargs: dict[str, Any]) -> Any:
        space = self.candidates.space
        store = self.kernel_cache.existing(fields, space)
        decision = self.kernel_cache.decision(store) if store is not None else None
        if decision is None:
            near = nearest_tuned(self.kernel_cache, fields)
            if near is None:
                first = self.candidates.points[0] if self.candidates.listed else \
                    self.candidates.feasible(LaunchContext(args={**(self.nargs or {}), **kwargs})).point(0)
                log.warning("%s: key %s was never tuned and no key is (cache-only): using the first configuration "
                            "%s", self.base_fn.__name__, fields, self.candidates.config(first))
                return self.candidates.config(first)
            other, decision = near
            log.warning("%s: key %s was never tuned (cache-only): using the configuration tuned for the nearest "
                        "key %s", self.base_fn.__name__, fields, other)
        self.decisions[tuple(fields.values())] = self.last_decision = decision
        return self.candidates.config(space.from_storage(decision.config))


def _sms(args: tuple[Any, ...]) -> int | None:
    """The multiprocessors of the GPU the launch's first CUDA tensor is on (None: no CUDA tensor)."""
    for a in args:
        device = getattr(a, "device", None)
        if getattr(device, "type", None) == "cuda":
            import torch

            return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return None


def _plain(value: Any) -> Any:
    """A key value as JSON keeps it (ints, floats, strings, bools; anything else as its text)."""
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def autotune(configs: Sequence[Any] | None = None, key: Sequence[str] = (), space: SearchSpace | None = None,
             prune_configs_by: dict[str, Any] | None = None, reset_to_zero: Sequence[str] | None = None,
             restore_value: Sequence[str] | None = None, pre_hook: Callable[..., Any] | None = None,
             post_hook: Callable[..., Any] | None = None, warmup: int = 3, rep: float = 100.0,
             do_bench: Callable[..., Any] | None = None, budget: int = 64, mode: str = "online",
             cache: Any = None, confirm: int = 3) -> Callable[[Any], Autotuner]:
    """Decorator for a ``triton.jit`` kernel, with ``triton.autotune``'s arguments and behaviour, plus:

    ``space``: an evotune :class:`~evotune.core.space.SearchSpace` instead of ``configs`` (meta-parameters plus
    ``num_warps``/``num_stages``; its named constraints prune with reasons, reading the launch as ``ctx.args``);
    ``budget``: configurations timed per key (a list no longer is timed whole, as Triton does; a larger set
    is searched by evotune's ``default`` strategy); ``confirm``: the fastest few re-timed side by side before
    the decision (0 or 1: no confirmation); ``mode``: ``"online"`` (tune a key on its first call) or
    ``"cache-only"`` (never time; an unseen key takes the nearest tuned key's configuration, logged);
    ``cache``: where decisions persist (a storage URL or a folder; default ``$EVOTUNE_AUTOTUNE_CACHE``, else
    ``~/.cache/evotune/autotune/autotune.db``; ``False``: kept in memory only); ``warmup``: launches before
    timing; ``rep``: at most this many ms of sampling per configuration (the GPU oracle). ``do_bench`` is
    Triton's: ``do_bench(call, quantiles=(0.5, 0.2, 0.8))``, its first figure taken as the time in ms.

    Shared memory and registers of each compiled configuration are checked against the device before it is
    timed; under the Triton interpreter (``TRITON_INTERPRET=1``) there is no compiled kernel and that check
    is skipped, and without ``do_bench`` the interpreter is timed by the wall clock.
    """

    def decorator(fn: Any) -> Autotuner:
        return Autotuner(fn, fn.arg_names, configs=configs, key=key, space=space, prune_configs_by=prune_configs_by,
                         reset_to_zero=reset_to_zero, restore_value=restore_value, pre_hook=pre_hook,
                         post_hook=post_hook, warmup=warmup, rep=rep, do_bench=do_bench, budget=budget, mode=mode,
                         cache=cache, confirm=confirm)

    return decorator
