"""Resuming a study from an experiment file that changed: a changed strategy option is refused (one line, exit 2,
nothing measured), a budget lowered below the study is said in a warning."""

from __future__ import annotations

import optuna
from conftest import KT_EXCERPT, replay_experiment

from evotune.cli import main


def _experiment(tmp_path, trials: int, options: str):
    return replay_experiment(tmp_path / "res.toml", name="res", url=f"sqlite:///{tmp_path / 'res.db'}",
                             trials=trials, options=options, landscapes=(KT_EXCERPT,),
                             extra=f'[outputs]\nbest = "{tmp_path / "best.json"}"\n')


def _trials(tmp_path) -> int:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'res.db'}")
    (summary,) = optuna.get_all_study_summaries(storage, include_best_trial=False)
    return summary.n_trials


def test_a_changed_strategy_option_is_refused_naming_the_file_field_and_both_values(tmp_path, capsys):
    exp = _experiment(tmp_path, 12, "population = 6, offspring = 6")
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    assert _trials(tmp_path) == 12
    capsys.readouterr()

    exp = _experiment(tmp_path, 24, "population = 8, offspring = 6")
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "res.toml: strategy.options.population:" in err
    assert "population = 6" in err and "population = 8" in err
    assert _trials(tmp_path) == 12  # nothing measured

    exp = _experiment(tmp_path, 24, "population = 6")  # an option taken away is a change too
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 2
    assert "strategy.options.offspring" in capsys.readouterr().err and _trials(tmp_path) == 12

    exp = _experiment(tmp_path, 24, "offspring = 6, population = 6")  # the same options resume
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    assert _trials(tmp_path) == 24


def test_a_budget_below_what_the_study_holds_is_said(tmp_path, capsys):
    exp = _experiment(tmp_path, 12, "")
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    capsys.readouterr()

    exp = _experiment(tmp_path, 8, "")
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    err = " ".join(capsys.readouterr().err.split())  # one warning, however the console wraps it
    assert "warning: " in err and "res.toml: budget.trials: study res/" in err
    assert "began with 12, now 8" in err and "holds 12 trials, already past it" in err
    assert _trials(tmp_path) == 12

    exp = _experiment(tmp_path, 16, "")  # a higher budget resumes without a word
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    assert "warning" not in capsys.readouterr().err and _trials(tmp_path) == 16


def test_a_finished_study_resumed_with_the_same_budget_is_said_nothing_of(tmp_path, capsys):
    exp = _experiment(tmp_path, 12, "")
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    capsys.readouterr()
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0  # it holds its 12 trials, as asked
    assert "warning" not in capsys.readouterr().err and _trials(tmp_path) == 12

    exp = _experiment(tmp_path, 8, "")  # lowered: said once, then the study's budget is the lowered one
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    assert "began with 12, now 8" in " ".join(capsys.readouterr().err.split())
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    assert "warning" not in capsys.readouterr().err and _trials(tmp_path) == 12


def test_a_study_whose_clock_ran_past_its_own_seconds_is_said_nothing_of(tmp_path, capsys):
    exp = _experiment(tmp_path, 500, "")
    exp.write_text(exp.read_text().replace("trials = 500", "trials = 500\nseconds = 5"))
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    capsys.readouterr()
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'res.db'}")
    (study,) = optuna.get_all_study_summaries(storage, include_best_trial=False)
    trials = optuna.load_study(study_name=study.study_name, storage=storage).trials
    assert max(t.user_attrs["clock_s"] for t in trials) > 5  # the last point ends past the budget
    assert main(["run", str(exp), "--no-progress", "--no-plots"]) == 0
    assert "warning" not in capsys.readouterr().err and _trials(tmp_path) == len(trials)
