"""``evotune record``: measure every feasible point of a space for each problem, and write landscapes.

Recording is an ordinary study (``NAME/PROBLEM/SPACE/record``) driven by the exhaustive strategy,
best-estimated points first, so it can be done in pieces (``--seconds``, for all problems of the
command together) and resumed. With no time limit, each problem is taken from both ends of that
order in turn, odd ones worst first (:func:`whole_space`). After each problem the landscape file is
(re)written from the study: every point measured so far with its status, bounded timing samples,
compile and benchmark time, plus the device, clocks, versions, date and the baselines timed in the
same run. ``complete`` says whether every feasible point is in it. The file is also rewritten every
``WRITE_EVERY_S`` seconds while a problem is measured, so a piece killed from outside keeps what it
measured.

A piece can resume from the study, or from the landscape file alone: points
the file already holds are copied into the study (marked ``imported_from``)
and not measured again. So a piece may run on a fresh machine that has only
the repository; each piece's date, device and baselines are kept in the
file's ``pieces`` list.

The recording studies live in a storage of their own, ``storage.record_url``
(default: derived from ``storage.url``, e.g. ``runs/NAME.db`` ->
``runs/NAME_record.db``; see :func:`evotune.storage.study.record_storage_url`), never in
the storage that ``best``, ``plot`` and the dashboard read: an exhaustive
recording is not a tuning result, and counting it as one would swell the trial
counts and draw a curve nobody asked for.

Landscape files go to ``--out`` (default :data:`OUT_DIR`, ``runs/landscapes``: the
shipped files under ``evotune/landscapes`` are rewritten only when named by
``--out``) and are named ``SPACE_PROBLEM.json.gz`` with every character that
some file system refuses (``:`` of ``landscape:NAME`` spaces, ``/``, ``\\``, ...)
replaced by ``_``, so the files can be copied to any OS.

One measuring process (on a GPU, one GPU worker) serves every problem and
space, so a kernel whose binary does not depend on the shape is loaded once
for them all.

Several ``record`` processes may share the work, one per GPU (each sees its
own through ``CUDA_VISIBLE_DEVICES``): they take whole problems first and
share the points of the last ones (see :mod:`evotune.running.schedule`), and every
point is claimed in the record storage before it is measured, so none is
measured twice; the baselines of a problem are timed by one of them
(:mod:`evotune.running.shared_baselines`). The one that finishes a problem confirms
it and writes its file last; a confirmation stands for the points recorded
when it was made, so a piece that adds none keeps the one before.

Example::

    python -m evotune record experiments/h100_record_bf16.toml --seconds 480 --out evotune/landscapes/h100
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from evotune.core.budget import Budget
from evotune.core.landscape import (
    Landscape,
    LandscapeError,
    json_values,
    landscape_document,
    load_landscape,
    write_landscape,
)
from evotune.core.result import EvalResult
from evotune.core.space import FeasibleSet
from evotune.running.experiment import Experiment, ExperimentError, OracleKind
from evotune.running.session import Session, StudyPlan, StudyStorage
from evotune.running.targets import Target, group_name, study_attrs, study_name, target_study_names
from evotune.search.strategies.base import Strategy, StrategyOptions
from evotune.search.strategies.exhaustive import Exhaustive, Listed
from evotune.storage.claims import Claims, wait_for_others
from evotune.storage.study import StudyStore

# where the landscape files go without --out: never the shipped ones under evotune/landscapes, which only an
# explicit --out rewrites
OUT_DIR = Path("runs/landscapes")
WRITE_EVERY_S = 60.0  # rewrite the landscape file this often while a problem is being recorded
MAX_SAMPLES = 8  # per point in the written landscape: keeps shipped files small (spread over the sorted samples)


@dataclass(frozen=True)
class Sampling:
    """Record part of a space too large to record whole: every point the experiment's searches measured (best
    first, so the file holds the top of the space as the search found it), then ``size`` feasible points drawn
    uniformly at random with ``seed``. The same seed draws the same points for every problem whose feasible set
    is the same, so a sample's kernels are compiled once for them all."""

    size: int
    seed: int = 0

    def plan(self, exp: Experiment, target: Target, fs: FeasibleSet) -> tuple[list[int], dict[str, Any]]:
        """(the feasible rows to record, in order; the file's ``coverage``, which says what they are)."""
        tuning = StudyStorage.tuning(exp).open(exp)
        measured: list[tuple[float, int]] = []
        studies = []
        for name in target_study_names(exp, target):
            store = StudyStore.load(tuning, name, target.space)
            if store is None:
                continue
            studies.append(name)
            for r in store.history():
                row = fs.row(r.point)
                if row is not None:
                    measured.append((math.inf if r.value is None else r.value, row))
        searched = list(dict.fromkeys(row for _, row in sorted(measured)))
        drawn = np.random.default_rng(self.seed).choice(len(fs), size=min(self.size, len(fs)), replace=False)
        rows = list(dict.fromkeys([*searched, *(int(r) for r in drawn)]))
        return rows, {"kind": "sample", "searched": len(searched), "studies": studies, "random": len(drawn),
                      "seed": self.seed, "feasible": len(fs)}


