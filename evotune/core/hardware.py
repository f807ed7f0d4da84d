"""GPU specs and the limits used for pruning, from a table or read off a live GPU.

Example::

    from evotune.core.hardware import get_hardware
    h100 = get_hardware("H100")
    h100.smem_per_block, h100.max_cluster, h100.has("wgmma")   # 232448, 16, True

The table holds datasheet figures (dense tensor-core peaks, no sparsity).
:func:`detect` reads the limits of the GPU in this process through cuda-python
(or torch) and keeps the table's peaks for the matching chip.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

KIB = 1024


@dataclass(frozen=True)
class Hardware:
    name: str
    arch: str  # compute capability as a target, e.g. "sm_90a"
    sm_count: int
    smem_per_block: int  # bytes a block may opt in to
    smem_per_sm: int
    regs_per_sm: int
    max_threads_per_block: int
    max_cluster_portable: int
    max_cluster: int  # non-portable limit (needs cudaFuncAttributeNonPortableClusterSizeAllowed)
    l2_bytes: int
    hbm_gbps: float  # datasheet memory bandwidth, GB/s
    peak_tflops: dict[str, float] = field(default_factory=dict)  # dense, by input dtype
    features: frozenset[str] = frozenset()
    regs_per_thread: int = 255
    source: str = "table"

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def sm_version(self) -> int:
        """90 for sm_90a, 100 for sm_100a."""
        return int("".join(ch for ch in self.arch.split("_")[1] if ch.isdigit()))

    def peak(self, dtype: str) -> float | None:
        """Dense tensor-core peak in TFLOP/s (TOP/s for int8) for input ``dtype``."""
        return self.peak_tflops.get(dtype)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name, "arch": self.arch, "sm_count": self.sm_count,
            "smem_per_block": self.smem_per_block, "max_cluster": self.max_cluster,
            "features": sorted(self.features), "source": self.source,
        }


FP8_MIN_CC = (8, 9)  # the first compute capability with FP8 (e4m3, e5m2) tensor cores: Ada
_HOPPER = frozenset({"mma_sync", "cp_async", "wgmma", "tma", "clusters", "fp8"})
_BLACKWELL = frozenset({"mma_sync", "cp_async", "tma", "clusters", "fp8", "tcgen05", "2cta", "fp4"})

TABLE: dict[str, Hardware] = {
    "A100": Hardware(
        name="A100", arch="sm_80", sm_count=108, smem_per_block=163 * KIB, smem_per_sm=164 * KIB,
        regs_per_sm=65536, max_threads_per_block=1024, max_cluster_portable=1, max_cluster=1,
        l2_bytes=40 * 1024 * KIB, hbm_gbps=2039.0,
        peak_tflops={"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "int8": 624.0},
        features=frozenset({"mma_sync", "cp_async"}),
    ),
    "H100": Hardware(
        name="H100", arch="sm_90a", sm_count=132, smem_per_block=227 * KIB, smem_per_sm=228 * KIB,
        regs_per_sm=65536, max_threads_per_block=1024, max_cluster_portable=8, max_cluster=16,
        l2_bytes=50 * 1024 * KIB, hbm_gbps=3350.0,
        peak_tflops={"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp8": 1978.9, "int8": 1978.9},
        features=_HOPPER,
    ),
    "H200": Hardware(
        name="H200", arch="sm_90a", sm_count=132, smem_per_block=227 * KIB, smem_per_sm=228 * KIB,
        regs_per_sm=65536, max_threads_per_block=1024, max_cluster_portable=8, max_cluster=16,
        l2_bytes=50 * 1024 * KIB, hbm_gbps=4800.0,
        peak_tflops={"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp8": 1978.9, "int8": 1978.9},
        features=_HOPPER,
    ),
    "B200": Hardware(
        name="B200", arch="sm_100a", sm_count=148, smem_per_block=227 * KIB, smem_per_sm=228 * KIB,
        regs_per_sm=65536, max_threads_per_block=1024, max_cluster_portable=8, max_cluster=16,
        l2_bytes=126 * 1024 * KIB, hbm_gbps=8000.0,
        peak_tflops={"bf16": 2250.0, "fp16": 2250.0, "tf32": 1125.0, "fp8": 4500.0, "int8": 4500.0},
        features=_BLACKWELL,
    ),
}

_ALIASES = {"H100_SXM": "H100", "H100 SXM": "H100", "NVIDIA H100 80GB HBM3": "H100",
            "NVIDIA H200": "H200", "NVIDIA B200": "B200", "NVIDIA A100-SXM4-80GB": "A100"}


class UnknownHardware(KeyError):
    pass


def names() -> list[str]:
    return list(TABLE)


def get_hardware(name: str) -> Hardware:
    """A table entry by name (``"H100"``), or the live GPU for ``"auto"``."""
    if name == "auto":
        return detect()
    key = _ALIASES.get(name, name)
    if key not in TABLE:
        raise UnknownHardware(name)
    return TABLE[key]


def match_name(device_name: str) -> str | None:
    """The table entry whose name appears in a device name such as 'NVIDIA H100 80GB HBM3'."""
    upper = device_name.upper()
    for key in ("H200", "H100", "B200", "A100"):
        if key in upper:
            return key
    return None


def canonical_name(device: str) -> str:
    """One spelling per GPU: the table's name of the chip a name spells ("H100" for "NVIDIA H100 80GB HBM3", the
    live device's name, for "H100_SXM" and for an experiment's "H100"); another GPU's name stripped and
    lower-cased. Names that are one GPU compare equal this way, however an experiment, a landscape or a study
    spelt them."""
    name = device.strip()
    return _ALIASES.get(name) or match_name(name) or name.lower()


def detect(device: int = 0) -> Hardware:
    """Limits of the GPU in this process, read live; peaks from the matching table entry.

    Raises RuntimeError when no CUDA GPU can be queried.
    """
    props = _query_cuda_python(device) or _query_torch(device)
    if props is None:
        raise RuntimeError("no CUDA GPU found (cuda-python and torch both failed to query one)")
    base = TABLE.get(match_name(props["name"]) or "", None)
    arch = f"sm_{props['major']}{props['minor']}"
    if props["major"] in (9, 10):
        arch += "a"  # the arch-specific target, which wgmma / tcgen05 need
    features = base.features if base else frozenset()
    if (props["major"], props["minor"]) >= FP8_MIN_CC:
        features |= {"fp8"}  # a chip the table lacks (an L40S, an RTX 4090) has FP8 tensor cores from sm_89 on
    cluster = base.max_cluster if base else (8 if props["major"] >= 9 else 1)
    return replace(
        base or TABLE["H100"],
        name=props["name"], arch=arch, sm_count=props["sm_count"],
        smem_per_block=props["smem_per_block"], smem_per_sm=props["smem_per_sm"],
        regs_per_sm=props["regs_per_sm"], l2_bytes=props["l2_bytes"],
        max_cluster=cluster, features=features,
        peak_tflops=dict(base.peak_tflops) if base else {}, source="live",
    )


def _query_cuda_python(device: int) -> dict[str, Any] | None:
    try:
        from cuda.bindings import runtime as rt  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart as rt  # older cuda-python
        except ImportError:
            return None
    err, p = rt.cudaGetDeviceProperties(device)
    if int(err) != 0:
        return None
    name = p.name.decode() if isinstance(p.name, bytes) else str(p.name)
    return {
        "name": name.rstrip("\x00"), "major": p.major, "minor": p.minor,
        "sm_count": p.multiProcessorCount, "smem_per_block": p.sharedMemPerBlockOptin,
        "smem_per_sm": p.sharedMemPerMultiprocessor, "regs_per_sm": p.regsPerMultiprocessor,
        "l2_bytes": p.l2CacheSize,
    }


def _query_torch(device: int) -> dict[str, Any] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    p = torch.cuda.get_device_properties(device)
    return {
        "name": p.name, "major": p.major, "minor": p.minor, "sm_count": p.multi_processor_count,
        "smem_per_block": getattr(p, "shared_memory_per_block_optin", 227 * KIB),
        "smem_per_sm": getattr(p, "shared_memory_per_multiprocessor", 228 * KIB),
        "regs_per_sm": getattr(p, "regs_per_multiprocessor", 65536),
        "l2_bytes": getattr(p, "L2_cache_size", 50 * 1024 * KIB),
    }
