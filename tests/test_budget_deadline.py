"""``budget.seconds`` bounds the wall time of a run on a measuring oracle: no point is handed out that the time
left cannot fit, an evaluation still waiting at the deadline is dropped, the compiles in flight are abandoned, and
the confirmation stage gets its share. A fake clock stands for the wall clock: nothing here waits."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from pathlib import Path

import pytest

from evotune.core.budget import Budget
from evotune.core.plugins import load_space
from evotune.core.problem import Problem
from evotune.core.result import EvalResult, Status
from evotune.core.space import Context
from evotune.measurement.base import DeadlinePassed, Evaluator
from evotune.running import run, session, tuner
from evotune.running.experiment import load_experiment
from evotune.running.tuner import tune_study
from evotune.search.strategies import make_strategy
from evotune.storage.study import StudyStore

FAULTS = Path(__file__).resolve().parent / "spaces" / "faults.py"
PROBLEM = Problem.gemm(64, 64, 64, "fp32")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Slow(Evaluator):
    """Each evaluation times its kernel for ``cost`` seconds of the fake clock (no start-up: the run's clock
    starts with the first one); the points of ``compiling`` are still compiling when asked for, for
    ``compile_s`` more, and wait for it as the GPU evaluator waits for its pool."""

    kind = "fake"

    def __init__(self, clock: FakeClock, cost: float, compiling: tuple[str, ...] = (), compile_s: float = 0.0):
        self.clock, self.cost, self.compiling, self.compile_s = clock, cost, compiling, compile_s
        self.abandoned = 0
        self.bounds: list[bool] = []

    def bound(self, time_left):
        self.bounds.append(time_left is not None)
        super().bound(time_left)

    def evaluate(self, point, problem):
        if point["mode"] in self.compiling:
            left = self.time_left() if self.time_left is not None else self.compile_s
            if left < self.compile_s:
                self.clock.now += max(0.0, left)
                raise DeadlinePassed("still compiling")
            self.clock.now += self.compile_s
        self.clock.now += self.cost
        return EvalResult(Status.OK, time_ms=1.0 + point["size"] / 10, bench_s=self.cost)

    def abandon(self):
        self.abandoned += 1


def _tune(tmp_path, evaluator, budget, clock, name="t"):
    space = load_space(str(FAULTS))
    ctx = Context(problem=PROBLEM)
    fs = space.feasible(ctx)
    store = StudyStore.open(f"sqlite:///{tmp_path / 'b.db'}", name, space)
    strategy = make_strategy("exhaustive", space, fs, ctx=ctx)
    return tune_study(space, ctx, evaluator, strategy, store, budget, clock=clock), store


def test_no_point_is_handed_out_that_the_time_left_cannot_fit(tmp_path):
    clock = FakeClock()
    ev = Slow(clock, cost=10.0)
    result, store = _tune(tmp_path, ev, Budget(trials=100, seconds=35.0), clock)
    # 0-10, 10-20, 20-30; at 30 the 5 s left cannot fit a 10 s evaluation
    assert result.stopped == "seconds" and result.trials == 3
    assert clock.now == 30.0 and result.clock_s == 30.0
    assert [r.clock_s for r in store.history()] == [10.0, 20.0, 30.0]  # the tuning clock is the run's wall time
    assert ev.abandoned == 1 and ev.bounds == [True, False]  # the run's deadline is lifted once it ends


def test_an_evaluation_waiting_for_its_compile_at_the_deadline_is_dropped_and_its_compiles_abandoned(tmp_path):
    clock = FakeClock()
    ev = Slow(clock, cost=1.0, compiling=("ok_slow",), compile_s=100.0)
    result, store = _tune(tmp_path, ev, Budget(trials=100, seconds=40.0), clock)
    assert result.stopped == "seconds"
    assert clock.now == pytest.approx(40.0)  # the wait ended at the deadline, not after the compile
    assert all(r.point["mode"] != "ok_slow" for r in store.history())  # nothing stored for the dropped point
    assert ev.abandoned == 1


def test_the_clock_goes_on_from_what_the_study_held(tmp_path):
    clock = FakeClock()
    _tune(tmp_path, Slow(clock, cost=10.0), Budget(trials=2, seconds=100.0), clock)
    clock.now = 1000.0  # a later run, at any time: only its own wall time counts on top
    result, store = _tune(tmp_path, Slow(clock, cost=10.0), Budget(trials=100, seconds=45.0), clock)
    assert [r.clock_s for r in store.history()] == [10.0, 20.0, 30.0, 40.0]
    assert result.stopped == "seconds" and result.clock_s == 40.0


def test_a_study_resumed_with_less_time_left_than_an_evaluation_takes_ends_at_once(tmp_path):
    clock = FakeClock()
    _tune(tmp_path, Slow(clock, cost=10.0), Budget(trials=100, seconds=35.0), clock)  # 3 trials, stopped at 30

    class Untouched(Slow):
        def evaluate(self, point, problem):
            raise AssertionError("an evaluation was started that the time left could not fit")

        def prefetch(self, points, problem):
            raise AssertionError("compiles were started for a deadline that has come")

    ev = Untouched(clock, cost=10.0)
    ev.prefetch_depth = 4
    result, store = _tune(tmp_path, ev, Budget(trials=100, seconds=35.0), clock)
    assert result.stopped == "seconds" and result.trials == 3 and len(store.history()) == 3


class StartingUp(Slow):
    """The measuring process's start-up (its imports) and the first compiles: ``startup`` seconds of the fake
    clock that the first evaluation asked of it waits before it times anything, as a GPU worker's does."""

    def __init__(self, clock: FakeClock, cost: float, startup: float):
        super().__init__(clock, cost)
        self.startup = startup

    def evaluate(self, point, problem):
        waited, self.startup = self.startup, 0.0
        self.clock.now += waited
        result = super().evaluate(point, problem)
        result.compile_s = waited
        return result


