"""Speed-up from more workers on one experiment: the same work with 1, 2, ... workers, each on its own GPU.

For each count of workers N the experiment runs afresh (a new study database
and an empty kernel cache, so every run pays for every compile): N processes
of ``evotune worker`` (or ``evotune record`` with ``--record``) share it, each
seeing one GPU through ``CUDA_VISIBLE_DEVICES``. The figure is the wall time
until the last worker ends; the studies are then checked for their trial
counts (exactly the budget, or every feasible point when recording) and for
points measured twice. Each tuning worker measures its own costs (start-up,
per problem, per evaluation; see ``evotune/cost_model.py``), and the costs of
the run with one worker predict the speed-up of the others, which the table
shows beside the measured one.

``--cpu`` runs the same problems, strategies and budget on the CPU against
their recorded landscapes (``--landscapes``, by default the H100 ones in the
repository), without a GPU: the workers' start-up, the per-problem work of
the tuner and the storage, and the claims are real; a GPU evaluation's time is
not (a replayed evaluation is a look-up). ``--problems`` and ``--trials`` make
the run smaller, ``--points`` records excerpts of the landscapes instead.

Usage (``--gpus N`` alone runs 1 and N)::

    python3 benchmarks/scaleout.py experiments/scaleout_int8.toml --gpus 1,2,4
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

from evotune.cost_model import CostModel  # noqa: E402
from evotune.experiment import Experiment, load_experiment  # noqa: E402


@dataclass
class Run:
    """One count of workers on the experiment, and what it did."""

    workers: int
    split: str
    seconds: float
    trials: dict[str, int]  # study -> trials
    expected: dict[str, int]  # study -> the trials it must hold
    duplicates: int
    costs: list[dict[str, Any]] = field(default_factory=list)  # each tuning worker's, as --costs writes them
    incomplete: list[str] = field(default_factory=list)  # recording: landscape files that miss points

    @property
    def exact(self) -> bool:
        return self.trials == self.expected and self.duplicates == 0 and not self.incomplete


def replay_copy(exp: Experiment, landscapes: Path, work: Path, problems: int | None, trials: int | None,
                points: int | None) -> str:
    """``exp`` as a replay experiment over the recorded landscape of each of its problems (text of its file)."""
    from evotune.evaluation.landscape import landscape_document, load_landscape, write_landscape
    from evotune.record import safe_filename

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


def experiment_copy(args: argparse.Namespace, exp: Experiment, work: Path, tag: str) -> Path:
    """The experiment file of one run, in ``work``, with a storage of its own."""
    if args.cpu:
        text = replay_copy(exp, args.landscapes, work, args.problems, args.trials, args.points)
    else:
        # inputs named by relative paths (a space's .py) must be absolute: the copy is read from `work`
        text = re.sub(r"(?ms)^\[storage\].*?(?=^\[|\Z)", "", exp.path.read_text())
    url = f"sqlite:///{work / tag}.db"
    path = work / f"{tag}.toml"
    path.write_text(text + f'\n[storage]\nurl = "{url}"\n')
    return path


def run(args: argparse.Namespace, exp: Experiment, workers: int, split: str, work: Path) -> Run:
    """``workers`` processes on a fresh copy of the experiment, to the end."""
    import optuna

    from evotune.study import make_storage, study_names

    tag = f"{split}{workers}"
    path = experiment_copy(args, exp, work, tag)
    command = "record" if args.record else "worker"
    env = {**os.environ, "EVOTUNE_KERNEL_CACHE": str(work / f"kernels-{tag}"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    extra = ["--out", str(work / f"landscapes-{tag}")] if args.record else ["--no-progress"]
    started = time.perf_counter()
    procs = []
    for i in range(workers):
        costs = [] if args.record else ["--costs", str(work / f"costs-{tag}-{i}.json")]
        gpu = {} if args.cpu else {"CUDA_VISIBLE_DEVICES": str(i)}
        procs.append(subprocess.Popen([sys.executable, "-m", "evotune", command, str(path), "--split", split,
                                       *extra, *costs], cwd=work, env={**env, **gpu}, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate()[0] for p in procs]
    seconds = time.perf_counter() - started
    if any(p.returncode for p in procs):
        raise SystemExit("a worker failed:\n" + "\n".join(log[-3000:] for log in logs))
    copy = load_experiment(path)
    storage = make_storage(copy.record_storage if args.record else copy.storage)
    trials, expected, duplicates = {}, {}, 0
    for name in study_names(storage):
        study = optuna.load_study(study_name=name, storage=storage)
        keys = [t.user_attrs["key"] for t in study.get_trials(deepcopy=False)]
        trials[name] = len(keys)
        expected[name] = study.user_attrs["feasible"] if args.record else min(copy.budget.trials,
                                                                              study.user_attrs["feasible"])
        duplicates += len(keys) - len(set(keys))
    costs = [json.loads((work / f"costs-{tag}-{i}.json").read_text()) for i in range(workers) if not args.record]
    incomplete = []
    if args.record:
        from evotune.evaluation.landscape import load_landscape

        written = {ls.problem.key: ls for ls in map(load_landscape, (work / f"landscapes-{tag}").glob("*.json.gz"))}
        keys = [name.split("/")[1] for name in trials]  # EXPERIMENT/PROBLEM/SPACE/record
        incomplete = [k for k in keys if k not in written or not written[k].meta.get("complete")]
    return Run(workers, split, seconds, trials, expected, duplicates, costs, incomplete)


def table(runs: list[Run], problems: int, evals: int, unit: str) -> list[str]:
    """The rows printed: each run's wall time, trials, duplicates, speed-up, and the cost model's prediction."""
    lines = [f"| {unit} | split | wall time (s) | trials (studies) | exact | duplicates | speed-up | predicted |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        one = next((o for o in runs if o.workers == 1 and o.split == r.split), None)
        speedup = f"{one.seconds / r.seconds:.2f}x" if one else "-"
        predicted = "-"
        if one is not None and one.costs:
            predicted = f"{CostModel(**one.costs[0]['model']).speedup(problems, evals, r.workers, r.split):.2f}x"
        lines.append(f"| {r.workers} | {r.split} | {r.seconds:.1f} | {sum(r.trials.values())} ({len(r.trials)}) | "
                     f"{'yes' if r.trials == r.expected and not r.incomplete else 'NO'} | {r.duplicates} | "
                     f"{speedup} | {predicted} |")
    return lines


def cost_lines(runs: list[Run]) -> list[str]:
    """Each tuning worker's measured costs."""
    out = []
    for r in runs:
        for i, c in enumerate(r.costs):
            m = c["model"]
            out.append(f"{r.split} x{r.workers} worker {i}: start-up {m['startup_s']:.2f} s, per problem "
                       f"{m['per_problem_s']:.3f} s ({len(c['problems_s'])} taken up), per evaluation "
                       f"{m['per_eval_s'] * 1e3:.2f} ms ({m['serial_eval_s'] * 1e3:.2f} writing to the storage; "
                       f"{c['evals']} evaluations), wall {c['wall_s']:.1f} s")
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
    ap.add_argument("--landscapes", type=Path, default=ROOT / "experiments" / "landscapes" / "h100")
    ap.add_argument("--problems", type=int, help="with --cpu: only the first N problems")
    ap.add_argument("--trials", type=int, help="with --cpu: this budget instead of the experiment's")
    ap.add_argument("--points", type=int, help="with --cpu: record excerpts of the landscapes, N points each")
    ap.add_argument("--json", type=Path, help="write the runs here")
    args = ap.parse_args(argv)
    exp = load_experiment(args.experiment)
    counts = [int(n) for n in (args.workers if args.cpu and args.workers else args.gpus).split(",")]
    if len(counts) == 1 and counts[0] > 1:
        counts = [1, *counts]  # the speed-up needs the run with one
    work = Path(tempfile.mkdtemp(prefix="evotune-scale-"))
    runs = [run(args, exp, n, split, work) for split in args.split.split(",") for n in counts]
    problems = len(exp.problems[:args.problems]) if args.cpu else len(exp.problems)
    evals = (args.trials or exp.budget.trials) * sum(s.repeats for s in exp.strategies)
    mode = "CPU, replaying recorded landscapes" if args.cpu else "one GPU per worker"
    print(f"{exp.path} ({mode}): {problems} problems, "
          + ("recording every feasible point" if args.record else f"{evals} evaluations each"))
    print("\n".join(table(runs, problems, evals, "workers" if args.cpu else "GPUs")))
    print("\n".join(cost_lines(runs)))
    if args.json:
        args.json.write_text(json.dumps({"experiment": str(exp.path), "cpu": args.cpu, "record": args.record,
                                         "problems": problems, "evals": evals,
                                         "runs": [{**r.__dict__, "exact": r.exact} for r in runs]}, indent=1))
    return 0 if all(r.exact for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
