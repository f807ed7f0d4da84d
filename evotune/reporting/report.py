"""The best configurations found, read back from the studies: table and JSON export.

Per problem it says how far the best is from the landscape's optimum (when
the optimum is known), from the baselines timed beside it (cuBLAS) and from
the chip's dense peak (workloads with a FLOP count, on known hardware).

Example::

    rows = collect_best("sqlite:///runs/quickstart.db", experiment="quickstart")
    export_best(rows, "runs/quickstart_best.json")
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from evotune.core import hardware as hw
from evotune.core.budget import stop_text, stopped_short
from evotune.core.flush import UNRECORDED_FLUSH
from evotune.core.problem import Problem
from evotune.measurement.oracle import ci_half_width
from evotune.measurement.retiming import newer
from evotune.storage.study import make_storage
from evotune.storage.summaries import StudySummary, study_summaries


@dataclass
class Best:
    experiment: str
    problem_key: str
    problem: dict[str, Any]
    space: str
    config: dict[str, Any]
    time_ms: float
    study: str
    trial: int
    strategy: str
    seed: int
    trials: int  # finished trials over every study of this problem
    hardware: str | None = None
    oracle: str = "replay"
    optimum_ms: float | None = None
    tflops: float | None = None
    pct_peak: float | None = None
    pct_hbm_roofline: float | None = None  # minimum bytes at the measured copy bandwidth / time
    # memory-bound problems: minimum bytes at the read bandwidth measured in the same run (a sum) / time
    pct_read_bw: float | None = None
    # the L2 flush before each sample: "dirty" or "clean", "... (not recorded)" for figures that do not say
    flush: str | None = None
    baselines: dict[str, float] = field(default_factory=dict)  # name -> time_ms
    # The confirmation stage (GPU runs): time_ms and baselines are then the confirmed medians, timed
    # side by side in one run; what the search measured is kept beside them.
    confirmed: bool = False
    ci95_ms: list[float] | None = None  # of the confirmed median
    search_ms: float | None = None
    search_baselines: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    space_source: str = ""  # how the space is loaded again: a built-in's name or a user's file path
    # Where several spaces tuned the problem: each space's fastest time (confirmed where its
    # confirmation record has one), so a user sees by how much the winning space won.
    by_space: dict[str, float] = field(default_factory=dict)
    # what the best study's strategy transferred from: related results of the same space (name, distance)
    sources: list[dict[str, Any]] = field(default_factory=list)
    # the problem's studies that stopped before a fifth of their trials budget: "ga s0: stopped on seconds after
    # 1 of 24 trials" (their best is the best of few points)
    short_stops: list[str] = field(default_factory=list)

    @property
    def fraction_of_optimum(self) -> float | None:
        return self.optimum_ms / self.time_ms if self.optimum_ms else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fraction_of_optimum"] = self.fraction_of_optimum
        d["speedup_vs"] = {k: v / self.time_ms for k, v in self.baselines.items()}
        return d


def collect_best(storage: str | optuna.storages.BaseStorage, experiment: str | None = None) -> list[Best]:
    """The best trial per problem over every study (of ``experiment``, when given) in ``storage``."""
    st = make_storage(storage) if isinstance(storage, str) else storage
    by_problem: dict[tuple[str, str], list[StudySummary]] = defaultdict(list)
    for s in study_summaries(st, best=True):
        exp = s.user_attrs.get("experiment", s.study_name.split("/")[0])
        if experiment is not None and exp != experiment:
            continue
        by_problem[(exp, s.user_attrs.get("problem_key", s.study_name))].append(s)
    out = []
    for (exp, key), summaries in sorted(by_problem.items()):
        done = [s for s in summaries if s.best_trial is not None]
        trials = sum(s.n_trials for s in summaries)
        if not done:
            continue
        s = min(done, key=_best_value)
        a, t = s.user_attrs, s.best_trial
        assert t is not None  # done holds only summaries with a best trial
        best = Best(exp, key, a.get("problem", {}), a.get("space", "?"), dict(t.params), _best_value(s),
                    s.study_name, t.number, a.get("strategy", "?"), int(a.get("seed", 0)), trials,
                    a.get("hardware"), a.get("oracle", "replay"), a.get("optimum_ms"))
        best.sources = list(a.get("transfer_sources") or [])
        best.space_source = str(a.get("space_source") or "")
        best.baselines = {k: float(v["time_ms"] if isinstance(v, dict) else v)
                          for k, v in (a.get("baselines") or {}).items()
                          if not isinstance(v, dict) or v.get("time_ms") is not None}
        best.by_space = _space_bests(done)
        best.short_stops = _short_stops(summaries)
        best.flush = flush_text(a)
        _apply_confirmation(best, done, st)
        info = a.get("device_info") or {}
        _add_throughput(best, info.get("copy_gbps"), info.get("read_gbps"))
        out.append(best)
    return out


def _best_value(s: StudySummary) -> float:
    """The value of ``s``'s best trial, for a summary that has one (a best trial is complete: it has a value)."""
    t = s.best_trial
    assert t is not None and t.value is not None
    return float(t.value)


