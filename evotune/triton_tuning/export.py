"""``python -m evotune export-configs``: the cache's decisions as JSON, or as vLLM's fused-MoE or block-fp8 config
files, and the check of such files.

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
``--n-divisor 2``. A kernel whose key has an e4m3 tensor (``a_ptr.dtype = torch.float8_e4m3fn``) is vLLM's
``fp8_w8a8``, written ``E=8,N=14336,device_name=...,dtype=fp8_w8a8.json``, with ``,block_shape=[128,128]`` for
block-quantized weights (``--block-shape 128,128``), as vLLM's ``get_config_file_name`` names them; it also names
every H200 variant's files ``device_name=NVIDIA_H200``.

``vllm-block-fp8``: the layout vLLM's block-scaled fp8 linear layers read (``w8a8_block_fp8_matmul``,
``benchmarks/kernels/benchmark_w8a8_block_fp8.py`` writes it): one file per (N, K, device),
``N=4096,K=7168,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128,128].json``, holding
``{"<batch size>": {the six fields above}, ...}`` and nothing else (vLLM reads every key as a batch size). N, K
and the batch size are read off the key's ``N``, ``K`` and ``M`` fields unless told otherwise; BLOCK_SIZE_K must
divide the block's K (vLLM's kernel reads one scale per K step).

The device is named as vLLM names it: ``torch.cuda.get_device_name()`` with spaces as underscores.
:func:`check_vllm_file` reads a written file back and checks its name and contents; ``export-configs --check
DIR`` checks every file of a folder.

Where one kernel's key was decided more than once (another source version or Triton version), the newest
decision is exported.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import optuna

from evotune.storage.summaries import study_summaries
from evotune.triton_tuning.cache import DECISION, PREFIX, Decision

VLLM_FIELDS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
VLLM_FP8 = "fp8_w8a8"  # vLLM's name for fp8 (e4m3) weights and activations
#: the dtypes a vLLM fused-MoE file name carries (its get_config_dtype_str; none for 16-bit)
VLLM_MOE_DTYPES = (VLLM_FP8, "int8_w8a8", "int8_w8a16", "int4_w4a16", "float32")
FP8_DTYPE = "torch.float8_e4m3fn"  # how a key names an e4m3 tensor's dtype
BLOCK_SHAPE = (128, 128)  # the (N, K) block of the weights' scales that vLLM's block-fp8 files name by default
_DEVICE = r"(?P<device>[^,\s]+)"
_BLOCK = r",block_shape=\[(?P<block_n>\d+),(?P<block_k>\d+)\]"
MOE_NAME = re.compile(rf"E=(?P<e>\d+),N=(?P<n>\d+),device_name={_DEVICE}(,dtype=(?P<dtype>[a-z0-9_]+))?({_BLOCK})?"
                      r"\.json")
BLOCK_FP8_NAME = re.compile(rf"N=(?P<n>\d+),K=(?P<k>\d+),device_name={_DEVICE},dtype={VLLM_FP8}{_BLOCK}\.json")


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


def vllm_device_name(device: str, moe: bool = False) -> str:
    """A device as vLLM's config file names spell it: ``torch.cuda.get_device_name()`` with spaces as
    underscores; fused-MoE files name every H200 variant ``NVIDIA_H200`` (vLLM's ``get_config_file_name``)."""
    name = device.replace(" ", "_")
    return "NVIDIA_H200" if moe and "H200" in name.split("_") else name


def vllm_dtype(key: dict[str, Any]) -> str | None:
    """vLLM's dtype of a kernel keyed by ``key``: ``fp8_w8a8`` when one of its tensors is e4m3, else None (a
    16-bit kernel's files name no dtype)."""
    return VLLM_FP8 if any(f.endswith(".dtype") and v == FP8_DTYPE for f, v in key.items()) else None


def vllm_file_name(experts: Any, n: Any, device: str, dtype: str | None = None,
                   block_shape: tuple[int, int] | None = None) -> str:
    """A fused-MoE config file's name, as vLLM's ``get_config_file_name`` makes it."""
    dtype_part = f",dtype={dtype}" if dtype else ""
    block_part = f",block_shape=[{block_shape[0]},{block_shape[1]}]" if block_shape else ""
    return f"E={experts},N={n},device_name={vllm_device_name(device, moe=True)}{dtype_part}{block_part}.json"


def vllm_block_fp8_file_name(n: Any, k: Any, device: str, block_shape: tuple[int, int] = BLOCK_SHAPE) -> str:
    """A block-fp8 linear layer's config file name, as vLLM's ``get_w8a8_block_fp8_configs`` looks it up."""
    return (f"N={n},K={k},device_name={vllm_device_name(device)},dtype={VLLM_FP8},"
            f"block_shape=[{block_shape[0]},{block_shape[1]}].json")


def _checked_row(e: dict[str, Any], fields: tuple[str, ...], options: str, what: str) -> None:
    for field in fields:
        if field not in e["key"]:
            raise ExportError(f"{e['study']}: key field {field!r} missing (the key has "
                              f"{', '.join(e['key'])}); name the fields with {options}")
    missing = [f for f in VLLM_FIELDS if f not in e["config"]]
    if missing:
        raise ExportError(f"{e['study']}: config field {missing[0]!r} missing: {what} takes {', '.join(VLLM_FIELDS)}")


def _add(files: dict[str, dict[str, Any]], owner: dict[str, str], name: str, e: dict[str, Any], batch: str,
         first: dict[str, Any]) -> None:
    """``e``'s configuration under its batch size in file ``name`` (begun with ``first``)."""
    if owner.setdefault(name, e["kernel"]) != e["kernel"]:
        raise ExportError(f"{name}: kernels {owner[name]} and {e['kernel']} both have it; choose one with --kernel")
    files.setdefault(name, dict(first))[str(int(e["key"][batch]))] = {f: int(e["config"][f]) for f in VLLM_FIELDS}


def _sorted(doc: dict[str, Any]) -> dict[str, Any]:
    """The file's batch sizes in increasing order, after any other key."""
    sizes = sorted((k for k in doc if k.isdigit()), key=int)
    return {**{k: v for k, v in doc.items() if not k.isdigit()}, **{k: doc[k] for k in sizes}}


def vllm_moe(rows: list[dict[str, Any]], batch: str = "M", experts: str = "E", n: str = "N",
             n_divisor: int = 1, block_shape: tuple[int, int] | None = None) -> dict[str, dict[str, Any]]:
    """File name -> contents, in vLLM's fused-MoE layout; the file's N is the key's ``n`` field over ``n_divisor``;
    ``block_shape`` names block-quantized weights."""
    files: dict[str, dict[str, Any]] = {}
    owner: dict[str, str] = {}
    for e in rows:
        _checked_row(e, (batch, experts, n), "--batch-key/--experts-key/--n-key", "vLLM's fused MoE")
        name = vllm_file_name(e["key"][experts], int(e["key"][n]) // n_divisor, str(e["device"]),
                              vllm_dtype(e["key"]), block_shape)
        _add(files, owner, name, e, batch, {"triton_version": e["triton_version"]})
    return {name: _sorted(doc) for name, doc in files.items()}


def vllm_block_fp8(rows: list[dict[str, Any]], batch: str = "M", n: str = "N", k: str = "K",
                   block_shape: tuple[int, int] | None = None) -> dict[str, dict[str, Any]]:
    """File name -> contents, in the layout of vLLM's block-fp8 linear layers (batch sizes only: vLLM reads every
    key as one); the weights' scale block ``block_shape``, :data:`BLOCK_SHAPE` unless given."""
    block_shape = block_shape or BLOCK_SHAPE
    files: dict[str, dict[str, Any]] = {}
    owner: dict[str, str] = {}
    for e in rows:
        _checked_row(e, (batch, n, k), "--batch-key/--n-key/--k-key", "vLLM's block-fp8 kernel")
        dtypes = {f: v for f, v in e["key"].items() if f.endswith(".dtype")}
        if dtypes and vllm_dtype(e["key"]) is None:
            named = ", ".join(f"{f} = {v}" for f, v in dtypes.items())
            raise ExportError(f"{e['study']}: key: no e4m3 tensor ({named}): not a block-fp8 kernel; choose one with "
                              "--kernel")
        step = int(e["config"]["BLOCK_SIZE_K"])
        if step < 1 or block_shape[1] % step:
            raise ExportError(f"{e['study']}: config field 'BLOCK_SIZE_K': {step} does not divide the block's K "
                              f"{block_shape[1]} (vLLM's kernel reads one scale per K step)")
        name = vllm_block_fp8_file_name(int(e["key"][n]), int(e["key"][k]), str(e["device"]), block_shape)
        _add(files, owner, name, e, batch, {})
    return {name: _sorted(doc) for name, doc in files.items()}


def check_vllm_config(name: str, doc: Any, shown: str = "") -> None:
    """Raise :class:`ExportError` (``FILE: FIELD: why``, the file shown as ``shown`` if given) unless ``doc`` is what
    vLLM reads from a config file named ``name``: a fused-MoE or block-fp8 name, the device spelt as vLLM looks it
    up, batch sizes (and, in a fused-MoE file, ``triton_version``) mapping to the six fields as positive integers,
    BLOCK_SIZE_K dividing a block-fp8 file's block."""
    moe, block = MOE_NAME.fullmatch(name), BLOCK_FP8_NAME.fullmatch(name)
    file = shown or name
    match = block or moe
    if match is None:
        raise ExportError(f"{file}: (name): neither vLLM's fused-MoE name E=..,N=..,device_name=..[,dtype=..]"
                          f"[,block_shape=[..,..]].json nor its block-fp8 name N=..,K=..,device_name=..,"
                          f"dtype={VLLM_FP8},block_shape=[..,..].json")
    device = match["device"]
    if moe and moe["dtype"] is not None and moe["dtype"] not in VLLM_MOE_DTYPES:
        raise ExportError(f"{file}: dtype: vLLM names a fused-MoE file's dtype one of {', '.join(VLLM_MOE_DTYPES)}"
                          f", not {moe['dtype']}")
    if moe and device != vllm_device_name(device, moe=True):
        raise ExportError(f"{file}: device_name: vLLM's fused MoE looks up every H200 as NVIDIA_H200, not {device}")
    if not isinstance(doc, dict):
        raise ExportError(f"{file}: (contents): expected a JSON object of batch sizes, got {type(doc).__name__}")
    if not any(k.isdigit() for k in doc):
        raise ExportError(f"{file}: (contents): no batch size in it")
    for key, config in doc.items():
        if moe and key == "triton_version":
            if not isinstance(config, str):
                raise ExportError(f"{file}: triton_version: expected a string, got {config!r}")
            continue
        if not key.isdigit() or str(int(key)) != key or int(key) < 1:
            raise ExportError(f"{file}: {key}: not a batch size (vLLM reads every key of the file as one)")
        if not isinstance(config, dict) or set(config) != set(VLLM_FIELDS):
            got = sorted(config) if isinstance(config, dict) else config
            raise ExportError(f"{file}: {key}: expected the fields {', '.join(VLLM_FIELDS)}, got {got}")
        for field in VLLM_FIELDS:
            value = config[field]
            power = field != "num_stages" and field != "GROUP_SIZE_M"
            if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (power and value & (value - 1)):
                what = "a power of two" if power else "a positive integer"
                raise ExportError(f"{file}: {key}.{field}: expected {what}, got {value!r}")
        if block and int(match["block_k"]) % config["BLOCK_SIZE_K"]:
            raise ExportError(f"{file}: {key}.BLOCK_SIZE_K: {config['BLOCK_SIZE_K']} does not divide the block's K "
                              f"{match['block_k']} (vLLM's kernel reads one scale per K step)")


def check_vllm_file(path: Path) -> None:
    """Read a written config file back and check it (:func:`check_vllm_config`); ExportError names the file."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"{path}: (syntax): cannot read it as JSON: {exc}") from None
    check_vllm_config(path.name, doc, str(path))


def check_vllm_folder(folder: Path) -> list[Path]:
    """Check every ``*.json`` file of ``folder`` as a vLLM config file; the files checked."""
    if not folder.is_dir():
        raise ExportError(f"{folder}: no such folder")
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise ExportError(f"{folder}: no vLLM config files (*.json) in it")
    for path in paths:
        check_vllm_file(path)
    return paths


def write_vllm_files(files: dict[str, dict[str, Any]], out: Path) -> list[Path]:
    """Write vLLM config files into ``out``: each checked before anything is written, and read back after."""
    for name, doc in files.items():
        check_vllm_config(name, doc)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, doc in sorted(files.items()):
        path = out / name
        path.write_text(json.dumps(doc, indent=4) + "\n")
        check_vllm_file(path)
        paths.append(path)
    return paths


def write_vllm_moe(rows: list[dict[str, Any]], out: Path, batch: str = "M", experts: str = "E",
                   n: str = "N", n_divisor: int = 1, block_shape: tuple[int, int] | None = None) -> list[Path]:
    return write_vllm_files(vllm_moe(rows, batch, experts, n, n_divisor, block_shape), out)


def write_vllm_block_fp8(rows: list[dict[str, Any]], out: Path, batch: str = "M", n: str = "N", k: str = "K",
                         block_shape: tuple[int, int] | None = None) -> list[Path]:
    return write_vllm_files(vllm_block_fp8(rows, batch, n, k, block_shape), out)
