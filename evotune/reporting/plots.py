"""Figures read from the studies: convergence and parameter effects, as PNG.

* ``<experiment>_<problem>_convergence.png``: best so far against evaluations
  and against the tuning clock, one curve per strategy, the median over its
  seeds with the inter-quartile band. When the landscape's optimum is known,
  the y axis is the fraction of the optimum reached (1.0 = the optimum).
  Every point of a curve is taken over all of its seeds: a seed with no valid
  result yet at that x (not started yet on the tuning clock, or only failures
  so far) counts as having found nothing, a fraction of 0 (or, without a known
  optimum, an infinitely slow time, which is not drawn). So the median never
  falls as x grows, as a best-so-far must not; a median over only the seeds
  that have started would jump down when a slower seed starts.
* :func:`evaluation_bands` holds the left panel's curves as numbers, and
  :func:`write_bands` writes them as CSV, so that a figure can be kept with
  the data it draws (README's quickstart figure is, in ``docs/images/``).
* ``<experiment>_<problem>_params.png``: for each parameter, how the measured
  points spread per choice (relative to the best point seen). A problem tuned
  in several spaces gets one per space, ``<experiment>_<problem>_<space>_params.png``:
  each space has parameters of its own.

Example::

    paths = plot_experiment("journal:runs/quickstart.journal", "quickstart", "runs/plots")
"""

from __future__ import annotations

import csv
import textwrap
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed or wanted
import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt
import optuna
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from optuna.trial import TrialState

from evotune.measurement.retiming import newer
from evotune.reporting.report import sources_text
from evotune.storage.study import make_storage
from evotune.storage.summaries import study_summaries

Floats = npt.NDArray[np.float64]  # one value per evaluation


@dataclass
class Curve:
    space: str
    strategy: str
    seed: int
    values: Floats  # best so far after each evaluation (nan before the first success)
    clock: Floats  # tuning clock after each evaluation, seconds


@dataclass
class ProblemRuns:
    experiment: str
    problem_key: str
    optimum_ms: float | None
    curves: list[Curve]
    trials: list[optuna.trial.FrozenTrial]
    spaces: dict[str, list[optuna.trial.FrozenTrial]] = field(default_factory=dict)  # the trials of each space
    confirmation: dict[str, Any] = field(default_factory=dict)  # the problem's newest confirmation record (GPU runs)
    sources: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # strategy -> what it transferred from


def load_runs(storage: str | optuna.storages.BaseStorage, experiment: str | None = None) -> list[ProblemRuns]:
    st = make_storage(storage) if isinstance(storage, str) else storage
    groups: dict[tuple[str, str], ProblemRuns] = {}
    for s in study_summaries(st):
        a = s.user_attrs
        exp = a.get("experiment", s.study_name.split("/")[0])
        if experiment is not None and exp != experiment:
            continue
        key = (exp, a.get("problem_key", s.study_name))
        runs = groups.setdefault(key, ProblemRuns(exp, key[1], a.get("optimum_ms"), [], []))
        if a.get("transfer_sources"):
            runs.sources.setdefault(a.get("strategy", "?"), a["transfer_sources"])
        rec = a.get("confirmation") or {}
        if newer(rec, runs.confirmation):
            runs.confirmation = rec
        trials = optuna.load_study(study_name=s.study_name, storage=st).get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
        trials.sort(key=lambda t: t.number)
        values = np.array([t.value if t.state == TrialState.COMPLETE else np.nan for t in trials], dtype=float)
        best = np.fmin.accumulate(values) if len(values) else values
        clock = np.array([t.user_attrs.get("clock_s", i) for i, t in enumerate(trials)], dtype=float)
        runs.curves.append(Curve(a.get("space", "?"), a.get("strategy", "?"), int(a.get("seed", 0)), best, clock))
        runs.trials.extend(trials)
        runs.spaces.setdefault(a.get("space", "?"), []).extend(trials)
    return [groups[k] for k in sorted(groups)]


def _band(curves: list[Floats], missing: float | None = None) -> tuple[Floats, Floats, Floats]:
    """25th, 50th and 75th percentiles over ``curves`` at each x; shorter curves keep their last value.

    With ``missing``, a NaN (no result yet) counts as that value, so every x is taken over every
    curve; infinite percentiles come back as NaN (not drawn). Without it, NaNs are left out.
    """
    n = max(len(c) for c in curves)
    m = np.full((len(curves), n), np.nan)
    for i, c in enumerate(curves):
        m[i, : len(c)] = c
        if len(c):
            m[i, len(c):] = c[-1]  # a finished run keeps its best
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-nan columns; inf - inf while interpolating
        if missing is None:
            return tuple(np.nanpercentile(m, q, axis=0) for q in (25, 50, 75))
        m[np.isnan(m)] = missing
        out = [np.percentile(m, q, axis=0) for q in (25, 50, 75)]
    p25, p50, p75 = (np.where(np.isfinite(b), b, np.nan) for b in out)
    return p25, p50, p75


