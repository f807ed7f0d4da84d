"""evotune.autotune in triton.autotune's place, checked in Triton's terms: what Triton's own autotuner tests check
(the key and ``kernel.cache``, the default benchmarker, ``restore_value`` / ``reset_to_zero``, hooks around a
configuration the device refuses, ``prune_configs_by``, the error when nothing is left, ``ir_override``), plus
its signature, the attributes it exposes, and a decision keyed by the build (Triton, backend, tools, knobs).

Kernels run on the CPU through the Triton interpreter; what only a GPU does (a configuration refused when
its binary is loaded) runs on :class:`OnDevice`, a stand-in for a jit kernel on a GPU (the real ones:
tests/test_autotune_gpu.py).
"""

from __future__ import annotations

import importlib
import inspect
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.fixture(autouse=True)
def interpreter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("EVOTUNE_AUTOTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RANK", raising=False)


def bench_recording(timed: list[Any]) -> Callable[..., list[float]]:
    """A do_bench that launches once and answers a made-up time by the launch's order (first fastest)."""

    def do_bench(call, quantiles=None):
        call()
        timed.append(len(timed))
        return [float(len(timed))] * 3

    return do_bench


# -- the key and kernel.cache -------------------------------------------------------------------------------

def test_one_key_in_any_argument_order_shares_a_decision(kernels) -> None:
    import evotune

    kern = evotune.autotune(kernels.ADD_CONFIGS, ["n"], do_bench=kernels.counting_bench)(kernels.add)
    x, y, out = torch.randn(40), torch.randn(40), torch.empty(40)
    kern[kernels.grid_1d(40)](x, y, out, 40)
    timed = kernels.counting_bench.calls
    assert timed >= len(kernels.ADD_CONFIGS) and len(kern.cache) == 1
    out2 = torch.empty(40)
    kern[kernels.grid_1d(40)](n=40, out=out2, y=y, x=x)  # the same key, by keyword in another order
    assert len(kern.cache) == 1 and kernels.counting_bench.calls == timed and torch.equal(out2, x + y)
    kern[kernels.grid_1d(20)](x[:20], y=y[:20], n=20, out=out2[:20])  # another key
    assert len(kern.cache) == 2 and kernels.counting_bench.calls > timed
    assert set(kern.cache) == {(40, *["torch.float32"] * 3), (20, *["torch.float32"] * 3)}
    assert all(c in kernels.ADD_CONFIGS for c in kern.cache.values())


def test_the_default_benchmarker_times_every_config(kernels) -> None:
    """No do_bench: on a GPU evotune's oracle, under the interpreter the wall clock; each config timed."""
    import evotune

    kern = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"])(kernels.add)
    x, y, out = torch.randn(30), torch.randn(30), torch.empty(30)
    kern[kernels.grid_1d(30)](x, y, out, 30)
    assert kern.timer.kind == "wall-clock" and len(kern.cache) == 1 and torch.equal(out, x + y)
    assert set(kern.configs_timings) == set(kernels.ADD_CONFIGS)


@pytest.mark.parametrize("by_keyword", [False, True])
def test_restore_value_and_reset_to_zero_leave_one_launchs_result(kernels, by_keyword: bool,
                                                                  tmp_path: Path) -> None:
    import evotune

    n = 50
    x, start = torch.randn(n), torch.randn(n)
    for protect, expected in (({"restore_value": ["out"]}, start + x), ({"reset_to_zero": ["out"]}, x)):
        kern = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                                cache=tmp_path / next(iter(protect)), **protect)(kernels.accumulate)
        out = start.clone()
        if by_keyword:
            kern[kernels.grid_1d(n)](x=x, out=out, n=n)
        else:
            kern[kernels.grid_1d(n)](x, out, n)
        assert kernels.counting_bench.calls >= 3  # out += x ran once per timing, and once more
        assert torch.equal(out, expected), protect
        kernels.counting_bench.calls = 0


