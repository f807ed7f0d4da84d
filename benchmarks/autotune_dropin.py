"""evotune.autotune against triton.autotune on one GPU: the same matmul and configurations, both ways.

(a) a matmul (examples/triton_autotune/matmul.py, ``--configs`` of its list, at most 16) tuned by
    ``triton.autotune`` and by ``evotune.autotune`` (fresh cache): tuning seconds (every configuration is
    compiled before, so neither counts compiling), each one's pick; the
    outputs of evotune's pick checked bit for bit against the same configuration run under
    ``triton.autotune``, and both against ``torch.matmul``; then every configuration re-timed side by
    side (evotune's confirmation rounds: interleaved, CUDA graphs, cold L2, until each median's 95% CI
    is within 0.5%), which says how far each pick is from the fastest;
(b) a second process on the same cache: the key is read, nothing is timed (its timer's count is 0);
(c) host time per launch of a cached key, ``--launches`` launches of a small matmul (GPU work far below
    the launch cost): the plain kernel with the config given, ``triton.autotune`` and ``evotune.autotune``;
(d) the first call of a new key from cold: each decorator in a new process with an empty Triton cache (and an
    empty evotune cache), compiling included: ``triton.autotune`` builds each configuration when it first times
    it, ``evotune.autotune`` builds the list side by side first (:mod:`evotune.triton_tuning.compile_ahead`).

Prints a compact table and writes everything as JSON to ``--out``; meant to finish within 3 minutes on an H100::

    python benchmarks/autotune_dropin.py --out runs/autotune_dropin.json

Two other modes:

``--triton-tests FILE``: Triton's own autotuner tests (an unmodified copy of Triton's
``python/test/unit/runtime/test_autotuner.py``, kept outside the repository) run twice, plainly and with
``triton.autotune`` swapped for ``evotune.autotune`` from outside the file (the pytest plugin
``benchmarks/triton_tests/evotune_swap.py``, loaded before the file is imported; Triton's ``device`` and
``fresh_knobs`` fixtures from ``triton_fixtures.py`` when no conftest gives them); each test's outcome both
ways, side by side::

    python benchmarks/autotune_dropin.py --triton-tests /tmp/triton/test_autotuner.py --out runs/triton_tests.json

``--moe``: the fused-MoE example's plain kernel (``examples/triton_autotune/fused_moe.py:moe_gemm_kernel``, a
``triton.jit`` kernel launched with its configuration as keyword arguments) tuned as ``tune-kernel --space
--key`` tunes it, for the three batch sizes of ``--moe-keys`` (default ``moe_keys_plain.toml``: Mixtral's layer,
M = 16, 64, 256); then every configuration of the space that its constraints keep at each key (the whole list
evotune chose among) is compiled and timed by the oracle, and each pick is re-timed side by side with that
grid's three fastest (the confirmation's rounds): the pick's time over the grid's best, per batch size::

    python benchmarks/autotune_dropin.py --moe --out runs/autotune_dropin_moe.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "triton_autotune")]

import matmul as mm  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402

import evotune  # noqa: E402
from evotune.measurement.options import ConfirmOptions  # noqa: E402
from evotune.measurement.oracle import Oracle  # noqa: E402
from evotune.measurement.retiming import confirm_rounds  # noqa: E402

KEY = ["M", "N", "K"]
SWAP_PLUGINS = ROOT / "benchmarks" / "triton_tests"
EXAMPLES = ROOT / "examples" / "triton_autotune"


def inputs(size: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(size, size, device="cuda", dtype=dtype, generator=g),
            torch.randn(size, size, device="cuda", dtype=dtype, generator=g))


def tune_seconds(kernel, a: torch.Tensor, b: torch.Tensor) -> tuple[float, torch.Tensor]:
    torch.cuda.synchronize()
    started = time.perf_counter()
    c = mm.matmul(a, b, kernel=kernel)
    torch.cuda.synchronize()
    return time.perf_counter() - started, c


def name(config) -> str:
    return " ".join(f"{k}={v}" for k, v in config.all_kwargs().items())


def side_by_side(configs: list, a: torch.Tensor, b: torch.Tensor) -> dict[str, dict]:
    """Every configuration re-timed in interleaved rounds (the confirmation stage's method)."""
    c = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=a.dtype)
    args = mm.launch_args(a, b, c)
    grid = mm.grid(a.shape[0], b.shape[1])
    oracle = Oracle()
    launches = {}
    for cfg in configs:
        def call(cfg=cfg) -> None:
            mm.matmul_kernel.fn[grid](*args, **cfg.all_kwargs())

        oracle.warm(call)
        launches[name(cfg)] = call
    options = ConfirmOptions(top_k=len(configs), per_round=10, min_rounds=3, max_rounds=20, ci_target=0.005,
                             max_seconds=40.0, warmup_s=0.5)
    result = confirm_rounds(list(launches), lambda n, k: oracle.round(launches[n], k), options,
                            warm=lambda s: (torch.cuda._sleep(int(s * 1.5e9)), torch.cuda.synchronize()))
    return {k: {"median_ms": v.median_ms, "ci95_ms": list(v.ci95_ms)} for k, v in result.items.items()}


