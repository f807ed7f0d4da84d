"""The cost model: a worker's start-up, per-problem and per-evaluation costs, and the speed-up they allow."""

from __future__ import annotations

import pytest

from evotune.running.cost_model import CostModel, WorkerCosts, measuring_share


def test_one_worker_pays_everything_once_whatever_the_split():
    m = CostModel(startup_s=6.0, per_problem_s=4.0, per_eval_s=0.3)
    for split in ("problems", "points", "whole"):
        assert m.wall_s(20, 100, 1, split) == pytest.approx(6.0 + 20 * (4.0 + 100 * 0.3))
        assert m.speedup(20, 100, 1, split) == pytest.approx(1.0)


def test_sharing_points_pays_every_problem_on_every_worker():
    m = CostModel(startup_s=6.0, per_problem_s=4.0, per_eval_s=0.3)
    # two problems of 48 evaluations on two workers, each paying both problems' fixed cost
    assert m.wall_s(2, 48, 2, "points") == pytest.approx(6.0 + 2 * 4.0 + 2 * 48 * 0.3 / 2)
    one, two = 6.0 + 2 * (4.0 + 14.4), 6.0 + 8.0 + 14.4
    assert m.speedup(2, 48, 2, "points") == pytest.approx(one / two)


def test_whole_problems_pay_each_problem_once_and_share_the_last():
    m = CostModel(startup_s=6.0, per_problem_s=4.0, per_eval_s=0.3)
    assert m.wall_s(2, 48, 2) == pytest.approx(6.0 + 4.0 + 14.4)  # one problem each
    # 5 problems on 2 workers: two rounds of whole problems, then the fifth shared by both
    assert m.wall_s(5, 48, 2) == pytest.approx(6.0 + 2 * (4.0 + 14.4) + (4.0 + 14.4 / 2))
    # fewer problems than workers: every worker joins one, and they share its points
    assert m.wall_s(1, 48, 4) == pytest.approx(6.0 + 4.0 + 14.4 / 4)
    # many problems: the fixed costs no longer stand in the way of scaling
    assert m.speedup(20, 100, 2) > m.speedup(20, 100, 2, "points")
    assert m.speedup(20, 100, 4) == pytest.approx((6.0 + 20 * 34.0) / (6.0 + 5 * 34.0))
    # no fixed costs at all: the speed-up is the number of workers, either way
    free = CostModel(0.0, 0.0, 0.3)
    assert free.speedup(20, 100, 4) == pytest.approx(4.0) and free.speedup(20, 100, 4, "points") == pytest.approx(4.0)


def test_problems_each_one_workers_leave_the_others_idle_in_the_last_round():
    m = CostModel(startup_s=6.0, per_problem_s=4.0, per_eval_s=0.3)
    # 18 keys on 4 workers: four rounds of four, then two keys while two workers have nothing left
    assert m.wall_s(18, 48, 4, "whole") == pytest.approx(6.0 + 5 * (4.0 + 14.4))
    assert m.wall_s(18, 48, 4, "whole") > m.wall_s(18, 48, 4, "problems")
    assert m.wall_s(16, 48, 4, "whole") == pytest.approx(m.wall_s(16, 48, 4, "problems"))
    assert m.wall_s(1, 48, 4, "whole") == pytest.approx(6.0 + 4.0 + 14.4)  # nobody shares a key's points


def test_storage_writes_one_worker_at_a_time_bound_the_speed_up():
    # an evaluation that is mostly writing to the storage (a replayed one): two workers barely help
    replay = CostModel(startup_s=1.0, per_problem_s=0.05, per_eval_s=0.018, serial_eval_s=0.016)
    assert replay.wall_s(20, 100, 2) == pytest.approx(1.0 + 2000 * 0.016)
    assert replay.speedup(20, 100, 2) == pytest.approx((1.0 + 20 * (0.05 + 1.8)) / (1.0 + 32.0))
    # a GPU measurement beside the same writes: the bound is far away
    gpu = CostModel(startup_s=6.0, per_problem_s=4.0, per_eval_s=0.3, serial_eval_s=0.016)
    assert gpu.wall_s(20, 100, 4) == CostModel(6.0, 4.0, 0.3).wall_s(20, 100, 4)


def test_bad_arguments_are_refused():
    m = CostModel(1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="split"):
        m.wall_s(2, 10, 2, "studies")
    with pytest.raises(ValueError, match="workers"):
        m.wall_s(2, 10, 0)


def test_a_worker_measures_its_costs_so_that_they_add_up_to_its_wall_time():
    costs = WorkerCosts(started=0.0)
    costs.problem(seconds=5.0, evals=10, eval_s=2.0, store_s=0.1)  # the first one also started the measuring process
    costs.problem(seconds=2.0, evals=10, eval_s=1.5, store_s=0.1)
    costs.problem(seconds=2.5, evals=10, eval_s=1.5, store_s=0.1)
    costs.wall_s = 11.0
    m = costs.model()
    assert m.per_problem_s == pytest.approx(1.0)  # the median of 3.0, 0.5 and 1.0
    assert m.per_eval_s == pytest.approx(5.0 / 30) and m.serial_eval_s == pytest.approx(0.01)
    assert m.startup_s == pytest.approx(11.0 - 5.0 - 3 * 1.0)  # the first problem's excess counts as start-up
    assert m.startup_s + 3 * m.per_problem_s + 30 * m.per_eval_s == pytest.approx(costs.wall_s)
    assert costs.to_dict()["model"]["per_problem_s"] == pytest.approx(1.0)
    assert "per problem 1.000 s (median of 3)" in costs.describe()


