"""The key tuner ``tune-model`` runs by default: evotune's autotune, one key at a time, on this process's GPU.

It reaches ``evotune.autotune`` through ``autotune_api.py``: its ahead-of-time entry point (``tune_kernel``: a
kernel reference, a keys file, the cache) and what it reports per key (``KeyProgress``).

Each key is tuned as ``tune-kernel`` tunes it: a one-key keys file written beside the run's outputs, the kernel's
launch built by its module's ``make_args``, the decision kept in the run's autotune cache (``OUT/autotune.db``,
which ``lookup()`` and ``export-configs`` read). Keys of one shape are tuned in increasing batch size, so each key
after the first has its nearest tuned keys as transfer sources. An interrupted key resumes from the trials its
study holds: nothing is timed twice. After the decision the chosen configuration is timed against what an untuned
server runs (``triton.testing.do_bench``, the two side by side): vLLM's default configuration for the fused MoE,
cuBLAS (``torch.matmul``) for a dense GEMM.

The kernels are shipped with the package (``search_spaces``, imported by module name, so an installed evotune finds
them): the fused MoE of ``search_spaces/_triton_fused_moe.py`` (bf16, or fp8 scaled per tensor or per 128 x 128 block;
vLLM's grid as its space) and the bf16 dense GEMM of ``search_spaces/_triton_matmul_example.py``, both plain
``@triton.jit`` kernels given their space and key here. Decode keys (M <= 64), block-fp8 keys and fp8 GEMM keys are
their built-in space's (``triton_decode_gemm``, ``triton_block_fp8``, ``triton_matmul``), tuned in evotune's one tuning
loop with the GPU evaluator and confirmed beside the untuned baseline (``study_tuner.py``). A plan the tuner has no
kernel for (int8; fp8 weights scaled in blocks other than 128 x 128) is refused before anything is tuned
(:func:`check_supported`).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evotune.model.autotune_api import (
    VLLM_FIELDS,
    AheadError,
    CompileCount,
    KeyProgress,
    build_processes,
    load_module,
    start_build_processes,
    stop_build_processes,
    tune_kernel,
)
from evotune.model.models import ModelError
from evotune.model.outcome import Outcome
from evotune.model.plan import BUILD_S, EVAL_S, FP8_BLOCK, Family, Key, Plan
from evotune.model.runner import autotune_cache

if TYPE_CHECKING:
    from evotune.model.study_tuner import StudyTuner

MOE_MODULE = "search_spaces._triton_fused_moe"
GEMM_MODULE = "search_spaces._triton_matmul_example"
TORCH_DTYPES = {"bf16": "bfloat16", "fp8": "float8_e4m3fn"}


@dataclass(frozen=True)
class KernelSource:
    """A kernel ``tune-kernel`` can tune: its reference, its candidates and key (a plain jit kernel), and the name
    of its module's launch function."""

    ref: str
    space: str | None
    key: str | None


SOURCES = {
    Family.FUSED_MOE: KernelSource(f"{MOE_MODULE}:moe_gemm_kernel", f"{MOE_MODULE}:SPACE", "M,N,K,E"),
    Family.GEMM: KernelSource(f"{GEMM_MODULE}:matmul_space_plain", f"{GEMM_MODULE}:SPACE", "M,N,K"),
}

def compile_cost() -> float:
    """A configuration's compile in evaluations' worth of time: a key's search weighs the configurations not built
    for an earlier key of the same specialisation (Triton's: M is 1, a multiple of 16, or neither; any M for the
    fused MoE, which is not specialised on it) by it. The
    build processes compile side by side while the GPU times, so a build costs the run its share of them; weighed
    as a whole build, a later key's search would keep to the configurations built for smaller batch sizes."""
    return BUILD_S / (EVAL_S * build_processes())

#: milliseconds of do_bench's sampling a round when the decision is timed against the untuned default: three
#: alternated rounds of a few hundred launches each (a key's whole search is 64 evaluations of a few ms each)
UNTUNED_REP_MS = 30

