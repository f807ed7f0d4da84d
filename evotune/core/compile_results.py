"""Compile-only files: what the compiler said about each point of a space, and how that agrees with its pruning.

``evotune record --compile-only`` (:mod:`evotune.running.compile_only`) compiles the
points of a space for one GPU, one input dtype and one layout, and writes them
here as one small gzipped JSON file per (space, hardware, dtype, layout): the
CuTe DSL binaries have symbolic shapes, so one compile serves every problem
size of those dtypes. Each row holds a point's values, whether it compiled, the
compile seconds, registers and stack frame per thread, shared memory per block
(static plus the dynamic amount it launches with), the A/B stages the kernel
chose, and the compiler's first error line.

A compiled point *builds* on the hardware when its shared memory, static plus
dynamic, also fits in a block's opt-in limit: CUDA allows a kernel no more
dynamic shared memory than that limit less its static shared memory (see
``cudaFuncAttributeMaxDynamicSharedMemorySize``), and CuTe DSL compiles a
kernel that asks for more, which then fails at launch.

:func:`agreement` holds a space's pruning against such a file: a
*false-feasible* point is feasible in the space but does not build; a
*false-infeasible* one is pruned but builds. Constraints on the problem's shape
(bounds, alignment) cannot be judged by a shape-free compile; their pruned
points are counted apart, as ``unjudged``.

Example::

    from evotune.core.compile_results import DEFAULT_DIR, load_compiled, agreement
    table = load_compiled(DEFAULT_DIR / "cute_blackwell_gemm_B200_bf16_tn.json.gz")
    agreement(SPACE, Context(get_hardware("B200"), problem), table).false_feasible   # []
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evotune.core.hardware import Hardware
from evotune.core.landscape import SHIPPED
from evotune.core.space import Context, Point, SearchSpace

FORMAT = "evotune-compile-1"
COLUMNS = ("ok", "compile_s", "regs", "frame_bytes", "smem", "stages", "error")
#: the shipped compile-only files (package data, beside the shipped landscapes)
DEFAULT_DIR = SHIPPED / "compile"


class CompiledError(ValueError):
    """A compile-only file that cannot be read; the message names the file."""


def file_name(space: str, hardware: str, dtype: str, layout: str) -> str:
    return f"{space}_{hardware}_{dtype}_{layout}.json.gz"


@dataclass
class Compiled:
    """One point's compile: ``ok`` is whether the compiler produced a binary."""

    ok: bool
    compile_s: float
    regs: int | None = None
    frame_bytes: int | None = None
    smem: int | None = None
    stages: int | None = None
    error: str | None = None

    def builds(self, hardware: Hardware) -> bool:
        return self.why_not(hardware) is None

    def why_not(self, hardware: Hardware) -> str | None:
        """Why the binary cannot run on ``hardware`` (the compiler's error, or a launch limit), or None."""
        if not self.ok:
            return self.error or "did not compile"
        if self.smem is not None and self.smem > hardware.smem_per_block:
            return f"launch needs {self.smem} B of shared memory, {hardware.name} allows {hardware.smem_per_block}"
        return None


@dataclass
class CompiledTable:
    """A compile-only file: its header and one :class:`Compiled` per point key."""

    meta: dict[str, Any]
    rows: dict[str, Compiled] = field(default_factory=dict)
    path: Path | None = None

    def get(self, space: SearchSpace, point: Point) -> Compiled | None:
        return self.rows.get(space.key(point))


def document(space: SearchSpace, meta: dict[str, Any], results: list[tuple[Point, Compiled]]) -> dict[str, Any]:
    """The JSON document for ``results``: errors are stored once and referred to by index."""
    errors: list[str] = []
    rows = []
    for point, c in sorted(results, key=lambda pr: space.encode(pr[0])):
        err = None
        if c.error:
            if c.error not in errors:
                errors.append(c.error)
            err = errors.index(c.error)
        values = list(space.to_storage(point).values())
        rows.append([*values, int(c.ok), round(c.compile_s, 2), c.regs, c.frame_bytes, c.smem, c.stages, err])
    return {"format": FORMAT, **meta, "params": space.names, "columns": list(COLUMNS), "errors": errors,
            "rows": rows}