def test_contention_learned_from_two_workers_predicts_more():
    one = CostModel(startup_s=6.0, per_problem_s=4.0, per_eval_s=0.05)
    learned = one.learn(2, per_eval_s=0.085)  # two workers each measured 85 ms where one measured 50
    assert learned.contention == pytest.approx(0.7)
    assert learned.per_eval_at(1) == pytest.approx(0.05) and learned.per_eval_at(4) == pytest.approx(0.155)
    assert learned.wall_s(20, 100, 1) == one.wall_s(20, 100, 1)  # one worker alone: nothing changes
    assert learned.wall_s(20, 100, 2) == pytest.approx(6.0 + 10 * (4.0 + 100 * 0.085))
    assert learned.speedup(20, 100, 2) < one.speedup(20, 100, 2)
    assert one.learn(2, per_eval_s=0.04).contention == 0.0  # faster beside another: noise, not help
    with pytest.raises(ValueError, match="2 workers"):
        one.learn(1, 0.05)


def test_the_measuring_share_of_a_run_comes_from_its_trials():
    import datetime as dt
    from types import SimpleNamespace

    t0 = dt.datetime(2026, 1, 1)

    def trial(start_s, took_s, worker_s=None):
        attrs = {} if worker_s is None else {"worker_s": worker_s}
        return SimpleNamespace(datetime_start=t0 + dt.timedelta(seconds=start_s),
                               datetime_complete=t0 + dt.timedelta(seconds=start_s + took_s), user_attrs=attrs)

    busy, window = measuring_share([trial(0.0, 0.03, 0.025), trial(0.04, 0.03, 0.02), trial(0.08, 0.02)])
    assert window == pytest.approx(0.10) and busy == pytest.approx(0.065)
    assert measuring_share([]) == (0.0, 0.0)


def test_a_worker_adds_up_its_studies_storage_and_measuring_time():
    from types import SimpleNamespace

    def result(first, last, **kw):
        return SimpleNamespace(new_trials=10, loop_s=1.0, store_s=0.02, write_s=0.03, busy_s=0.8, first_eval=first,
                               last_eval=last, evaluate_s=0.9, **kw)

    costs = WorkerCosts(started=0.0)
    costs.took(1.5, [result(100.0, 101.0), result(101.0, 102.0)])
    costs.took(1.2, [result(103.0, 104.0), result(None, None)])
    costs.wall_s = 4.0
    assert costs.evals == 40 and costs.store_s == pytest.approx(0.08) and costs.write_s == pytest.approx(0.12)
    assert costs.window_s == pytest.approx(4.0) and costs.busy_share == pytest.approx(3.2 / 4.0)
    assert costs.model().serial_eval_s == pytest.approx(0.2 / 40)  # claims and trials: under the storage's lock
    assert "80% of the 4.00 s from the first evaluation to the last" in costs.describe()
    # the evaluator's calls took 0.9 s a study, the measuring process 0.8 of them: 0.1 s waited for compiles
    assert costs.compile_wait_s == pytest.approx(0.4) and costs.to_dict()["compile_wait_s"] == pytest.approx(0.4)
    assert "measuring 80.0 ms per evaluation (10.0 before it waiting for compiles)" in costs.describe()


def test_a_worker_notes_where_its_start_up_goes(tmp_path):
    from pathlib import Path

    from evotune.running.experiment import load_experiment
    from evotune.running.run import Role, run_experiment

    landscape = Path(__file__).resolve().parents[1] / "evotune/landscapes/kerneltuner/gemm_RTX_2080_Ti.json.gz"
    path = tmp_path / "exp.toml"
    path.write_text(f'name = "marks"\nspace = "landscape"\n[oracle]\nkind = "replay"\nlandscapes = ["{landscape}"]\n'
                    f'[[strategy]]\nname = "random"\n[budget]\ntrials = 5\n'
                    f'[storage]\nurl = "sqlite:///{tmp_path / "s.db"}"\n')
    costs = WorkerCosts()
    run_experiment(load_experiment(path), progress=False, role=Role(costs=costs))
    steps = ["experiment read", "storage opened", "first problem taken up", "first baselines", "first sources read",
             "first evaluation"]
    assert list(costs.marks) == steps  # in the order they happen, each noted once
    assert [costs.marks[s] for s in steps] == sorted(costs.marks[s] for s in steps)
    costs.stop()
    assert "start-up steps: experiment read" in costs.describe()
    # a replayed evaluation is its recorded cost, all of it the "measuring" look-up: nothing waits for a compile
    assert costs.evaluate_s > 0 and costs.compile_wait_s == pytest.approx(0.0)