def landscape_path(out_dir: Path, target: Target) -> Path:
    """Where the landscape of ``target`` is written: a name every OS accepts."""
    return out_dir / f"{safe_filename(f'{target.space.name}_{target.problem.key}')}.json.gz"


def safe_filename(name: str) -> str:
    """``name`` with what Windows, macOS or Linux refuse in a file name (``<>:"/\\|?*``, control
    characters, a trailing dot or space) replaced by ``_``."""
    out = "".join("_" if ch in '<>:"/\\|?*' or ord(ch) < 32 else ch for ch in name)
    return out.rstrip(". ") or "_"


def check_landscape_flushes(exp: Experiment, resolved: list[Target], out_dir: Path) -> None:
    """Refuse to add points to a landscape file measured after another L2 flush (one that names none had the
    dirty one): its times and the new ones would not compare. ExperimentError on ``oracle.flush``, before
    anything is measured or written."""
    if exp.oracle is not OracleKind.GPU:
        return
    new = exp.oracle_options.timing.flush
    for target in resolved:
        path = landscape_path(out_dir, target)
        try:
            old = load_landscape(path) if path.is_file() else None
        except LandscapeError:
            continue  # an unreadable earlier piece is measured again (see _import_recorded)
        if old is not None and old.flush is not None and old.flush[0] != new:
            raise ExperimentError(exp.path, "oracle.flush", f"{path} was measured after the {old.flush[0]!r} flush, "
                                                            f"this file has {new!r}: recording into it would mix "
                                                            "two flushes (restore it, or record into another "
                                                            "folder with --out)")


def record_experiment(exp: Experiment, out_dir: Path, seconds: float | None, console: Console,
                      split: str = "problems", sampling: Sampling | None = None, progress: bool = True) -> list[Path]:
    """Record the problems of ``exp``, for at most ``seconds`` of tuning time in all; the files written.

    Several processes may record one experiment together, one per GPU: they take whole problems first and
    share the points of the last ones (``split``, see :mod:`evotune.running.schedule`); each point is claimed before
    it is measured, so none is measured twice. With ``sampling``, each file holds the searches' points and a
    uniform sample instead of every feasible point (:class:`Sampling`). With ``progress``, a live bar per
    problem, as ``run`` shows."""
    session = Session(exp, StudyStorage.recording(exp), console=console, progress=progress)
    check_landscape_flushes(exp, session.targets, out_dir)
    written: list[Path] = []
    with session:
        console.print(f"[bold]evotune record[/] {exp.name}: space {', '.join(exp.spaces)}, oracle {exp.oracle.value}, "
                      f"{len(session.targets)} problem{'s' if len(session.targets) != 1 else ''}"
                      f"{'' if sampling is None else f', a sample of {sampling.size} points each'}, "
                      f"storage {exp.record_storage}, landscapes to {out_dir}"
                      + ("" if seconds is None else f", {seconds:.0f} s on the tuning clock"))
        groups = [(group_name(exp, t), [study_name(exp, t, "record")]) for t in session.targets]

        def wants_more(t: Target, store: StudyStore) -> bool:
            """Whether the recording lacks a point it plans: a feasible one, or one of the sample."""
            fs = t.space.feasible(t.ctx)
            if sampling is None:
                return len(store.history()) < len(fs)
            done = {fs.row(r.point) for r in store.history()}
            return any(row not in done for row in sampling.plan(exp, t, fs)[0])

        spent = 0.0
        for g, target, _ in session.groups(groups, wants_more, split):
            if seconds is not None and spent >= seconds:
                console.print(f"  the {seconds:.0f} s of this piece (tuning clock) are spent: the problems "
                              "left are a later piece's")
                break
            path, used = _record_one(session, target, g, out_dir, None if seconds is None else seconds - spent,
                                     sampling)
            written.append(path)
            spent += used
    return written