@dataclass(frozen=True)
class Band:
    """One curve of the convergence plot against evaluations: after each evaluation, the 25th, 50th and 75th
    percentiles over the seeds of the fraction of the optimum found (the best time in ms, when the optimum is
    unknown; NaN where nothing is drawn)."""

    label: str  # the strategy ("SPACE STRATEGY" when the problem was tuned in several spaces)
    seeds: int
    p25: Floats
    median: Floats
    p75: Floats


def _by_label(runs: ProblemRuns) -> list[tuple[str, list[Curve]]]:
    """The seeds' curves of each strategy (of each space and strategy, when there are several spaces), by label."""
    groups: dict[str, list[Curve]] = defaultdict(list)
    several_spaces = len({c.space for c in runs.curves}) > 1
    for c in runs.curves:
        groups[f"{c.space} {c.strategy}" if several_spaces else c.strategy].append(c)
    return sorted(groups.items())


def _y(runs: ProblemRuns, values: Floats) -> Floats:
    return runs.optimum_ms / values if runs.optimum_ms else values


def _nothing(runs: ProblemRuns) -> float:
    """What a seed without a valid result yet has found (see the module docstring)."""
    return 0.0 if runs.optimum_ms else np.inf


def evaluation_bands(runs: ProblemRuns) -> list[Band]:
    """The curves of the convergence plot's left panel, by label."""
    return [Band(label, len(curves), *_band([_y(runs, c.values) for c in curves], _nothing(runs)))
            for label, curves in _by_label(runs)]


def write_bands(bands: list[Band], path: str | Path) -> Path:
    """``bands`` as CSV, one row per (curve, evaluation): ``curve, seeds, evaluation, p25, median, p75``, values
    to 6 significant digits, empty where nothing is drawn."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(["curve", "seeds", "evaluation", "p25", "median", "p75"])
        for b in bands:
            for i, values in enumerate(zip(b.p25, b.median, b.p75, strict=True), start=1):
                out.writerow([b.label, b.seeds, i, *("" if np.isnan(v) else f"{v:.6g}" for v in values)])
    return path


def plot_convergence(runs: ProblemRuns, path: str | Path) -> Path:
    opt = runs.optimum_ms
    nothing = _nothing(runs)
    fig, (ax_e, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for i, ((strategy, curves), band) in enumerate(zip(_by_label(runs), evaluation_bands(runs), strict=True)):
        color = f"C{i}"
        x = np.arange(1, len(band.median) + 1)
        label = f"{strategy} ({len(curves)} seed{'s' if len(curves) > 1 else ''})"
        ax_e.plot(x, band.median, color=color, label=label)
        ax_e.fill_between(x, band.p25, band.p75, color=color, alpha=0.2, linewidth=0)
        ends = [(float(c.clock[0]), float(c.clock[-1])) for c in curves if len(c.clock)] or [(0.0, 1.0)]
        grid = np.linspace(min(e[0] for e in ends), max(e[1] for e in ends), 300)
        on_grid = []
        for c in curves:
            idx = np.searchsorted(c.clock, grid, side="right") - 1
            vals = (np.where(idx >= 0, _y(runs, c.values)[np.clip(idx, 0, None)], np.nan) if len(c.values)
                    else grid * np.nan)
            on_grid.append(vals)
        glo, gmed, ghi = _band(on_grid, nothing)
        ax_t.plot(grid, gmed, color=color, label=label)
        ax_t.fill_between(grid, glo, ghi, color=color, alpha=0.2, linewidth=0)
    ylabel = "fraction of optimum reached (1 = best in landscape)" if opt else "best time so far (ms, lower is better)"
    ax_e.set_ylabel(ylabel)
    ax_e.set_xlabel("evaluations")
    ax_t.set_xlabel("tuning clock (s): compile + benchmark time charged per point")
    if opt:
        for ax in (ax_e, ax_t):
            ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
    else:
        _confirmed_lines(runs.confirmation, (ax_e, ax_t))
    for ax in (ax_e, ax_t):
        ax.grid(alpha=0.3)
    ax_e.legend(loc="lower right" if opt else "upper right")
    transfer = "".join(f"\n{strategy} transferred from {sources_text(src)}" for strategy, src in runs.sources.items())
    fig.suptitle(f"{runs.experiment}: {runs.problem_key} (median and inter-quartile band over seeds){transfer}")
    fig.tight_layout()
    return _save(fig, path)


def _confirmed_lines(rec: dict[str, Any], axes: tuple[Axes, ...]) -> None:
    """The confirmation stage's figures as reference lines: the fastest configuration and each baseline,
    re-timed side by side after the search (what ``best`` reports)."""
    items, configs = rec.get("items", {}), rec.get("configs", {})
    timed = [items[k]["median_ms"] for k in configs if k in items]
    lines = ([(min(timed), "best configuration, confirmed", "k", ":")] if timed else []) + [
        (items[n]["median_ms"], f"{n}, confirmed", "0.45", "--") for n in rec.get("baselines", []) if n in items]
    for value, label, color, style in lines:
        for i, ax in enumerate(axes):
            ax.axhline(value, color=color, linestyle=style, linewidth=1.0, label=label if i == 0 else None)


def plot_param_effects(runs: ProblemRuns, path: str | Path, max_params: int = 16,
                       space: str | None = None) -> Path | None:
    """Each parameter's effect over the measured points of ``space`` (of all of them when the problem has one)."""
    seen: dict[str, optuna.trial.FrozenTrial] = {}
    for t in runs.trials if space is None else runs.spaces[space]:
        if t.state == TrialState.COMPLETE:
            seen.setdefault(t.user_attrs.get("key", str(t.params)), t)
    trials = list(seen.values())
    if not trials:
        return None
    best = min(_value(t) for t in trials)
    names = [n for n in trials[0].params if len({str(t.params[n]) for t in trials}) > 1][:max_params]
    if not names:
        return None
    cols = min(4, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False, sharey=True)
    for ax, name in zip(axes.flat, names, strict=False):
        choices = sorted({t.params[name] for t in trials}, key=_sort_key)
        data = [[best / _value(t) for t in trials if t.params[name] == c] for c in choices]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(choices) + 1), [str(c) for c in choices], rotation=45 if len(choices) > 6 else 0,
                      fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("best / time (1 = best)")
    where = f"{runs.problem_key} in {space}" if space else runs.problem_key
    fig.suptitle(f"{runs.experiment}: {where}: effect of each parameter ({len(trials)} measured points)")
    fig.tight_layout()
    return _save(fig, path)


