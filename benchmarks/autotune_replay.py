"""evotune.autotune's per-key search replayed on the CPU over recorded landscapes, one landscape per key.

For each seed, a fresh kernel cache (a temporary SQLite or journal storage, as ``evotune.autotune``
keeps) tunes the keys in order. Each key is tuned by :func:`evotune.triton_tuning.search.tune_key` on a
:class:`~evotune.triton_tuning.search.KeyJob`, exactly as ``Autotuner._tune`` builds it: the ``default``
strategy with the trials of the keys already tuned as its sources (:func:`evotune.triton_tuning.neighbours.sources`),
the claims, the key's Optuna study, and the confirmation of the fastest ``--confirm`` configurations.
Only the kernel is replaced: timing a configuration looks up its recorded result in the key's landscape
(a recorded failure is a failed evaluation), and the confirmation's samples are the recorded samples of
the configuration, cycled (its recorded time when none were kept): a deterministic fake timing.

Why this level and not the ``Autotuner`` with a fake kernel: ``Autotuner`` needs Triton (its constructor,
``KernelId.of`` and ``_measure`` import it, and ``_measure`` compiles the configuration to check its
resources); what it adds over ``tune_key(KeyJob)`` is the launch, the pruning of a ``triton.Config`` list and
the compiled kernel's resource check, none of which a recorded landscape can exercise. Everything from the
``KeyJob`` down (cache, study, claims, sources, strategy, confirmation, decision) is the real code.

The candidates of a key are the points its landscape recorded (a sampled recording answers for those
only), in one space shared by all keys (the union of the landscapes' parameter choices), as the
``Autotuner`` keeps one space for every key of a kernel. That space holds the recorded parameters only:
``tune``'s ``default`` strategy starts from a random sample (no hardware model), so what the kernel's own
space adds is its constraints. A recording may hold points they reject (the fused-MoE landscapes record vLLM's
whole grid, tiles over the shared memory and ``BLOCK_SIZE_M`` far over the tokens an expert gets included),
which the ``Autotuner`` never offers its search: with ``--space FILE:NAME`` (the kernel's ``SearchSpace``) and
``--launch FILE:FUNCTION`` (the launch's arguments from a key's fields, as the constraints read them from
``ctx.args``), each key keeps only the recorded points the space's constraints accept in its launch, as
:func:`evotune.triton_tuning.pruning.prune` keeps them (:class:`SpaceRule`); how many each key lost, and by which
constraint, is reported. The fractions stay against the optimum of every recorded point, so a constraint that
prunes the fastest point shows (``kept``: the best kept point's fraction). Each seed is the strategy's seed of
every key (the ``Autotuner`` passes 0), so the seeds are independent runs.

A key's fields come from its landscape: the ``key`` object of the file when it has one, else ``M``,
``N``, ``K`` and ``dtype`` of a GEMM problem, else the numeric fields of the problem; the distance
between keys (and so which keys are sources) is ``evotune.autotune``'s own.

Reported per key (median over seeds): evaluations until the best time so far is within 0.99 of the
landscape's optimum (optimum / best >= 0.99; None when never within the budget), the fraction reached
after 10 and after 40 evaluations (after the last one when the budget is smaller), the fraction of the
decided configuration (after the confirmation), and the number of sources each key's search was
given. The acceptance check: the first key within 40 evaluations, every later key within 10::

    python benchmarks/autotune_replay.py --landscapes evotune/landscapes/autotune_matmul \\
        --seeds 5 --budget 40 --out runs/autotune_replay.json

The fused-MoE landscapes, searched over what ``tune-kernel`` and ``tune-model`` search::

    python benchmarks/autotune_replay.py --landscapes evotune/landscapes/autotune_moe \\
        --grid benchmarks/fused_moe_grid.py:grid --sms 132 \\
        --space search_spaces/_triton_fused_moe.py:SPACE --launch benchmarks/fused_moe_grid.py:launch_args

With ``--compile-cost X`` each key's search weighs compiles as ``tune-kernel`` does (``tune-model`` passes its
``compile_cost()``): the configurations measured for an earlier key of the same Triton specialisation
(:func:`evotune.triton_tuning.builds.built_points`) count as built, every other one costs X evaluations' worth of
time. Reported beside the fractions, per key: the new compiles (the points measured for the key that were not
built for an earlier key of its specialisation, failed ones included: a configuration that fails at launch was
compiled first) and the lowest decided fraction over the seeds. The default, 0, weighs no compile (the
``Autotuner``'s own default); the new compiles are counted all the same. ``--unspecialised M`` says the kernel is
not specialised on M (the package's fused MoE): a configuration built for any earlier key is built.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import inspect
import json
import math
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.cli.output import EXIT_USAGE, UsageError  # noqa: E402
from evotune.core.feasible import FeasibleSet  # noqa: E402
from evotune.core.landscape import Landscape, LandscapeError, landscape_stem, load_landscape  # noqa: E402
from evotune.core.result import EvalResult  # noqa: E402
from evotune.core.space import Param, Point, SearchSpace, categorical, ordinal  # noqa: E402
from evotune.search import launch  # noqa: E402
from evotune.triton_tuning.builds import built_points  # noqa: E402
from evotune.triton_tuning.cache import DecisionStore, KernelId  # noqa: E402
from evotune.triton_tuning.configs import LaunchContext  # noqa: E402
from evotune.triton_tuning.neighbours import sources  # noqa: E402
from evotune.triton_tuning.search import KeyJob, tune_key  # noqa: E402
from evotune.triton_tuning.timers import Call, Timer  # noqa: E402

TARGET = 0.99
FIRST_LIMIT = 40  # evaluations the first key may take to reach TARGET
LATER_LIMIT = 10  # evaluations every later key may take


@dataclass
class ReplayKey:
    """One key: its landscape and its fields as ``evotune.autotune`` keys it."""

    name: str
    landscape: Landscape
    fields: dict[str, Any]
    kept: list[tuple[Any, ...]] | None = None  # the recorded entries a space's constraints keep (None: all)
    pruned: dict[str, int] = field(default_factory=dict)  # the entries pruned, by the first constraint rejecting each

    @property
    def optimum_ms(self) -> float:
        opt = self.landscape.optimum_ms
        assert opt is not None  # checked when loaded
        return opt

    @property
    def candidates(self) -> list[tuple[Any, ...]]:
        """The recorded entries the search is offered."""
        return list(self.landscape.entries) if self.kept is None else self.kept

    def kept_fraction(self) -> float:
        """The optimum over the fastest candidate: below 1 when the constraints prune the fastest recorded point."""
        times = [got.value for got in (self.landscape.lookup(dict(zip(self.landscape.names, e, strict=True)))
                                       for e in self.candidates) if got is not None and got.value is not None]
        return self.optimum_ms / min(times) if times else 0.0


@dataclass
class KeyRun:
    """One key tuned in one seed's run."""

    key: str
    seed: int
    sources: list[str]
    fractions: list[float]  # best-so-far optimum / best time after each evaluation (0 before any success)
    decided_fraction: float  # optimum / recorded time of the decided configuration
    how: str
    trials: int  # the trials the key's study holds afterwards (one per evaluation)
    built: int = 0  # the points built for earlier keys of the key's specialisation when its search began
    new_compiles: int = 0  # the points measured for the key that were not among them
    measured: list[str] = field(default_factory=list)  # the points measured (the space's key of each), in order

    @property
    def evals(self) -> int:
        return len(self.fractions)

    def evals_to(self, target: float = TARGET) -> int | None:
        return next((i + 1 for i, f in enumerate(self.fractions) if f >= target), None)

    def fraction_at(self, n: int) -> float:
        return self.fractions[min(n, len(self.fractions)) - 1] if self.fractions else 0.0