def test_the_start_up_and_the_first_build_are_not_spent_from_the_seconds_budget(tmp_path):
    clock = FakeClock()
    ev = StartingUp(clock, cost=0.3, startup=30.0)
    result, store = _tune(tmp_path, ev, Budget(trials=12, seconds=10.0), clock)
    assert result.stopped == "trials" and result.trials == 12  # not "seconds" after the first point
    assert result.startup_s == pytest.approx(30.0) and result.stop_text == "stopped on trials"
    history = store.history()
    assert history[0].clock_s == pytest.approx(0.3)  # the clock starts as the first kernel is timed
    assert history[0].attrs["startup_s"] == pytest.approx(30.0) and history[0].attrs["wall_s"] == pytest.approx(30.3)
    assert history[-1].clock_s == pytest.approx(12 * 0.3) and clock.now == pytest.approx(30.0 + 12 * 0.3)
    assert ev.bounds == [True, False]  # the deadline holds once the clock runs, not over the start-up


def test_a_resumed_study_does_not_take_its_start_up_for_a_typical_evaluation(tmp_path):
    clock = FakeClock()
    _tune(tmp_path, StartingUp(clock, cost=0.3, startup=30.0), Budget(trials=1, seconds=10.0), clock)
    result, _ = _tune(tmp_path, StartingUp(clock, cost=0.3, startup=30.0), Budget(trials=12, seconds=10.0), clock)
    assert result.stopped == "trials" and result.trials == 12  # 9.7 s left: room for a 0.3 s evaluation


def test_a_study_that_stops_before_a_fifth_of_its_trials_says_after_how_many(tmp_path):
    clock = FakeClock()
    result, _ = _tune(tmp_path, StartingUp(clock, cost=4.0, startup=30.0), Budget(trials=24, seconds=10.0), clock)
    assert result.stopped == "seconds" and result.trials == 2  # 4, 8; at 8 the 2 s left cannot fit 4 s
    assert result.stop_text == "stopped on seconds after 2 of 24 trials"



def _two_problems(tmp_path, name, trials, seconds, outputs=""):
    """An experiment of the fault space on the CPU oracle: a 64^3 and a 32^3 fp32 problem, searched exhaustively
    within the budget."""
    path = tmp_path / f"{name}.toml"
    problems = "".join(f"[[problem]]\nm = {s}\nn = {s}\nk = {s}\ndtype = \"fp32\"\n" for s in (64, 32))
    path.write_text(f'name = "{name}"\nspace = "{FAULTS}"\n[oracle]\nkind = "cpu"\n{problems}'
                    f'[strategy]\nname = "exhaustive"\n[budget]\ntrials = {trials}\nseconds = {seconds}\n'
                    f'[storage]\nurl = "sqlite:///{tmp_path / (name + ".db")}"\n{outputs}')
    return path

