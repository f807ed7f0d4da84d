"""The workload seam: finding workloads, and the GEMM workload keeping every key and count it had."""

from __future__ import annotations

import numpy as np
import pytest

from evotune.core.problem import (
    FieldError,
    Problem,
    Workload,
    WorkloadNotFound,
    find_workload,
    get_workload,
    workload_names,
)


def test_builtin_workloads_are_found_by_kind():
    assert "gemm" in workload_names()
    assert isinstance(get_workload("gemm"), Workload)
    assert get_workload("gemm").kind == "gemm"


def test_unknown_kind_is_no_workload():
    assert find_workload("pnpoly") is None
    with pytest.raises(WorkloadNotFound, match=r"unknown workload 'pnpoly'; accepted: .*gemm"):
        get_workload("pnpoly")


def test_gemm_problem_keys_counts_and_json_are_unchanged():
    p = Problem.gemm(4000, 4096, 4096, dtype="int8", layout="tn")
    assert p.key == "gemm_int8_tn_4000x4096x4096"
    assert p.bucket().key == "gemm_int8_tn_4096x4096x4096"
    assert get_workload("gemm").bucket_key(p) == "gemm_int8_tn_4096x4096x4096"
    assert p.flops == 2 * 4000 * 4096 * 4096
    assert p.min_bytes == (4000 * 4096 + 4096 * 4096) * 1 + 4000 * 4096 * 4
    assert p.to_dict() == {"kind": "gemm", "m": 4000, "n": 4096, "k": 4096, "dtype": "int8", "layout": "tn",
                           "label": "", "extra": {}}
    assert Problem.from_dict(p.to_dict()) == p
    assert p.describe() == "4000x4096x4096 int8 tn"


def test_recorded_kernel_problem_is_unchanged():
    p = Problem(kind="pnpoly", label="20000000")
    assert (p.key, p.flops, p.min_bytes, p.bucket()) == ("pnpoly_20000000", None, None, p)
    assert p.to_dict() == {"kind": "pnpoly", "label": "20000000", "extra": {}}


def test_gemm_parse_names_the_bad_field():
    w = get_workload("gemm")
    assert w.parse({"m": 8, "n": 16, "k": 32, "dtype": "fp16"}) == Problem.gemm(8, 16, 32, "fp16")
    for table, field in [({"n": 1, "k": 1}, "m"), ({"m": 0, "n": 1, "k": 1}, "m"),
                         ({"m": 1, "n": 1, "k": 1, "dtype": "fp4"}, "dtype"),
                         ({"m": 1, "n": 1, "k": 1, "layout": "xx"}, "layout")]:
        with pytest.raises(FieldError) as exc:
            w.parse(table)
        assert exc.value.field == field


def test_gemm_cpu_check_is_a_at_b():
    w, p = get_workload("gemm"), Problem.gemm(5, 6, 7, "fp32")
    a, b = w.cpu_inputs(p, seed=3)
    assert (a.shape, b.shape) == ((5, 7), (7, 6))
    assert w.cpu_verify(p, (a, b), a @ b)[0]
    ok, _, why = w.cpu_verify(p, (a, b), a @ b + 1)
    assert not ok and "relative error" in why
    assert w.cpu_verify(p, (a, b), np.zeros((6, 5)))[2] == "shape (6, 5), expected (5, 6)"
