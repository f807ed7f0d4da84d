"""A model as its serving kernels see it: the sizes read from a Hugging Face ``config.json``.

``MODEL`` is a path to a ``config.json`` or the name of a shipped description (``configs/NAME.json`` beside this
module: Llama-3-8B, Llama-3-70B, Mixtral-8x7B, DeepSeek-V3). Only the JSON is read: no weights, no network, no
``transformers``. A missing or mistyped field raises :class:`ModelError`, one line naming the file and the field.

Fields read: ``hidden_size``, ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads`` (default: the
heads), ``head_dim`` (default ``hidden_size / num_attention_heads``); experts as ``num_local_experts`` (Mixtral) or
``n_routed_experts`` (DeepSeek), with ``num_experts_per_tok`` and ``moe_intermediate_size`` (default
``intermediate_size``), ``n_shared_experts``, ``first_k_dense_replace``; multi-head latent attention
(``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``); and
``quantization_config`` (``quant_method = "fp8"`` with ``weight_block_size``: block-fp8 weights).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHIPPED = Path(__file__).parent / "configs"


class ModelError(ValueError):
    """A model that cannot be read: one line naming the file (or the name) and the field."""


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention (DeepSeek): queries and keys/values through low-rank projections."""

    q_lora_rank: int | None  # None: queries projected straight from the hidden state
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Experts:
    """The mixture of experts of an MoE layer."""

    routed: int  # E
    top_k: int
    intermediate_size: int  # one expert's
    shared: int  # experts every token goes through (a dense MLP of shared x intermediate_size)
    dense_layers: int  # leading layers with a dense MLP instead (first_k_dense_replace)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # the file read
    hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: Experts | None
    latent: Latent | None
    fp8_block: tuple[int, int] | None  # (N, K) of the weights' scale blocks when shipped as block-fp8

    @property
    def default_dtype(self) -> str:
        return "fp8" if self.fp8_block is not None else "bf16"


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.json"))


def resolve(model: str) -> Path:
    """The ``config.json`` that ``model`` names: a path, or a shipped description's name."""
    path = Path(model)
    if path.suffix == ".json" or path.is_file() or path.is_dir() or "/" in model:
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ModelError(f"{model}: no such file")
        return path
    shipped = SHIPPED / f"{model}.json"
    if not shipped.is_file():
        raise ModelError(f"MODEL: {model}: neither a config.json path nor a shipped model "
                         f"({', '.join(shipped_names())})")
    return shipped


def load_model(model: str) -> ModelSpec:
    path = resolve(model)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{path}: cannot read it as JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    # a checkpoint's config.json is named by its folder (Meta-Llama-3-8B/config.json), any other file by itself
    return parse(doc, path, path.parent.name if path.name == "config.json" and path.parent.name else path.stem)


def _int(doc: dict[str, Any], path: Path, field: str, default: int | None = None, minimum: int = 1) -> int:
    value = doc.get(field)
    if value is None:
        if default is None:
            raise ModelError(f"{path}: {field}: missing (a Hugging Face config.json field this model needs)")
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ModelError(f"{path}: {field}: expected an integer >= {minimum}, got {value!r}")
    return value


def parse(doc: dict[str, Any], path: Path, name: str) -> ModelSpec:
    hidden = _int(doc, path, "hidden_size")
    heads = _int(doc, path, "num_attention_heads")
    kv_heads = _int(doc, path, "num_key_value_heads", heads)
    if hidden % heads and "head_dim" not in doc:
        raise ModelError(f"{path}: head_dim: missing, and hidden_size {hidden} is not a multiple of "
                         f"num_attention_heads {heads}")
    head_dim = _int(doc, path, "head_dim", hidden // heads)
    routed = doc.get("num_local_experts", doc.get("n_routed_experts"))
    experts = None
    moe_size = doc.get("moe_intermediate_size")
    if routed is not None:
        field = "num_local_experts" if "num_local_experts" in doc else "n_routed_experts"
        routed = _int(doc, path, field)
        top_k = _int(doc, path, "num_experts_per_tok")
        size = _int(doc, path, "moe_intermediate_size", None if "intermediate_size" not in doc else
                    _int(doc, path, "intermediate_size"))
        experts = Experts(routed, top_k, size, _int(doc, path, "n_shared_experts", 0, 0),
                          _int(doc, path, "first_k_dense_replace", 0, 0))
        if top_k > routed:
            raise ModelError(f"{path}: num_experts_per_tok: {top_k} is more than the {routed} experts")
    intermediate = _int(doc, path, "intermediate_size", moe_size if isinstance(moe_size, int) and experts else None)
    latent = None
    if "kv_lora_rank" in doc:
        q_rank = doc.get("q_lora_rank")
        latent = Latent(None if q_rank is None else _int(doc, path, "q_lora_rank"),
                        _int(doc, path, "kv_lora_rank"), _int(doc, path, "qk_nope_head_dim"),
                        _int(doc, path, "qk_rope_head_dim"), _int(doc, path, "v_head_dim"))
    return ModelSpec(name, str(path), hidden, intermediate, heads, kv_heads, head_dim, experts, latent,
                     _fp8_block(doc, path))


def _fp8_block(doc: dict[str, Any], path: Path) -> tuple[int, int] | None:
    q = doc.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise ModelError(f"{path}: quantization_config: expected an object, got {q!r}")
    if q.get("quant_method") != "fp8" or q.get("weight_block_size") is None:
        return None  # another scheme: the model is tuned at the dtype given on the command line
    block = q["weight_block_size"]
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ModelError(f"{path}: quantization_config.weight_block_size: expected two positive integers, got "
                         f"{block!r}")
    return block[0], block[1]