def write_compiled(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    tmp.replace(path)
    return path


def load_compiled(path: str | Path, space: SearchSpace | None = None) -> CompiledTable:
    """Read a compile-only file; with ``space``, check that its parameters match and key rows by point."""
    path = Path(path)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise CompiledError(f"{path}: not a readable compile-only file ({exc})") from None
    if doc.get("format") != FORMAT:
        raise CompiledError(f"{path}: format {doc.get('format')!r}, expected {FORMAT!r}")
    names = doc["params"]
    if space is not None and names != space.names:
        raise CompiledError(f"{path}: parameters {names} are not those of space {space.name!r} ({space.names})")
    meta = {k: v for k, v in doc.items() if k not in ("rows", "errors", "params", "columns")}
    table = CompiledTable(meta, path=path)
    n = len(names)
    for row in doc["rows"]:
        values, rest = row[:n], row[n:]
        c = Compiled(bool(rest[0]), rest[1], rest[2], rest[3], rest[4], rest[5],
                     None if rest[6] is None else doc["errors"][rest[6]])
        params = dict(zip(names, values, strict=True))
        key = space.key(space.from_storage(params)) if space is not None else ",".join(
            f"{k}={v}" for k, v in params.items())
        table.rows[key] = c
    return table


def find_compiled(directory: str | Path, space: str, hardware: str, dtype: str, layout: str) -> Path | None:
    path = Path(directory) / file_name(space, hardware, dtype, layout)
    return path if path.is_file() else None


@dataclass
class Agreement:
    """A space's pruning against the compiler, in one context."""

    checked_feasible: int = 0
    feasible_total: int = 0
    checked_pruned: int = 0
    false_feasible: list[tuple[str, str]] = field(default_factory=list)  # (point key, why it does not build)
    false_infeasible: Counter[str] = field(default_factory=Counter)  # constraint -> pruned points that build
    agreed_pruned: Counter[str] = field(default_factory=Counter)  # constraint -> pruned points that do not build
    unjudged: Counter[str] = field(default_factory=Counter)  # constraint on the shape -> pruned points checked
    examples: dict[str, str] = field(default_factory=dict)  # constraint -> one false-infeasible point key


# constraints that speak of the problem's shape, which a shape-free compile cannot see
SHAPE_CONSTRAINTS = frozenset({"alignment", "no-tma-store-oob", "dtype", "8bit-k-major"})


def agreement(space: SearchSpace, ctx: Context, table: CompiledTable) -> Agreement:
    """Count false-feasible and false-infeasible points of ``space`` in ``ctx`` over the points ``table`` holds."""
    assert ctx.hardware is not None, "agreement needs the hardware the file was compiled for"
    out = Agreement(feasible_total=len(space.feasible(ctx)))
    for point in space.points():
        c = table.get(space, point)
        if c is None:
            continue
        reason = space.check(point, ctx)
        why = c.why_not(ctx.hardware)
        if reason is None:
            out.checked_feasible += 1
            if why is not None:
                out.false_feasible.append((space.key(point), why))
            continue
        out.checked_pruned += 1
        name = reason.split(":", 1)[0]
        if name in SHAPE_CONSTRAINTS:
            out.unjudged[name] += 1
        elif why is None:
            out.false_infeasible[name] += 1
            out.examples.setdefault(name, space.key(point))
        else:
            out.agreed_pruned[name] += 1
    return out


def compiled_context(directory: Path, space: SearchSpace, ctx: Context) -> Context:
    """``ctx`` with the compile-only file of its space, GPU, dtype and layout from ``directory``, when there is
    one: the space's estimate (hardware seeding) then reads registers, shared memory and stages off the
    binaries. Raises :class:`CompiledError` for a file that does not match the space."""
    hardware, problem = ctx.hardware, ctx.problem
    if hardware is None or problem is None or problem.kind != "gemm":
        return ctx
    path = find_compiled(directory, space.name, hardware.name, problem.dtype, problem.layout)
    if path is None:
        return ctx
    return Context(hardware, problem, compiled=load_compiled(path, space))