#: the search spaces of the two kernels, by the names they carry (the SPACE of each module)
SPACES = {Family.FUSED_MOE: "vllm_fused_moe", Family.GEMM: "matmul_example"}
#: the layout of each dense kernel's operands, by its space: the GEMM kernel's x (M x K) times a K x N weight, both
#: row-major; the decode kernel's K-contiguous weight (N x K), as a linear layer keeps it
LAYOUTS = {SPACES[Family.GEMM]: "nn", Family.DECODE.value: "tn"}


def check_supported(plan: Plan) -> None:
    """:class:`ModelError` naming ``--dtype`` or the kernel when this tuner has no kernel for part of the plan."""
    if plan.dtype not in TORCH_DTYPES:
        raise ModelError(f"--dtype {plan.dtype}: the default tuner's kernels are bf16 and fp8; plan it with "
                         "--dry-run, or name a tuner for it with --tuner")
    block = plan.model.fp8_block if plan.dtype == "fp8" else None
    if block not in (None, FP8_BLOCK):
        raise ModelError(f"{plan.model.source}: weight_block_size: {list(block)}; the default tuner's fp8 kernels "
                         f"(block-fp8 and the fused MoE) take {list(FP8_BLOCK)}")


class AutotuneTuner:
    """Tunes fused-MoE keys and bf16 GEMM keys with ``evotune.autotune`` into ``cache``, the other dense keys with
    their built-in space (:class:`~evotune.model.study_tuner.StudyTuner`, in the same ``OUT/autotune.db``), each
    within the default budget (64 evaluations a key)."""

    def __init__(self, plan: Plan, out: Path, studies: StudyTuner | None = None):
        check_supported(plan)
        self.plan, self.out = plan, out
        self.cache = autotune_cache(out)
        self._studies = studies
        if any(k.shape.family is Family.FUSED_MOE for k in plan.keys):
            # the fused MoE's build processes start with the worker, not with its first key, and before its CUDA
            # context and any thread: they are then forked from this process, which imported torch, Triton and
            # the kernel (build_processes.start), and are up before the first key's first builds
            moe = SOURCES[Family.FUSED_MOE]
            start_build_processes(moe.ref, moe.space, moe.key)
        studied = {k.shape.family for k in plan.keys if not self._autotuned(k)}
        if studied and _has_gpu():
            _start_gpu_server(sorted(studied, key=lambda f: f.value))
        if any(self._autotuned(k) for k in plan.keys):
            _open_gpu()

    @property
    def studies(self) -> StudyTuner:
        """The tuner of the keys of built-in spaces, made on the first (its imports, the run machinery's, wait for
        it)."""
        if self._studies is None:
            from evotune.model.study_tuner import StudyTuner

            self._studies = StudyTuner(self.out, self.plan.dtype, self.plan.ident)
        return self._studies

    def _autotuned(self, key: Key) -> bool:
        """Whether ``key`` is tuned with ``evotune.autotune`` here (the fused MoE, the bf16 GEMM), not by
        :attr:`studies`."""
        family = key.shape.family
        return family is Family.FUSED_MOE or (family is Family.GEMM and self.plan.dtype == "bf16")

    def tune(self, key: Key) -> Outcome:
        family = key.shape.family
        if not self._autotuned(key):
            return self.studies.tune(key)
        source = SOURCES[family]
        fields: dict[str, Any] = {"M": key.m, "N": key.shape.n, "K": key.shape.k,
                                  "dtype": TORCH_DTYPES[self.plan.dtype]}
        if family is Family.FUSED_MOE:
            fields.update(E=key.shape.experts, top_k=key.shape.top_k)
            if self.plan.dtype == "fp8" and self.plan.model.fp8_block is not None:
                fields.update(block=self.plan.model.fp8_block[0])  # scaled per block, as the checkpoint ships
        events: list[KeyProgress] = []
        with tempfile.TemporaryDirectory(dir=self.out) as tmp, CompileCount() as count:
            keys = Path(tmp) / "key.toml"
            keys.write_text("[[key]]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in fields.items()))
            try:
                ((_, config, decision),) = tune_kernel(source.ref, keys, self.cache, source.space, source.key,
                                                       events.append, compile_cost(), self._after(key))
            except AheadError as exc:
                raise ModelError(str(exc)) from None
        done = events[-1]
        chosen = {k: int(v) for k, v in config.all_kwargs().items() if isinstance(v, int)}
        tuned_ms, untuned_ms = _against_untuned(source, family, key, fields, chosen)
        import triton

        return Outcome(key.ident, key.shape.name, key.shape.family.value, key.fields(), chosen, done.evaluations,
                       done.new, done.seconds, tuned_ms if tuned_ms is not None else
                       (None if decision is None else decision.time_ms), untuned_ms,
                       "single" if decision is None else decision.how, _device(), str(triton.__version__),
                       SPACES[family], count.compiles, count.loads, done.timing_s)

    def _after(self, key: Key) -> list[dict[str, Any]]:
        """The keys of ``key``'s kernel after it, in the plan's order, by the fields its keys file names (their
        configurations are built while ``key`` is searched)."""
        keys = next(k.keys for k in self.plan.kernels if k.shape == key.shape)
        later = keys[keys.index(key) + 1:]
        return [k.fields() for k in later]

    def close(self) -> None:
        """Stop the build processes (at once: the keys are decided, nothing waits for a build) and the dense keys'
        tuner."""
        stop_build_processes()
        if self._studies is not None:
            self._studies.close()


def _has_gpu() -> bool:
    """Whether this process measures on a GPU (not under the interpreter)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return False
    import torch

    return bool(torch.cuda.is_available())


def _start_gpu_server(families: list[Family]) -> None:
    """Start the server the GPU evaluator's processes fork from (:attr:`AutotuneTuner.studies`' keys), importing
    what the spaces of ``families`` measure with, now: a worker that comes to those keys after others (a model's
    expert GEMMs first) has the server's imports (torch, the GPU worker, the spaces' compilers: seconds) done by
    then, not waited for at its first such key."""
    from evotune.core.plugins import load_space
    from evotune.measurement.gpu import start_processes

    start_processes([load_space(f.value) for f in families])


def _open_gpu() -> None:
    """Make this process's CUDA context now, where it has a GPU."""
    if _has_gpu():
        import torch

        torch.zeros(1, device="cuda")