def _short_stops(summaries: list[StudySummary]) -> list[str]:
    """Each study that stopped before a fifth of its trials budget, and why (its ``stopped`` attribute)."""
    out = []
    for s in summaries:
        a = s.user_attrs
        stopped, budget = a.get("stopped"), a.get("budget") or {}
        if not isinstance(stopped, str) or not isinstance(budget, dict):
            continue
        if stopped_short(stopped, s.n_trials, budget.get("trials")):
            out.append(f"{a.get('strategy', '?')} s{a.get('seed', 0)}: "
                       f"{stop_text(stopped, s.n_trials, budget.get('trials'))}")
    return out


def _newest_records(summaries: list[StudySummary]) -> dict[str, dict[str, Any]]:
    """Each space's newest confirmation record among a problem's studies (records that confirmed something)."""
    records: dict[str, dict[str, Any]] = {}
    for s in summaries:
        rec = s.user_attrs.get("confirmation") or {}
        space = s.user_attrs.get("space", "?")
        if rec.get("configs") and newer(rec, records.get(space)):
            records[space] = rec
    return records


def _confirmed_items(rec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(point key, its confirmed figures) of a record's configurations, baselines left out."""
    return [(key, item) for key, item in rec["items"].items() if key in rec["configs"]]


def _space_bests(summaries: list[StudySummary]) -> dict[str, float]:
    """Each space's fastest time for one problem: its newest confirmation record's fastest configuration,
    else the fastest trial of its studies."""
    searched: dict[str, float] = {}
    for s in summaries:
        space = s.user_attrs.get("space", "?")
        searched[space] = min(searched.get(space, math.inf), _best_value(s))
    for space, rec in _newest_records(summaries).items():
        confirmed = [item["median_ms"] for _, item in _confirmed_items(rec)]
        if confirmed:
            searched[space] = float(min(confirmed))
    return dict(sorted(searched.items(), key=lambda kv: kv[1]))


def _apply_confirmation(best: Best, summaries: list[StudySummary],
                        storage: optuna.storages.BaseStorage) -> None:
    """Make ``best`` the fastest confirmed configuration of the problem over every space's confirmation
    record (the newest per space), with that record's baselines; unchanged when nothing was confirmed."""
    records = _newest_records(summaries)
    found = [(item["median_ms"], space, key, rec) for space, rec in records.items()
             for key, item in _confirmed_items(rec)]
    if not found:
        return
    median, space, key, rec = min(found, key=lambda f: f[0])
    item = rec["items"][key]
    best.search_baselines = dict(best.baselines)
    best.baselines = {n: rec["items"][n]["median_ms"] for n in rec.get("baselines", []) if n in rec["items"]}
    best.confirmed, best.time_ms, best.ci95_ms = True, float(median), list(item["ci95_ms"])
    best.search_ms, best.warnings = item.get("search_ms"), list(rec.get("warnings", []))
    if best.space != space or best.config != rec["configs"][key]:
        best.space, best.config = space, dict(rec["configs"][key])
        for s in summaries:  # where the confirmed winner was found
            if s.user_attrs.get("space") != space:
                continue
            trials = optuna.load_study(study_name=s.study_name, storage=storage).get_trials(deepcopy=False)
            hit = next((t for t in trials if t.user_attrs.get("key") == key), None)
            if hit is not None:
                a = s.user_attrs
                best.study, best.trial = s.study_name, hit.number
                best.strategy, best.seed = a.get("strategy", "?"), int(a.get("seed", 0))
                break


def throughput(problem: Problem, time_ms: float, peak_tflops: float | None,
               copy_gbps: float | None) -> tuple[float | None, float | None, float | None]:
    """(TFLOP/s, % of ``peak_tflops``, % of the HBM roofline) of a problem that takes ``time_ms``.

    The FLOP count and the fewest bytes the kernel must move come from the problem's workload; the
    roofline is those bytes at ``copy_gbps`` (measured copy bandwidth). A problem with no FLOP count
    (a recorded kernel) has none of the three.
    """
    if problem.flops is None or problem.min_bytes is None:
        return None, None, None
    tflops = problem.flops / (time_ms * 1e-3) / 1e12
    pct_peak = 100.0 * tflops / peak_tflops if peak_tflops else None
    pct_roofline = 100.0 * (problem.min_bytes / (copy_gbps * 1e9)) / (time_ms * 1e-3) if copy_gbps else None
    return tflops, pct_peak, pct_roofline


def flush_text(attrs: dict[str, Any]) -> str | None:
    """The L2 flush a study's times were measured after, as ``best`` shows it: what the study (or the landscape
    it replays) recorded, else "dirty (not recorded)" for a GPU study, the one flush there was then; None where
    no GPU oracle measured (the cpu oracle, a Kernel Tuner landscape)."""
    flush = attrs.get("flush")
    if not isinstance(flush, str):
        return f"{UNRECORDED_FLUSH} (not recorded)" if attrs.get("oracle") == "gpu" else None
    return flush if attrs.get("flush_recorded", True) else f"{flush} (not recorded)"


def read_bw_percent(problem: Problem, time_ms: float, read_gbps: float | None,
                    peak_tflops: float | None) -> float | None:
    """% of the achievable read bandwidth ``read_gbps`` that a problem's fewest bytes over ``time_ms`` make, for
    a memory-bound problem: one whose FLOP per byte is under the ridge point of ``peak_tflops`` and that
    bandwidth (every problem with a byte count when the peak is unknown); None otherwise."""
    if not read_gbps or problem.min_bytes is None:
        return None
    if peak_tflops and problem.flops is not None and \
            problem.flops / problem.min_bytes >= peak_tflops * 1e12 / (read_gbps * 1e9):
        return None  # compute-bound: the dense peak says more
    return 100.0 * (problem.min_bytes / (read_gbps * 1e9)) / (time_ms * 1e-3)


def _add_throughput(best: Best, copy_gbps: float | None, read_gbps: float | None = None) -> None:
    from evotune.core.problem import find_workload

    workload = find_workload(str(best.problem.get("kind")))
    if workload is None:  # a recorded kernel: no FLOP count
        return
    problem = Problem.from_dict(best.problem)
    peak = None
    if best.hardware:
        try:
            peak = hw.get_hardware(best.hardware).peak(workload.peak_dtype(problem))
        except (KeyError, RuntimeError):
            pass
    best.tflops, best.pct_peak, best.pct_hbm_roofline = throughput(problem, best.time_ms, peak, copy_gbps)
    best.pct_read_bw = read_bw_percent(problem, best.time_ms, read_gbps, peak)


OPTIONAL = ("space", "flush", "confirmed", "vs optimum", "vs baseline", "TFLOP/s (% peak)", "% HBM roofline",
            "% read BW")
TRIALS = "all trials"  # a problem's finished trials: every strategy and seed together


def best_table(rows: list[Best], title: str = "Best configurations") -> Group:
    """A table of the best per problem, then each best configuration on a line of its own.

    A column no row has a value for is left out (replay knows no baseline, throughput or confirmation), and
    a space shared by every row is named once in the title, so that the table fits an 80-column terminal.
    """
    spaces = sorted({b.space for b in rows})
    if len(spaces) == 1:
        title = f"{title}, space {spaces[0]}"
    cells = [{"problem": b.problem_key, "space": b.space if len(spaces) > 1 else "-", "best (ms)": f"{b.time_ms:.4g}",
              "flush": b.flush or "-",
              "confirmed": _confirmed_text(b), "vs optimum": _optimum_text(b), "vs baseline": _baseline_text(b),
              "TFLOP/s (% peak)": _throughput_text(b), "% HBM roofline": _roofline_text(b),
              "% read BW": f"{b.pct_read_bw:.0f}%" if b.pct_read_bw else "-",
              TRIALS: str(b.trials), "found by": f"{b.strategy} s{b.seed}"} for b in rows]
    columns = [c for c in cells[0] if c not in OPTIONAL or any(row[c] != "-" for row in cells)] if cells else []
    table = FittedTable(title, f"{TRIALS}: every strategy and seed of the problem together", columns, cells)
    configs = []
    for b in rows:
        configs.append(Text.assemble((b.problem_key, "bold"), ": ", " ".join(f"{k}={v}" for k, v in b.config.items())))
        if len(b.by_space) > 1:
            configs.append(Text("  each space's best: " + ", ".join(
                f"{space} {ms:.4g} ms ({ms / b.time_ms:.2f}x)" for space, ms in b.by_space.items())))
        configs += [Text.assemble(("  warning: ", "yellow"), w) for w in b.warnings]
        if b.sources:
            configs.append(Text(f"  transferred from {sources_text(b.sources)}"))
        configs += [Text.assemble(("  ", ""), (stop, "yellow")) for stop in b.short_stops]
    return Group(table, *configs)


@dataclass
class FittedTable:
    """A table laid out for the width it is printed in: where it does not fit, the other columns' headers and
    cells wrap first, and a problem key only as far as it must (a space name never: it is one of few, and short
    where there are several)."""

    title: str
    caption: str
    columns: list[str]
    cells: list[dict[str, str]]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)

    def table(self, width: int) -> Table:
        table = Table(title=self.title, caption=self.caption)
        for col, col_width in zip(self.columns, self.widths(width - (3 * len(self.columns) + 1)), strict=True):
            table.add_column(col, overflow="fold", no_wrap=col == "space", width=col_width)
        for row in self.cells:
            table.add_row(*(row[c] for c in self.columns))
        return table

    def widths(self, room: int) -> list[int | None]:
        """Each column's width in ``room`` characters (borders and padding excluded); None: Rich's choice (all
        fits, or nothing can)."""
        texts = {c: [c, *(row[c] for row in self.cells)] for c in self.columns}
        longest = {c: max(len(t) for t in ts) for c, ts in texts.items()}
        if sum(longest.values()) <= room:
            return [None] * len(self.columns)
        # the longest word: narrower, and a column's cells break inside words
        least = {c: max(len(w) for t in ts for w in t.split()) for c, ts in texts.items() if c != "problem"}
        least["problem"] = min(longest["problem"], 12)
        spare = room - sum(least.values())
        if spare < 0:
            return [None] * len(self.columns)
        fitted = dict(least)
        # the problem key first, then the columns that need least to be whole (more of them are)
        others = sorted((c for c in self.columns if c != "problem"), key=lambda c: longest[c] - least[c])
        for col in ("problem", *others):
            more = min(spare, longest[col] - fitted[col])
            fitted[col] += more
            spare -= more
        return [fitted[c] for c in self.columns]


