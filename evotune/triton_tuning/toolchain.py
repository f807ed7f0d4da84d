"""What a kernel's build depends on besides its source and the device: Triton, the backend, its tools, the knobs.

A decision was timed on one build of the kernel. Triton builds it again, differently, when its version, the
backend's target or tools (ptxas, CUDA), or a codegen knob changes (``TRITON_*`` and the other variables it reads,
set in the environment or through ``triton.knobs``); a decision stored for the old build would be read for the new
one. :meth:`Toolchain.current` reads all of that, and its :attr:`~Toolchain.digest` is part of a decision's key
(:class:`~evotune.triton_tuning.cache.KernelId`), so that any change tunes again:

* ``triton``: ``triton.__version__``;
* ``backend``: the backend's own hash of its target and tools, as Triton's kernel cache keys a build with it
  (NVIDIA: ptxas's version and the architecture); ``interpreter`` under ``TRITON_INTERPRET=1``; empty when no
  GPU driver is active;
* ``ptxas``: the path and version of the ptxas Triton runs (``triton.knobs.nvidia.ptxas``), where readable;
* ``cuda``: the CUDA version torch was built with (``torch.version.cuda``), where torch is;
* ``knobs``: every codegen knob Triton reads, as ``name=value``: the variables Triton's C++ side lists as
  invalidating its cache, and each knob of ``triton.knobs``'s ``compilation``, ``language``, ``nvidia``, ``amd``
  and ``runtime`` groups, except those that only dump, log, locate a library or say where to keep files
  (:data:`NOT_CODEGEN`); a Triton without ``triton.knobs``: every ``TRITON_*`` variable but those.

Example::

    Toolchain.current().digest    # '3f9c0a1b2c4d'
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

#: knobs read by Triton that change no generated code (dumps, logs, where files go, tools that only disassemble)
#: or that are keyed already (ptxas: its own field; the interpreter: the device); a knob not named here is keyed
NOT_CODEGEN = frozenset({
    "compilation.dump_ir", "compilation.dump_ir_extract_di_local_variables", "compilation.store_binary_only",
    "compilation.always_compile", "compilation.front_end_debugging", "compilation.use_ir_loc",
    "nvidia.cuobjdump", "nvidia.nvdisasm", "nvidia.ptxas", "nvidia.dump_nvptx", "nvidia.dump_ptxas_log",
    "nvidia.libcuda_path", "amd.dump_amdgcn", "amd.dump_mir", "amd.libhip_path", "runtime.interpret",
})
#: the ``triton.knobs`` groups read
GROUPS = ("compilation", "language", "nvidia", "amd", "runtime")
#: knobs Triton reads once as plain attributes rather than through a descriptor
PLAIN = (("runtime", "debug"), ("compilation", "instrumentation_mode"))
#: without ``triton.knobs``: the ``TRITON_*`` variables that change no generated code
NOT_CODEGEN_ENV = frozenset({
    "TRITON_INTERPRET", "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_DUMP_DIR", "TRITON_OVERRIDE_DIR",
    "TRITON_PRINT_AUTOTUNING", "TRITON_CACHE_AUTOTUNING", "TRITON_KERNEL_DUMP", "TRITON_ALWAYS_COMPILE",
    "TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND", "TRITON_LIBCUDA_PATH", "TRITON_DUMP_PTXAS_LOG",
})


@dataclass(frozen=True)
class Toolchain:
    """The build identity of a kernel besides its source and the device (see the module)."""

    triton: str
    backend: str
    ptxas: str
    cuda: str
    knobs: tuple[str, ...]

    @classmethod
    def current(cls) -> Toolchain:
        import triton

        return cls(str(triton.__version__), backend_hash(), ptxas_identity(), cuda_version(), codegen_knobs())

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def backend_hash() -> str:
    """The active backend's hash of its target and tools (what Triton's kernel cache keys a build with)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "interpreter"
    try:
        from triton.compiler.compiler import make_backend
        from triton.runtime.driver import driver

        return f"{make_backend(driver.active.get_current_target()).hash()}"
    except Exception:  # no GPU driver active (a CPU host), or a backend that cannot say
        return ""


def ptxas_identity() -> str:
    """``PATH VERSION`` of the ptxas Triton runs, or empty where Triton cannot find or name one."""
    try:
        from triton import knobs

        tool = knobs.nvidia.ptxas
    except Exception:  # no triton.knobs (an older Triton), or no ptxas
        return ""
    return f"{getattr(tool, 'path', '')} {getattr(tool, 'version', '')}".strip()


def cuda_version() -> str:
    try:
        import torch
    except ImportError:
        return ""
    return str(torch.version.cuda or "")


def codegen_knobs() -> tuple[str, ...]:
    """``name=value`` of every codegen knob and variable Triton reads (see the module), sorted."""
    out: dict[str, str] = {}
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        out.update({f"env.{k}": str(v) for k, v in get_cache_invalidating_env_vars().items()})
    except ImportError:
        pass
    try:
        from triton import knobs
    except ImportError:  # an older Triton: its TRITON_* variables
        out.update({f"env.{k}": v for k, v in os.environ.items()
                    if k.startswith("TRITON_") and k not in NOT_CODEGEN_ENV})
        return tuple(f"{k}={v}" for k, v in sorted(out.items()))
    for group_name in GROUPS:
        group = getattr(knobs, group_name, None)
        for name in getattr(group, "knob_descriptors", {}):
            full = f"{group_name}.{name}"
            if full not in NOT_CODEGEN:
                out[full] = _text(group, name)
    for group_name, name in PLAIN:
        group = getattr(knobs, group_name, None)
        if group is not None and hasattr(group, name):
            out[f"{group_name}.{name}"] = _text(group, name)
    return tuple(f"{k}={v}" for k, v in sorted(out.items()))


def _text(group: Any, name: str) -> str:
    """A knob's value as text (a tool: its path and version); a knob that fails to read, as the failure."""
    try:
        value = getattr(group, name)
    except Exception as exc:  # a tool knob whose binary is missing raises when read
        return f"unreadable ({type(exc).__name__})"
    if hasattr(value, "path") and hasattr(value, "version"):
        return f"{value.path} {value.version}"
    return str(value)
