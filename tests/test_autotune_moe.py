"""The fused-MoE example: vLLM's 1,920-config grid as a space with named constraints, searched within a budget
by evotune's default strategy, on the CPU through the Triton interpreter (tiny shapes)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "triton_autotune"


@pytest.fixture
def moe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # the module, imported with TRITON_INTERPRET set
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("EVOTUNE_AUTOTUNE_CACHE", str(tmp_path / "default"))
    monkeypatch.syspath_prepend(str(EXAMPLES))
    module = importlib.import_module("fused_moe")
    yield module
    sys.modules.pop("fused_moe", None)


def test_space_is_vllms_grid_and_prunes_with_reasons(moe) -> None:
    from evotune.triton_tuning.configs import LaunchContext

    assert moe.SPACE.size == 1920
    a = torch.empty(0, dtype=torch.float16)
    mixtral = LaunchContext(args={"M": 64, "N": 14336 // 8, "K": 4096, "E": 8, "top_k": 2, "a": a})
    from evotune.triton_tuning.configs import Candidates

    fs = Candidates.from_space(moe.SPACE).feasible(mixtral)
    assert 0 < len(fs) < 1920
    # 64 x 2 / 8 = 16 tokens an expert on average: 64-row tiles are mostly padding, 16-row ones split each expert
    assert set(fs.pruned) == {"block-m-vs-tokens-per-expert", "block-m-over-tokens-per-expert", "shared-memory"}
    assert "BLOCK_SIZE_M 64 is over twice the tokens" in fs.reasons["block-m-vs-tokens-per-expert"]
    assert "BLOCK_SIZE_M 16 is no more than the tokens" in fs.reasons["block-m-over-tokens-per-expert"]
    assert {fs.point(i)["BLOCK_SIZE_M"] for i in range(len(fs))} == {32}
    big = LaunchContext(args={"M": 4096, "N": 14336 // 8, "K": 4096, "E": 8, "top_k": 2, "a": a})
    prefill = Candidates.from_space(moe.SPACE).feasible(big)
    assert len(prefill) > len(fs) and "accumulator-registers" in prefill.pruned


RECORDED = sorted((ROOT / "evotune" / "landscapes").glob("autotune_moe*/*.json.gz"))


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shared_memory_rule_is_what_the_compiler_asked_for(moe, path: Path) -> None:
    """The space's shared-memory rule against every configuration of vLLM's grid built on an H100 and an H200
    (the shipped landscapes, bf16): the rule keeps exactly those that Triton built within the block's shared
    memory (``num_stages`` buffers of a 64-row or wider tile, one fewer of a 16- or 32-row one), and prunes
    exactly those refused for it."""
    from evotune.core.landscape import load_landscape
    from evotune.core.result import Status
    from evotune.triton_tuning.configs import LaunchContext

    rule = next(c for c in moe.SPACE.constraints if c.name == "shared-memory")
    ctx = LaunchContext(args={"a": torch.empty(0, dtype=torch.bfloat16)})
    landscape = load_landscape(path)
    assert len(landscape) == moe.SPACE.size
    wrong = []
    for values, result in landscape.entries.items():
        point = dict(zip(landscape.names, values, strict=True))
        ok = result.status is Status.OK
        refused = not ok and "shared memory" in (result.message or "")
        if (rule.reason(point, ctx) is None) == refused or (not ok and not refused):
            wrong.append((values, result.status.value, result.message))
    assert not wrong


#: vLLM's get_default_config (vllm/model_executor/layers/fused_moe/fused_moe.py) for a 16-bit or per-tensor fp8
#: MoE and for block-scaled fp8 (block 128), num_warps and num_stages at Triton's defaults where vLLM leaves them out
VLLM_DEFAULTS = [
    ((1, 8, 0), (16, 32, 64, 1, 4, 3)), ((8, 8, 0), (16, 32, 64, 1, 4, 3)), ((9, 8, 0), (64, 64, 32, 8, 4, 3)),
    ((256, 256, 0), (16, 32, 64, 1, 4, 3)), ((4096, 256, 0), (64, 64, 32, 8, 4, 3)),
    ((16, 8, 128), (64, 128, 128, 32, 4, 3)),
]


@pytest.mark.parametrize(("args", "want"), VLLM_DEFAULTS)
def test_default_is_vllms_default(moe, args: tuple[int, int, int], want: tuple[int, ...]) -> None:
    """What a tuned configuration is timed against is the configuration vLLM launches without a tuned file."""
    names = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
    assert moe.default_config(*args) == dict(zip(names, want, strict=True))
    assert moe.config_for(args[0], args[1], None, args[2]) == moe.default_config(*args)


TUNE = """
import json, sys, torch
sys.path.insert(0, {folder!r})
import fused_moe as moe
import evotune