@pytest.mark.parametrize("protect", ["reset_to_zero", "restore_value"])
def test_an_optional_tensor_left_none_is_skipped_by_the_default_hooks(kernels, protect: str) -> None:
    import evotune

    kern = evotune.autotune(configs=kernels.ADD_CONFIGS, key=["n"], do_bench=kernels.counting_bench,
                            **{protect: ["extra"]})(kernels.bump)
    dst = torch.full((24,), 2.0)
    kern[kernels.grid_1d(24)](None, dst, 24)
    assert torch.equal(dst, torch.ones(24)) and kernels.counting_bench.calls >= 3


# -- hooks around a configuration the device refuses ---------------------------------------------------------

def add_on_device(x, y, out, n):
    """The kernel :class:`OnDevice` stands for: out = x + y (its source is the kernel's identity)."""


class Compiled:
    """A compiled kernel as Triton's launcher holds it: its metadata, and a loader that raises Triton's
    OutOfResources for a configuration past the device's limit, as ``CompiledKernel._init_handles`` does."""

    def __init__(self, shared: int, refusal: Exception | None):
        self.metadata = SimpleNamespace(shared=shared)
        self.n_regs = 0
        self.refusal = refusal

    def _init_handles(self) -> None:
        if self.refusal is not None:
            raise self.refusal


class OnDevice:
    """A jit kernel as a GPU runs it, where the interpreter skips a step: building a configuration gives its
    :class:`Compiled` (evotune reads its metadata before timing), and a launch loads the binary first (the
    device's refusal is raised there, before anything runs), then computes ``out = x + y``."""

    arg_names = ["x", "y", "out", "n"]

    def __init__(self, refuse: Callable[[dict], Exception | None], shared: Callable[[dict], int]):
        self.fn, self.refuse, self.shared = add_on_device, refuse, shared
        self.launched: list[dict] = []

    def warmup(self, *args, grid, **options):
        return Compiled(self.shared(options), self.refuse(options))

    def run(self, x, y, out, n, *, grid, warmup, **options):
        self.warmup(x, y, out, n, grid=grid, **options)._init_handles()
        self.launched.append(options)
        out.copy_(x + y)


SHARED_LIMIT = 232448


@pytest.fixture
def gpu_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """evotune's path for a compiled kernel (no interpreter), with an H100's limits for :class:`OnDevice`."""
    from evotune.triton_tuning import resources

    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(resources, "device_limits", lambda: {"max_shared_mem": SHARED_LIMIT, "max_num_regs": 65536})


