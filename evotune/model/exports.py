"""The files vLLM and SGLang read, written from a run's outcomes, and their check.

Both servers read the same JSON: ``{"<batch size>": {BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M,
num_warps, num_stages}, ...}`` (a fused-MoE file of vLLM's may also hold ``"triton_version"``); they differ in
names and folders:

* vLLM (``OUT/vllm/``, one folder: point ``VLLM_TUNED_CONFIG_FOLDER`` at it, or copy its files into
  ``vllm/model_executor/layers/fused_moe/configs/`` and ``.../quantization/utils/configs/``):
  fused MoE ``E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3[,dtype=fp8_w8a8][,block_shape=[128,128]].json``
  (``get_config_file_name``: the block shape without spaces, every H200 variant named ``NVIDIA_H200``);
  block-fp8 linear layers ``N=..,K=..,device_name=..,dtype=fp8_w8a8,block_shape=[128,128].json``
  (``get_w8a8_block_fp8_configs``).
* SGLang (``OUT/sglang/``, laid out as its source tree): fused MoE
  ``fused_moe_triton/configs/triton_3_4_0/E=..,N=..,device_name=..[,dtype=..][,block_shape=[128, 128]].json`` (a
  folder per Triton version; the device as ``get_device_name()`` spells it, H200s unmerged; the block shape with a
  space, as Python prints the list); block-fp8
  ``quantization/configs/N=..,K=..,device_name=..,dtype=fp8_w8a8,block_shape=[128, 128].json`` (with the space too).

The MoE file's N is the intermediate size per shard (the gate-and-up GEMM's N halved). Every file is checked before
it is written and read back after (:func:`check_file`, which knows the four names and the contents; a vLLM file
also passes ``export-configs --check``'s check).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evotune.core.problem import Problem
from evotune.core.tuned_cache import remember
from evotune.model.autotune_api import VLLM_FIELDS, VllmFileError, check_vllm_config
from evotune.model.outcome import Outcome
from evotune.model.plan import FP8_BLOCK, Family, scaling_of


class ServerFileError(ValueError):
    """A file that is not what its server reads: ``FILE: FIELD: why``."""


class ServerFileKind(enum.Enum):
    VLLM_MOE = "vllm fused MoE"
    VLLM_BLOCK_FP8 = "vllm block-fp8"
    SGLANG_MOE = "sglang fused MoE"
    SGLANG_BLOCK_FP8 = "sglang block-fp8"


MOE_DTYPES = {"bf16": None, "fp8": "fp8_w8a8", "int8": "int8_w8a8"}
_DEV = r"(?P<device>[^,\s]+)"
NAMES = {
    ServerFileKind.VLLM_MOE: re.compile(rf"E=\d+,N=\d+,device_name={_DEV}(,dtype=[a-z0-9_]+)?"
                                r"(,block_shape=\[\d+,\d+\])?\.json"),
    ServerFileKind.VLLM_BLOCK_FP8: re.compile(rf"N=\d+,K=\d+,device_name={_DEV},dtype=fp8_w8a8,"
                                      r"block_shape=\[\d+,(?P<block_k>\d+)\]\.json"),
    ServerFileKind.SGLANG_MOE: re.compile(rf"E=\d+,N=\d+,device_name={_DEV}(,dtype=[a-z0-9_]+)?"
                                  r"(,block_shape=\[\d+, \d+\])?\.json"),
    ServerFileKind.SGLANG_BLOCK_FP8: re.compile(rf"N=\d+,K=\d+,device_name={_DEV},dtype=fp8_w8a8,"
                                        r"block_shape=\[\d+, (?P<block_k>\d+)\]\.json"),
}
SGLANG_MOE_DIR = Path("sglang/fused_moe_triton/configs")
SGLANG_FP8_DIR = Path("sglang/quantization/configs")
VLLM_DIR = Path("vllm")


def device_part(device: str, target: ServerFileKind) -> str:
    name = device.replace(" ", "_")
    if target is ServerFileKind.VLLM_MOE and "H200" in name.split("_"):
        return "NVIDIA_H200"
    return name


def _block(block: tuple[int, int] | None, spaced: bool) -> str:
    if block is None:
        return ""
    return f",block_shape=[{block[0]}, {block[1]}]" if spaced else f",block_shape=[{block[0]},{block[1]}]"


def moe_name(e: int, n: int, device: str, dtype: str | None, block: tuple[int, int] | None,
             target: ServerFileKind) -> str:
    dtype_part = f",dtype={dtype}" if dtype else ""
    return (f"E={e},N={n},device_name={device_part(device, target)}{dtype_part}"
            f"{_block(block, target is ServerFileKind.SGLANG_MOE)}.json")


def block_fp8_name(n: int, k: int, device: str, block: tuple[int, int], target: ServerFileKind) -> str:
    spaced = target is ServerFileKind.SGLANG_BLOCK_FP8
    return f"N={n},K={k},device_name={device.replace(' ', '_')},dtype=fp8_w8a8{_block(block, spaced)}.json"


def sglang_triton_dir(version: str) -> str:
    return "triton_" + version.replace(".", "_")


def files(outcomes: Iterable[Outcome], dtype: str, block: tuple[int, int] | None = None
          ) -> dict[Path, tuple[ServerFileKind, dict[str, Any]]]:
    """Relative path -> (its server's reader, contents) for every fused-MoE and block-fp8 outcome. ``block``: the
    fp8 weights' scale block (the fused MoE's file names it; None: scaled per tensor)."""
    out: dict[Path, tuple[ServerFileKind, dict[str, Any]]] = {}
    weights_block = block if dtype == "fp8" else None

    def put(path: Path, target: ServerFileKind, m: int, config: dict[str, int], head: dict[str, Any]) -> None:
        doc = out.setdefault(path, (target, dict(head)))[1]
        doc[str(m)] = {f: int(config[f]) for f in VLLM_FIELDS}

    for o in outcomes:
        missing = [f for f in VLLM_FIELDS if f not in o.config]
        family = Family(o.family)
        if family not in (Family.FUSED_MOE, Family.BLOCK_FP8):
            continue
        if missing:
            raise ServerFileError(f"{o.key}: config: {missing[0]} missing (vLLM's and SGLang's files take "
                              f"{', '.join(VLLM_FIELDS)})")
        f, m = o.fields, o.fields["M"]
        if family is Family.FUSED_MOE:
            n = f["N"] // 2
            moe_dtype = MOE_DTYPES[dtype]
            put(VLLM_DIR / moe_name(f["E"], n, o.device, moe_dtype, weights_block, ServerFileKind.VLLM_MOE),
                ServerFileKind.VLLM_MOE, m, o.config, {"triton_version": o.triton_version})
            put(SGLANG_MOE_DIR / sglang_triton_dir(o.triton_version)
                / moe_name(f["E"], n, o.device, moe_dtype, weights_block, ServerFileKind.SGLANG_MOE),
                ServerFileKind.SGLANG_MOE, m, o.config, {})
        else:
            fp8_block = weights_block or FP8_BLOCK
            for folder, target in ((VLLM_DIR, ServerFileKind.VLLM_BLOCK_FP8),
                                   (SGLANG_FP8_DIR, ServerFileKind.SGLANG_BLOCK_FP8)):
                put(folder / block_fp8_name(f["N"], f["K"], o.device, fp8_block, target), target, m, o.config, {})
    return {p: (t, _sorted(doc)) for p, (t, doc) in out.items()}


def _sorted(doc: dict[str, Any]) -> dict[str, Any]:
    sizes = sorted((k for k in doc if k.isdigit()), key=int)
    return {**{k: v for k, v in doc.items() if not k.isdigit()}, **{k: doc[k] for k in sizes}}


def target_of(path: Path) -> ServerFileKind:
    """Which server reads ``path``, from where it lies under the outputs folder."""
    parts = path.parts
    if "sglang" in parts:
        return ServerFileKind.SGLANG_BLOCK_FP8 if path.name.startswith("N=") else ServerFileKind.SGLANG_MOE
    return ServerFileKind.VLLM_BLOCK_FP8 if path.name.startswith("N=") else ServerFileKind.VLLM_MOE


def check(name: str, doc: Any, target: ServerFileKind, shown: str = "") -> None:
    """:class:`ServerFileError` unless ``doc`` under ``name`` is what ``target`` reads."""
    file = shown or name
    match = NAMES[target].fullmatch(name)
    if match is None:
        raise ServerFileError(f"{file}: (name): not the name {target.value} looks up")
    if target is ServerFileKind.VLLM_MOE and match["device"] != device_part(match["device"], target):
        raise ServerFileError(f"{file}: device_name: vLLM's fused MoE looks up every H200 as NVIDIA_H200")
    # and as export-configs --check reads vLLM's files
    if target in (ServerFileKind.VLLM_MOE, ServerFileKind.VLLM_BLOCK_FP8):
        try:
            check_vllm_config(name, doc, file)
        except VllmFileError as exc:
            raise ServerFileError(str(exc)) from None
    if not isinstance(doc, dict) or not any(k.isdigit() for k in doc):
        raise ServerFileError(f"{file}: (contents): expected a JSON object of batch sizes")
    for key, config in doc.items():
        if key == "triton_version" and target is ServerFileKind.VLLM_MOE:
            if not isinstance(config, str):
                raise ServerFileError(f"{file}: triton_version: expected a string, got {config!r}")
            continue
        if not key.isdigit() or str(int(key)) != key or int(key) < 1:
            raise ServerFileError(f"{file}: {key}: not a batch size ({target.value} reads every key as one)")
        if not isinstance(config, dict) or set(config) != set(VLLM_FIELDS):
            raise ServerFileError(f"{file}: {key}: expected the fields {', '.join(VLLM_FIELDS)}")
        for field in VLLM_FIELDS:
            value = config[field]
            power = field not in ("num_stages", "GROUP_SIZE_M")
            if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (power and value & (value - 1)):
                kind = "power of two" if power else "positive integer"
                raise ServerFileError(f"{file}: {key}.{field}: expected a {kind}, got {value!r}")
        if "block_k" in match.groupdict() and int(match["block_k"]) % config["BLOCK_SIZE_K"]:
            raise ServerFileError(f"{file}: {key}.BLOCK_SIZE_K: {config['BLOCK_SIZE_K']} does not divide the block's K "
                              f"{match['block_k']} (the kernel reads one scale per K step)")


def check_file(path: Path, root: Path) -> None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ServerFileError(f"{path}: (syntax): cannot read it as JSON: {exc}") from None
    check(path.name, doc, target_of(path.relative_to(root)), str(path))


def check_folder(root: Path) -> list[Path]:
    """Check every ``*.json`` under ``root/vllm`` and ``root/sglang``; the files checked."""
    paths = sorted(p for d in ("vllm", "sglang") for p in (root / d).rglob("*.json"))
    for path in paths:
        check_file(path, root)
    return paths


def write_server_files(outcomes: Iterable[Outcome], out: Path, dtype: str,
                       block: tuple[int, int] | None = None) -> list[Path]:
    """Write the files under ``out``: each checked before anything is written, and read back after."""
    todo = files(outcomes, dtype, block)
    for path, (target, doc) in todo.items():
        check(path.name, doc, target, str(path))
    written = []
    for path, (_, doc) in sorted(todo.items()):
        full = out / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(json.dumps(doc, indent=4) + "\n")
        check_file(full, out)
        written.append(full)
    return written


@dataclass(frozen=True)
class TunedRow:
    """A dense GEMM's outcome as the tuning-result cache keeps a best configuration (``tuned_cache.remember``)."""

    space: str
    hardware: str
    oracle: str
    problem_key: str
    problem: dict[str, Any]
    config: dict[str, Any]
    time_ms: float
    experiment: str
    study: str


