"""The figures' drawn data: best-so-far medians never fall, and titles are not cut off at the figure's edges."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from evotune.reporting import plots
from evotune.reporting.plots import Curve, ProblemRuns


@pytest.fixture
def drawn(monkeypatch):
    """The figures that plots._save is handed, kept open for inspection."""
    figures = []
    real = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or real(fig, path))
    return figures


def staggered_runs() -> ProblemRuns:
    """Three seeds of one strategy; on the tuning clock the first starts alone, with a good early find."""
    nan = np.nan
    curves = [
        # best time so far (ms; the optimum is 1.0) and the tuning clock after each evaluation
        Curve("s", "ga", 0, np.array([1.2, 1.2, 1.1, 1.05]), np.array([1.0, 2.0, 3.0, 4.0])),
        Curve("s", "ga", 1, np.array([nan, 4.0, 3.0, 2.0]), np.array([5.0, 6.0, 7.0, 8.0])),
        Curve("s", "ga", 2, np.array([4.5, 4.5, 2.5, 1.5]), np.array([9.0, 10.0, 11.0, 12.0])),
    ]
    return ProblemRuns("exp", "problem", 1.0, curves, [])


@pytest.mark.parametrize("optimum", [1.0, None])
def test_the_median_best_so_far_never_falls(tmp_path, drawn, optimum):
    runs = staggered_runs()
    runs.optimum_ms = optimum
    plots.plot_convergence(runs, tmp_path / "c.png")
    (fig,) = drawn
    ax_evals, ax_clock = fig.axes
    for ax in (ax_evals, ax_clock):
        y = np.asarray(ax.lines[0].get_ydata(), dtype=float)
        assert np.isfinite(y).sum() >= 3
        shown = y[np.isfinite(y)]
        steps = np.diff(shown)
        # better is up for the fraction of the optimum, down for the time itself
        assert np.all(steps >= -1e-12) if optimum else np.all(steps <= 1e-12), shown
    if optimum:
        clock = np.asarray(ax_clock.lines[0].get_ydata(), dtype=float)
        # once the seed that started first has found 1/1.2 of the optimum, the others have found nothing yet
        assert clock[0] == 0.0 and clock[-1] == pytest.approx(1 / 1.5)


def test_titles_are_wrapped_to_fit_the_figure(tmp_path):
    long = ("gemm_bf16_tn_4096x4096x4096_cute_hopper_gemm: 13320 points, optimum 0.1739 ms "
            "(median and inter-quartile band over seeds)")
    fig, ax = plt.subplots(figsize=(8, 4.8))
    ax.plot([1, 2], [0.5, 1.0])
    ax.set_title(long, fontsize=9)
    fig.suptitle(long * 2)
    fig.tight_layout()
    plots._save(fig, tmp_path / "t.png")
    renderer = FigureCanvasAgg(fig).get_renderer()  # the figure as saved: pyplot has let go of its canvas
    for title in (ax.title, *fig.texts):
        box = title.get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width, title.get_text()
    assert "\n" in ax.title.get_text()
    assert " ".join(ax.title.get_text().split()) == long  # wrapped, nothing dropped


def test_a_gpu_run_draws_its_confirmed_best_and_baselines(tmp_path, drawn):
    """Without a known optimum the y axis is time: the confirmation's best and baseline are drawn as lines."""
    runs = staggered_runs()
    runs.optimum_ms = None
    runs.confirmation = {"items": {"cfg-a": {"median_ms": 1.1}, "cfg-b": {"median_ms": 1.3},
                                   "torch.matmul": {"median_ms": 1.25}},
                         "configs": {"cfg-a": {}, "cfg-b": {}}, "baselines": ["torch.matmul"]}
    plots.plot_convergence(runs, tmp_path / "c.png")
    (fig,) = drawn
    for ax in fig.axes:
        flat = {tuple(np.asarray(line.get_ydata(), dtype=float)) for line in ax.lines}
        assert (1.1, 1.1) in flat and (1.25, 1.25) in flat and (1.3, 1.3) not in flat
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "best configuration, confirmed" in labels and "torch.matmul, confirmed" in labels


def test_a_problem_tuned_in_two_spaces_gets_each_spaces_parameter_effects(tmp_path, drawn):
    """Two kernel families on one problem have parameters of their own: one parameter figure per space."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    url = f"sqlite:///{tmp_path / 'two.db'}"
    for space, names in (("family_a", ("BLOCK_M", "num_warps")), ("family_b", ("tile_m", "stages"))):
        study = optuna.create_study(storage=url, study_name=f"exp/p/{space}/ga/seed0")
        for k, v in {"experiment": "exp", "problem_key": "p", "space": space, "strategy": "ga", "seed": 0}.items():
            study.set_user_attr(k, v)
        for i in range(6):
            params = {names[0]: (64, 128)[i % 2], names[1]: (2, 4, 8)[i % 3]}
            dists = {n: CategoricalDistribution([64, 128] if n == names[0] else [2, 4, 8]) for n in names}
            study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=1.0 + i,
                                                      user_attrs={"key": f"{space}{i}", "clock_s": float(i)}))
    paths = plots.plot_experiment(url, "exp", tmp_path)
    assert sorted(p.name for p in paths) == ["exp_p_convergence.png", "exp_p_family_a_params.png",
                                             "exp_p_family_b_params.png"]
    titles = {fig._suptitle.get_text().replace("\n", " ") for fig in drawn if fig._suptitle is not None}
    assert any("p in family_a" in t for t in titles) and any("p in family_b" in t for t in titles)
    panels = {ax.get_title() for fig in drawn for ax in fig.axes}
    assert {"BLOCK_M", "num_warps", "tile_m", "stages"} <= panels