@dataclass
class KeySummary:
    key: str
    fields: dict[str, Any]
    points: int
    limit: int
    median_evals_to_99: float | None  # None: the median run never got there within the budget
    median_fraction_at_10: float
    median_fraction_at_40: float
    median_decided_fraction: float
    sources: list[int] = field(default_factory=list)  # the number of sources, per seed
    evals_to_99: list[int | None] = field(default_factory=list)  # per seed
    min_decided_fraction: float = 0.0  # the lowest over the seeds
    median_new_compiles: float = 0.0
    new_compiles: list[int] = field(default_factory=list)  # per seed
    pruned: int = 0  # the recorded points the space's constraints pruned
    pruned_by: dict[str, int] = field(default_factory=dict)  # by constraint
    kept_fraction: float = 1.0  # the optimum over the fastest point kept

    @property
    def passed(self) -> bool:
        return self.median_evals_to_99 is not None and self.median_evals_to_99 <= self.limit


# -- reading the keys -------------------------------------------------------------------------------
def landscape_paths(inputs: Sequence[str]) -> list[Path]:
    """The landscape files named: each file as given, each folder's ``*.json`` and ``*.json.gz``."""
    out: list[Path] = []
    for text in inputs:
        path = Path(text)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))
            if not found:
                raise UsageError(f"--landscapes: {path} holds no .json or .json.gz landscape")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise UsageError(f"--landscapes: {path} does not exist")
    return out


