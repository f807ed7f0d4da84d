"""``evotune record --compile-only``: compile the points of a space for the experiment's GPU, and run nothing.

For each (space, dtype, layout) of the experiment, every point that is
feasible for some problem of the experiment is compiled, and so are the points
the space prunes: all of them, or ``pruned_sample`` of each constraint's (drawn
with a fixed seed, so a stratified sample that a rerun repeats). Compiling needs
the space's ``compile_only(point, problem, hardware)`` (the CuTe DSL spaces
compile from meta tensors, so the target GPU need not be present) and nothing
else: no GPU, no storage, no timing.

Each compile runs in a worker process (:mod:`evotune.measurement.isolation`),
``workers`` at a time: a compiler that crashes or hangs costs that point only
(recorded as not compiled, with the reason). A space whose compiler this
machine lacks (``SearchSpace.needs``) is refused before anything is compiled
or written. Results go to one file per
(space, hardware, dtype, layout) (:mod:`evotune.core.compile_results`), in ``--out``
(default :data:`OUT_DIR`, ``runs/compile``), rewritten every
``WRITE_EVERY_S`` seconds; a rerun keeps what the file holds and compiles the
rest, so a sweep can be done in pieces (``seconds``).

Example::

    python -m evotune record --compile-only experiments/b200_compile.toml --workers 2
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
import random
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evotune.core.compile_results import Compiled, document, file_name, load_compiled, write_compiled
from evotune.core.hardware import Hardware
from evotune.core.problem import Problem
from evotune.core.space import Point, SearchSpace
from evotune.measurement.isolation import WorkerProcess, answer_requests
from evotune.measurement.messages import CompileOnly, Reply, ReplyStatus
from evotune.running.experiment import Experiment, ExperimentError
from evotune.running.targets import Target, resolve_targets

WRITE_EVERY_S = 60.0
# where the files go without --out: never the shipped ones under evotune/landscapes/compile, which only an
# explicit --out rewrites
OUT_DIR = Path("runs/compile")
TIMEOUT_S = 600.0  # one compile; the largest CuTe kernels take seconds
VERSIONS = ("nvidia-cutlass-dsl", "nvidia-cutlass-operators", "torch")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class CompileOptions:
    """``record --compile-only``'s options, typed."""

    out_dir: Path
    workers: int = 2
    pruned_sample: int | None = None  # points per pruning constraint; None: all of them
    seconds: float | None = None
    seed: int = 0


@dataclass
class CompilePlan:
    """The points of one (space, dtype, layout) to compile, and where they go."""

    space: SearchSpace
    problem: Problem  # the first of the experiment's problems with these dtypes: it names the operands
    hardware: Hardware
    points: list[Point]
    path: Path
    sampled: dict[str, int]  # constraint -> pruned points of it planned


def first_error_line(text: str) -> str:
    """The compiler's message in one line: the ``error:`` line when there is one, without colours or code frames."""
    lines = [ln.strip() for ln in _ANSI.sub("", text).splitlines() if ln.strip()]
    for ln in lines:
        if "error:" in ln:
            return ln.split("error:", 1)[1].strip()[:300]
    return (lines[0] if lines else "unknown error")[:300]


def plan_compiles(exp: Experiment, targets: list[Target], opts: CompileOptions) -> list[CompilePlan]:
    """What to compile for each (space, dtype, layout) of ``exp``'s ``targets``; bad inputs name their field."""
    groups: dict[tuple[str, str, str], list[Target]] = {}
    hardware_of: dict[tuple[str, str, str], Hardware] = {}  # each group's: its first target's
    for t in targets:
        if t.ctx.hardware is None:
            raise ExperimentError(exp.path, "hardware", "compile-only needs the hardware to compile for")
        if t.space.compile_only is None:
            raise ExperimentError(exp.path, "space", f"{t.space.name!r} cannot compile without running "
                                  "(it has no compile_only)")
        group = (t.space.name, t.problem.dtype, t.problem.layout)
        groups.setdefault(group, []).append(t)
        hardware_of.setdefault(group, t.ctx.hardware)
    plans = []
    for (name, dtype, layout), ts in groups.items():
        space, hardware = ts[0].space, hardware_of[name, dtype, layout]
        feasible: dict[str, Point] = {}
        pruned: dict[str, dict[str, Point]] = {}
        for point in space.points():
            key = space.key(point)
            refusals = [r for r in (space.check(point, t.ctx) for t in ts) if r is not None]
            if len(refusals) < len(ts):  # feasible for some problem
                feasible[key] = point
            else:
                pruned.setdefault(refusals[0].split(":", 1)[0], {})[key] = point
        rng = random.Random(opts.seed)
        chosen = list(feasible.values())
        sampled = {}
        for constraint, points in sorted(pruned.items()):
            keys = sorted(points)
            if opts.pruned_sample is not None and len(keys) > opts.pruned_sample:
                keys = sorted(rng.sample(keys, opts.pruned_sample))
            sampled[constraint] = len(keys)
            chosen += [points[k] for k in keys]
        path = opts.out_dir / file_name(name, hardware.name, dtype, layout)
        plans.append(CompilePlan(space, ts[0].problem, hardware, chosen, path, sampled))
    return plans