def _value(t: optuna.trial.FrozenTrial) -> float:
    """A complete trial's value (a study of one objective stores one with each complete trial)."""
    assert t.value is not None
    return t.value


def _sort_key(v: object) -> tuple[int, object]:
    return (0, v) if isinstance(v, (int, float)) else (1, str(v))


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if _fit_titles(fig):
        fig.tight_layout()  # make room for the extra lines
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fit_titles(fig: Figure) -> bool:
    """Wrap the figure's and the axes' titles that would be cut off at the figure's edges; whether any was."""
    canvas = fig.canvas if hasattr(fig.canvas, "get_renderer") else FigureCanvasAgg(fig)  # a Figure made without pyplot
    renderer = canvas.get_renderer()
    width = fig.bbox.width
    margin = 0.01 * width  # text extents differ a little between resolutions: keep clear of the edge
    titles = [*fig.texts, *(ax.title for ax in fig.axes)]  # fig.texts holds the suptitle
    wrapped = False
    for title in titles:
        text = title.get_text()
        if not text:
            continue
        for _ in range(8):  # each pass narrows the lines; a handful is plenty for any title
            box = title.get_window_extent(renderer)
            if box.x0 >= margin and box.x1 <= width - margin:
                break
            # the room on the title's narrower side of its anchor, twice, is what a centred line may use
            centre = (box.x0 + box.x1) / 2
            room = 2 * (min(centre, width - centre) - margin) * 0.95
            longest = max(len(line) for line in title.get_text().splitlines())
            chars = max(10, int(longest * room / box.width))
            title.set_text(textwrap.fill(text, chars, break_on_hyphens=False))
            wrapped = True
    return wrapped


def plot_experiment(storage: str | optuna.storages.BaseStorage, experiment: str | None,
                    out_dir: str | Path) -> list[Path]:
    """Write the convergence and parameter-effect PNGs of every problem; returns their paths."""
    out = []
    for runs in load_runs(storage, experiment):
        stem = f"{runs.experiment}_{runs.problem_key}"
        out.append(plot_convergence(runs, Path(out_dir) / f"{stem}_convergence.png"))
        several = len(runs.spaces) > 1
        for space in sorted(runs.spaces) if several else [None]:
            name = f"{stem}_{space}_params.png" if space else f"{stem}_params.png"
            effects = plot_param_effects(runs, Path(out_dir) / name, space=space)
            if effects:
                out.append(effects)
    return out