calls = []


def bench(fn, quantiles=None):
    calls.append(1)
    fn()
    return [float(len(calls) % 5 + 1)] * 3  # a made-up time: only which points are timed is checked


kernel = evotune.autotune(space=moe.SPACE, key=["M", "N", "K", "E"], budget=4, confirm=2, do_bench=bench,
                          cache={cache!r})(moe.moe_gemm_kernel)
tokens, hidden, inter, experts, top_k = 8, 64, 32, 4, 2
g = torch.Generator().manual_seed(0)
x, gate = torch.randn(tokens, hidden, generator=g), torch.randn(hidden, experts, generator=g)
w = torch.randn(experts, inter, hidden, generator=g) / hidden**0.5
out = moe.fused_moe(x, gate, w, top_k, kernel=kernel)
torch.testing.assert_close(out, moe.reference(x, gate, w, top_k), rtol=1e-4, atol=1e-4)
args = moe.make_launch(x, w, *moe.route(x, gate, top_k), top_k)[1]
fields = kernel.key_fields(dict(zip(kernel.arg_names, args)), {{}})
trials = kernel.decision_store.existing(fields, moe.SPACE).history()
print(json.dumps({{"points": [t.point for t in trials], "how": kernel.last_decision.how}}))
"""


@pytest.mark.slow  # Triton kernels through the interpreter, in other processes
def test_tuned_within_budget_matches_torch(tmp_path: Path) -> None:
    """In a process of its own: the kernel calls triton.language's jit'd helpers (tl.zeros), which the
    interpreter runs only when TRITON_INTERPRET was set before triton was imported."""
    script = TUNE.format(folder=str(EXAMPLES), cache=str(tmp_path))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(EXAMPLES.parents[1])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    points = got["points"]
    assert len(points) == 4 == len({json.dumps(p, sort_keys=True) for p in points})  # the budget, each once
    assert all(p["BLOCK_SIZE_M"] == 16 and p["BLOCK_SIZE_K"] == 64 for p in points)  # the constraints held
    assert got["how"] == "confirmed"


USE = """
import json, sys, torch
sys.path.insert(0, {folder!r})
import fused_moe as moe

doc = json.load(open({file!r}))
configs = {{int(b): c for b, c in doc.items() if b != "triton_version"}}
config = moe.config_for(8, 4, configs)
g = torch.Generator().manual_seed(1)
x, gate = torch.randn(8, 64, generator=g), torch.randn(64, 4, generator=g)
w = torch.randn(4, 32, 64, generator=g) / 8
out = moe.fused_moe(x, gate, w, 2, kernel=moe.moe_gemm_kernel, config=config)  # the plain launch, **config
torch.testing.assert_close(out, moe.reference(x, gate, w, 2), rtol=1e-4, atol=1e-4)
print(json.dumps(config))
"""


@pytest.mark.slow  # the plain kernel tuned through the interpreter by the command line, in other processes
def test_tune_kernel_tunes_the_plain_kernel_and_its_launch_reads_the_export(tmp_path: Path) -> None:
    """The example's kernel as vLLM writes one: plain, launched with its configuration as keyword arguments.
    ``tune-kernel`` tunes it with ``--space`` and ``--key`` (its keys' launches pass a default configuration,
    dropped), ``export-configs`` writes vLLM's file, and the plain launch with the configuration read from it
    matches torch."""
    keys = tmp_path / "keys.toml"
    keys.write_text('launch = "make_vllm_args"\n[[key]]\nM = 8\nN = 32\nK = 64\nE = 4\ndtype = "float32"\n')
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(EXAMPLES.parents[1])}
    source = EXAMPLES / "fused_moe.py"
    for args in (["tune-kernel", f"{source}:moe_gemm_kernel", "--space", f"{source}:SPACE", "--key", "M,N,K,E",
                  "--keys", str(keys), "--cache", str(tmp_path / "cache")],
                 ["export-configs", "--cache", str(tmp_path / "cache"), "--format", "vllm-moe", "--out",
                  str(tmp_path / "vllm")]):
        done = subprocess.run([sys.executable, "-m", "evotune", *args], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    (path,) = (tmp_path / "vllm").iterdir()
    assert path.name == "E=4,N=32,device_name=cpu-interpreter.json"
    script = USE.format(folder=str(EXAMPLES), file=str(path))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout.strip().splitlines()[-1])
    assert config["BLOCK_SIZE_M"] == 16 and config["BLOCK_SIZE_N"] == 32  # the constraints held at M = 8