def untuned_wins(o: Outcome) -> bool:
    """Whether the untuned default was timed faster than the key's tuned configuration: nothing to hand out."""
    return o.time_ms is not None and o.untuned_ms is not None and o.untuned_ms < o.time_ms


def write_tuned(outcomes: Iterable[Outcome], out: Path, dtype: str, layouts: Mapping[str, str],
                experiment: str) -> Path | None:
    """``OUT/tuned.json``: each dense GEMM key's configuration in the tuning-result cache's format, so that
    ``evotune.lookup(Problem.gemm(M, N, K, dtype, layout, scaling), space=..., path=OUT/tuned.json)`` answers it,
    the layout being its space's kernel's (``layouts``, by space name; ``tn``, a linear layer's, for any other) and
    the scaling its family's (:func:`~evotune.model.plan.scaling_of`); an interpreter's times as oracle ``cpu``,
    never standing for a GPU's. A key whose untuned default (cuBLAS, or vLLM's default configuration) was timed
    faster than the best configuration found is left out (:func:`untuned_wins`): ``lookup()`` then has no exact
    answer for it, and a caller that takes only exact answers keeps its default. None when no dense key was timed
    and kept."""
    rows = []
    for o in outcomes:
        family = Family(o.family)
        if family not in (Family.DECODE, Family.GEMM, Family.BLOCK_FP8) or o.time_ms is None or not o.space \
                or untuned_wins(o):
            continue
        problem = Problem.gemm(o.fields["M"], o.fields["N"], o.fields["K"], dtype, layouts.get(o.space, "tn"),
                               scaling_of(family, dtype))
        rows.append(TunedRow(o.space, o.device, "cpu" if o.device.startswith("cpu") else "gpu", problem.key,
                             problem.to_dict(), o.config, o.time_ms, experiment, o.key))
    if not rows:
        return None
    path = out / "tuned.json"
    remember(rows, str(out / "autotune.db"), path)
    return path