def host_us(launch, n: int) -> float:
    """Median over 5 runs of the host time per launch (µs), ``n`` launches each."""
    runs = []
    for _ in range(5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(n):
            launch()
        runs.append((time.perf_counter() - started) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(runs)


def child(cache: str, size: int, configs: int) -> None:
    """(b): the same key in a new process: read from the cache, nothing timed."""
    kernel = evotune.autotune(configs=mm.CONFIGS[:configs], key=KEY, cache=cache)(mm.matmul_kernel.fn)
    a, b = inputs(size, torch.float16)
    seconds, _ = tune_seconds(kernel, a, b)
    print(json.dumps({"timed": kernel.timer.calls, "config": name(kernel.best_config), "seconds": seconds}))


def cold_child(kind: str, size: int, configs: int) -> None:
    """(d): the first call of one decorator in a fresh process (the parent gives it an empty Triton cache)."""
    listed = mm.CONFIGS[:configs]
    if kind == "triton":
        kernel = triton.autotune(configs=listed, key=KEY)(mm.matmul_kernel.fn)
    else:
        kernel = evotune.autotune(configs=listed, key=KEY, cache=tempfile.mkdtemp(prefix="evotune_cold_"))(
            mm.matmul_kernel.fn)
    a, b = inputs(size, torch.float16)
    seconds, _ = tune_seconds(kernel, a, b)
    print(json.dumps({"seconds": seconds, "config": name(kernel.best_config)}))


def cold(size: int, configs: int, env: dict[str, str]) -> dict[str, dict]:
    out = {}
    for kind in ("triton", "evotune"):
        fresh = tempfile.mkdtemp(prefix="triton_cold_")
        done = subprocess.run([sys.executable, __file__, "--cold", kind, "--size", str(size), "--configs",
                               str(configs)], env={**env, "TRITON_CACHE_DIR": fresh}, capture_output=True, text=True,
                              check=True)
        out[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


# -- --triton-tests: Triton's own tests, plainly and with the swap ------------------------------------------------
def junit_outcomes(path: Path) -> dict[str, str]:
    """test id -> passed, failed, error or skipped, from pytest's JUnit XML (in the file's order)."""
    import xml.etree.ElementTree as ET

    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        outcome = next((t for t in ("error", "failure", "skipped") if t in tags), "passed")
        out[case.get("name", "?")] = {"failure": "failed"}.get(outcome, outcome)
    return out


def triton_tests(path: str, out: str) -> None:
    test = Path(path).resolve()
    if not test.is_file():
        sys.exit(f"autotune_dropin: --triton-tests: {path}: no such file")
    outcomes: dict[str, dict[str, str]] = {}
    tails: dict[str, str] = {}
    for label, swap in (("triton.autotune", []), ("evotune.autotune", ["-p", "evotune_swap"])):
        with tempfile.TemporaryDirectory(prefix="triton_tests_") as tmp:
            ini, xml = Path(tmp) / "pytest.ini", Path(tmp) / "report.xml"
            ini.write_text("[pytest]\n")  # no settings of the repository's or the file's folders
            env = {**os.environ, "EVOTUNE_AUTOTUNE_CACHE": str(Path(tmp) / "cache"),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(SWAP_PLUGINS), str(ROOT),
                                                               os.environ.get("PYTHONPATH")]))}
            cmd = [sys.executable, "-m", "pytest", "-q", "-c", str(ini), f"--rootdir={test.parent}", "-p",
                   "no:cacheprovider", "-p", "triton_fixtures", *swap, f"--junitxml={xml}", str(test)]
            done = subprocess.run(cmd, env=env, cwd=test.parent, capture_output=True, text=True)
            tails[label] = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            outcomes[label] = junit_outcomes(xml) if xml.is_file() else {}
    names = list(dict.fromkeys([*outcomes["triton.autotune"], *outcomes["evotune.autotune"]]))
    width = max([len(n) for n in names] + [10])
    print(f"{test.name}: triton {triton.__version__}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
    print(f"{'test':{width}}  {'triton.autotune':>16}  {'evotune.autotune':>16}")
    for n in names:
        theirs, ours = (outcomes[k].get(n, "-") for k in ("triton.autotune", "evotune.autotune"))
        print(f"{n:{width}}  {theirs:>16}  {ours:>16}")
    passed = {k: sum(v == "passed" for v in o.values()) for k, o in outcomes.items()}
    print(f"{'passed':{width}}  {passed['triton.autotune']:>11} of {len(outcomes['triton.autotune']):<3}"
          f"{passed['evotune.autotune']:>12} of {len(outcomes['evotune.autotune']):<3}")
    for label, tail in tails.items():
        if not outcomes[label]:
            print(f"{label}: no report; pytest ended with:\n{tail}")
    doc = {"file": str(test), "triton": triton.__version__, "outcomes": outcomes, "passed": passed, "tails": tails}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1))
    print(f"written: {out}")


# -- --moe: the plain fused-MoE kernel, each pick against its grid ------------------------------------------------
def moe(keys_path: str, out: str, budget: int = 0) -> None:
    import fused_moe as moe_example

    from evotune.measurement.options import TimingOptions
    from evotune.triton_tuning.ahead import load_keys
    from evotune.triton_tuning.compile_ahead import compile_ahead
    from evotune.triton_tuning.configs import LaunchContext
    from evotune.triton_tuning.plain import without_config
    from evotune.triton_tuning.references import load_kernel
    from evotune.triton_tuning.timers import OracleTimer, Timer, WallClockTimer

    gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    source = EXAMPLES / "fused_moe.py"
    # what `tune-kernel fused_moe.py:moe_gemm_kernel --space fused_moe.py:SPACE --key M,N,K,E` loads and launches
    tuned, module = load_kernel(f"{source}:moe_gemm_kernel", f"{source}:SPACE", "M,N,K,E")
    if budget:
        tuned.budget = budget
    tuned.use_cache(tempfile.mkdtemp(prefix="evotune_moe_"))
    keys = load_keys(Path(keys_path), module)
    plain = module.moe_gemm_kernel
    grid_timer: Timer = OracleTimer(rep_ms=2000.0, timing=TimingOptions(min_samples=10, max_samples=50,
                                                                          ci_target=0.02)) if gpu \
        else WallClockTimer()
    rows = []
    for key in keys.keys:
        grid, args, launch_kwargs = keys.launch(**key)
        kwargs = without_config(tuned, launch_kwargs)  # the launch's default configuration: the tuner chooses
        started = time.perf_counter()
        tuned[grid](*args, **kwargs)
        tune_s = time.perf_counter() - started
        pick = tuned.best_config
        fields = tuned.key_fields(dict(zip(tuned.arg_names, args, strict=False)), kwargs)
        trials = tuned.decision_store.existing(fields, tuned.candidates.space).history()

        candidates = tuned.candidates
        fs = candidates.feasible(LaunchContext(args={**dict(zip(tuned.arg_names, args, strict=False)), **kwargs}))
        configs = [candidates.config(fs.point(r)) for r in range(len(fs))]
        grid_started = time.perf_counter()
        compile_ahead(plain, args, {"grid": grid, **kwargs}, configs)

        def call_of(config, grid=grid, args=args, kwargs=kwargs):
            return lambda: plain[grid](*args, **kwargs, **config.all_kwargs())

        timed: dict[str, float] = {}
        for config in configs:
            try:
                timed[name(config)] = grid_timer.measure(call_of(config))[0]
            except Exception:  # a configuration the device refuses is no part of the grid's best
                continue
        grid_s = time.perf_counter() - grid_started
        fastest = sorted((c for c in configs if name(c) in timed), key=lambda c: timed[name(c)])[:3]
        top = {name(c): c for c in fastest}
        result = grid_timer.confirm({n: call_of(c) for n, c in {**top, name(pick): pick}.items()})
        side = {n: it.median_ms for n, it in result.items.items()}
        best = min(top, key=lambda n: side[n])
        x, gate, w = moe_example.make_inputs(key["M"], key["N"], key["K"], key["E"], key.get("dtype", "float16"))
        got = moe_example.fused_moe(x, gate, w, kwargs["top_k"], kernel=plain, config=pick.all_kwargs())
        ref = moe_example.reference(x, gate, w, kwargs["top_k"]).float()
        rows.append({"key": fields, "pick": name(pick), "how": tuned.last_decision.how if tuned.last_decision
                     else "single", "tune_seconds": tune_s, "timed_by_evotune": len(trials), "grid": len(configs),
                     "grid_timed": len(timed), "grid_seconds": grid_s, "pick_ms": side[name(pick)],
                     "grid_best": best, "grid_best_ms": side[best], "pick_over_best": side[name(pick)] / side[best],
                     "max_rel_error": float((got.float() - ref).abs().max() / ref.abs().max())})
    device_name = torch.cuda.get_device_name() if gpu else "cpu-interpreter"
    print(f"{device_name}, triton {triton.__version__}: the plain fused-MoE kernel, tuned as tune-kernel --space "
          f"--key tunes it; each pick and its grid's three fastest re-timed side by side")
    print(f"{'M':>6}{'tune (s)':>10}{'evotune timed':>15}{'grid':>7}{'pick (ms)':>12}{'grid best (ms)':>16}"
          f"{'pick / best':>13}{'rel. error':>12}")
    for r in rows:
        print(f"{r['key']['M']:>6}{r['tune_seconds']:>10.1f}{r['timed_by_evotune']:>15}{r['grid']:>7}"
              f"{r['pick_ms']:>12.4f}{r['grid_best_ms']:>16.4f}{r['pick_over_best']:>13.4f}"
              f"{r['max_rel_error']:>12.2e}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"device": device_name, "triton": triton.__version__, "keys": keys_path,
                                     "rows": rows}, indent=1))
    print(f"written: {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=4096, help="M = N = K of the tuned matmul (default 4096)")
    p.add_argument("--configs", type=int, default=12, help="configurations of the example's list, at most 16")
    p.add_argument("--launches", type=int, default=2000, help="launches per host-overhead run")
    p.add_argument("--out", default="runs/autotune_dropin.json")
    p.add_argument("--triton-tests", metavar="FILE", help="run Triton's test_autotuner.py (a copy, unmodified) "
                                                           "plainly and with evotune.autotune swapped in")
    p.add_argument("--moe", action="store_true", help="the plain fused-MoE kernel: each pick against its grid")
    p.add_argument("--moe-keys", default=str(EXAMPLES / "moe_keys_plain.toml"), help="the keys of --moe")
    p.add_argument("--moe-budget", type=int, default=0, help="evaluations a key of --moe (default tune-kernel's)")
    p.add_argument("--child", metavar="CACHE", help=argparse.SUPPRESS)
    p.add_argument("--cold", choices=("triton", "evotune"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child, args.size, min(args.configs, 16))
        return
    if args.cold:
        cold_child(args.cold, args.size, min(args.configs, 16))
        return
    if args.triton_tests:
        triton_tests(args.triton_tests, args.out)
        return
    if args.moe:
        moe(args.moe_keys, args.out, args.moe_budget)
        return
    if not torch.cuda.is_available():
        sys.exit("autotune_dropin: needs a CUDA GPU")
    configs = mm.CONFIGS[: min(args.configs, 16)]
    cache = tempfile.mkdtemp(prefix="evotune_autotune_")
    a, b = inputs(args.size, torch.float16)

    c0 = torch.empty_like(a)
    for cfg in configs:  # compiled once before either tunes: both tuning times leave compiling out
        mm.matmul_kernel.fn.warmup(*mm.launch_args(a, b, c0), grid=mm.grid(args.size, args.size), **cfg.all_kwargs())
    theirs = triton.autotune(configs=configs, key=KEY)(mm.matmul_kernel.fn)
    ours = evotune.autotune(configs=configs, key=KEY, cache=cache)(mm.matmul_kernel.fn)
    triton_s, c_triton = tune_seconds(theirs, a, b)
    evotune_s, c_ours = tune_seconds(ours, a, b)
    how = ours.last_decision.how if ours.last_decision else None  # "confirmed": the top few re-timed side by side
    same_config = triton.autotune(configs=[ours.best_config], key=KEY)(mm.matmul_kernel.fn)
    c_same = mm.matmul(a, b, kernel=same_config)
    ref = (a.float() @ b.float())
    identical = bool(torch.equal(c_ours, c_same))
    err = {"evotune": float((c_ours.float() - ref).abs().max() / ref.abs().max()),
           "triton": float((c_triton.float() - ref).abs().max() / ref.abs().max())}

    timed = side_by_side(configs, a, b)
    fastest = min(timed, key=lambda k: timed[k]["median_ms"])
    best_ms = timed[fastest]["median_ms"]
    picks = {"evotune": name(ours.best_config), "triton": name(theirs.best_config)}

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, __file__, "--child", cache, "--size", str(args.size),
                           "--configs", str(len(configs))], env=env,
                          capture_output=True, text=True, check=True)
    second = json.loads(done.stdout.strip().splitlines()[-1])

    small_a, small_b = inputs(256, torch.float16, seed=1)
    small_c = torch.empty(256, 256, device="cuda", dtype=torch.float16)
    largs, lgrid = mm.launch_args(small_a, small_b, small_c), mm.grid(256, 256)
    mm.matmul(small_a, small_b, kernel=ours)  # the small key tuned once, outside the host timing
    mm.matmul(small_a, small_b, kernel=theirs)
    chosen = ours.best_config.all_kwargs()
    plain = host_us(lambda: mm.matmul_kernel.fn[lgrid](*largs, **chosen), args.launches)
    host = {"plain_us": plain,
            "triton_autotune_us": host_us(lambda: theirs[lgrid](*largs), args.launches),
            "evotune_autotune_us": host_us(lambda: ours[lgrid](*largs), args.launches)}
    host["evotune_over_plain_us"] = host["evotune_autotune_us"] - plain
    first_call = cold(args.size, len(configs), env)

    out = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "size": args.size,
           "configs": len(configs), "tune_seconds": {"triton": triton_s, "evotune": evotune_s},
           "picks": picks, "side_by_side_ms": timed, "fastest": fastest,
           "pick_vs_fastest": {k: timed[v]["median_ms"] / best_ms for k, v in picks.items()},
           "outputs": {"evotune_pick_bitwise_equal_under_triton": identical, "max_rel_error_vs_torch": err},
           "second_process": second, "host_per_launch": host,
           "evotune_decision": how, "cold_first_call": first_call}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"{out['device']}, triton {out['triton']}, matmul {args.size}^3 fp16, {len(configs)} configurations")
    print(f"{'':34}{'triton.autotune':>18}{'evotune.autotune':>18}")
    print(f"{'tuning (s)':34}{triton_s:>18.2f}{evotune_s:>18.2f}")
    print(f"{'pick / fastest (side by side)':34}{out['pick_vs_fastest']['triton']:>18.4f}"
          f"{out['pick_vs_fastest']['evotune']:>18.4f}")
    for k in ("triton", "evotune"):
        print(f"  {k} pick: {picks[k]}")
    print(f"fastest side by side: {fastest} at {best_ms:.4f} ms")
    print(f"evotune's pick bit-identical under triton.autotune: {identical}; max rel error vs torch: "
          f"evotune {err['evotune']:.2e}, triton {err['triton']:.2e}")
    agree = "same" if second["config"] == picks["evotune"] else "DIFFERENT"
    print(f"second process: {second['timed']} timings, config {agree}, {second['seconds']:.2f} s to first output")
    print(f"host per cached launch (µs): plain {plain:.1f}, triton.autotune {host['triton_autotune_us']:.1f}, "
          f"evotune.autotune {host['evotune_autotune_us']:.1f} (+{host['evotune_over_plain_us']:.1f} over plain)")
    print(f"first call of a new key, empty Triton cache (s, compiling included): triton.autotune "
          f"{first_call['triton']['seconds']:.2f}, evotune.autotune {first_call['evotune']['seconds']:.2f}")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