def key_fields(ls: Landscape) -> dict[str, Any]:
    """The key of a landscape: its file's ``key`` object, a GEMM's M, N, K and dtype, or the problem's numbers."""
    key = ls.meta.get("key")
    if isinstance(key, dict) and key:
        return dict(key)
    p = ls.problem
    if p.kind == "gemm":
        return {"M": p.m, "N": p.n, "K": p.k, "dtype": p.dtype}
    numbers = {k: v for k, v in p.extra if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if not numbers:
        raise UsageError(f"{ls.path}: problem: no key (no 'key' object, not a GEMM, no numeric problem fields)")
    return {**numbers, "dtype": p.dtype}


def load_keys(inputs: Sequence[str], order: Sequence[str] | None = None) -> list[ReplayKey]:
    """The keys in tuning order: ``order`` (file stems or paths) when given, else the files sorted by name."""
    paths = landscape_paths(inputs)
    by_stem = {landscape_stem(p): p for p in paths}
    if order:
        missing = [o for o in order if landscape_stem(o) not in by_stem]
        if missing:
            raise UsageError(f"--order: {', '.join(missing)} is not among the landscapes given")
        paths = [by_stem[landscape_stem(o)] for o in order]
    else:
        paths = sorted(by_stem.values(), key=lambda p: p.name)
    keys = []
    for path in paths:
        ls = load_landscape(path)
        if ls.optimum_ms is None:
            raise UsageError(f"{path}: points: no point was recorded with a time")
        keys.append(ReplayKey(landscape_stem(path), ls, key_fields(ls)))
    if len({json.dumps(k.fields, sort_keys=True) for k in keys}) != len(keys):
        raise UsageError(f"--landscapes: two landscapes have the same key ({', '.join(k.name for k in keys)})")
    return keys


def common_space(keys: Sequence[ReplayKey]) -> SearchSpace:
    """One space for every key (as the Autotuner keeps one per kernel): each parameter's choices of all files."""
    first = keys[0].landscape
    for k in keys[1:]:
        if k.landscape.names != first.names:
            raise UsageError(f"{k.landscape.path}: params: {k.landscape.names}, the first landscape has "
                             f"{first.names}")
    params: list[Param] = []
    for i, p in enumerate(first.params):
        values = list(dict.fromkeys(c for k in keys for c in k.landscape.params[i].choices))
        if values == list(p.choices):
            params.append(p)
        elif p.ordered:
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            params.append(ordinal(p.name, sorted(values) if numeric else values))
        else:
            params.append(categorical(p.name, values))
    name = first.space_name if first.space_name != "landscape" else f"landscape:{first.stem}"
    return SearchSpace(name, params, description="the recorded configurations of every key",
                       workload=first.problem.kind)


# -- the fake kernel ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordedCall:
    """A launch of one configuration whose timing is its recorded samples."""

    samples_ms: tuple[float, ...]

    def __call__(self) -> None:
        return None


class RecordedTimer(Timer):
    """Answers a RecordedCall's samples, cycled: the same figures on every run."""

    kind = "replay"

    def _samples(self, call: Call, n: int) -> list[float]:
        recorded = call.samples_ms if isinstance(call, RecordedCall) else ()
        if not recorded:
            raise TypeError(f"the replay's timer times recorded calls only, got {call!r}")
        return [recorded[i % len(recorded)] for i in range(n)]


class KeyReplay:
    """The measure and make_call of one key's KeyJob: lookups in its landscape, each evaluation logged."""

    def __init__(self, key: ReplayKey, space: SearchSpace):
        self.key = key
        self.space = space
        self.times: list[float | None] = []
        self.measured: list[str] = []  # the points measured (space.key), in order

    def result(self, point: Point) -> EvalResult:
        got = self.key.landscape.lookup(point)
        if got is None:  # the candidates are the recorded points: a search cannot ask for another
            raise LookupError(f"{self.key.landscape.path}: no recorded point {point}")
        return got

    def measure(self, point: Point) -> EvalResult:
        got = self.result(point)
        self.times.append(got.value)
        self.measured.append(self.space.key(point))
        return got

    def make_call(self, point: Point) -> Call:
        got = self.result(point)
        samples = tuple(got.samples_ms) or ((got.time_ms,) if got.time_ms is not None else ())
        return RecordedCall(samples)

    def fractions(self) -> list[float]:
        out, best = [], math.inf
        for t in self.times:
            if t is not None:
                best = min(best, t)
            out.append(self.key.optimum_ms / best if best < math.inf else 0.0)
        return out


# -- the replay -----------------------------------------------------------------------------------
def kernel_id(keys: Sequence[ReplayKey], kernel: str) -> KernelId:
    """The kernel every key belongs to: one identity, so that the keys' studies are one kernel's."""
    meta = keys[0].landscape.meta
    text = "\n".join(keys[0].landscape.names)
    return KernelId(kernel, hashlib.sha256(text.encode()).hexdigest()[:16], str(meta.get("triton", "replay")),
                    str(meta.get("device", "replay")))


class GridRule:
    """The launch grid of a key's configuration, from the kernel's own grid function (``--grid FILE:FUNC``).

    ``FUNC`` takes key fields by name (those its signature names) and returns the grid: a tuple of sizes, or
    a function of the META dict (the configuration's values) that returns one, as a Triton launcher's grid
    is (``examples/triton_autotune/matmul.py:grid``). ``evotune.autotune`` counts the programs of the real
    launch the same way (:func:`evotune.search.launch.programs_of` of the grid at the configuration).
    """

    def __init__(self, spec: str):
        self.fn = load_function("--grid", spec)
        self.names = list(inspect.signature(self.fn).parameters)

    def programs(self, key: dict[str, Any], point: Point) -> int:
        grid = self.fn(**key_arguments("--grid", self.names, key))
        return launch.programs_of(grid(dict(point)) if callable(grid) else grid)


def load_attribute(flag: str, spec: str, what: str) -> tuple[str, Any]:
    """(FILE, the value of NAME in it) of ``spec``, ``FILE:NAME``; a bad one is a UsageError naming ``flag``."""
    path, _, name = spec.rpartition(":")
    if not path or not name:
        raise UsageError(f"{flag}: expected FILE:{what}, got {spec!r}")
    if not Path(path).is_file():
        raise UsageError(f"{flag}: {path} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"_replay_{Path(path).stem}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # where a dataclass of the file looks up its module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: its error in one line
        raise UsageError(f"{flag}: {path}: {type(exc).__name__}: {exc}".replace("\n", " ")) from exc
    return path, getattr(module, name, None)


def load_function(flag: str, spec: str) -> Callable[..., Any]:
    path, fn = load_attribute(flag, spec, "FUNCTION")
    if not callable(fn):
        raise UsageError(f"{flag}: {path} has no function {spec.rpartition(':')[2]!r}")
    return fn


def key_arguments(flag: str, names: Sequence[str], key: dict[str, Any]) -> dict[str, Any]:
    """The key's fields a function's signature names."""
    missing = [n for n in names if n not in key]
    if missing:
        raise UsageError(f"{flag}: the key {key} has no field {', '.join(missing)}")
    return {n: key[n] for n in names}


class SpaceRule:
    """The kernel's own space (``--space FILE:NAME``) and its launch at a key (``--launch FILE:FUNCTION``).

    ``FUNCTION`` takes key fields by name and returns the launch's arguments by name, what the space's
    constraints read as ``ctx.args`` (``benchmarks/fused_moe_grid.py:launch_args``). A key keeps the recorded
    points the constraints accept in a :class:`~evotune.triton_tuning.configs.LaunchContext` of those arguments,
    as ``evotune.autotune`` prunes a space's points for a launch; a recorded point outside the space's choices is
    not a candidate either.
    """

    OUTSIDE = "outside-the-space"

    def __init__(self, space_spec: str, launch_spec: str):
        path, space = load_attribute("--space", space_spec, "NAME")
        if not isinstance(space, SearchSpace):
            what = "nothing" if space is None else type(space).__name__
            raise UsageError(f"--space: {path}: {space_spec.rpartition(':')[2]}: expected a SearchSpace, found {what}")
        self.space = space
        self.spec = launch_spec
        self.fn = load_function("--launch", launch_spec)
        self.names = list(inspect.signature(self.fn).parameters)

    def context(self, key: dict[str, Any]) -> LaunchContext:
        given = key_arguments("--launch", self.names, key)
        try:
            args = self.fn(**given)
        except Exception as exc:  # the user's function: its error in one line
            raise UsageError(f"--launch: {self.spec} failed for {given}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(args, dict):
            raise UsageError(f"--launch: {self.spec} returned {type(args).__name__}, expected a dict of arguments")
        return LaunchContext(args=args)

    def apply(self, key: ReplayKey) -> ReplayKey:
        """The key with the entries the space keeps and the count of those it prunes, by constraint."""
        ls = key.landscape
        if set(ls.names) != set(self.space.names):
            raise UsageError(f"--space: {self.space.name} has parameters {', '.join(self.space.names)}; "
                             f"{ls.path} records {', '.join(ls.names)}")
        ctx = self.context(key.fields)
        kept, pruned = [], Counter[str]()
        for values in ls.entries:
            point = dict(zip(ls.names, values, strict=True))
            try:
                self.space.validate(point)
            except ValueError:
                pruned[self.OUTSIDE] += 1
                continue
            try:
                reason = self.space.check(point, ctx)
            except Exception as exc:  # a constraint reading what the launch lacks
                raise UsageError(f"--launch: the constraints of {self.space.name} failed on the arguments "
                                 f"{self.spec} gives for {key.name}: {type(exc).__name__}: {exc}") from exc
            if reason is None:
                kept.append(values)
            else:
                pruned[reason.split(":", 1)[0]] += 1
        out = ReplayKey(key.name, ls, key.fields, kept, dict(pruned.most_common()))
        if out.kept_fraction() == 0.0:
            raise UsageError(f"--space: {self.space.name} keeps no recorded point with a time of {ls.path}")
        return out


def replay_seed(keys: Sequence[ReplayKey], seed: int, budget: int, confirm: int, storage: str,
                kernel: str = "matmul_kernel", grid: GridRule | None = None, sms: int | None = None,
                compile_cost: float = 0.0, unspecialised: frozenset[str] = frozenset()) -> list[KeyRun]:
    """Tune every key in order, on a fresh cache, with ``seed`` for each key's strategy (and, with ``grid``,
    the launch features of a GPU of ``sms`` multiprocessors, as ``evotune.autotune`` gives them; with
    ``compile_cost`` above 0, each unbuilt configuration weighed by it, as ``Autotuner._tune`` weighs it; a
    configuration is built for every key of one specialisation, ``unspecialised`` naming the key's fields the
    kernel is not specialised on)."""
    space = common_space(keys)
    runs = []
    with tempfile.TemporaryDirectory(prefix="autotune_replay_") as tmp:
        url = f"journal:{tmp}/autotune.journal" if storage == "journal" else f"sqlite:///{tmp}/autotune.db"
        cache = DecisionStore(url, kernel_id(keys, kernel))
        for key in keys:
            names = key.landscape.names
            feasible = FeasibleSet.from_codes(
                space, (space.encode(dict(zip(names, values, strict=True))) for values in key.candidates))
            replay = KeyReplay(key, space)
            used = [s.name for s in sources(cache, key.fields, space)]  # what tune's search is given below
            programs = None if grid is None else functools.partial(grid.programs, key.fields)
            # counted whatever the cost, so that the runs without one report their compiles too; handed to the
            # search as the Autotuner hands it (only with a cost)
            built = built_points(cache, key.fields, space, unspecialised)
            job = KeyJob(cache, key.fields, space, feasible, None, budget, replay.measure, replay.make_call,
                         RecordedTimer(), confirm, seed=seed, programs=programs, sms=sms,
                         compile_cost=compile_cost, built=built if compile_cost > 0 else frozenset())
            decision = tune_key(job)
            decided = key.landscape.lookup(space.from_storage(decision.config))
            decided_ms = decided.value if decided is not None else None
            store = cache.existing(key.fields, space)
            trials = len(store.history()) if store is not None else 0
            runs.append(KeyRun(key.name, seed, used, replay.fractions(),
                               key.optimum_ms / decided_ms if decided_ms else 0.0, decision.how, trials,
                               len(built), len(set(replay.measured) - built), replay.measured))
    return runs


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarize(keys: Sequence[ReplayKey], runs: Sequence[KeyRun]) -> list[KeySummary]:
    out = []
    for i, key in enumerate(keys):
        mine = [r for r in runs if r.key == key.name]
        reached = [r.evals_to() for r in mine]
        med = statistics.median([math.inf if e is None else e for e in reached])
        out.append(KeySummary(
            key.name, key.fields, len(key.landscape), FIRST_LIMIT if i == 0 else LATER_LIMIT,
            None if med == math.inf else float(med), _median([r.fraction_at(10) for r in mine]),
            _median([r.fraction_at(40) for r in mine]), _median([r.decided_fraction for r in mine]),
            [len(r.sources) for r in mine], reached, min(r.decided_fraction for r in mine),
            _median([r.new_compiles for r in mine]), [r.new_compiles for r in mine], sum(key.pruned.values()),
            key.pruned, key.kept_fraction()))
    return out


def table(summaries: Sequence[KeySummary]) -> str:
    # the keys' file stems less what they all begin with (the space, workload and dtype), so each shows whole
    keys = [s.key for s in summaries]
    prefix = next((keys[0][:i] for i in range(len(keys[0]), 0, -1) if all(k.startswith(keys[0][:i]) for k in keys)),
                  "") if len(keys) > 1 else ""
    prefix = prefix[:prefix.rfind("_") + 1]  # whole words only
    rows = [f"{'key':<28} {'points':>6} {'pruned':>6} {'kept':>6} {'sources':>7} {'evals->0.99':>11} {'@10':>6} "
            f"{'@40':>6} {'decided':>7} {'lowest':>6} {'new':>5}  check"]
    for s in summaries:
        evals = "never" if s.median_evals_to_99 is None else f"{s.median_evals_to_99:g}"
        src = "/".join(map(str, sorted(set(s.sources))))
        verdict = "PASS" if s.passed else "FAIL"
        name = s.key[len(prefix):][:28]
        rows.append(f"{name:<28} {s.points:>6} {s.pruned:>6} {s.kept_fraction:>6.3f} {src:>7} {evals:>11} "
                    f"{s.median_fraction_at_10:>6.3f} "
                    f"{s.median_fraction_at_40:>6.3f} {s.median_decided_fraction:>7.3f} "
                    f"{s.min_decided_fraction:>6.3f} {s.median_new_compiles:>5g}  {verdict} "
                    f"(<= {s.limit})")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landscapes", nargs="+", required=True, help="a folder of landscapes or landscape files")
    ap.add_argument("--order", default="", help="the keys' tuning order: comma-separated file stems "
                    "(default: the files sorted by name)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=40, help="evaluations per key (default 40)")
    ap.add_argument("--confirm", type=int, default=3, help="configurations confirmed per key (default 3)")
    ap.add_argument("--storage", choices=("sqlite", "journal"), default="sqlite", help="the cache's storage")
    ap.add_argument("--grid", help="FILE:FUNCTION, the kernel's launch grid from the key's fields (see "
                    "GridRule): the search then gets the launch features that evotune.autotune gives it")
    ap.add_argument("--sms", type=int, help="the GPU's multiprocessors, for the launch features (132: H100 SXM)")
    ap.add_argument("--compile-cost", type=float, default=0.0, help="a configuration's compile in evaluations' "
                    "worth of time, as tune-kernel weighs it (tune-model: its compile_cost()); 0, the default, "
                    "weighs none")
    ap.add_argument("--unspecialised", default="", help="the key's fields the kernel is not specialised on, "
                    "comma-separated (Triton's do_not_specialize; M for the package's fused MoE): a configuration "
                    "built for one key is built for every key that differs only in them")
    ap.add_argument("--space", help="FILE:NAME, the kernel's SearchSpace: each key keeps the recorded points its "
                    "constraints accept in the key's launch (needs --launch)")
    ap.add_argument("--launch", help="FILE:FUNCTION, the launch's arguments (what the constraints read as ctx.args) "
                    "from the key's fields")
    ap.add_argument("--out", help="write the runs and the summary as JSON here")
    args = ap.parse_args(argv)
    try:
        if args.seeds < 1:
            raise UsageError(f"--seeds: expected an integer >= 1, got {args.seeds}")
        if args.budget < 1:
            raise UsageError(f"--budget: expected an integer >= 1, got {args.budget}")
        if args.sms is not None and args.sms < 1:
            raise UsageError(f"--sms: expected an integer >= 1, got {args.sms}")
        if not (math.isfinite(args.compile_cost) and args.compile_cost >= 0):
            raise UsageError(f"--compile-cost: expected a number >= 0, got {args.compile_cost}")
        if args.space and not args.launch:
            raise UsageError("--launch: missing: --space needs the launch its constraints read (FILE:FUNCTION)")
        if args.launch and not args.space:
            raise UsageError("--space: missing: --launch is read for a space's constraints only (FILE:NAME)")
        keys = load_keys(args.landscapes, [o for o in args.order.split(",") if o])
        unspecialised = frozenset(n for n in args.unspecialised.split(",") if n)
        unknown = sorted(unspecialised - {f for k in keys for f in k.fields})
        if unknown:
            raise UsageError(f"--unspecialised: {', '.join(unknown)}: not a field of the keys "
                             f"({', '.join(keys[0].fields)})")
        if args.space:
            rule = SpaceRule(args.space, args.launch)
            keys = [rule.apply(k) for k in keys]
        space = common_space(keys)
        grid = GridRule(args.grid) if args.grid else None
        if grid is not None:  # every key's every point, before anything runs
            for k in keys:
                for values in k.candidates:
                    grid.programs(k.fields, space.decode(space.encode(dict(zip(k.landscape.names, values,
                                                                                 strict=True)))))
    except (UsageError, LandscapeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    runs = [r for seed in range(args.seeds) for r in replay_seed(keys, seed, args.budget, args.confirm,
                                                                   args.storage, grid=grid, sms=args.sms,
                                                                   compile_cost=args.compile_cost,
                                                                   unspecialised=unspecialised)]
    summaries = summarize(keys, runs)
    features = f"launch features from {args.grid} ({args.sms or 'unknown'} SMs)" if grid else "no launch features"
    kept = f"the points {args.space} keeps" if args.space else "every recorded point"
    print(f"evotune.autotune replayed: {len(keys)} keys, {args.seeds} seeds, budget {args.budget}, "
          f"confirm {args.confirm}, {features}, compile cost {args.compile_cost:g}"
          f"{', not specialised on ' + ','.join(sorted(unspecialised)) if unspecialised else ''}, over {kept}; "
          f"medians over seeds "
          f"(pruned: the recorded points the space's constraints pruned; kept: the fraction of the fastest one "
          f"kept; lowest: the lowest decided fraction; new: the compiles not built for an earlier key)")
    for k in keys:
        if k.pruned:
            print(f"  {k.name}: pruned " + ", ".join(f"{n} by {c}" for c, n in k.pruned.items()))
    print(table(summaries))
    ok = all(s.passed for s in summaries)
    print(f"acceptance (first key <= {FIRST_LIMIT}, later keys <= {LATER_LIMIT} evaluations to {TARGET}): "
          f"{'PASS' if ok else 'FAIL'}")
    if args.out:
        doc = {"budget": args.budget, "seeds": args.seeds, "confirm": args.confirm, "target": TARGET,
               "grid": args.grid, "sms": args.sms, "compile_cost": args.compile_cost, "space": args.space,
               "launch": args.launch, "unspecialised": sorted(unspecialised),
               "order": [k.name for k in keys], "passed": ok,
               "keys": [{**asdict(s), "passed": s.passed} for s in summaries],
               "runs": [{**asdict(r), "evals_to_99": r.evals_to()} for r in runs]}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
