"""``python -m evotune doctor``: what this machine can run, in a few lines, and what to install for the rest.

Each component is found without importing it where that can be done (a package's version from its installed
metadata, a module by :func:`evotune.core.space.findable`, as a space's ``needs`` are checked, a program on
``PATH``); the GPU is asked of ``nvidia-smi``, else of cuda-python and torch, and torch is imported for its CUDA
build. What is missing names the extra that brings it (``pip install '.[gpu]'`` in the evotune clone).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from evotune.cli.output import make_console
from evotune.core.space import findable

NVIDIA_SMI_S = 30  # nvidia-smi answers in well under a second; a driver in a bad state can leave it hanging


@dataclass(frozen=True)
class Finding:
    """One component: what was found (``found`` False: what is missing) and, when missing, how to install it."""

    component: str
    found: bool
    detail: str
    install: str = ""

    def line(self, width: int) -> str:
        text = self.detail + (f": {self.install}" if self.install and not self.found else "")
        return f"{self.component:<{width}}  {text}"


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: str  # "9.0"


def evotune_version() -> str:
    """evotune's version as installed (its metadata), else the source's own (a checkout run with
    ``python -m evotune``)."""
    from evotune import __version__

    return package_version("evotune") or __version__


def package_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, read from its metadata (nothing imported)."""
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def find_gpus() -> tuple[list[Gpu], str]:
    """The GPUs of this machine, and how they were found (or why none was)."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            done = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=NVIDIA_SMI_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None and done.returncode == 0:
            gpus = [Gpu(*(part.strip() for part in row.rsplit(",", 1)))
                    for row in done.stdout.splitlines() if "," in row]
            if gpus:
                return gpus, "nvidia-smi"
    from evotune.core import hardware

    try:  # cuda-python, else torch
        found = hardware.detect()
    except RuntimeError:
        how = "nvidia-smi not on PATH" if smi is None else "nvidia-smi found none"
        return [], f"{how}; cuda-python and torch found none"
    capability = found.arch.removeprefix("sm_").rstrip("a")
    return [Gpu(found.name, f"{capability[:-1]}.{capability[-1]}")], "cuda-python or torch"


def gpu_finding() -> Finding:
    gpus, how = find_gpus()
    if not gpus:
        return Finding("GPU", False, f"none found ({how})")
    kinds = list(dict.fromkeys(gpus))
    return Finding("GPU", True, "; ".join(f"{gpus.count(g)} x {g.name} (compute capability {g.capability})"
                                          if gpus.count(g) > 1 else f"{g.name} (compute capability {g.capability})"
                                          for g in kinds))


def triton_finding() -> Finding:
    v = package_version("triton")
    if v is None:
        return Finding("Triton", False, "not installed", "pip install '.[gpu]'")
    interpreter = findable("triton.runtime.interpreter")
    on = os.environ.get("TRITON_INTERPRET") == "1"
    return Finding("Triton", True, f"{v}; " + ("its interpreter runs kernels on the CPU with TRITON_INTERPRET=1"
                                               + (" (set)" if on else "") if interpreter else "no interpreter"))


def cute_finding() -> Finding:
    if not findable("cutlass.cute"):
        return Finding("CuTe DSL", False, "cutlass.cute not found", "pip install '.[gpu]'")
    v = package_version("nvidia-cutlass-dsl")
    operators = findable("cutlass.operators")
    return Finding("CuTe DSL", operators, f"cutlass.cute {v or '(version unknown)'}"
                   + ("" if operators else "; cutlass.operators not found"), "pip install '.[gpu]'")


def cutlass_cpp_finding() -> Finding:
    headers = bool(os.environ.get("CUTLASS_PATH")) or findable("cutlass_library")
    parts = [("cutlass_library" if not os.environ.get("CUTLASS_PATH") else "CUTLASS_PATH", headers),
             ("cutlass_cppgen", findable("cutlass_cppgen")), ("nvcc on PATH", shutil.which("nvcc") is not None)]
    missing = [name for name, ok in parts if not ok]
    if not missing:
        v = package_version("nvidia-cutlass")
        return Finding("CUTLASS C++", True, f"nvidia-cutlass {v or '(CUTLASS_PATH)'}, nvcc on PATH")
    install = "pip install '.[cutlass]'" + (" and the CUDA toolkit's nvcc on PATH" if "nvcc on PATH" in missing
                                             else "")
    return Finding("CUTLASS C++", False, "missing " + ", ".join(missing), install)


def torch_finding() -> Finding:
    v = package_version("torch")
    if v is None:
        return Finding("torch", False, "not installed", "pip install '.[gpu]'")
    try:
        import torch
    except Exception as exc:  # installed but broken: what it said
        return Finding("torch", False, f"{v}, fails to import ({type(exc).__name__})", "pip install '.[gpu]'")
    cuda = torch.version.cuda
    return Finding("torch", True, f"{v}, " + (f"built for CUDA {cuda}" if cuda else "a CPU build (no CUDA)"))


def optional_finding(component: str, dist: str, purpose: str, extra: str) -> Finding:
    v = package_version(dist)
    if v is None:
        return Finding(component, False, f"not installed ({purpose})", f"pip install '.[{extra}]'")
    return Finding(component, True, f"{dist} {v} ({purpose})")


def findings() -> list[Finding]:
    return [gpu_finding(), triton_finding(), cute_finding(), cutlass_cpp_finding(), torch_finding(),
            optional_finding("dashboard", "optuna-dashboard", "evotune dashboard", "dashboard"),
            optional_finding("Kernel Tuner", "kernel_tuner", "compare's kt: strategies", "bench")]


def can_run(found: dict[str, Finding]) -> str:
    """What the findings let this machine run, in one line."""
    out = ["replayed landscapes and CPU experiments (run, record, compare)"]
    gpu, triton = found["GPU"].found, found["Triton"].found
    if gpu and triton and found["torch"].found:
        out.append("Triton spaces and evotune.autotune on the GPU")
    elif triton and found["torch"].found:
        out.append("evotune.autotune and tune-kernel on the CPU through TRITON_INTERPRET=1 (tiny shapes)")
    if found["CuTe DSL"].found:
        out.append("the CuTe DSL spaces" + (" on the GPU" if gpu else " with record --compile-only"))
    if found["CUTLASS C++"].found:
        out.append("the CUTLASS C++ spaces" + (" on the GPU" if gpu else " with record --compile-only"))
    return "can run: " + "; ".join(out)


def cmd_doctor(args: argparse.Namespace) -> int:
    console = make_console()
    found = findings()
    width = max(len(f.component) for f in found)
    lines = [f"evotune {evotune_version()} on Python {sys.version.split()[0]}",
             *(f.line(width) for f in found), can_run({f.component: f for f in found})]
    for line in lines:  # wrapped at word boundaries, continuations under the text
        for part in textwrap.wrap(line, width=console.width, subsequent_indent=" " * (width + 2),
                                  break_long_words=False, break_on_hyphens=False):
            console.print(part, markup=False, highlight=False, soft_wrap=True)
    return 0