def _record_one(session: Session, target: Target, group: int, out_dir: Path, seconds: float | None,
                sampling: Sampling | None) -> tuple[Path, float]:
    """Measure what the study of ``target`` still lacks, for at most ``seconds`` of tuning clock; (landscape file,
    tuning-clock seconds used)."""
    exp, console = session.exp, session.console
    wall_began = time.monotonic()
    name = study_name(exp, target, "record")
    attrs = study_attrs(exp, target, "exhaustive", 0, session.baselines(target, name))
    store = StudyStore.open(session.storage, name, target.space, attrs)
    path = landscape_path(out_dir, target)
    claims = session.claims(name)
    previous = _import_recorded(store, target, path, claims)
    fs = target.space.feasible(target.ctx)
    feasible = len(fs)
    coverage: dict[str, Any] | None = None
    strategy: Strategy
    if sampling is None:
        strategy = whole_space(target, fs, ends=None if seconds is not None else group % 2)
        planned = feasible
    else:
        rows, coverage = sampling.plan(exp, target, fs)
        strategy = Listed(target.space, fs, ctx=target.ctx, rows=rows)
        planned = len(rows)
    history = store.history()
    started = max((r.clock_s for r in history), default=0.0)
    before = len(history)
    last_write = time.monotonic()

    def keep(trials: int, best: float | None) -> None:
        # a piece killed from outside keeps what it measured
        nonlocal last_write
        if time.monotonic() - last_write >= WRITE_EVERY_S and trials > before:
            write_recorded(store, target, exp, feasible, path, previous, coverage)
            last_write = time.monotonic()

    budget = Budget(trials=planned, seconds=None if seconds is None else started + seconds)
    label = f"{target.problem.key[:28]} {target.space.name[:18]} record"
    result = session.tune(target, StudyPlan(name, attrs, budget, claims, label, planned), strategy, keep, store)
    used = result.clock_s - started
    if result.stopped != "seconds":  # every point stored or being stored: the file is written with them all
        wait_for_others(exp.record_storage, [name])
    console.print(f"  {store.study.study_name}: {len(store.history())} of {planned} "
                  f"{'planned' if sampling else 'feasible'} points recorded"
                  f" ({result.new_trials} new by this worker; tuning clock {used:.0f} s, "
                  f"wall time {time.monotonic() - wall_began:.0f} s)")
    summary = session.cache_summary(target)
    if summary:
        console.print(f"  compiled-kernel cache so far: {summary}")
    with session.confirmation_turn(group, {name}) as stores:
        if stores:
            # the fastest points re-timed beside the baselines before the file is written, so that the file's
            # optimum and its baselines come from one interleaved measurement, not from one lucky sample
            measured = [(r.value, r.point) for r in store.history() if r.value is not None]
            record = session.confirm(target, measured, lambda p: json_values(p, target.space.names))
            if record is not None:
                store.study.set_user_attr("confirmation", record.to_attr())
    return write_recorded(store, target, exp, feasible, path, previous, coverage), used


def whole_space(target: Target, fs: FeasibleSet, ends: int | None = None) -> Strategy:
    """Every feasible point once, best predicted first (a record cut short by its seconds keeps the top of the
    space); with ``ends``, from both ends of that order in turn: the best and the worst first (0), or the worst
    and the best (1). A record with no time limit takes even problems with 0 and odd ones with 1: workers
    recording problems side by side on one host need the same kernels (their keys leave the shape out), and a
    compile process does not wait for a kernel another process compiles (it takes its next point), so the two
    workers' pools build what the other has not locked, and each GPU measures the points of both pools as they
    are built. In one order the pools would build the same few kernels at a time; in opposite orders each GPU
    would meet the other pool's kernels only after its own."""
    forward = Exhaustive(target.space, fs, StrategyOptions(seeding="hardware"), ctx=target.ctx)
    if ends is None:
        return forward
    order = forward.order if ends == 0 else forward.order[::-1]
    # first, last, second, second last, ...: the first len(order) of these hold each row once (the middle one of
    # an odd count last)
    turns = [row for pair in zip(order, order[::-1], strict=True) for row in pair][:len(order)]
    return Listed(target.space, fs, ctx=target.ctx, rows=turns)