def _optimum_text(b: Best) -> str:
    return f"{100 * b.fraction_of_optimum:.1f}%" if b.fraction_of_optimum else "-"


def _baseline_text(b: Best) -> str:
    return ", ".join(f"{v / b.time_ms:.2f}x {k}" for k, v in b.baselines.items()) or "-"


def _throughput_text(b: Best) -> str:
    if b.tflops is None:
        return "-"
    return _tflops_text(b.tflops) + (f" ({b.pct_peak:.0f}%)" if b.pct_peak is not None else "")


def _roofline_text(b: Best) -> str:
    return f"{b.pct_hbm_roofline:.0f}%" if b.pct_hbm_roofline else "-"


def sources_text(sources: list[dict[str, Any]], limit: int = 3) -> str:
    """'5 sources, nearest: study:x/a (1.0), study:x/b (2.0), ...' from a study's ``transfer_sources``."""
    near = sorted(sources, key=lambda s: s.get("distance", 0.0))[:limit]
    more = ", ..." if len(sources) > limit else ""
    return (f"{len(sources)} source{'s' if len(sources) != 1 else ''}, nearest: "
            + ", ".join(f"{s.get('name')} ({s.get('distance', 0.0):g})" for s in near) + more)


def _confirmed_text(b: Best) -> str:
    """'±0.3% (search 0.1234)' for a confirmed best; '-' for one the search alone measured."""
    if not b.confirmed or not b.ci95_ms:
        return "-"
    search = f" (search {b.search_ms:.4g})" if b.search_ms is not None else ""
    return f"±{100 * ci_half_width(b.time_ms, b.ci95_ms):.1f}%{search}"


def _tflops_text(tflops: float) -> str:
    """Whole TFLOP/s where that says enough; 3 significant digits for small ones, so none reads as 0."""
    return f"{tflops:.0f}" if tflops >= 100 else f"{tflops:.3g}"


def export_best(rows: list[Best], path: str | Path) -> Path:
    """Write the best configurations as JSON, one object per problem."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([b.to_dict() for b in rows], indent=2) + "\n")
    return path
