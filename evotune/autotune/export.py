"""``python -m evotune export-configs``: the cache's decisions as JSON, or as vLLM's fused-MoE config files.

``json`` (the default): one list, an object per tuned key::

    {"kernel": "matmul_kernel", "source_hash": "...", "triton_version": "3.4.0", "device": "NVIDIA H100 80GB HBM3",
     "key": {"M": 64, "N": 64, "K": 64, "a_ptr.dtype": "torch.float16", ...},
     "config": {"BLOCK_M": 64, ..., "num_warps": 4, "num_stages": 3}, "time_ms": 0.0123, "how": "confirmed",
     "date": "...", "study": "autotune/matmul_kernel/..."}

``vllm-moe``: the layout vLLM's fused MoE reads (``benchmarks/kernels/benchmark_moe.py`` writes it):
one file per (E, N, device), ``E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json``, holding
``{"triton_version": "...", "<batch size>": {"BLOCK_SIZE_M": .., "BLOCK_SIZE_N": .., "BLOCK_SIZE_K": ..,
"GROUP_SIZE_M": .., "num_warps": .., "num_stages": ..}, ...}``. E, N and the batch size are read off each key's
fields (``E``, ``N``, ``M`` unless told otherwise). vLLM's N is ``shard_intermediate_size // 2`` (the
intermediate size per shard): a kernel keyed by the gate-and-up GEMM's N (twice that) exports with
``--n-divisor 2``.

Where one kernel's key was decided more than once (another source version or Triton version), the newest
decision is exported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna

from evotune.autotune.cache import DECISION, PREFIX, Decision
from evotune.storage.study import study_summaries

VLLM_FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


class ExportError(ValueError):
    """Nothing to export, or a decision that does not fit the format (one line naming the study and field)."""


def entries(storage: optuna.storages.BaseStorage, kernel: str | None = None) -> list[dict[str, Any]]:
    """Every decided key of the cache (of ``kernel``, when given), newest decision per (kernel, device, key)."""
    newest: dict[str, dict[str, Any]] = {}
    for s in study_summaries(storage):
        a = s.user_attrs
        d = Decision.from_attr(a.get(DECISION))
        k = a.get("kernel")
        if not s.study_name.startswith(PREFIX + "/") or d is None or not isinstance(k, dict):
            continue
        if kernel is not None and k.get("name") != kernel:
            continue
        entry = {"kernel": k.get("name"), "source_hash": k.get("source_hash"),
                 "triton_version": k.get("triton_version"), "device": k.get("device"), "key": a.get("key", {}),
                 "config": d.config, "time_ms": d.time_ms, "how": d.how, "date": d.date, "study": s.study_name}
        ident = json.dumps([entry["kernel"], entry["device"], entry["key"]], sort_keys=True)
        if ident not in newest or newest[ident]["date"] <= entry["date"]:
            newest[ident] = entry
    return sorted(newest.values(), key=lambda e: (e["kernel"], e["device"], json.dumps(e["key"], sort_keys=True)))


def write_json(rows: list[dict[str, Any]], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    return out


def vllm_file_name(experts: Any, n: Any, device: str) -> str:
    return f"E={experts},N={n},device_name={device.replace(' ', '_')}.json"


def vllm_moe(rows: list[dict[str, Any]], batch: str = "M", experts: str = "E", n: str = "N",
             n_divisor: int = 1) -> dict[str, dict[str, Any]]:
    """File name -> contents, in vLLM's fused-MoE layout; the file's N is the key's ``n`` field over ``n_divisor``."""
    files: dict[str, dict[str, Any]] = {}
    owner: dict[str, str] = {}
    for e in rows:
        for field in (batch, experts, n):
            if field not in e["key"]:
                raise ExportError(f"{e['study']}: key field {field!r} missing (the key has "
                                  f"{', '.join(e['key'])}); name the fields with --batch-key/--experts-key/--n-key")
        missing = [f for f in VLLM_FIELDS if f not in e["config"]]
        if missing:
            raise ExportError(f"{e['study']}: config field {missing[0]!r} missing: vLLM's fused MoE takes "
                              f"{', '.join(VLLM_FIELDS)}")
        name = vllm_file_name(e["key"][experts], int(e["key"][n]) // n_divisor, str(e["device"]))
        if owner.setdefault(name, e["kernel"]) != e["kernel"]:
            raise ExportError(f"{name}: kernels {owner[name]} and {e['kernel']} both have it; choose one with --kernel")
        doc = files.setdefault(name, {"triton_version": e["triton_version"]})
        doc[str(int(e["key"][batch]))] = {f: int(e["config"][f]) for f in VLLM_FIELDS}
    for name, doc in files.items():
        sizes = sorted((k for k in doc if k != "triton_version"), key=int)
        files[name] = {"triton_version": doc["triton_version"], **{k: doc[k] for k in sizes}}
    return files


def write_vllm_moe(rows: list[dict[str, Any]], out: Path, batch: str = "M", experts: str = "E",
                   n: str = "N", n_divisor: int = 1) -> list[Path]:
    files = vllm_moe(rows, batch, experts, n, n_divisor)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, doc in sorted(files.items()):
        path = out / name
        path.write_text(json.dumps(doc, indent=4) + "\n")
        paths.append(path)
    return paths