def _over(resource: str) -> tuple[Callable[[dict], Exception | None], Callable[[dict], int], Any]:
    """(refuse, shared bytes, the config the device refuses) for a configuration out of ``resource``."""
    from triton.runtime.errors import OutOfResources

    def shared(o: dict) -> int:
        return 4 * o["BLOCK"] * o["num_stages"]

    if resource == "shared memory":
        bad = triton.Config({"BLOCK": 4096}, num_stages=64)
        return (lambda o: OutOfResources(shared(o), SHARED_LIMIT, resource) if shared(o) > SHARED_LIMIT else None,
                shared, bad)
    if resource == "threads":
        bad = triton.Config({"BLOCK": 64}, num_warps=128)
        return (lambda o: OutOfResources(o["num_warps"] * 32, 1024, resource) if o["num_warps"] * 32 > 1024
                else None), shared, bad
    bad = triton.Config({"BLOCK": 256}, num_warps=4)  # tensor memory: a 256-column accumulator x 5 > 512
    return (lambda o: OutOfResources(o["BLOCK"] // 128 * 320, 512, resource) if o["BLOCK"] > 128 else None,
            shared, bad)


@pytest.mark.parametrize("resource", ["shared memory", "threads", "tensor memory"])
def test_hooks_are_paired_and_the_post_hook_gets_the_launchs_out_of_resources(resource: str, gpu_path) -> None:
    import evotune

    refuse, shared, bad = _over(resource)
    good = [triton.Config({"BLOCK": 32}, num_warps=2), triton.Config({"BLOCK": 64}, num_warps=4)]
    seen: dict[str, Any] = {"open": 0, "pre": 0, "post": 0, "unpaired": 0, "exceptions": []}

    def pre_hook(nargs, reset_only=False):
        if reset_only:  # outputs reset after tuning: no launch follows, no post_hook
            return
        seen["open"] += 1
        seen["pre"] += 1

    def post_hook(nargs, exception):
        seen["open"] -= 1
        seen["post"] += 1
        seen["unpaired"] += seen["open"] != 0
        if exception is not None:
            seen["exceptions"].append(exception)

    device = OnDevice(refuse, shared)
    timed: list[int] = []
    kern = evotune.autotune([bad, *good], ["n"], pre_hook=pre_hook, post_hook=post_hook,
                            do_bench=bench_recording(timed))(device)
    x, y, out = torch.randn(16), torch.randn(16), torch.empty(16)
    kern[(1,)](x, y, out, 16)

    (exc,) = seen["exceptions"]
    from triton.runtime.errors import OutOfResources

    assert isinstance(exc, OutOfResources) and exc.name == resource
    assert str(exc).startswith(f"out of resource: {resource}, Required: ")
    assert seen["unpaired"] == 0 and seen["post"] == seen["pre"] > 0
    assert torch.equal(out, x + y) and kern.best_config in good  # the launch ran with another config
    assert kern.configs_timings[bad] == [float("inf")] * 3
    trials = kern.decision_store.existing(kern.key_fields({"x": x, "y": y, "out": out, "n": 16}, {}),
                                        kern.candidates.space).history()
    (refused,) = [t for t in trials if kern.candidates.config(t.point) is bad]
    assert refused.status.value == "infeasible" and f"out of resource: {resource}" in refused.attrs["message"]


# -- prune_configs_by -----------------------------------------------------------------------------------------

def test_early_config_prune_gets_triton_arguments_and_is_matched_by_value(kernels) -> None:
    import evotune

    calls = []

    def early(configs, named_args, **kwargs):
        calls.append((configs, dict(named_args), sorted(kwargs)))
        # new objects, equal in value to the first two listed
        return [triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages) for c in configs[:2]]

    timed: list[int] = []
    kern = evotune.autotune(kernels.ADD_CONFIGS, ["n"], {"early_config_prune": early},
                            do_bench=bench_recording(timed))(kernels.add)
    x, y, out = torch.randn(33), torch.randn(33), torch.empty(33)
    kern[kernels.grid_1d(33)](x, y, out, n=33)
    ((configs, named_args, kwargs),) = calls
    assert configs == kernels.ADD_CONFIGS  # the user's list
    assert sorted(named_args) == ["out", "x", "y"] and "n" in kwargs  # positional, then keyword arguments
    assert {c.kwargs["BLOCK"] for c in kern.configs_timings} == {16, 32}  # exactly the two returned were timed
    assert kern.best_config in kernels.ADD_CONFIGS[:2] and torch.equal(out, x + y)


def test_early_config_prune_may_return_a_config_not_listed(kernels) -> None:
    import evotune

    extra = triton.Config({"BLOCK": 128}, num_warps=8)
    kern = evotune.autotune(kernels.ADD_CONFIGS, ["n"], {"early_config_prune": lambda cs, nargs, **kw: [cs[0], extra]},
                            do_bench=kernels.counting_bench, confirm=0)(kernels.add)
    x, y, out = torch.randn(200), torch.randn(200), torch.empty(200)
    kern[kernels.grid_1d(200)](x, y, out, 200)
    assert set(kern.configs_timings) == {kernels.ADD_CONFIGS[0], extra} and torch.equal(out, x + y)
    out2 = torch.empty(100)
    kern[kernels.grid_1d(100)](x[:100], y[:100], out2, 100)  # the next key is offered the user's list again
    assert torch.equal(out2, x[:100] + y[:100])


