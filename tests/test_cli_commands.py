"""Commands a new user meets first: ``--version``, ``doctor`` (what this machine can run) and ``spaces`` in a
terminal 80 columns wide."""

from __future__ import annotations

import re
import stat
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pytest

from evotune.cli import doctor
from evotune.cli.main import main


def test_version_is_the_installed_one_else_the_sources(monkeypatch, capsys) -> None:
    import evotune

    def not_installed(dist: str) -> str:
        raise PackageNotFoundError(dist)

    monkeypatch.setattr(doctor, "version", not_installed)  # a checkout run with python -m evotune
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"evotune {evotune.__version__}\n"
    monkeypatch.setattr(doctor, "version", lambda dist: "7.1.2" if dist == "evotune" else not_installed(dist))
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == "evotune 7.1.2\n"


COMPONENTS = ("GPU", "Triton", "CuTe DSL", "CUTLASS C++", "torch", "dashboard", "Kernel Tuner")


def test_doctor_on_this_machine_names_every_component_and_how_to_install_what_is_missing(capsys) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("evotune ") and lines[-1].startswith(("can run: ", " "))
    found = {f.component: f for f in doctor.findings()}
    assert set(found) == set(COMPONENTS)
    for name in COMPONENTS:
        assert any(line.startswith(name + " ") for line in lines), (name, out)
        if not found[name].found:
            assert found[name].install in " ".join(out.split()), (name, out)
    if found["Triton"].found:
        assert "TRITON_INTERPRET=1" in out
    if found["torch"].found:
        import torch

        assert torch.__version__ in out and (("CUDA " + str(torch.version.cuda)) if torch.version.cuda
                                             else "a CPU build") in out
        if not torch.cuda.is_available() and not found["GPU"].found:
            assert "none found" in out


def _nothing_installed(monkeypatch, path: Path) -> None:
    """As on a bare machine: no package but evotune's own dependencies, no program on PATH but those in
    ``path``, no GPU that cuda-python or torch would find."""
    from evotune.core import hardware

    def no_gpu(device: int = 0):
        raise RuntimeError("no CUDA GPU found")

    monkeypatch.setattr(doctor, "package_version", lambda dist: None)
    monkeypatch.setattr(doctor, "findable", lambda module: False)
    monkeypatch.setattr(hardware, "detect", no_gpu)
    monkeypatch.setenv("PATH", str(path))
    monkeypatch.delenv("CUTLASS_PATH", raising=False)


def test_doctor_on_a_bare_machine_names_each_extra(tmp_path, monkeypatch, capsys) -> None:
    _nothing_installed(monkeypatch, tmp_path)
    assert main(["doctor"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "GPU none found (nvidia-smi not on PATH; cuda-python and torch found none)" in out
    assert "Triton not installed: pip install '.[gpu]'" in out
    assert "CuTe DSL cutlass.cute not found: pip install '.[gpu]'" in out
    assert ("CUTLASS C++ missing cutlass_library, cutlass_cppgen, nvcc on PATH: pip install '.[cutlass]' and the "
            "CUDA toolkit's nvcc on PATH") in out
    assert "torch not installed: pip install '.[gpu]'" in out
    assert "dashboard not installed (evotune dashboard): pip install '.[dashboard]'" in out
    assert "Kernel Tuner not installed (compare's kt: strategies): pip install '.[bench]'" in out
    assert out.endswith("can run: replayed landscapes and CPU experiments (run, record, compare)")


def test_doctor_reads_the_gpus_from_nvidia_smi(tmp_path, monkeypatch, capsys) -> None:
    _nothing_installed(monkeypatch, tmp_path)
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\nprintf "NVIDIA H100 80GB HBM3, 9.0\\nNVIDIA H100 80GB HBM3, 9.0\\n"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    assert main(["doctor"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "GPU 2 x NVIDIA H100 80GB HBM3 (compute capability 9.0)" in out


@pytest.mark.slow  # about 1.8 s: kept out of the fast lane (its 3-minute margin)
def test_spaces_in_80_columns_keeps_every_name_whole(monkeypatch, capsys) -> None:
    from evotune.core.plugins import builtin_names, load_space

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["spaces"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    words = set(re.findall(r"[\w.]+", "\n".join(lines)))
    for name in builtin_names():  # each space heads its lines, its parameters whole
        assert any(line.startswith(f"{name}: ") or line.startswith(f"{name} (for ") for line in lines), name
        assert {p.name for p in load_space(name).params} <= words, name
    assert len(lines) <= 8 * len(builtin_names())
    monkeypatch.setenv("COLUMNS", "200")  # wide enough: the table
    assert main(["spaces"]) == 0
    assert "┃ space" in capsys.readouterr().out

