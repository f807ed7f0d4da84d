"""Resource use read from a compiled kernel: registers, shared memory and stack frame, without a GPU.

CuTe DSL's ``export_to_c`` writes a host object file that embeds the kernel's
fatbin; the fatbin holds the cubin (an ELF file for the GPU). NVIDIA documents
no Python API for what ``cuobjdump --dump-resource-usage`` prints, and the
toolkits evotune meets do not all ship cuobjdump, so this module reads the ELF
itself (standard library only):

* registers per thread: the ``EIATTR_REGCOUNT`` attribute of ``.nv.info``
  (the figure ``ptxas -v`` prints as "Used N registers");
* stack frame per thread: ``EIATTR_FRAME_SIZE``; register spills land in the
  frame, so 0 means no spills (ptxas's exact spill bytes are not in the cubin);
* static shared memory: the size of the kernel's ``.nv.shared.*`` sections;
* the target: the fatbin entry's SM version.

Dynamic shared memory is not in the cubin: the host code passes it at launch.
:func:`launch_smem_from_ir` reads it from the host IR that CuTe DSL keeps on a
compiled function (the ``dynamicSmemBytes`` field of the ``cudaLaunchConfig_t``
it fills in).

Example::

    from evotune.measurement.binary import read_object
    info = read_object(open("kernel.o", "rb").read())
    info.regs, info.static_smem, info.frame_bytes, info.sm   # 47, 1024, 0, 100
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

FATBIN_MAGIC = 0xBA55ED50
ELF_MAGIC = b"\x7fELF"
FATBIN_KIND_CUBIN = 2
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL = 0x04  # a sized value; every other format is a 16-bit value or none, in 4 bytes with the header


class BinaryError(ValueError):
    """The bytes are not an object, fatbin or cubin this module can read."""


@dataclass(frozen=True)
class KernelResources:
    """What one compiled kernel needs per thread and per block (the largest over the kernels of a binary)."""

    regs: int
    frame_bytes: int
    static_smem: int
    sm: int  # 90 for sm_90a, 100 for sm_100a (0 when the container does not say)


def _sections(elf: bytes) -> list[tuple[str, int, int, int, int]]:
    """(name, type, offset, size, info) of every section of a 64-bit little-endian ELF."""
    if elf[:4] != ELF_MAGIC or elf[4] != 2 or elf[5] != 1:
        raise BinaryError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = raw[shstrndx][4]

    def name(offset: int) -> str:
        start = strtab + offset
        return elf[start:elf.index(b"\0", start)].decode(errors="replace")

    return [(name(s[0]), s[1], s[4], s[5], s[7]) for s in raw]


def _attributes(data: bytes) -> list[tuple[int, bytes]]:
    """(attribute, value bytes) of an ``.nv.info`` section."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        fmt, attr = data[pos], data[pos + 1]
        if fmt == EIFMT_SVAL:
            size, = struct.unpack_from("<H", data, pos + 2)
            out.append((attr, data[pos + 4:pos + 4 + size]))
            pos += 4 + size
        else:
            out.append((attr, data[pos + 2:pos + 4]))
            pos += 4
    return out


def read_cubin(cubin: bytes, sm: int = 0) -> KernelResources:
    """Registers, stack frame and static shared memory of the kernels in a cubin."""
    regs = frame = smem = 0
    for name, _type, offset, size, _info in _sections(cubin):
        if name == ".nv.info":
            for attr, value in _attributes(cubin[offset:offset + size]):
                if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and len(value) == 8:
                    _symbol, amount = struct.unpack("<II", value)
                    if attr == EIATTR_REGCOUNT:
                        regs = max(regs, amount)
                    else:
                        frame = max(frame, amount)
        elif name.startswith(".nv.shared.") and not name.startswith(".nv.shared.reserved"):
            smem = max(smem, size)
    if not regs:
        raise BinaryError("the cubin has no register count (EIATTR_REGCOUNT)")
    return KernelResources(regs=regs, frame_bytes=frame, static_smem=smem, sm=sm)


def cubins(blob: bytes) -> list[tuple[int, bytes]]:
    """(SM version, cubin) for every uncompressed cubin of every fatbin found in ``blob``."""
    found, pos = [], 0
    magic = struct.pack("<I", FATBIN_MAGIC)
    while (start := blob.find(magic, pos)) >= 0:
        _magic, _version, header, total = struct.unpack_from("<IHHQ", blob, start)
        entry, end = start + header, start + header + total
        while entry + 16 <= min(end, len(blob)):
            kind, _v, entry_header, size = struct.unpack_from("<HHIQ", blob, entry)
            sm, = struct.unpack_from("<I", blob, entry + 28) if entry_header >= 32 else (0,)
            payload = blob[entry + entry_header:entry + entry_header + size]
            if kind == FATBIN_KIND_CUBIN and payload[:4] == ELF_MAGIC:
                found.append((sm, payload))
            entry += entry_header + size
        pos = max(end, start + 4)
    return found


def read_object(blob: bytes) -> KernelResources:
    """Resource use of the kernels in a host object (``export_to_c``), a fatbin or a bare cubin."""
    if blob[:4] == ELF_MAGIC and not cubins(blob):
        return read_cubin(blob)
    found = cubins(blob)
    if not found:
        raise BinaryError("no uncompressed cubin found (is the fatbin compressed?)")
    parts = [read_cubin(cubin, sm) for sm, cubin in found]
    return KernelResources(regs=max(p.regs for p in parts), frame_bytes=max(p.frame_bytes for p in parts),
                           static_smem=max(p.static_smem for p in parts), sm=max(p.sm for p in parts))


_LAUNCH_CONFIG = r"!llvm\.struct<\(array<3 x i32>, array<3 x i32>, i64, ptr, ptr, i32\)>"
_SMEM_FIELD = re.compile(r"(%\d+) = llvm\.getelementptr %\d+\[0, 2\] : \(!llvm\.ptr\) -> !llvm\.ptr, " + _LAUNCH_CONFIG)


def launch_smem_from_ir(ir: str) -> int | None:
    """The dynamic shared memory the host code launches with, from CuTe DSL's host IR (LLVM dialect).

    The largest constant stored into the ``dynamicSmemBytes`` field of a launch
    config; None when the IR sets it from a run-time value or has another shape.
    """
    sizes = []
    for body in re.split(r"\n\s*llvm\.func ", ir):  # SSA names are local to a function
        constants = dict(re.findall(r"(%\d+) = llvm\.mlir\.constant\((\d+) : i64\) : i64", body))
        for field in _SMEM_FIELD.findall(body):
            for value in re.findall(r"llvm\.store (%\d+), " + re.escape(field) + r" : i64", body):
                if value in constants:
                    sizes.append(int(constants[value]))
    return max(sizes) if sizes else None
