"""Speed-up from more GPUs on one study: the same experiment with 1 worker, then with one worker per GPU.

Each configuration runs in a fresh study and a fresh, empty kernel cache, so
both pay for every compile; the workers of a run share the study (and the
claims in its database) and each sees one GPU through CUDA_VISIBLE_DEVICES.
The figure is wall time until the budget is spent, and the study is checked
for duplicates and for the trial count.

Usage (on a machine with N GPUs)::

    python3 benchmarks/scaleout.py experiments/h100_bf16_gemm.toml --gpus 2 --json out.json
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(experiment: Path, gpus: int, work: Path) -> dict:
    import optuna

    from evotune.study import make_storage, study_names

    tag = f"scale{gpus}"
    text = experiment.read_text()
    text = re.sub(r'(?m)^name = ".*"$', f'name = "{tag}"', text, count=1)  # the experiment's, not a strategy's
    text = re.sub(r"(?ms)^\[storage\].*?(?=^\[|\Z)", "", text)
    url = f"sqlite:///{work / tag}.db"
    copy = work / f"{tag}.toml"
    copy.write_text(text + f'\n[storage]\nurl = "{url}"\n')
    env = {**os.environ, "EVOTUNE_KERNEL_CACHE": str(work / f"kernels{gpus}"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "evotune", "worker", str(copy), "--no-progress"], cwd=work,
                              env={**env, "CUDA_VISIBLE_DEVICES": str(g)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for g in range(gpus)]
    logs = [p.communicate()[0] for p in procs]
    seconds = time.perf_counter() - started
    if any(p.returncode for p in procs):
        raise SystemExit("a worker failed:\n" + "\n".join(log[-2000:] for log in logs))
    storage = make_storage(url)
    counts, duplicates = {}, 0
    for name in study_names(storage):
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        keys = [t.user_attrs["key"] for t in trials]
        counts[name] = len(trials)
        duplicates += len(keys) - len(set(keys))
    return {"gpus": gpus, "seconds": seconds, "trials": counts, "duplicates": duplicates,
            "log_tail": [log[-600:] for log in logs]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("experiment", type=Path)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="evotune-scale-"))
    one = run(args.experiment, 1, work)
    many = run(args.experiment, args.gpus, work)
    out = {"experiment": str(args.experiment), "one": one, "many": many, "speedup": one["seconds"] / many["seconds"]}
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