def test_perf_model_keeps_the_top_k_estimates_and_a_fraction_keeps_one(kernels) -> None:
    import evotune

    estimated, timed = [], []

    def perf_model(**kwargs):
        estimated.append(kwargs["BLOCK"])
        return -kwargs["BLOCK"]  # larger blocks estimated faster

    kern = evotune.autotune(kernels.ADD_CONFIGS, ["n"], {"perf_model": perf_model, "top_k": 2},
                            do_bench=bench_recording(timed))(kernels.add)
    x, y, out = torch.randn(70), torch.randn(70), torch.empty(70)
    kern[kernels.grid_1d(70)](x, y, out, 70)
    assert sorted(estimated) == [16, 32, 64] and {c.kwargs["BLOCK"] for c in kern.configs_timings} == {32, 64}

    def no_bench(call, quantiles=None):
        raise AssertionError("one configuration left: nothing to time")

    single = evotune.autotune(kernels.ADD_CONFIGS, ["n"], {"perf_model": perf_model, "top_k": 0.3},
                              do_bench=no_bench)(kernels.add)  # int(3 * 0.3) == 0, yet one is kept
    single[kernels.grid_1d(70)](x, y, out, 70)
    assert single.best_config == kernels.ADD_CONFIGS[2] and torch.equal(out, x + y)

    estimated.clear()
    enough = evotune.autotune(kernels.ADD_CONFIGS[:2], ["n"], {"perf_model": perf_model, "top_k": 2},
                              do_bench=kernels.counting_bench)(kernels.add)
    enough[kernels.grid_1d(70)](x, y, out, 70)
    assert estimated == []  # no more than top_k: not estimated, as in Triton

    bad = evotune.autotune(kernels.ADD_CONFIGS, ["n"], {"perf_model": perf_model, "top_k": "2"})(kernels.add)
    with pytest.raises(TypeError, match="top_k must be either"):
        bad[kernels.grid_1d(70)](x, y, out, 70)


def test_nothing_left_after_pruning_is_tritons_error(kernels) -> None:
    import evotune

    kern = evotune.autotune(kernels.ADD_CONFIGS, ["n"], {"early_config_prune": lambda configs, nargs, **kw: []},
                            do_bench=kernels.counting_bench)(kernels.add)
    with pytest.raises(triton.TritonError) as got:
        kern[kernels.grid_1d(8)](torch.ones(8), torch.ones(8), torch.empty(8), n=8)
    assert str(got.value) == ("Autotuner error: No valid autotuner configs after pruning. `early_config_prune` "
                              "should return at least one config.")
    assert kernels.counting_bench.calls == 0


def test_configs_equal_but_for_ir_override_or_pre_hook_stay_apart(gpu_path) -> None:
    import evotune
    from evotune.triton_tuning.configs import Candidates

    def hook_a(nargs):
        return None

    def hook_b(nargs):
        return None

    configs = [triton.Config({"BLOCK": 32}, ir_override="first.ttgir"),
               triton.Config({"BLOCK": 32}, ir_override="second.ttgir"),
               triton.Config({"BLOCK": 64}, pre_hook=hook_a), triton.Config({"BLOCK": 64}, pre_hook=hook_b)]
    as_meta = [triton.Config({"BLOCK": 32, "ir_override": "third.ttir"})]  # as Triton's tests write it
    for listed in (configs, as_meta):
        cands = Candidates.from_configs("k", listed)
        assert [cands.config(p) for p in cands.points] == listed and all(
            cands.config(p) is c for p, c in zip(cands.points, listed, strict=True))
        for c in listed:  # a copy is found by its values
            copy = triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages,
                                 ir_override=c.ir_override, pre_hook=c.pre_hook)
            assert cands.config(cands.find(copy)) is c
    cands = Candidates.from_configs("k", configs)
    assert cands.find(triton.Config({"BLOCK": 64}, pre_hook=lambda nargs: None)) is None

    device = OnDevice(lambda o: None, lambda o: 0)
    timed: list[int] = []
    kern = evotune.autotune([*configs[:2], triton.Config({"BLOCK": 64})], ["n"], do_bench=bench_recording(timed),
                            confirm=0)(device)
    x, y, out = torch.randn(8), torch.randn(8), torch.empty(8)
    kern[(1,)](x, y, out, 8)
    overrides = [o.get("ir_override") for o in device.launched]
    assert {"first.ttgir", "second.ttgir", None} == set(overrides) and len(timed) == 3  # each with its own IR
    assert device.launched[-1].get("ir_override") == kern.best_config.all_kwargs().get("ir_override")


# -- the signature and what a tuned kernel exposes --------------------------------------------------------------