def test_run_and_best_say_when_a_problem_stopped_after_few_of_its_trials(tmp_path, monkeypatch, capsys):
    from evotune.cli import main

    exp_path = _two_problems(tmp_path, "few", trials=24, seconds=10,
                             outputs=f'[outputs]\nbest = "{tmp_path / "best.json"}"\n')

    class Sizes(StartingUp):
        """The first problem's points take 4 s to time, the second's 0.3 s."""

        def evaluate(self, point, problem):
            self.cost = 4.0 if problem.m == 64 else 0.3
            return super().evaluate(point, problem)

    clock = FakeClock()
    monkeypatch.setattr(tuner, "wall_clock", clock)
    # one measuring process for the run's space: its start-up is paid by the first problem's first evaluation
    ev = Sizes(clock, cost=0.0, startup=30.0)
    monkeypatch.setattr(session, "make_evaluator", lambda exp, target, worker=None: ev)
    assert main(["run", str(exp_path), "--no-progress", "--no-plots"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert ": 2 trials (2 new), stopped on seconds after 2 of 24 trials" in err
    assert ": 12 trials (12 new), stopped on exhausted" in err  # every feasible point: not a short stop
    assert "exhausted after" not in err

    assert main(["best", str(exp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "exhaustive s0: stopped on seconds after 2 of 24 trials" in out
    assert out.count("stopped on") == 1  # the problem that measured every point says nothing


class Confirming(Slow):
    """Confirms, as the GPU evaluator does, taking whatever time it is given (on the fake clock)."""

    confirms = True
    asked: list[float | None] = []

    def confirm(self, points, problem, search_ms, seconds=None):
        Confirming.asked.append(seconds)
        self.clock.now += seconds if seconds is not None else 120.0
        keys = [str(i) for i in range(len(points))]
        return {"items": {k: {"median_ms": t} for k, t in zip(keys, search_ms, strict=True)},
                "configs": dict(zip(keys, points, strict=True)), "baselines": []}


def test_each_problems_confirmation_gets_its_share_and_the_problem_ends_within_its_seconds(tmp_path, monkeypatch):
    exp_path = _two_problems(tmp_path, "d", trials=50, seconds=100)
    clock = FakeClock()
    monkeypatch.setattr(tuner, "wall_clock", clock)
    monkeypatch.setattr(session, "make_evaluator", lambda exp, target, worker=None: Confirming(clock, cost=10.0))
    Confirming.asked = []
    results = run.run_experiment(load_experiment(exp_path), progress=False)
    # each problem: 80 s of search (eight 10 s points), then its confirmation in the 20 s held back for it
    assert [(r.trials, r.stopped, r.clock_s) for r in results] == [(8, "seconds", 80.0), (8, "seconds", 80.0)]
    assert Confirming.asked == [20.0, 20.0]  # the second problem's confirmation ran too
    assert clock.now == 200.0  # two problems of 100 s each, not a second more


def test_the_gpu_evaluator_stops_waiting_for_a_compile_at_the_deadline_and_kills_the_compiles_in_flight():
    from evotune.measurement.gpu import GpuEvaluator

    ev = object.__new__(GpuEvaluator)  # its state only: no GPU worker is started
    ev.space, ev.timeout_s = load_space(str(FAULTS)), 300.0
    pool = concurrent.futures.ProcessPoolExecutor(1)
    point = {"mode": "ok_fast", "size": 1}
    ev._pool, ev._compiling = pool, {(PROBLEM.key, ev.space.key(point)): pool.submit(time.sleep, 3600)}
    ev.bound(lambda: 0.0)
    with pytest.raises(DeadlinePassed):
        ev._precompiled(point, PROBLEM)
    processes = list(pool._processes.values())
    assert processes and all(p.is_alive() for p in processes)
    ev.abandon()
    for p in processes:
        p.join()
        assert p.exitcode is not None and p.exitcode < 0  # killed, not left compiling beside the GPU worker
    assert ev._pool is None and ev._compiling == {}


def test_the_gpu_evaluator_builds_the_confirmations_candidates_side_by_side_before_confirming(monkeypatch):
    """After a resume the candidates' kernels are not built: the pool builds them together, and only then does the
    GPU worker re-time them (it would otherwise build them one after another, a minute each for nvcc)."""
    import threading

    from evotune.measurement import gpu
    from evotune.measurement.messages import Confirm, Reply, ReplyStatus
    from evotune.running.experiment import OracleOptions

    ev = object.__new__(gpu.GpuEvaluator)  # its state only: no GPU worker is started
    ev.space, ev.timeout_s, ev.options = load_space(str(FAULTS)), 300.0, OracleOptions()
    ev.workers, ev._compiling = 3, {}
    ev.bound(None)
    points = [{"mode": "ok_fast", "size": s} for s in (1, 2, 3)]
    started, built = threading.Barrier(3, timeout=60), set()

    def precompile(source, point, problem):  # all three in the pool at once, or the barrier breaks
        started.wait()
        built.add(point["size"])
        return gpu.Precompiled(0.0)

    class Worker:
        def call(self, message, timeout_s=None):
            assert isinstance(message, Confirm)
            assert built == {1, 2, 3}, "the GPU worker was asked to confirm before the pool had built every candidate"
            return Reply(ReplyStatus.OK, confirmation={"items": {}})

    monkeypatch.setattr(gpu, "_precompile", precompile)
    ev._pool, ev._worker = concurrent.futures.ThreadPoolExecutor(3), Worker()
    assert ev.confirm(points, PROBLEM, [1.0, 2.0, 3.0]) == {"items": {}}
    assert ev._compiling == {}
    ev._pool.shutdown()


def _compile_with_a_child(pid_file: str) -> None:
    """A compile process's task that starts a compiler of its own (a sleeping child) and waits for it."""
    import subprocess

    child = subprocess.Popen(["sleep", "3600"])
    Path(pid_file).write_text(str(child.pid))
    child.wait()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:  # gone
        return False


def test_abandoning_the_compiles_kills_the_compilers_they_started(tmp_path):
    import multiprocessing
    import os

    from evotune.measurement import gpu
    from evotune.measurement.processes import pool_initializer

    ev = object.__new__(gpu.GpuEvaluator)
    pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"),
                                                  initializer=pool_initializer,
                                                  initargs=(dict(os.environ), functools.partial(gpu._pool_init, None)))
    pid_file = tmp_path / "child"
    ev._pool, ev._compiling = pool, {("p", "k"): pool.submit(_compile_with_a_child, str(pid_file))}
    while not pid_file.exists() or not pid_file.read_text():
        time.sleep(0.05)
    child = int(pid_file.read_text())
    ev.abandon()
    waited = time.monotonic() + 120  # a guard against a hang only: a killed process is gone in milliseconds
    while _running(child) and time.monotonic() < waited:  # killed: gone, or a zombie until its new parent reaps it
        time.sleep(0.05)
    if _running(child):
        os.kill(child, 9)
        raise AssertionError("the compiler a compile process started outlived it")
    assert ev._pool is None and ev._compiling == {}


def _niceness() -> int:
    import os

    return os.getpriority(os.PRIO_PROCESS, 0)


def test_compile_processes_run_below_the_measuring_process():
    """Where several workers fill a host's cores, the GPU worker's launches must not wait for a compile."""
    import multiprocessing
    import os

    from evotune.measurement import gpu
    from evotune.measurement.processes import pool_initializer

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"),
                                                initializer=pool_initializer,
                                                initargs=(dict(os.environ), functools.partial(gpu._pool_init, None))
                                                ) as pool:
        assert pool.submit(_niceness).result() == min(19, _niceness() + 5)


def test_a_point_another_process_compiles_is_ready_once_that_compile_is_done(tmp_path):
    """The pool did not wait for it (evotune.measurement.kernel_cache.never_wait): the tuning loop takes the points
    that are built first, and this one when the other process lets its lock go; then the GPU worker loads it."""
    import fcntl

    from evotune.measurement import gpu

    ev = object.__new__(gpu.GpuEvaluator)  # its state only: no GPU worker is started
    ev.space, ev.timeout_s = load_space(str(FAULTS)), 300.0
    ev.bound(None)
    elsewhere, built = {"mode": "ok_fast", "size": 1}, {"mode": "ok_fast", "size": 2}
    lock = tmp_path / "k.lock"
    done = {}
    for point, result in ((elsewhere, gpu.Precompiled(0.01, elsewhere=str(lock))), (built, gpu.Precompiled(2.0))):
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(result)
        done[(PROBLEM.key, ev.space.key(point))] = future
    ev._compiling = done
    with open(lock, "w") as held:  # the other process compiles
        fcntl.flock(held, fcntl.LOCK_EX)
        assert [ev.ready(p, PROBLEM) for p in (elsewhere, built)] == [False, True]
    assert ev.ready(elsewhere, PROBLEM)
    assert ev._precompiled(elsewhere, PROBLEM) == (0.0, None, None)  # not this pool's build: the GPU worker's load
    assert ev._precompiled(built, PROBLEM) == (2.0, None, False)