def _import_recorded(store: StudyStore, target: Target, path: Path, claims: Claims) -> Landscape | None:
    """Copy the points of an earlier piece's landscape file that the study lacks; that file, if usable.
    One worker at a time copies (``claims``), so that workers starting together copy each point once."""
    if not path.is_file():
        return None
    try:
        old = load_landscape(path)
    except LandscapeError:
        return None  # an unreadable earlier piece is measured again, and its file replaced
    if old.names != target.space.names or old.problem.key != target.problem.key:
        return None
    with claims.holding(f"import:{path.name}"):
        have = {r.key for r in store.history()}
        for values, result in old.entries.items():
            point = dict(zip(old.names, values, strict=True))
            if target.space.key(point) not in have and target.space.check(point, target.ctx) is None:
                store.record(point, result, 0.0, {"imported_from": path.name})
    return old


def write_recorded(store: StudyStore, target: Target, exp: Experiment, feasible: int, path: Path,
                   previous: Landscape | None = None, coverage: dict[str, Any] | None = None) -> Path:
    """Write the study as the landscape file; this piece is what the file gains over ``previous``.
    ``coverage`` says what a sampled recording holds (:meth:`Sampling.plan`); it is then never complete."""
    history = store.history()
    attrs = store.study.user_attrs
    confirmation = attrs.get("confirmation") or {}
    confirmed = {k: v["median_ms"] for part in ("raced_out", "items") for k, v in confirmation.get(part, {}).items()
                 if k in confirmation.get("configs", {})}
    # a confirmed point's time is its confirmed median (its search time stays in the confirmation record), and
    # so is a raced-out one's: a fresh, interleaved figure, where its search time may have been a lucky sample
    rows = [(r.point, EvalResult(r.status, time_ms=confirmed.get(r.key, r.value),
                                 samples_ms=r.attrs.get("samples_ms", []),
                                 compile_s=r.attrs.get("compile_s", 0.0), bench_s=r.attrs.get("bench_s", 0.0),
                                 error=r.attrs.get("error"), message=r.attrs.get("message", "")))
            for r in history]
    # Counted against the file, not the study: a piece may resume a study that outran an older copy
    # of the file (a fresh checkout has the file as committed), and the gain must still show.
    new = [(p, r) for p, r in rows if previous is None or previous.lookup(p) is None]
    fastest = min(((r.time_ms, p) for p, r in new if r.time_ms is not None), default=None, key=lambda t: t[0])
    piece = {"date": _dt.date.today().isoformat(), "device": attrs.get("device"),
             "device_info": attrs.get("device_info", {}), "baselines": attrs.get("baselines", {}),
             "new_points": len(new), "flush": attrs.get("flush"),
             # the fastest point this piece measured: a report finds the baselines timed beside the optimum
             "best": None if fastest is None else {"params": json_values(fastest[1], target.space.names),
                                                   "time_ms": fastest[0]}}
    pieces = list(previous.meta.get("pieces", [])) if previous is not None else []
    if new or not pieces:
        pieces.append(piece)
    meta = {
        # the top level speaks for the latest piece that measured something
        **{k: pieces[-1][k] for k in ("date", "device", "device_info", "baselines")},
        "hardware": attrs.get("hardware"), "feasible": feasible, "recorded": len(rows),
        "complete": coverage is None and len(rows) >= feasible, "experiment": exp.name, "pieces": pieces,
    }
    if pieces[-1].get("flush"):  # the L2 flush of the latest piece (a GPU recording)
        meta["flush"] = pieces[-1]["flush"]
    if coverage is not None:
        meta["coverage"] = coverage
    if "items" in confirmation:
        meta["confirmation"] = confirmation
    doc = landscape_document(target.space.params, rows, target.problem, meta, target.space.name, MAX_SAMPLES)
    return write_landscape(path, doc)