class _Handler:
    def __init__(self, source: str, base_dir: str, problem: Problem, hardware: Hardware):
        from evotune.core.plugins import load_space

        self.space = load_space(source, Path(base_dir))
        self.problem, self.hardware = problem, hardware

    def handle(self, message: CompileOnly) -> Reply:
        started = time.perf_counter()
        try:
            assert self.space.compile_only is not None  # plan_compiles() refuses a space without one
            res = self.space.compile_only(message.point, self.problem, self.hardware)
        except Exception as exc:  # the compiler's verdict on this point, not a fault of the sweep
            return Reply(ReplyStatus.COMPILE_ERROR, first_error_line(f"{type(exc).__name__}: {exc}"),
                         compile_s=time.perf_counter() - started)
        return Reply(ReplyStatus.OK, compile_s=res["compile_s"], extra=res)


def _worker_main(conn: Any, source: str, base_dir: str, problem: Problem, hardware: Hardware) -> None:
    answer_requests(conn, lambda: _Handler(source, base_dir, problem, hardware))


def _compiled_from(reply: Reply) -> Compiled:
    if reply.ok:
        res = reply.extra
        return Compiled(True, reply.compile_s, res["regs"], res["frame_bytes"], res["smem"], res["stages"])
    return Compiled(False, reply.compile_s or reply.bench_s, error=reply.message or reply.status.value)


def _meta(p: CompilePlan, opts: CompileOptions) -> dict[str, Any]:
    versions: dict[str, str | None] = {}  # None: not installed
    for dist in VERSIONS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {"space": p.space.name, "hardware": p.hardware.name, "arch": p.hardware.arch,
            "sm_count": p.hardware.sm_count, "dtype": p.problem.dtype, "layout": p.problem.layout,
            "date": _dt.date.today().isoformat(), "machine": f"{platform.node() or 'host'} ({platform.machine()})",
            "versions": versions, "max_active_clusters": "sm_count // cluster size",
            "pruned_sample": opts.pruned_sample, "seed": opts.seed, "sampled": p.sampled}


def run_plan(p: CompilePlan, opts: CompileOptions, progress: Callable[[str], None]) -> tuple[Path, int]:
    """Compile what ``p``'s file lacks, for at most ``opts.seconds``; (file, points compiled now)."""
    results: dict[str, tuple[Point, Compiled]] = {}
    if p.path.is_file():
        old = load_compiled(p.path, p.space)
        # every row of the file is kept, planned or not: a rerun with a smaller sample adds, never drops
        for point in p.space.points():
            c = old.get(p.space, point)
            if c is not None:
                results[p.space.key(point)] = (point, c)
    todo = [pt for pt in p.points if p.space.key(pt) not in results]
    before = len(p.points) - len(todo)
    progress(f"{p.path.name}: {before} of {len(p.points)} points compiled before, {len(todo)} to go")
    lock = threading.Lock()
    deadline = None if opts.seconds is None else time.monotonic() + opts.seconds
    last_write = [time.monotonic()]
    done = [0]
    workers = [WorkerProcess(_worker_main, (p.space.source or p.space.name, str(Path.cwd()), p.problem, p.hardware),
                             "compile worker", TIMEOUT_S) for _ in range(max(1, opts.workers))]
    queue = list(reversed(todo))

    def work(worker: WorkerProcess) -> None:
        while True:
            with lock:
                if not queue or (deadline is not None and time.monotonic() >= deadline):
                    return
                point = queue.pop()
            compiled = _compiled_from(worker.call(CompileOnly(point)))
            with lock:
                results[p.space.key(point)] = (point, compiled)
                done[0] += 1
                if time.monotonic() - last_write[0] >= WRITE_EVERY_S:
                    write_compiled(p.path, document(p.space, _meta(p, opts), list(results.values())))
                    last_write[0] = time.monotonic()
                    progress(f"  {done[0]} of {len(todo)} compiled")

    try:
        with ThreadPoolExecutor(len(workers)) as pool:
            list(pool.map(work, workers))
    finally:
        for w in workers:
            w.close()
        write_compiled(p.path, document(p.space, _meta(p, opts), list(results.values())))
    return p.path, done[0]


def compile_experiment(exp: Experiment, opts: CompileOptions, progress: Callable[[str], None]) -> list[Path]:
    """Compile every planned point of ``exp``; the files written."""
    written = []
    started = time.monotonic()
    # only what compiling needs is checked: nothing is measured, so neither an evaluator nor a GPU
    for p in plan_compiles(exp, resolve_targets(exp, measuring=False), opts):
        left = None if opts.seconds is None else opts.seconds - (time.monotonic() - started)
        if left is not None and left <= 0:
            progress(f"{p.path.name}: not started, the {opts.seconds:.0f} s of this piece are spent")
            continue
        path, _ = run_plan(p, replace(opts, seconds=left), progress)
        written.append(path)
    return written
