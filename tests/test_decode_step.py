"""The CPU side of benchmarks/decode_step.py: the bytes a layer moves and how the two flushes are scored."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import ROOT


@pytest.fixture(scope="module")
def decode_step():
    spec = importlib.util.spec_from_file_location("decode_step", ROOT / "benchmarks" / "decode_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["decode_step"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def layer(decode_step, in_seq: float, dirty: float, clean: float):
    return decode_step.LayerTimes("l", 4096, 4096, in_seq, (in_seq, in_seq), {"dirty": dirty, "clean": clean},
                                  {"dirty": (dirty, dirty), "clean": (clean, clean)})


def test_the_flush_whose_isolated_times_are_nearer_the_sequence_wins(decode_step):
    layers = [layer(decode_step, 0.040, 0.050, 0.038), layer(decode_step, 0.100, 0.110, 0.104)]
    result = decode_step.verdict(layers)
    assert result["mean_abs_rel_err"]["dirty"] == pytest.approx((0.25 + 0.10) / 2)
    assert result["mean_abs_rel_err"]["clean"] == pytest.approx((0.05 + 0.04) / 2)
    assert result["better"] == "clean"
    layers = [layer(decode_step, 0.050, 0.051, 0.040)]
    assert decode_step.verdict(layers)["better"] == "dirty"


def test_the_block_is_llama_7b_at_16_tokens(decode_step):
    assert decode_step.M == 16
    assert [(n, k) for _, n, k in decode_step.LAYERS] == [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008)]
    # x, W and y once each, bf16
    assert decode_step.min_bytes(4096, 4096) == (16 * 4096 + 4096 * 4096 + 16 * 4096) * 2
