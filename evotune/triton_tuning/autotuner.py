"""The kernel ``evotune.autotune`` returns: a drop-in for ``triton.autotune``'s that searches, confirms and
remembers (the decorator: :mod:`evotune.triton_tuning.decorator`).

The decorated kernel is launched as before (``kernel[grid](*args)``, ``grid`` a tuple
or a function of the META dict); ``kernel.best_config`` is the ``triton.Config`` of the
last launch. The key is what Triton's is: the values of the ``key`` arguments, then
the dtype of every tensor argument. On a key's first call (``mode="online"``):

1. candidates: the ``configs`` list, or every point of ``space`` its named constraints
   keep (they may read the launch's arguments as ``ctx.args``), then
   ``prune_configs_by`` (``early_config_prune``, then ``perf_model`` with ``top_k``;
   :mod:`evotune.triton_tuning.pruning`); nothing left is Triton's ``AutotunerError``;
2. each configuration to time is compiled first; one whose compiled kernel exceeds the
   device's shared memory or registers is launched once, with the hooks, so that its
   ``post_hook`` gets the launch's own ``OutOfResources`` as under ``triton.autotune``
   (skipped under the interpreter); a configuration the device refuses at its first
   launch (threads, shared or tensor memory) is recorded infeasible with Triton's message
   (:mod:`evotune.triton_tuning.measure`);
3. timing and the decision: :mod:`evotune.triton_tuning.search`;
4. the decision is kept per key in memory: a cached launch is a dict lookup, then the launch.

``kernel.cache`` (key -> ``triton.Config``), ``best_config``, ``configs``,
``configs_timings`` (config -> ``[median, 20th, 80th percentile]`` ms of the last key
resolved by tuning) and ``bench_time`` (its seconds) are Triton's attributes; an
``Autotuner`` is built with ``triton.runtime.Autotuner``'s arguments, in its order.

``mode="cache-only"`` never times: a key with no decision takes the nearest tuned key's
(logged on the ``evotune.autotune`` logger), or the first candidate when none is tuned.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from evotune.core.result import EvalResult
from evotune.core.space import FeasibleSet, Point, SearchSpace
from evotune.search import launch
from evotune.triton_tuning.builds import built_points, later_points, not_specialised_on, specialisation
from evotune.triton_tuning.cache import CacheArg, Decision, DecisionStore, KernelId, cache_url
from evotune.triton_tuning.compile_ahead import CompilePool, PointBuilds, compile_ahead, pool_depth
from evotune.triton_tuning.configs import Candidates, LaunchContext, TritonConfig
from evotune.triton_tuning.hooks import Hooks
from evotune.triton_tuning.measure import launch_call, measure
from evotune.triton_tuning.neighbours import nearest_tuned
from evotune.triton_tuning.pruning import PruneBy, prune
from evotune.triton_tuning.resources import compile_config
from evotune.triton_tuning.search import KeyJob, tune_key
from evotune.triton_tuning.timers import make_timer
from evotune.triton_tuning.toolchain import Toolchain

log = logging.getLogger("evotune.autotune")

#: Triton's key of a launch: the ``key`` arguments' values, then ``str(dtype)`` of every tensor argument
LaunchKey = tuple[Hashable, ...]
MODES = ("online", "cache-only")


class Autotuner:
    """The tuned kernel: ``run`` looks the key up and launches; a key not looked up before is resolved once."""

    def __init__(self, fn: Any, arg_names: Sequence[str], configs: Sequence[Any] | None = None,
                 key: Sequence[str] = (), reset_to_zero: Sequence[str] | None = None,
                 restore_value: Sequence[str] | None = None, pre_hook: Callable[..., Any] | None = None,
                 post_hook: Callable[..., Any] | None = None, prune_configs_by: dict[str, Any] | None = None,
                 warmup: int | None = None, rep: float | None = None, use_cuda_graph: bool = False,
                 do_bench: Callable[..., Any] | None = None, cache_results: bool = False, *,
                 space: SearchSpace | None = None, budget: int = 64, mode: str = "online", cache: CacheArg = None,
                 confirm: int = 3):
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
        self.prune_by = PruneBy.of(prune_configs_by)
        self.perf_model, self.top_k = self.prune_by.perf_model, self.prune_by.top_k
        self.early_config_prune = self.prune_by.early_config_prune
        self.budget, self.mode, self.confirm = int(budget), mode, int(confirm)
        # a configuration's compile in evaluations' worth of time: above 0, a key's search weighs the configurations
        # not built for an earlier key of the same specialisation by it (evotune.triton_tuning.builds)
        self.compile_cost = 0.0
        #: makes what builds a searched key's proposals from (its depth, the space), where other processes can make
        #: the launch being tuned (set by ``tune-kernel``, which names the kernel by reference:
        #: build_processes.py); None: threads of this process build them
        self.builds: Callable[[int, SearchSpace], PointBuilds] | None = None
        #: the keys (their fields, as :meth:`key_fields` gives them) to be tuned after the one being tuned, nearest
        #: first: while a key is searched, idle build processes build their configurations (builds.later_points),
        #: and a later key's search counts those as built (set by ``tune-kernel`` and ``tune-model``)
        self.upcoming: list[dict[str, Any]] = []
        self._prebuilt: dict[tuple[str, ...], set[str]] = {}  # specialisation -> configurations built ahead
        # the GPU oracle always times CUDA graphs, and decisions always persist (where `cache` says): the two
        # flags of Triton's are kept as given and change nothing
        self.use_cuda_graph, self.cache_results = bool(use_cuda_graph), bool(cache_results)
        self.num_warmups, self.num_reps = warmup, rep
        self.timer = make_timer(do_bench, 3 if warmup is None else int(warmup), 100.0 if rep is None else float(rep))
        self.cache: dict[LaunchKey, TritonConfig] = {}  # key -> triton.Config, as triton.autotune keeps it
        self._launch: dict[LaunchKey, tuple[TritonConfig, dict[str, Any]]] = {}  # key -> (config, launch options)
        self._arg_set = frozenset(self.arg_names)
        self._key_pos = [self.arg_names.index(k) for k in self.keys]
        self._last_key_pos = max(self._key_pos, default=-1)
        self.decisions: dict[tuple[Any, ...], Decision] = {}  # key fields' values -> the decision it came from
        self.last_decision: Decision | None = None  # the decision of the last key resolved (None: a single config)
        self.best_config: TritonConfig | None = None
        # as triton.autotune keeps them (None with a space)
        self.configs: list[TritonConfig] | None = None if space is not None else list(configs or [triton.Config({})])
        self.configs_timings: dict[Any, list[float]] = {}  # the last key tuned here: config -> [median, p20, p80]
        self.bench_time = 0.0  # seconds the last key's tuning took
        self.nargs: dict[str, Any] | None = None
        self._cache_arg = cache
        self._decision_store: DecisionStore | None = None
        self._toolchain: Toolchain | None = None

    # -- launching --------------------------------------------------------------------------------
    def key_of(self, nargs: dict[str, Any], kwargs: dict[str, Any]) -> LaunchKey:
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
            candidates, fs = self._candidates({k: v for k, v in kwargs.items() if k != "grid"})
        finally:
            self.nargs = None
        return [compile_config(self.fn, args, kwargs, candidates.config(fs.point(r))) for r in range(len(fs))]

    # -- resolving a key --------------------------------------------------------------------------
    def use_cache(self, cache: CacheArg) -> None:
        """Keep decisions in ``cache`` from now on (a storage URL or a folder); keys resolved so far stay."""
        self._cache_arg, self._decision_store = cache, None

    @property
    def decision_store(self) -> DecisionStore:
        """This kernel's decisions and their studies for the build last read (:meth:`_refresh_build`): a changed
        Triton, backend, tool or codegen knob (:mod:`evotune.triton_tuning.toolchain`) opens other studies."""
        if self._decision_store is None or (self._toolchain is not None
                                            and self._toolchain != self._decision_store.kernel.toolchain):
            kernel = KernelId.of(self.base_fn, self._jit(), toolchain=self._toolchain)
            self._decision_store, self._toolchain = DecisionStore(cache_url(self._cache_arg), kernel), kernel.toolchain
        return self._decision_store

    def _refresh_build(self) -> None:
        """Read the build again before a key is resolved: a knob may have changed since the last key."""
        self._toolchain = Toolchain.current()

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

    def _resolve(self, key: LaunchKey, args: tuple[Any, ...], kwargs: dict[str, Any]) -> TritonConfig:
        if self.configs is not None and len(self.configs) == 1:
            config = self.configs[0]  # one config: nothing to prune or tune, as in Triton
        else:
            self._refresh_build()
            fields = self.key_fields(self.nargs or {}, kwargs)
            config = (self._from_cache(fields, kwargs) if self.mode == "cache-only"
                      else self._tune(fields, args, kwargs))
        self.cache[key] = config
        return config

    def _candidates(self, kwargs: dict[str, Any]) -> tuple[Candidates, FeasibleSet]:
        """The candidates (a list with what ``early_config_prune`` added to it: kept for the next keys) and their
        points left for this launch."""
        args = {**(self.nargs or {}), **kwargs}
        candidates, fs = prune(self.candidates, args, self.nargs or {}, kwargs, self.prune_by, self.base_fn.__name__,
                               self.configs)
        self.candidates = candidates
        return candidates, fs

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any], config: TritonConfig) -> Callable[[], None]:
        return launch_call(self.fn, args, kwargs, config, self.nargs or {}, self.pre_hook, self.post_hook)

    def _measure(self, args: tuple[Any, ...], kwargs: dict[str, Any], point: Point) -> EvalResult:
        config = self.candidates.config(point)
        return measure(self.fn, args, kwargs, config, self._call(args, kwargs, config), self.timer,
                       self.base_fn.__name__)

    def _tune(self, fields: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> TritonConfig:
        candidates, fs = self._candidates(kwargs)
        space = candidates.space
        timings_before = self.timer.calls
        counts = self._programs(fs, kwargs)
        # what is built for this key's specialisation, read once: the search weighs compiles by it, and the build
        # processes build ahead only what it lacks
        built = self._built(fields, space) if self.compile_cost > 0 or self.upcoming else frozenset()
        job = KeyJob(self.decision_store, fields, space, fs, candidates.listed, self.budget,
                     lambda p: self._measure(args, kwargs, p),
                     lambda p: self._call(args, kwargs, candidates.config(p)), self.timer, self.confirm,
                     compile_ahead=lambda points: compile_ahead(self.fn, args, kwargs,
                                                                [candidates.config(p) for p in points]),
                     pool=self._pool(args, kwargs, candidates, fs, fields, built) if CompilePool.available() else None,
                     programs=None if counts is None else (lambda p: counts[space.key(p)]), sms=_sms(args),
                     ctx=LaunchContext(args={**(self.nargs or {}), **kwargs}), compile_cost=self.compile_cost,
                     built=built if self.compile_cost > 0 else frozenset())
        started = time.perf_counter()
        decision = tune_key(job)
        self.bench_time = time.perf_counter() - started
        self.decisions[tuple(fields.values())] = self.last_decision = decision
        config = candidates.stored_config(decision.config)
        store = self.decision_store.existing(fields, space)
        self.configs_timings = {candidates.config(r.point): _timings(r.value, r.attrs.get("samples_ms"))
                                for r in (store.history() if store is not None else []) if r.point in fs}
        timed = self.timer.calls > timings_before
        if _autotuning_knob("print", "TRITON_PRINT_AUTOTUNING"):
            print(f"evotune autotuning for function {self.base_fn.__name__},\nwith key as {fields},\nfinished "
                  f"after {self.bench_time:.2f}s,\nbest config selected: {config} ({decision.how});")
        listener = _autotuning_knob("listener", None)
        if listener is not None and len(fs) > 1:  # Triton's listener hears of every key tuned among several
            listener(fn=self._jit(), key=tuple(fields.values()), best_config=config,
                     configs_timings=self.configs_timings, duration=self.bench_time if timed else None,
                     cache_hit=not timed)
        if timed:  # outputs touched by timing: reset them, as triton.autotune does
            self.pre_hook({**(self.nargs or {}), **kwargs, **config.all_kwargs()}, reset_only=True)
        return config

    def _built(self, fields: dict[str, Any], space: SearchSpace) -> frozenset[str]:
        """The configurations built for ``fields``' specialisation: measured for another key, or built ahead."""
        unspecialised = not_specialised_on(self.fn)
        ahead = self._prebuilt.get(specialisation(fields, unspecialised), set())
        return built_points(self.decision_store, fields, space, unspecialised) | frozenset(ahead)

    def _pool(self, args: tuple[Any, ...], kwargs: dict[str, Any], candidates: Candidates, fs: FeasibleSet,
              fields: dict[str, Any], built: frozenset[str]) -> Callable[[], PointBuilds]:
        """What builds a searched key's proposals ahead: other processes where they can make the launch (a kernel
        named by reference), else threads of this one; the processes also build the :attr:`upcoming` keys'
        configurations while the search leaves them idle."""
        depth, builds, space = pool_depth(self.budget), self.builds, candidates.space
        if builds is None:
            return lambda: CompilePool(self.fn, args, kwargs, candidates.config, space.key, depth)
        built_ahead = self._prebuilt.setdefault(specialisation(fields, not_specialised_on(self.fn)), set())

        def make() -> PointBuilds:
            pool = builds(depth, space)
            later = self._later(kwargs, candidates, fs, fields, built)
            if later:
                pool.background(later, built_ahead.add)
            return pool

        return make

    def _later(self, kwargs: dict[str, Any], candidates: Candidates, fs: FeasibleSet, fields: dict[str, Any],
               built: frozenset[str]) -> list[Point]:
        """The :attr:`upcoming` keys' configurations to build while this key is searched: those of the keys of its
        specialisation (so built with this launch), each key's candidates pruned for its launch (this launch with
        the key's values), none ``built`` already."""
        unspecialised = not_specialised_on(self.fn)
        mine = specialisation(fields, unspecialised)
        args = {**(self.nargs or {}), **kwargs}
        later = [candidates.feasible(LaunchContext(args={**args, **{n: v for n, v in key.items() if n in args}}))
                 for key in self.upcoming if key != fields and specialisation(key, unspecialised) == mine]
        return later_points(candidates.space, fs, later, built) if later else []

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

    def _from_cache(self, fields: dict[str, Any], kwargs: dict[str, Any]) -> TritonConfig:
        space = self.candidates.space
        store = self.decision_store.existing(fields, space)
        decision = self.decision_store.decision(store) if store is not None else None
        if decision is None:
            near = nearest_tuned(self.decision_store, fields)
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
        return self.candidates.stored_config(decision.config)


def _timings(value: float | None, samples: Any) -> list[float]:
    """A timed configuration's figures as Triton's ``configs_timings`` holds them: the median, then the 20th and
    80th percentiles of its samples (``inf`` for one that failed)."""
    if value is None:
        return [float("inf")] * 3
    got = sorted(float(x) for x in samples) if isinstance(samples, list) and samples else [float(value)]
    return [float(value), got[int(0.2 * (len(got) - 1))], got[round(0.8 * (len(got) - 1))]]


def _autotuning_knob(name: str, env: str | None) -> Any:
    """``triton.knobs.autotuning.NAME`` (a Triton without knobs: whether ``env`` is "1")."""
    try:
        from triton import knobs
    except ImportError:
        return os.environ.get(env) == "1" if env else None
    return getattr(knobs.autotuning, name, None)


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
