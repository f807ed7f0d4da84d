"""Speed-up from more workers on one experiment: the same work with 1, 2, ... workers, each on its own GPU.

For each count of workers N the experiment runs afresh (a new study database
and an empty kernel cache, so every run pays for every compile): N processes
of ``evotune worker`` (or ``evotune record`` with ``--record``) share it, each
seeing one GPU through ``CUDA_VISIBLE_DEVICES``. The figure is the wall time
until the last worker ends; the studies are then checked for their trial
counts (exactly the budget, or every feasible point when recording) and for
points measured twice. Each tuning worker measures its own costs (start-up,
per problem, per evaluation; see ``evotune/running/cost_model.py``), and the costs of
the run with one worker predict the speed-up of the others, which the table
shows beside the measured one; with a run of two workers too, the model
learns how much workers slow each other down (their contention for the
storage and the host: :meth:`evotune.running.cost_model.CostModel.learn`) and
predicts again. Each run also counts the kernels its host compiled (the
kernel cache's ``builds.log``: a kernel compiled twice on one host is a
duplicate), and how busy the measuring process was: the GPU worker's seconds
on the points (each trial's ``worker_s``) over the seconds from the first
evaluation's start to the last one's end (the trials' own times), and over the
same window of each study added up (the tuning loops alone, without each
problem's baselines and confirmation between them). The ceiling is the
speed-up the runs would reach if only the lone run's evaluations got N times
as fast: the time outside its window (start-up, the last confirmation) is
every worker's, so no scaling of the evaluations gets past it.

``--storage sqlite,journal`` runs every count on each storage; ``--warm``
fills a kernel cache with one untimed run first, which every timed run then
shares (so little is compiled: a GA breeds from measured times, and a second
run breeds some children the first did not); ``--run``
times ``evotune run`` (one process, as a user runs it) instead of workers.

``--cpu`` runs the same problems, strategies and budget on the CPU against
their recorded landscapes (``--landscapes``, by default the H100 ones in the
repository), without a GPU: the workers' start-up, the per-problem work of
the tuner and the storage, and the claims are real; a GPU evaluation's time is
not (a replayed evaluation is a look-up). ``--problems`` and ``--trials`` make
the run smaller, ``--points`` records excerpts of the landscapes instead.

Usage (``--gpus N`` alone runs 1 and N)::

    python3 benchmarks/scaleout.py experiments/scaleout_int8.toml --gpus 1,2 --storage sqlite,journal
    python3 benchmarks/scaleout.py experiments/gpu_busy_int8.toml --run --warm --gpus 1
    python3 benchmarks/scaleout.py experiments/scaleout_record_int8.toml --record --gpus 1,2,4
    python3 benchmarks/scaleout.py experiments/scaleout_int8.toml --cpu --workers 1,2 --split problems,points
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evotune.measurement.kernel_cache import KernelCache  # noqa: E402
from evotune.running.cost_model import CostModel, measuring_share  # noqa: E402
from evotune.running.experiment import Experiment, load_experiment  # noqa: E402


@dataclass
class Run:
    """One count of workers on the experiment, and what it did."""

    workers: int
    split: str
    storage: str  # sqlite | journal
    seconds: float
    trials: dict[str, int]  # study -> trials
    expected: dict[str, int]  # study -> the trials it must hold
    duplicates: int
    costs: list[dict[str, Any]] = field(default_factory=list)  # each tuning worker's, as --costs writes them
    incomplete: list[str] = field(default_factory=list)  # recording: landscape files that miss points
    builds: int = 0  # kernels compiled on the host (its kernel cache's builds.log)
    kernels: int = 0  # of which different ones
    busy_s: float = 0.0  # the measuring process's seconds on the points
    window_s: float = 0.0  # from the first evaluation's start to the last one's end
    loops_s: float = 0.0  # the same for each study, added up: the tuning loops alone, without what a problem
    #                       costs around them (its baselines, its confirmation)
    inside: dict[str, float] = field(default_factory=dict)  # per trial, ms (samples: a count): see inside_ms

    @property
    def exact(self) -> bool:
        return self.trials == self.expected and self.duplicates == 0 and not self.incomplete


def replay_copy(exp: Experiment, landscapes: Path, work: Path, problems: int | None, trials: int | None,
                points: int | None) -> str:
    """``exp`` as a replay experiment over the recorded landscape of each of its problems (text of its file)."""
    from evotune.core.landscape import landscape_document, load_landscape, write_landscape
    from evotune.running.record import safe_filename

    (space,) = exp.spaces
    paths = []
    for problem in exp.problems[:problems]:
        path = landscapes / f"{safe_filename(f'{space}_{problem.key}')}.json.gz"
        if not path.is_file():
            raise SystemExit(f"--cpu: no recorded landscape {path} for {problem.key}")
        if points is not None:  # an excerpt: its first points only
            ls = load_landscape(path)
            rows = [(dict(zip(ls.names, k, strict=True)), r) for k, r in list(ls.entries.items())[:points]]
            path = write_landscape(work / "landscapes" / path.name,
                                   landscape_document(ls.params, rows, ls.problem, ls.meta, ls.space_name))
        paths.append(str(path))
    strategies = "".join(
        f'\n[[strategy]]\nname = "{s.name}"\nseed = {s.seed}\nrepeats = {s.repeats}\n'
        + (f"options = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in s.options.items())} }}\n"
           if s.options else "")
        for s in exp.strategies)
    budget = "".join(f"{k} = {v}\n" for k, v in (("trials", trials or exp.budget.trials),
                                                  ("seconds", exp.budget.seconds),
                                                  ("plateau", exp.budget.plateau)) if v is not None)
    return (f'name = "{exp.name}"\nspace = "landscape"\n[oracle]\nkind = "replay"\nlandscapes = {json.dumps(paths)}\n'
            f"{strategies}\n[budget]\n{budget}")


def experiment_copy(args: argparse.Namespace, exp: Experiment, work: Path, tag: str, storage: str) -> Path:
    """The experiment file of one run, in ``work``, with a storage of its own (``storage``: sqlite or journal)."""
    if args.cpu:
        text = replay_copy(exp, args.landscapes, work, args.problems, args.trials, args.points)
    else:
        # inputs named by relative paths (a space's .py) must be absolute: the copy is read from `work`
        text = re.sub(r"(?ms)^\[storage\].*?(?=^\[|\Z)", "", exp.path.read_text())
    url = f"sqlite:///{work / tag}.db" if storage == "sqlite" else f"journal:{work / tag}.journal"
    path = work / f"{tag}.toml"
    path.write_text(text + f'\n[storage]\nurl = "{url}"\n')
    return path


def run(args: argparse.Namespace, exp: Experiment, workers: int, split: str, work: Path, storage: str = "sqlite",
        tag: str | None = None) -> Run:
    """``workers`` processes on a fresh copy of the experiment, to the end."""
    import optuna

    from evotune.storage.study import make_storage
    from evotune.storage.summaries import study_names

    tag = tag or f"{storage}-{split}{workers}"
    path = experiment_copy(args, exp, work, tag, storage)
    command = "record" if args.record else "run" if args.run else "worker"
    kernels = work / ("kernels-warm" if args.warm else f"kernels-{tag}")
    env = {**os.environ, "EVOTUNE_KERNEL_CACHE": str(kernels),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.record:
        extra = ["--out", str(work / f"landscapes-{tag}"), "--split", split]
    elif args.run:
        extra = ["--no-progress", "--no-plots"]
    else:
        extra = ["--no-progress", "--split", split]
    builds_before = len(KernelCache(kernels).builds())
    started = time.perf_counter()
    procs = []
    for i in range(workers):
        costs = ["--costs", str(work / f"costs-{tag}-{i}.json")] if command == "worker" else []
        gpu = {} if args.cpu else {"CUDA_VISIBLE_DEVICES": str(i)}
        procs.append(subprocess.Popen([sys.executable, "-m", "evotune", command, str(path), *extra, *costs],
                                      cwd=work, env={**env, **gpu}, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate()[0] for p in procs]
    seconds = time.perf_counter() - started
    for i, log in enumerate(logs):  # beside the run's studies and costs, for a closer look
        (work / f"log-{tag}-{i}.txt").write_text(log)
    if any(p.returncode for p in procs):
        raise SystemExit("a worker failed:\n" + "\n".join(log[-3000:] for log in logs))
    copy = load_experiment(path)
    st = make_storage(copy.record_storage if args.record else copy.storage)
    trials, expected, duplicates, every, loops = {}, {}, 0, [], 0.0
    for name in study_names(st):
        study = optuna.load_study(study_name=name, storage=st)
        every += study.get_trials(deepcopy=False)
        loops += measuring_share(study.get_trials(deepcopy=False))[1]
        keys = [t.user_attrs["key"] for t in study.get_trials(deepcopy=False)]
        trials[name] = len(keys)
        expected[name] = study.user_attrs["feasible"] if args.record else min(copy.budget.trials,
                                                                              study.user_attrs["feasible"])
        duplicates += len(keys) - len(set(keys))
    costs = [json.loads((work / f"costs-{tag}-{i}.json").read_text()) for i in range(workers) if command == "worker"]
    incomplete = []
    if args.record:
        from evotune.core.landscape import load_landscape

        written = {ls.problem.key: ls for ls in map(load_landscape, (work / f"landscapes-{tag}").glob("*.json.gz"))}
        keys = [name.split("/")[1] for name in trials]  # EXPERIMENT/PROBLEM/SPACE/record
        incomplete = [k for k in keys if k not in written or not written[k].meta.get("complete")]
    builds = KernelCache(kernels).builds()[builds_before:]
    busy, window = measuring_share(every)
    return Run(workers, split, storage, seconds, trials, expected, duplicates, costs, incomplete, len(builds),
               len({b["key"] for b in builds}), busy, window, loops, inside_ms(every))


#: the trials' attributes of a GPU evaluation's time: the tuner's wait for the GPU worker, the GPU worker's own
#: time on the request, and of that its verification, its timing and loading the built kernel (neither counts
#: the GPU worker's wait for another process's compile of the kernel: ``waited_s``)
INSIDE = ("worker_s", "served_s", "verify_s", "bench_s", "build_s")


def inside_ms(trials: list[Any]) -> dict[str, float]:
    """The mean of each of :data:`INSIDE` over the trials that have it, in ms; ``delay`` is ``worker_s`` less
    ``served_s``: the pipe both ways and the tuner process's own delays in taking the reply (its other threads);
    ``waited_s``, over every GPU trial, the GPU worker's wait for another process's compile of the kernel (a
    worker beside others on a host meets it where they need one kernel at once);
    ``samples``, the timed samples a trial took (a count), and ``sample``, the time a sample took (``bench_s`` over
    them): the oracle samples until its interval is narrow enough, so noisier timing shows in the first, and a
    slower measuring process in the second."""
    out = {}
    for name in INSIDE:
        values = [float(t.user_attrs[name]) for t in trials if name in t.user_attrs]
        if values:
            out[name] = 1e3 * sum(values) / len(values)
    if "worker_s" in out and "served_s" in out:
        out["delay"] = out["worker_s"] - out["served_s"]
    gpu = [t for t in trials if "worker_s" in t.user_attrs]
    if gpu:  # over every trial: a trial records it only where the GPU worker waited
        out["waited_s"] = 1e3 * sum(float(t.user_attrs.get("waited_s", 0.0)) for t in gpu) / len(gpu)
    timed = [(float(t.user_attrs["bench_s"]), len(t.user_attrs["samples_ms"])) for t in trials
             if "bench_s" in t.user_attrs and t.user_attrs.get("samples_ms")]
    if timed:
        out["samples"] = sum(n for _, n in timed) / len(timed)
        out["sample"] = 1e3 * sum(s / n for s, n in timed) / len(timed)
    return out


def per_eval_s(r: Run) -> float:
    """The per-evaluation cost the workers of ``r`` measured, weighted by their evaluations."""
    evals = sum(c["evals"] for c in r.costs)
    return sum(c["model"]["per_eval_s"] * c["evals"] for c in r.costs) / evals if evals else 0.0


def models(runs: list[Run], r: Run) -> tuple[CostModel | None, CostModel | None]:
    """For run ``r``: the cost model of the lone worker of its split and storage, and that model with the
    contention the run of two workers showed (None where a run is missing)."""
    mates = [o for o in runs if o.split == r.split and o.storage == r.storage and o.costs]
    one = next((CostModel(**o.costs[0]["model"]) for o in mates if o.workers == 1), None)
    two = next((o for o in mates if o.workers == 2), None)
    if one is None or two is None or one.per_eval_s <= 0:
        return one, None
    return one, one.learn(2, per_eval_s(two))


def predictions(runs: list[Run], r: Run, problems: int, evals: int) -> tuple[float | None, float | None]:
    """The speed-up of run ``r`` as the lone worker's costs predict it, and with the contention learned from
    the run of two."""
    one, learned = models(runs, r)
    return tuple(None if m is None else m.speedup(problems, evals, r.workers, r.split)  # type: ignore[return-value]
                 for m in (one, learned))


def lone(runs: list[Run], r: Run) -> Run | None:
    """The run of one worker that ``r`` is compared with: the same split and storage."""
    return next((o for o in runs if o.workers == 1 and o.split == r.split and o.storage == r.storage), None)


def ceiling(one: Run, workers: int) -> float | None:
    """The speed-up of ``workers`` against the lone run ``one`` if its evaluations ran exactly ``workers`` times as
    fast and nothing else changed: what lies outside its evaluations' window (start-up before the first, the last
    problem's confirmation after the last) is paid by every worker, so it bounds the speed-up however well the
    evaluations scale. None without a window."""
    if one.window_s <= 0:
        return None
    return one.seconds / (one.window_s / workers + one.seconds - one.window_s)


def table(runs: list[Run], problems: int, evals: int, unit: str) -> list[str]:
    """The rows printed: each run's wall time, trials, duplicates, kernels compiled, the measuring process's
    share of the evaluations' window, the speed-up, the cost model's predictions and the :func:`ceiling`."""
    lines = [f"| {unit} | storage | split | wall time (s) | trials (studies) | exact | duplicates | kernels compiled "
             "(different) | measuring | speed-up | predicted (1 worker) | predicted (1 and 2 workers) | ceiling |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        one = lone(runs, r)
        speedup = f"{one.seconds / r.seconds:.2f}x" if one else "-"
        bound = ceiling(one, r.workers) if one else None
        alone, contended = (f"{p:.2f}x" if p is not None else "-" for p in predictions(runs, r, problems, evals))
        busy = (f"{100 * r.busy_s / r.window_s:.0f}% of {r.window_s:.1f} s ({100 * r.busy_s / r.loops_s:.0f}% of "
                f"the loops' {r.loops_s:.1f} s)" if r.window_s > 0 and r.loops_s > 0 else "-")
        lines.append(f"| {r.workers} | {r.storage} | {r.split} | {r.seconds:.1f} | {sum(r.trials.values())} "
                     f"({len(r.trials)}) | {'yes' if r.trials == r.expected and not r.incomplete else 'NO'} | "
                     f"{r.duplicates} | {r.builds} ({r.kernels}) | {busy} | {speedup} | {alone} | {contended} | "
                     + (f"{bound:.2f}x |" if bound is not None else "- |"))
    return lines


def cost_lines(runs: list[Run]) -> list[str]:
    """Each tuning worker's measured costs."""
    out = []
    for r in runs:
        if r.inside:
            out.append(f"{r.storage} {r.split} x{r.workers}: per trial "
                       + ", ".join(f"{k} {v:.1f}" if k == "samples" else f"{k} {v:.2f} ms"
                                   for k, v in r.inside.items()))
        for i, c in enumerate(r.costs):
            m = c["model"]
            n = max(c["evals"], 1)
            out.append(f"{r.storage} {r.split} x{r.workers} worker {i}: start-up {m['startup_s']:.2f} s, per problem "
                       f"{m['per_problem_s']:.3f} s ({len(c['problems_s'])} taken up), per evaluation "
                       f"{m['per_eval_s'] * 1e3:.2f} ms ({c['store_s'] / n * 1e3:.2f} waiting for the storage, "
                       f"{c['write_s'] / n * 1e3:.2f} written behind; {c['evals']} evaluations), measuring "
                       f"{c['busy_s'] / n * 1e3:.2f} ms per evaluation ({c.get('compile_wait_s', 0.0) / n * 1e3:.2f} "
                       f"before it waiting for compiles; {100 * c['busy_share']:.0f}% of the "
                       f"{c['window_s']:.1f} s from the first evaluation to the last), wall {c['wall_s']:.1f} s"
                       + ("; start-up: " + ", ".join(f"{k} {v:.1f} s" for k, v in c.get("marks", {}).items())
                          if c.get("marks") else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment", type=Path)
    ap.add_argument("--gpus", default="1,2", help="counts of GPUs (one worker each) to run, e.g. 1,2,4; a single "
                                                  "count N runs 1 and N")
    ap.add_argument("--cpu", action="store_true", help="replay the recorded landscapes on the CPU instead")
    ap.add_argument("--workers", help="with --cpu: counts of workers (default: --gpus)")
    ap.add_argument("--split", default="problems", help="problems, points, or both: problems,points")
    ap.add_argument("--record", action="store_true", help="run `evotune record` (the experiment records)")
    ap.add_argument("--landscapes", type=Path, default=ROOT / "evotune" / "landscapes" / "h100")
    ap.add_argument("--problems", type=int, help="with --cpu: only the first N problems")
    ap.add_argument("--trials", type=int, help="with --cpu: this budget instead of the experiment's")
    ap.add_argument("--points", type=int, help="with --cpu: record excerpts of the landscapes, N points each")
    ap.add_argument("--storage", default="sqlite", help="sqlite, journal, or both: sqlite,journal")
    ap.add_argument("--warm", action="store_true", help="fill one kernel cache with an untimed run first; every "
                                                        "timed run shares it")
    ap.add_argument("--run", action="store_true", help="time `evotune run` (one process) instead of workers")
    ap.add_argument("--json", type=Path, help="write the runs here")
    args = ap.parse_args(argv)
    exp = load_experiment(args.experiment)
    counts = [int(n) for n in (args.workers if args.cpu and args.workers else args.gpus).split(",")]
    if len(counts) == 1 and counts[0] > 1:
        counts = [1, *counts]  # the speed-up needs the run with one
    if args.run and (args.record or counts != [1]):
        raise SystemExit("--run: one process of `evotune run` (--gpus 1), not with --record")
    storages = args.storage.split(",")
    if not set(storages) <= {"sqlite", "journal"}:
        raise SystemExit(f"--storage: sqlite, journal or both, got {args.storage!r}")
    work = Path(tempfile.mkdtemp(prefix="evotune-scale-"))
    if args.warm:
        run(args, exp, 1, "problems", work, storages[0], tag="warm-up")
    runs = [run(args, exp, n, split, work, storage) for storage in storages for split in args.split.split(",")
            for n in counts]
    problems = len(exp.problems[:args.problems]) if args.cpu else len(exp.problems)
    evals = (args.trials or exp.budget.trials) * sum(s.repeats for s in exp.strategies)
    mode = "CPU, replaying recorded landscapes" if args.cpu else "one GPU per worker"
    print(f"{exp.path} ({mode}): {problems} problems, "
          + ("recording every feasible point" if args.record else f"{evals} evaluations each"))
    print("\n".join(table(runs, problems, evals, "workers" if args.cpu else "GPUs")))
    print("\n".join(cost_lines(runs)))
    print(f"the runs' studies, costs and worker logs: {work}")
    if args.json:
        rows = []
        for r in runs:
            alone, contended = predictions(runs, r, problems, evals)
            one = lone(runs, r)
            rows.append({**r.__dict__, "exact": r.exact, "speedup": one.seconds / r.seconds if one else None,
                         "predicted": alone, "predicted_with_contention": contended,
                         "ceiling": ceiling(one, r.workers) if one else None})
        args.json.write_text(json.dumps({"experiment": str(exp.path), "cpu": args.cpu, "record": args.record,
                                         "problems": problems, "evals": evals, "runs": rows}, indent=1))
    return 0 if all(r.exact for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