def _device() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu-interpreter"


def _against_untuned(source: KernelSource, family: Family, key: Key, fields: dict[str, Any],
                     chosen: dict[str, int]) -> tuple[float | None, float | None]:
    """(tuned ms, untuned ms), timed side by side on the GPU (the plain kernel launched with the decision);
    (None, None) under the interpreter."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None, None
    import torch
    from triton.testing import do_bench

    module = load_module(source.ref.rpartition(":")[0])
    if family is Family.FUSED_MOE:
        grid, args, kwargs = module.make_args(key.m, key.shape.n, key.shape.k, key.shape.experts,
                                              key.shape.top_k, fields["dtype"], block=fields.get("block", 0))
        plain = module.moe_gemm_kernel
        default = module.default_config(key.m, key.shape.experts, fields.get("block", 0))
        launch = {f: chosen[f] for f in VLLM_FIELDS}  # what vLLM launches with: the file's six fields
        runs = {"tuned": lambda: plain[grid](*args, **kwargs, **launch),
                "untuned": lambda: plain[grid](*args, **kwargs, **default)}
    else:
        grid, args = module.make_args(key.m, key.shape.n, key.shape.k, fields["dtype"])
        gemm = module.matmul_space_plain
        config = {p.name: chosen[p.name] for p in module.SPACE.params}  # the decision just made, as launched
        a, b = args[0], args[1]
        runs = {"tuned": lambda: gemm[grid](*args, **config), "untuned": lambda: torch.matmul(a, b)}
    best: dict[str, float] = {}
    for _ in range(3):  # alternated rounds: a clock or thermal drift reaches both
        for name, run in runs.items():
            ms = float(do_bench(run, warmup=10, rep=UNTUNED_REP_MS))
            best[name] = min(ms, best.get(name, ms))
    return best["tuned"], best["untuned"]


def autotune_tuner(plan: Plan, out: Path) -> AutotuneTuner:
    """The default ``--tuner``."""
    return AutotuneTuner(plan, out)