def test_tritons_signature_in_its_order_then_evotunes_keyword_only() -> None:
    import evotune
    from evotune.triton_tuning.autotuner import Autotuner
    from evotune.triton_tuning.decorator import autotune

    assert evotune.autotune is autotune and inspect.isfunction(autotune)  # a plain function, and the only one
    for theirs, ours in ((triton.autotune, autotune),
                         (triton.runtime.Autotuner.__init__, Autotuner.__init__)):
        t, o = inspect.signature(theirs).parameters, inspect.signature(ours).parameters
        assert list(o)[: len(t)] == list(t), (list(o), list(t))
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(o.values())[len(t):])
        assert all(o[n].default == t[n].default for n in t if t[n].default is not inspect.Parameter.empty)
    doc = inspect.getdoc(autotune)
    assert "use_cuda_graph" in doc and "cache_results" in doc


def test_an_autotuner_built_directly_with_tritons_arguments(tmp_path: Path) -> None:
    from evotune.triton_tuning.autotuner import Autotuner

    launched, estimated = [], []

    class Kernel:  # a launchable stand-in, no jit function under it
        def __init__(self):
            self.fn = lambda: None

        def run(self, **kwargs):
            launched.append(kwargs["BLOCK"])

    def do_bench(call, quantiles):
        call()
        return [float(launched[-1])] * 3

    def perf_model(**kwargs):
        estimated.append(kwargs["BLOCK"])
        return kwargs["BLOCK"]

    configs = [triton.Config({"BLOCK": b}) for b in range(1, 9)]
    tuner = Autotuner(Kernel(), [], configs, [], None, None, do_bench=do_bench, cache=tmp_path / "direct",
                      prune_configs_by={"early_config_prune": lambda cs, nargs, **kw: cs[:6], "perf_model": perf_model,
                                        "top_k": 0.5})
    tuner.run()
    assert estimated == [1, 2, 3, 4, 5, 6] and {c.kwargs["BLOCK"] for c in tuner.configs_timings} == {1, 2, 3}
    assert tuner.best_config.kwargs["BLOCK"] == 1 and launched[-1] == 1


def test_best_config_cache_configs_timings_and_bench_time(kernels) -> None:
    import evotune

    kern = evotune.autotune(kernels.ADD_CONFIGS, ["n"], do_bench=kernels.counting_bench, use_cuda_graph=True,
                            cache_results=True)(kernels.add)
    assert kern.configs == kernels.ADD_CONFIGS and kern.use_cuda_graph and kern.cache_results
    x, y, out = torch.randn(12), torch.randn(12), torch.empty(12)
    kern[kernels.grid_1d(12)](x, y, out, 12)
    assert kern.cache == {(12, *["torch.float32"] * 3): kern.best_config}
    assert set(kern.configs_timings) == set(kernels.ADD_CONFIGS) and kern.best_config in kern.configs_timings
    assert all(len(v) == 3 and v[1] <= v[0] <= v[2] for v in kern.configs_timings.values())
    assert kern.bench_time > 0


# -- a decision is keyed by the build ---------------------------------------------------------------------------

def _fake_ptxas(folder: Path, version: str) -> str:
    path = folder / f"ptxas-{version}"
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {version}, V{version}.1'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def build_changes(tmp_path: Path) -> dict[str, Callable[[pytest.MonkeyPatch], None]]:
    """Each part of a kernel's build, changed (undone with the monkeypatch)."""
    from triton import knobs

    from evotune.triton_tuning import toolchain

    def knob(m: pytest.MonkeyPatch) -> None:
        m.setattr(knobs, "nvidia", knobs.nvidia.copy())  # a copy of the group, set back with it
        m.delenv("PTXAS_OPTIONS", raising=False)
        knobs.nvidia.ptxas_options = "-O1"
        os.environ.pop("PTXAS_OPTIONS")  # setting the knob exported it: only the value set in Python is left

    return {
        "triton version": lambda m: m.setattr(triton, "__version__", "9.9.9"),
        "backend": lambda m: m.setattr(toolchain, "backend_hash", lambda: "12.9-90a"),
        "ptxas": lambda m: m.setenv("TRITON_PTXAS_PATH", _fake_ptxas(tmp_path, "12.4")),
        "cuda": lambda m: m.setattr(torch.version, "cuda", "12.4"),
        "TRITON_* variable": lambda m: m.setenv("TRITON_F32_DEFAULT", "ieee"),
        "C++ side's variable": lambda m: m.setenv("TRITON_ENABLE_LLVM_DEBUG", "1"),
        "knob set in Python": knob,
    }


