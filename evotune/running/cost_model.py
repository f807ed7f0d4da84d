"""What a worker's wall time is made of, and the speed-up that several workers can give.

Three costs make up a worker's wall time:

* ``startup_s``, once per worker: the process, its imports, reading the
  experiment and its inputs, and starting the measuring process (on a GPU:
  torch, CUDA and the kernel DSL, and the compile pool's first imports);
* ``per_problem_s``, each time a worker takes up a problem (a target: one
  problem in one space): its baselines looked up or timed, its transfer sources
  read, its studies opened, each strategy set up and told what the study holds,
  its confirmation, and for a space that compiles per shape, its first builds;
* ``per_eval_s``, each evaluation: the strategy's proposal, the claim, the
  evaluation itself (compile where the pool did not hide it, verify, time),
  storing the trial and reading other workers' trials back.

So ``W`` workers on ``P`` problems of ``B`` evaluations each take, when they
share every problem's points (``split = "points"``: each worker takes up every
problem)::

    startup + P * per_problem + P * B * per_eval / W

and when each takes whole problems (``split = "problems"``; the ``P mod W``
left over at the end are shared by all)::

    startup + (P // W) * (per_problem + B * per_eval) + [per_problem + (P mod W) * B * per_eval / W]

the bracket only when ``P mod W`` is not 0; and when each problem is one worker's from its start to its end
(``split = "whole"``, as ``tune-model`` deals its keys: the last round leaves the other workers idle)::

    startup + ceil(P / W) * (per_problem + B * per_eval)

One worker takes ``startup + P * (per_problem + B * per_eval)`` whichever the split.

Part of each evaluation, ``serial_eval_s``, is writing its claims and its
trial, which on sqlite or a journal file go through the storage's one lock
(on PostgreSQL, a study's claims do): no two workers do it at once, so
however many workers there are, the wall time is at least
``startup + P * B * serial_eval``. Where an evaluation is a look-up (replay),
that part is most of it, and more workers do not help; where it is a GPU
measurement, it is a small part, and they do.

Workers also slow each other down: they share the storage's lock, the host's
cores and memory, its compile pools and kernel cache. One worker cannot show
that; a run of two can. :meth:`CostModel.learn` takes the per-evaluation cost
two (or W) workers measured beside the one a lone worker measured, and the
model then charges ``per_eval * (1 + contention * (W - 1))`` to each of ``W``
workers: a prediction from a 1-worker run and one 2-worker run.

:class:`WorkerCosts` measures the three on a running worker: its wall time
since the process started, each problem's time less its tuning loops (the
loop of each study after it is resumed: :attr:`evotune.running.tuner.TuneResult.loop_s`),
and its evaluations with the loops' time. The median problem is the per-problem cost; what the first problem
took beyond it (the measuring process started there) is counted as start-up.

Example::

    CostModel(startup_s=6.0, per_problem_s=4.0, per_eval_s=0.3).speedup(problems=20, evals=100, workers=2)
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from evotune.running.schedule import SPLITS as RUN_SPLITS

#: how workers divide the problems: a run's splits (the schedule's), and ``whole``, one worker a problem
SPLITS = (*RUN_SPLITS, "whole")

_IMPORTED = time.time()


@dataclass(frozen=True)
class CostModel:
    """A worker's three costs, in seconds."""

    startup_s: float
    per_problem_s: float
    per_eval_s: float
    serial_eval_s: float = 0.0  # of per_eval_s: what one worker at a time can do (the storage's writes)
    contention: float = 0.0  # how much each worker beside the first adds to per_eval_s, as a fraction of it

    def per_eval_at(self, workers: int) -> float:
        """The cost of one evaluation while ``workers`` workers run."""
        return self.per_eval_s * (1.0 + self.contention * (workers - 1))

    def learn(self, workers: int, per_eval_s: float) -> CostModel:
        """This (one worker's) model, with the contention that ``workers`` workers, measuring ``per_eval_s`` per
        evaluation each, show: ``per_eval_s = self.per_eval_s * (1 + contention * (workers - 1))``."""
        if workers < 2 or self.per_eval_s <= 0:
            raise ValueError(f"contention needs a run of 2 workers or more beside one, got {workers}")
        return replace(self, contention=max(0.0, (per_eval_s / self.per_eval_s - 1.0) / (workers - 1)))

    def wall_s(self, problems: int, evals: int, workers: int, split: str = "problems") -> float:
        """Wall time of ``problems`` problems of ``evals`` evaluations each on ``workers`` workers."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        if problems < 1 or evals < 0 or workers < 1:
            raise ValueError(f"need problems >= 1, evals >= 0 and workers >= 1, got {problems}, {evals}, {workers}")
        work = evals * self.per_eval_at(workers)  # one problem's evaluations
        serial = self.startup_s + problems * evals * self.serial_eval_s  # every storage write, one after another
        if split == "points":
            return max(serial, self.startup_s + problems * self.per_problem_s + problems * work / workers)
        if split == "whole":
            return max(serial, self.startup_s + -(-problems // workers) * (self.per_problem_s + work))
        rounds, left = divmod(problems, workers)
        tail = self.per_problem_s + left * work / workers if left else 0.0
        return max(serial, self.startup_s + rounds * (self.per_problem_s + work) + tail)

    def speedup(self, problems: int, evals: int, workers: int, split: str = "problems") -> float:
        """How much faster ``workers`` workers are than one."""
        return self.wall_s(problems, evals, 1, split) / self.wall_s(problems, evals, workers, split)


@dataclass
class WorkerCosts:
    """The costs of one worker, measured as it runs: :meth:`problem` (or :meth:`took`) after each problem it
    takes up.

    Beside the three costs it keeps what the storage cost (``store_s``: the loop waiting for it, claiming
    points and waiting for the trial writer; ``write_s``: the writer thread storing trials behind the loop)
    and how busy the measuring process was: ``busy_s``, its time on the points (on a GPU, the GPU worker's
    build, verify and time of each point), within the window from the first evaluation's start to the last
    one's end (``first_eval``, ``last_eval``, epoch seconds): :attr:`busy_share`.
    """

    started: float = field(default_factory=lambda: process_start_time())  # epoch seconds
    problems_s: list[float] = field(default_factory=list)  # each problem taken up: its time less its loops
    evals: int = 0
    eval_s: float = 0.0
    store_s: float = 0.0
    write_s: float = 0.0
    busy_s: float = 0.0
    evaluate_s: float = 0.0  # the evaluator's calls: busy_s, and waiting for the points' compiles
    first_eval: float | None = None
    last_eval: float | None = None
    wall_s: float = 0.0
    marks: dict[str, float] = field(default_factory=dict)  # start-up steps: seconds from the process's start

    def mark(self, step: str) -> None:
        """Note that start-up step ``step`` ended now (the first time only): where a start-up's seconds go."""
        self.marks.setdefault(step, round(time.time() - self.started, 3))

    def problem(self, seconds: float, evals: int, eval_s: float, store_s: float = 0.0, *, write_s: float = 0.0,
                busy_s: float = 0.0, first_eval: float | None = None, last_eval: float | None = None,
                evaluate_s: float = 0.0) -> None:
        """A problem taken up for ``seconds`` of wall time, of which its tuning loops took ``eval_s`` for ``evals``
        evaluations, ``store_s`` of that waiting for the storage; ``write_s``: its trials' writes behind the
        loops; ``busy_s``: the measuring process's time on its points, evaluated from ``first_eval`` to
        ``last_eval``; ``evaluate_s``: the loops' calls of the evaluator, ``busy_s`` and the waits for compiles."""
        self.problems_s.append(max(0.0, seconds - eval_s))
        self.evals += evals
        self.eval_s += eval_s
        self.store_s += store_s
        self.write_s += write_s
        self.busy_s += busy_s
        self.evaluate_s += evaluate_s
        if first_eval is not None:
            self.marks.setdefault("first evaluation", round(first_eval - self.started, 3))
            self.first_eval = first_eval if self.first_eval is None else min(self.first_eval, first_eval)
        if last_eval is not None:
            self.last_eval = last_eval if self.last_eval is None else max(self.last_eval, last_eval)

    def took(self, seconds: float, results: Sequence[Any]) -> None:
        """A problem taken up for ``seconds``, whose studies' tuning loops gave ``results``
        (:class:`evotune.running.tuner.TuneResult`)."""
        firsts = [r.first_eval for r in results if r.first_eval is not None]
        lasts = [r.last_eval for r in results if r.last_eval is not None]
        self.problem(seconds, sum(r.new_trials for r in results), sum(r.loop_s for r in results),
                     sum(r.store_s for r in results), write_s=sum(r.write_s for r in results),
                     busy_s=sum(r.busy_s for r in results), first_eval=min(firsts, default=None),
                     last_eval=max(lasts, default=None), evaluate_s=sum(r.evaluate_s for r in results))

    @property
    def window_s(self) -> float:
        """Seconds from the first evaluation's start to the last one's end."""
        return 0.0 if self.first_eval is None or self.last_eval is None else self.last_eval - self.first_eval

    @property
    def compile_wait_s(self) -> float:
        """Of the evaluator's calls, the time before the measuring process took the points: their compiles."""
        return max(0.0, self.evaluate_s - self.busy_s)

    @property
    def busy_share(self) -> float:
        """The share of :attr:`window_s` the measuring process spent on points."""
        return self.busy_s / self.window_s if self.window_s > 0 else 0.0

    def stop(self) -> None:
        self.wall_s = time.time() - self.started

    def model(self) -> CostModel:
        """The worker's costs: ``wall = startup + problems * per_problem + evals * per_eval``."""
        per_problem = statistics.median(self.problems_s) if self.problems_s else 0.0
        startup = self.wall_s - self.eval_s - per_problem * len(self.problems_s)
        n = max(self.evals, 1)
        # the storage's one lock is held for the loop's claims and for the writer's trials
        return CostModel(startup, per_problem, self.eval_s / n, (self.store_s + self.write_s) / n)

    def describe(self) -> str:
        m, n = self.model(), max(self.evals, 1)
        return (f"start-up {m.startup_s:.2f} s, per problem {m.per_problem_s:.3f} s (median of "
                f"{len(self.problems_s)}), per evaluation {m.per_eval_s * 1e3:.1f} ms ({self.store_s / n * 1e3:.1f} "
                f"waiting for the storage, {self.write_s / n * 1e3:.1f} written behind; {self.evals} evaluations), "
                f"measuring {self.busy_s / n * 1e3:.1f} ms per evaluation ({self.compile_wait_s / n * 1e3:.1f} before "
                f"it waiting for compiles), {100 * self.busy_share:.0f}% of the "
                f"{self.window_s:.2f} s from the first evaluation to the last, wall {self.wall_s:.2f} s"
                + (f"; start-up steps: {', '.join(f'{k} {v:.1f} s' for k, v in self.marks.items())}"
                   if self.marks else ""))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "window_s": self.window_s, "busy_share": self.busy_share,
                "compile_wait_s": self.compile_wait_s,
                "model": asdict(self.model())}


def measuring_share(trials: Sequence[Any]) -> tuple[float, float]:
    """(busy, window) of finished Optuna trials: the measuring process's seconds on their points (each trial's
    ``worker_s``, where the GPU evaluator recorded it, else its duration), and the seconds from the first
    trial's start to the last one's completion (a trial's times are its evaluation's own)."""
    timed = [t for t in trials if t.datetime_start is not None and t.datetime_complete is not None]
    if not timed:
        return 0.0, 0.0
    busy = sum(float(t.user_attrs.get("worker_s", (t.datetime_complete - t.datetime_start).total_seconds()))
               for t in timed)
    window = max(t.datetime_complete for t in timed) - min(t.datetime_start for t in timed)
    return busy, window.total_seconds()


def process_start_time() -> float:
    """When this process started, in epoch seconds (Linux: from /proc; elsewhere: when this module was imported)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED
