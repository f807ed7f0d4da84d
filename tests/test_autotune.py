"""evotune.autotune on the CPU, through the Triton interpreter (TRITON_INTERPRET=1), on tiny shapes.

Timings come from a counting ``do_bench`` (tests/autotune_kernels.py); what the tests check is which
configurations were timed and how often, never how long they took.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("RANK", raising=False)


def study_of(kernel, key: dict):
    """The study of one key of an evotune autotuner (its trials are the measured points)."""
    return kernel.decision_store.existing(key, kernel.candidates.space)


def add_key(n: int) -> dict:
    return {"n": n, "x.dtype": "torch.float32", "y.dtype": "torch.float32", "out.dtype": "torch.float32"}


@pytest.mark.slow  # about 1.6 s: kept out of the fast lane (its 3-minute margin)
def test_outputs_identical_to_triton_autotune(kernels, tmp_path: Path) -> None:
    import triton

    import evotune

    n = 100
    x, y = torch.randn(n), torch.randn(n)
    theirs = triton.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench)(kernels.add)
    ours = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                            cache=tmp_path)(kernels.add)
    a, b = torch.empty(n), torch.empty(n)
    theirs[kernels.grid_1d(n)](x, y, a, n)
    ours[kernels.grid_1d(n)](x, y, b, n)
    assert torch.equal(a, b) and torch.equal(b, x + y)
    assert ours.best_config in kernels.ADD_CONFIGS
    assert len(ours.warmup(x, y, b, n, grid=kernels.grid_1d(n))) == len(kernels.ADD_CONFIGS)  # each compiled

    # out += x under timing: reset_to_zero and restore_value protect the output as Triton's do
    for protect in ({"reset_to_zero": ["out"]}, {"restore_value": ["out"]}):
        start = torch.randn(n)
        outs = []
        for deco in (triton.autotune, evotune.autotune):
            extra = {"cache": tmp_path / str(len(outs))} if deco is evotune.autotune else {}
            k = deco(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench, **protect,
                     **extra)(kernels.accumulate)
            out = start.clone()
            k[kernels.grid_1d(n)](x, out, n)
            outs.append(out)
        assert torch.equal(outs[0], outs[1]), protect
        expected = x if "reset_to_zero" in protect else start + x
        assert torch.equal(outs[1], expected)


MATMUL = """
import sys, torch, triton
sys.path.insert(0, {folder!r})
import matmul as mm
import evotune
ours = evotune.autotune(configs=mm.CONFIGS[-3:], key=["M", "N", "K"], warmup=1, rep=10.0, budget=8,
                        cache={cache!r}, confirm=2)(mm.matmul_kernel.fn)
a, b = torch.randn(24, 40), torch.randn(40, 16)
c = mm.matmul(a, b, kernel=ours)
torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
again = triton.autotune(configs=[ours.best_config], key=["M", "N", "K"])(mm.matmul_kernel.fn)
assert torch.equal(mm.matmul(a, b, kernel=again), c)
print(ours.last_decision.how)
"""


@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_matmul_example_matches_torch_and_triton(tmp_path: Path) -> None:
    """The example's matmul (its small tiles: the interpreter is slow on large ones) against torch, and the
    configuration evotune chose run under triton.autotune gives the same output, bit for bit."""
    script = MATMUL.format(folder=str(ROOT / "examples" / "triton_autotune"), cache=str(tmp_path))
    env = {**os.environ, "TRITON_INTERPRET": "1", "EVOTUNE_AUTOTUNE_CACHE": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "confirmed"


def run_add(cache: Path, count: Path, configs: str = "ADD_CONFIGS", n: int = 100, extra: str = "",
            env: dict | None = None) -> subprocess.Popen:
    script = (f"import json, autotune_kernels as k, evotune, torch\n"
              f"kern = evotune.autotune(configs=k.{configs}, key=['n'], do_bench=k.counting_bench,"
              f" cache={str(cache)!r}{extra})(k.add)\n"
              f"x, y, out = torch.arange({n}.0), torch.ones({n}), torch.empty({n})\n"
              f"kern[k.grid_1d({n})](x, y, out, {n})\n"
              f"assert torch.equal(out, x + y)\n"
              f"print(json.dumps({{'config': kern.best_config.all_kwargs(), 'timed': k.counting_bench.calls}}))\n")
    full = {**os.environ, "TRITON_INTERPRET": "1", "AT_COUNT": str(count),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(TESTS), os.environ.get("PYTHONPATH")])),
            **(env or {})}
    return subprocess.Popen([sys.executable, "-c", script], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(p: subprocess.Popen) -> dict:
    out, err = p.communicate()
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_changed_config_list_keeps_earlier_points(kernels, tmp_path: Path) -> None:
    import triton

    import evotune

    n = 64
    x, y = torch.randn(n), torch.randn(n)
    first = evotune.autotune(configs=kernels.ADD_CONFIGS[:2], key=["n"], do_bench=kernels.counting_bench,
                             cache=tmp_path, confirm=0)(kernels.add)
    first[kernels.grid_1d(n)](x, y, torch.empty(n), n)
    assert kernels.counting_bench.calls == 2
    more = [*kernels.ADD_CONFIGS, triton.Config({"BLOCK": 128}, num_warps=4)]
    second = evotune.autotune(configs=more, key=["n"], do_bench=kernels.counting_bench, cache=tmp_path,
                              confirm=0)(kernels.add)
    out = torch.empty(n)
    second[kernels.grid_1d(n)](x, y, out, n)
    assert kernels.counting_bench.calls == 2 + 2  # only the two new configurations were timed
    assert torch.equal(out, x + y)
    trials = study_of(second, add_key(n)).history()
    assert len(trials) == 4 and len({t.key for t in trials}) == 4


def test_cache_only_takes_the_nearest_key_and_says_so(kernels, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    import evotune

    empty = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                             cache=tmp_path, mode="cache-only")(kernels.add)
    with caplog.at_level(logging.WARNING, logger="evotune.autotune"):
        empty[kernels.grid_1d(8)](torch.ones(8), torch.ones(8), torch.empty(8), 8)
    assert "no key is" in caplog.text and empty.best_config is kernels.ADD_CONFIGS[0]
    caplog.clear()

    online = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                              cache=tmp_path)(kernels.add)
    for n in (64, 1024):
        online[kernels.grid_1d(n)](torch.ones(n), torch.ones(n), torch.empty(n), n)
    timed = kernels.counting_bench.calls
    cached = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                              cache=tmp_path, mode="cache-only")(kernels.add)
    out = torch.empty(100)
    with caplog.at_level(logging.WARNING, logger="evotune.autotune"):
        cached[kernels.grid_1d(100)](torch.ones(100), torch.ones(100), out, 100)
    assert kernels.counting_bench.calls == timed  # nothing timed
    assert torch.equal(out, torch.full((100,), 2.0))
    assert "nearest key" in caplog.text and "'n': 64" in caplog.text  # 100 is nearer 64 than 1024
    assert cached.best_config.all_kwargs() == online.cache[(64, *["torch.float32"] * 3)].all_kwargs()


@pytest.fixture(scope="module")
def four_processes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """4 ranks (torch.distributed's variables) started together on one key of one cache, rank 0 last: (the
    cache, what each printed)."""
    tmp = tmp_path_factory.mktemp("four")
    procs = [run_add(tmp / "cache", tmp / "count", env={"AT_PAUSE": "0.02", "RANK": str(r), "WORLD_SIZE": "4"})
             for r in (3, 2, 1, 0)]
    return tmp / "cache", [finish(p) for p in procs]


@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_processes_started_together_agree_and_measure_each_point_once(
        kernels, four_processes: tuple[Path, list[dict]]) -> None:
    import evotune

    cache, results = four_processes
    assert len({json.dumps(r["config"], sort_keys=True) for r in results}) == 1
    assert sum(r["timed"] > 0 for r in results) >= 1
    probe = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], cache=cache)(kernels.add)
    trials = study_of(probe, add_key(100)).history()
    assert len(trials) == len(kernels.ADD_CONFIGS) == len({t.key for t in trials})


@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_processes_without_ranks_agree(kernels, tmp_path: Path) -> None:
    """Two programs on one cache, no ranks: whichever takes the key's decision claim first decides."""
    import evotune

    procs = [run_add(tmp_path / "cache", tmp_path / "count", env={"AT_PAUSE": "0.02"}) for _ in range(2)]
    first, second = finish(procs[0]), finish(procs[1])
    assert first["config"] == second["config"]
    probe = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], cache=tmp_path / "cache")(kernels.add)
    trials = study_of(probe, add_key(100)).history()
    assert len(trials) == len(kernels.ADD_CONFIGS) == len({t.key for t in trials})


@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_second_process_reuses_the_cache_without_timing(four_processes: tuple[Path, list[dict]],
                                                         tmp_path: Path) -> None:
    cache, results = four_processes
    again = finish(run_add(cache, tmp_path / "count"))
    assert again["timed"] == 0 and not (tmp_path / "count").exists()
    assert again["config"] == results[0]["config"]


def test_space_with_named_constraints_and_a_budget(kernels, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    import evotune
    from evotune.core.space import SearchSpace, constraint, ordinal, power_of_two

    space = SearchSpace("add_space", [power_of_two("BLOCK", 8, 256), ordinal("num_warps", [1, 2, 4, 8]),
                                      ordinal("num_stages", [1, 2, 3])],
                        constraints=[constraint("block-fits", lambda p, ctx: p["BLOCK"] <= ctx.args["n"],
                                                "BLOCK {BLOCK} is larger than n")])
    kern = evotune.autotune(space=space, key=["n"], do_bench=kernels.counting_bench, cache=tmp_path, budget=5,
                            confirm=2)(kernels.add)
    n = 64
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    with caplog.at_level(logging.INFO, logger="evotune.autotune"):
        kern[kernels.grid_1d(n)](x, y, out, n)
    assert torch.equal(out, x + y)
    assert "block-fits: BLOCK 128 is larger than n" in caplog.text
    trials = study_of(kern, add_key(n)).history()
    assert len(trials) == 5 and all(t.point["BLOCK"] <= n for t in trials)
    # each trial keeps its launch's program count (the grid at its BLOCK), for the keys that learn from it
    assert all(t.attrs["programs"] == -(-n // t.point["BLOCK"]) for t in trials)
    # measured in evotune's one tuning loop: each trial keeps its wall time, the first its start-up (off the clock)
    assert all(t.attrs["timer"] == "do_bench" and t.attrs["wall_s"] >= 0 for t in trials)
    assert "startup_s" in trials[0].attrs and not any("startup_s" in t.attrs for t in trials[1:])
    assert kern.best_config.kwargs["BLOCK"] <= n
    from evotune.reporting.report import collect_best

    (row,) = collect_best(kern.decision_store.storage)  # what `python -m evotune best --storage` shows
    assert row.confirmed and row.problem_key.startswith("n=64,")
    assert {k: v for k, v in row.config.items() if k in kern.best_config.kwargs} == kern.best_config.kwargs

    caplog.clear()  # a second key learns from the first: its trials are a source of the default strategy
    with caplog.at_level(logging.INFO, logger="evotune.autotune"):
        kern[kernels.grid_1d(128)](torch.ones(128), torch.ones(128), torch.empty(128), 128)
    assert "transfer from key:n=64," in caplog.text
    assert len(study_of(kern, add_key(128)).history()) == 5


def test_export_json_and_vllm_moe(kernels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import evotune
    from evotune.cli import main

    kern = evotune.autotune(configs=kernels.MOE_CONFIGS, key=["M", "N", "E"], do_bench=kernels.counting_bench,
                            cache=tmp_path / "c")(kernels.moe_like)
    for m in (1, 16):
        grid, args = kernels.make_moe_args(m, 32, 8)
        kern[grid](*args)
        assert torch.equal(args[1], args[0])
    monkeypatch.chdir(tmp_path)
    assert main(["export-configs", "--cache", str(tmp_path / "c"), "--out", "all.json"]) == 0
    rows = json.loads((tmp_path / "all.json").read_text())
    assert {r["key"]["M"] for r in rows} == {1, 16} and all(r["kernel"] == "moe_like" for r in rows)
    assert main(["export-configs", "--cache", str(tmp_path / "c"), "--format", "vllm-moe", "--out", "vllm"]) == 0
    (path,) = (tmp_path / "vllm").iterdir()
    assert path.name == "E=8,N=32,device_name=cpu-interpreter.json"
    assert main(["export-configs", "--cache", str(tmp_path / "c"), "--format", "vllm-moe", "--out", "half",
                 "--n-divisor", "2"]) == 0
    assert [p.name for p in (tmp_path / "half").iterdir()] == ["E=8,N=16,device_name=cpu-interpreter.json"]
    # without --out, under runs/ (ignored in a checkout), not among the files of the folder it runs in
    assert main(["export-configs", "--cache", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "runs" / "autotune_configs.json").read_text()) == rows
    assert main(["export-configs", "--cache", str(tmp_path / "c"), "--format", "vllm-moe"]) == 0
    assert [p.name for p in (tmp_path / "runs" / "vllm_configs").iterdir()] == [path.name]
    doc = json.loads(path.read_text())
    assert set(doc) == {"triton_version", "1", "16"}
    for batch in ("1", "16"):
        assert set(doc[batch]) == {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
                                   "num_stages"}


def test_tune_kernel_cli_and_its_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from evotune.cli import main

    ref = f"{TESTS / 'autotune_kernels.py'}:add_tuned"
    keys = tmp_path / "keys.toml"
    keys.write_text('launch = "make_add_args"\n[[key]]\nn = 32\n[[key]]\nn = 48\n')
    cache = tmp_path / "cache"
    assert main(["tune-kernel", ref, "--keys", str(keys), "--cache", str(cache)]) == 0
    assert main(["export-configs", "--cache", str(cache), "--out", str(tmp_path / "x.json")]) == 0
    rows = json.loads((tmp_path / "x.json").read_text())
    assert sorted(r["key"]["n"] for r in rows) == [32, 48]
    capsys.readouterr()

    bad = {
        'launch = "make_add_args"\n[[key]]\nm = 32\n': f"{keys}: key[0].m: not an argument of make_add_args",
        'launch = "nothing"\n[[key]]\nn = 32\n': f"{keys}: launch: autotune_kernels has no function 'nothing'",
        'launch = "make_add_args"\n': f"{keys}: key: expected at least one [[key]] table",
        'launch = "make_add_args"\n[[key]]\n': f"{keys}: key[0]: missing a required argument: 'n'",
        'launch = "make_add_args"\nkeys = 1\n': f"{keys}: keys: unknown field",
        "launch = \n": f"{keys}: not valid TOML",
    }
    for text, message in bad.items():
        keys.write_text(text)
        before = sorted(p.name for p in tmp_path.rglob("*"))
        assert main(["tune-kernel", ref, "--keys", str(keys), "--cache", str(tmp_path / "new")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, (text, err)
        assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing created
    for args, message in [(["nomodule_xyz:k"], "nomodule_xyz: cannot import it"),
                          ([f"{TESTS / 'autotune_kernels.py'}:add"], "add is not decorated with evotune.autotune"),
                          ([f"{TESTS / 'autotune_kernels.py'}:nope"], "no kernel named 'nope'"),
                          (["no_colon"], "MODULE:KERNEL: expected"),
                          ([ref, "--keys", str(tmp_path / "missing.toml")], "missing.toml: no such file")]:
        if "--keys" not in args:
            args = [*args, "--keys", str(keys)]
        assert main(["tune-kernel", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, (args, err)
    assert main(["export-configs", "--cache", str(tmp_path / "none")]) == 2
    assert "no autotune cache at" in capsys.readouterr().err
    assert main(["export-configs", "--cache", str(cache), "--format", "vllm-moe", "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "key field 'M' missing" in err and not (tmp_path / "v").exists()
    assert main(["export-configs", "--cache", str(cache), "--format", "vllm-moe", "--n-divisor", "0"]) == 2
    assert "--n-divisor: expected an integer >= 1" in capsys.readouterr().err


def test_prune_configs_by_and_keyword_launches(kernels, tmp_path: Path) -> None:
    import evotune

    seen = []

    def early(configs, named_args, **kwargs):
        seen.append((len(configs), named_args["n"]))
        return [c for c in configs if c.kwargs["BLOCK"] <= 32]

    def model(**kwargs):
        return kwargs["BLOCK"]  # smaller blocks first

    n = 40
    x, y = torch.randn(n), torch.randn(n)
    kern = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench, cache=tmp_path,
                            prune_configs_by={"early_config_prune": early, "perf_model": model, "top_k": 1})(
        kernels.add)
    out = torch.empty(n)
    kern[kernels.grid_1d(n)](x, y, out, n)
    assert seen == [(3, n)] and kernels.counting_bench.calls == 0  # one config left: nothing to time
    assert kern.best_config.kwargs["BLOCK"] == 16 and torch.equal(out, x + y)
    kern[kernels.grid_1d(n)](x, y, out=out, n=n)  # the same key, given by keyword: looked up, not resolved again
    assert seen == [(3, n)] and len(kern.cache) == 1


def test_a_rank_left_alone_on_a_key_decides_it(kernels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """Rank 1 waits for rank 0's decision only while another process works on the key (rank 0 may never
    launch it: another batch size); alone for RANK_WAIT_S, it decides, and rank 0 later reads that."""
    import evotune
    from evotune.triton_tuning import search

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(search, "RANK_WAIT_S", 0.3)
    kern = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                            cache=tmp_path)(kernels.add)
    with caplog.at_level(logging.INFO, logger="evotune.autotune"):
        kern[kernels.grid_1d(32)](torch.ones(32), torch.ones(32), torch.empty(32), 32)
    assert "rank 1 decides" in caplog.text and kern.last_decision.how == "confirmed"
    monkeypatch.setenv("RANK", "0")
    timed = kernels.counting_bench.calls
    zero = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                            cache=tmp_path)(kernels.add)
    zero[kernels.grid_1d(32)](torch.ones(32), torch.ones(32), torch.empty(32), 32)
    assert kernels.counting_bench.calls == timed and zero.best_config is kern.best_config


def test_where_the_cache_lives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evotune.triton_tuning.cache import cache_url

    monkeypatch.delenv("EVOTUNE_AUTOTUNE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_url(None) == f"sqlite:///{tmp_path}/xdg/evotune/autotune/autotune.db"
    monkeypatch.setenv("EVOTUNE_AUTOTUNE_CACHE", str(tmp_path / "env"))
    assert cache_url(None) == f"sqlite:///{tmp_path}/env/autotune.db"
    assert cache_url(tmp_path / "arg") == f"sqlite:///{tmp_path}/arg/autotune.db"  # the argument wins
    assert cache_url("journal:/x/y.journal") == "journal:/x/y.journal"
    assert cache_url(False) is None


def test_a_journal_file_cache(kernels, tmp_path: Path) -> None:
    """cache="journal:PATH": Optuna's journal file, its claims in a file beside it."""
    import evotune

    url = f"journal:{tmp_path / 'tuned.journal'}"
    first = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench, cache=url)(
        kernels.add)
    first[kernels.grid_1d(16)](torch.ones(16), torch.ones(16), torch.empty(16), 16)
    timed = kernels.counting_bench.calls
    assert timed >= 3 and (tmp_path / "tuned.journal.claims").exists()
    again = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench, cache=url)(
        kernels.add)
    again[kernels.grid_1d(16)](torch.ones(16), torch.ones(16), torch.empty(16), 16)
    assert kernels.counting_bench.calls == timed and again.best_config is first.best_config


def test_compiled_kernel_over_the_device_is_pruned_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check after compiling, on a stand-in for Triton's compiled kernel (the interpreter compiles none)."""
    import triton

    from evotune.triton_tuning import resources

    class Compiled:
        def __init__(self, shared: int, regs: int):
            self.metadata = type("Metadata", (), {"shared": shared})()
            self.n_regs = regs

    class Fn:
        def __init__(self, compiled: Compiled):
            self.compiled = compiled

        def warmup(self, *args, grid, **kwargs):
            return self.compiled

    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(resources, "device_limits", lambda: {"max_shared_mem": 232448, "max_num_regs": 65536})
    config = triton.Config({"BLOCK": 64}, num_warps=8)
    check = resources.over_limits
    assert check(Fn(Compiled(200_000, 128)), (), {"grid": (1,)}, config) is None
    assert check(Fn(Compiled(300_000, 128)), (), {"grid": (1,)}, config) == \
        "shared memory: 300000 bytes, the device allows 232448"
    assert check(Fn(Compiled(1024, 255)), (), {"grid": (1,)}, triton.Config({}, num_warps=16)).startswith(
        "registers: 255 per thread x 16 warps = 130560")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert check(Fn(Compiled(300_000, 255)), (), {"grid": (1,)}, config) is None  # the interpreter: no check