def test_every_part_of_the_build_changes_its_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evotune.triton_tuning.toolchain import Toolchain

    base = Toolchain.current()
    for what, change in build_changes(tmp_path).items():
        with monkeypatch.context() as m:
            change(m)
            changed = Toolchain.current()
            assert changed.digest != base.digest, what
        assert Toolchain.current() == base, what


@pytest.mark.slow  # 25 launches, each opening the cache
def test_a_changed_build_is_tuned_again_and_the_same_build_is_read(kernels, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Each of Triton's version, the backend, ptxas, CUDA, a TRITON_* variable, a variable Triton's C++ side
    reads, a triton.knobs value set in Python, and the kernel's source: changed, the key is timed again; put
    back, the decision is read."""
    import evotune

    cache = tmp_path / "builds"
    src = tmp_path / "kernel_src"
    src.mkdir()
    body = kernels.__loader__.get_source("autotune_kernels")
    (src / "k_one.py").write_text(body)
    (src / "k_two.py").write_text(body.replace("m = offs < n", "m = (offs < n) & (offs >= 0)"))

    def launch(kernel_fn=None) -> int:
        before = kernels.counting_bench.calls
        kern = evotune.autotune(kernels.ADD_CONFIGS, ["n"], do_bench=kernels.counting_bench, cache=cache,
                                confirm=0)(kernel_fn or kernels.add)
        out = torch.empty(16)
        kern[kernels.grid_1d(16)](torch.ones(16), torch.ones(16), out, 16)
        assert torch.equal(out, torch.full((16,), 2.0))
        return kernels.counting_bench.calls - before

    assert launch() == 3 and launch() == 0
    for what, change in build_changes(tmp_path).items():
        with monkeypatch.context() as m:
            change(m)
            assert launch() == 3, what
            assert launch() == 0, what
        assert launch() == 0, what  # put back: the first build's decision
    sys.path.insert(0, str(src))
    try:
        one, two = importlib.import_module("k_one"), importlib.import_module("k_two")
    finally:
        sys.path.remove(str(src))
    assert launch(one.add) == 0  # the same source in another module: the same kernel
    assert launch(two.add) == 3 and launch(two.add) == 0  # another source


# -- kernels nobody decorated ------------------------------------------------------------------------------------

def test_a_plain_kernel_tuned_in_code_leaves_its_module_as_it_is(kernels) -> None:
    """evotune.autotune applied to an imported jit kernel; the module's plain launch, its configuration passed as
    keyword arguments, then takes the tuned one."""
    import evotune

    plain = kernels.add
    tuned = evotune.autotune(kernels.ADD_CONFIGS, ["n"], do_bench=kernels.counting_bench)(plain)
    x, y, out = torch.randn(90), torch.randn(90), torch.empty(90)
    tuned[kernels.grid_1d(90)](x, y, out, 90)
    assert kernels.add is plain and torch.equal(out, x + y)
    again = torch.empty(90)
    plain[kernels.grid_1d(90)](x, y, again, 90, **tuned.best_config.all_kwargs())  # as serving code launches it
    assert torch.equal(again, out)


@pytest.mark.slow  # about 1.8 s: kept out of the fast lane (its 3-minute margin)
def test_tune_kernel_takes_a_plain_kernel_with_its_space_and_key(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    import json

    from evotune.cli import main

    module = TESTS / "autotune_kernels.py"
    keys = tmp_path / "keys.toml"
    keys.write_text('launch = "make_add_launch_with_config"\n[[key]]\nn = 32\n[[key]]\nn = 48\n')
    for space in ("ADD_CONFIGS", "ADD_SPACE"):  # a list of triton.Config, a SearchSpace
        cache = tmp_path / space
        assert main(["tune-kernel", f"{module}:add", "--space", f"{module}:{space}", "--key", "n", "--keys",
                     str(keys), "--cache", str(cache)]) == 0
        assert main(["export-configs", "--cache", str(cache), "--out", str(tmp_path / f"{space}.json")]) == 0
        rows = json.loads((tmp_path / f"{space}.json").read_text())
        assert sorted(r["key"]["n"] for r in rows) == [32, 48] and {r["kernel"] for r in rows} == {"add"}
        assert all(r["config"]["BLOCK"] in (16, 32, 64) for r in rows)
    capsys.readouterr()

    bad = {
        ("--key", "n"): "add is not decorated with evotune.autotune: give its candidates with --space FILE:NAME",
        ("--space", f"{module}:ADD_CONFIGS"): "--key: the arguments of add that key a decision",
        ("--space", f"{module}:ADD_CONFIGS", "--key", "m,n"): "--key: m: not an argument of the kernel",
        ("--space", f"{module}:NOTHING", "--key", "n"): "autotune_kernels.py: NOTHING: expected a SearchSpace",
        ("--space", f"{module}:grid_1d", "--key", "n"): "grid_1d: expected a SearchSpace or a list of triton.Config, "
                                                       "found function",
        ("--space", "nocolon", "--key", "n"): "--space: expected FILE:NAME",
        ("--space", str(tmp_path / "none.py:X"), "--key", "n"): "none.py: no such file",
    }
    for extra, message in bad.items():
        before = sorted(p.name for p in tmp_path.rglob("*"))
        assert main(["tune-kernel", f"{module}:add", *extra, "--keys", str(keys), "--cache",
                     str(tmp_path / "new")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, (extra, err)
        assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing created
    assert main(["tune-kernel", f"{module}:add_tuned", "--space", f"{module}:ADD_CONFIGS", "--keys", str(keys)]) == 2
    assert "add_tuned is decorated with evotune.autotune, which gives both" in capsys.readouterr().err


# -- benchmarks/autotune_dropin.py's modes, on the CPU --------------------------------------------------------------

SWAPPED = """
import torch
import triton
import triton.language as tl


def test_swapped():
    assert triton.autotune.__module__.startswith("evotune")


def test_tuned(device, fresh_knobs):
    fresh_knobs.autotuning.print = True
    x = torch.zeros(40, device=device)

    @triton.autotune(configs=[triton.Config({"B": 16}), triton.Config({"B": 32})], key=["n"], restore_value=["x"],
                     do_bench=lambda f, quantiles: (f(), [1.0, 1.0, 1.0])[1])
    @triton.jit
    def k(x, n, B: tl.constexpr):
        offs = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(x + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)

    k[lambda m: (triton.cdiv(40, m["B"]),)](x, 40)
    assert len(k.cache) == 1 and torch.equal(x, torch.ones(40))
"""


def _benchmark(args: list[str]) -> None:
    import os
    import subprocess

    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_TEST_DEVICE": "cpu"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "autotune_dropin.py"), *args], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow  # two pytest runs in other processes
def test_the_triton_tests_mode_runs_a_file_plainly_and_swapped(tmp_path: Path) -> None:
    import json

    (tmp_path / "test_swap_file.py").write_text(SWAPPED)
    _benchmark(["--triton-tests", str(tmp_path / "test_swap_file.py"), "--out", str(tmp_path / "out.json")])
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["outcomes"] == {"triton.autotune": {"test_swapped": "failed", "test_tuned": "passed"},
                               "evotune.autotune": {"test_swapped": "passed", "test_tuned": "passed"}}


@pytest.mark.slow  # the fused-MoE kernel through the interpreter, tuned and its grid timed
def test_the_moe_mode_times_each_pick_against_its_grid(tmp_path: Path) -> None:
    import json

    keys = tmp_path / "keys.toml"
    keys.write_text('launch = "make_vllm_args"\n[[key]]\nM = 8\nN = 32\nK = 64\nE = 4\ndtype = "float32"\n')
    _benchmark(["--moe", "--moe-keys", str(keys), "--moe-budget", "8", "--out", str(tmp_path / "moe.json")])
    (row,) = json.loads((tmp_path / "moe.json").read_text())["rows"]
    assert row["key"]["M"] == 8 and row["grid"] == row["grid_timed"] == 32  # the constraints' grid at M = 8
    assert row["timed_by_evotune"] == 8 and row["pick_over_best"] > 0 and row["max_rel_error"] < 1e-4
