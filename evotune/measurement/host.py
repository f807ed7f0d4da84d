"""The host a GPU worker shares: its GPUs, the workers on it, their compile pools' sizes, and where each
worker's processes run.

``evotune worker`` runs one worker per GPU (``CUDA_VISIBLE_DEVICES``), so a host of N GPUs runs N of them, and
they share its cores. Two rules follow:

* **Pool sizes.** Each worker's compile pool takes its share of the host's cores and free memory
  (:func:`default_workers`), so that the N pools fit the host together.
* **Placement.** A worker's measuring processes (the tuner and its GPU worker) wait on every point: the GPU
  worker's launches and synchronisations, then the tuner's next proposal. Its compile processes work in bursts, a
  dozen at once. Left to the scheduler, a burst lands on the cores the measuring processes were on, and each
  point's GPU work takes longer. So each worker measures on a core of its own, the ``index``-th of the host
  (``index``: the first GPU it sees), and every compile process runs on the cores that no worker of the host
  measures on (:func:`placement`). A run places its process for its length (:func:`place_measuring`,
  :func:`unplace`): a library call that measures moves nobody. The server the GPU worker and the compile processes
  fork from is started before, on every core: its imports run beside the tuner's start-up, and each process forked
  from it moves where it belongs (the GPU worker to its tuner's CPUs,
  :func:`evotune.measurement.processes.as_child`; a compile process to :func:`pool_cpus`). What it gives on a host
  of two GPUs: benchmarks/RESULTS.md, "Two GPUs against one".

Nothing is placed where the worker is confined to some cores already (``taskset``, a container's CPU set: the
user's choice stands), where the GPUs it sees are not named by index, or where the host has fewer than
``MIN_CPUS`` CPUs per worker (its pools would lose too large a share).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MIN_CPUS = 4  # per worker, for a placement: one core to measure on and three to compile
COMPILE_GB = 1.5  # memory a compile process may take (a CuTe DSL compile: about 1 GB)
_placed: Placement | None = None  # this process's placement while a run holds it (place_measuring)
_before: frozenset[int] = frozenset()  # and where it ran before


@dataclass(frozen=True)
class Placement:
    """Where one worker's processes run: ``measuring`` (the tuner, the GPU worker, the server they fork from)
    and ``pool`` (the compile processes of every worker on the host)."""

    measuring: frozenset[int]
    pool: frozenset[int]


def plan(cpus: Sequence[int], workers: int, index: int, siblings: Callable[[int], Iterable[int]]) -> Placement | None:
    """The placement of worker ``index`` of ``workers`` on a host of ``cpus``: the first cores (a core: a CPU and
    its hyperthread ``siblings``) go to the workers' measuring, one each, in the workers' order; the rest to the
    compile pools. The tuner and its GPU worker take turns more than they run side by side (the tuner proposes,
    the GPU worker measures), so one core serves both. None where the host has fewer than :data:`MIN_CPUS` per
    worker."""
    if not 0 <= index < workers or len(cpus) < MIN_CPUS * workers:
        return None
    usable, seen, cores = set(cpus), set[int](), list[frozenset[int]]()
    for cpu in sorted(usable):
        if cpu not in seen:
            core = frozenset({cpu, *(s for s in siblings(cpu) if s in usable)})
            seen |= core
            cores.append(core)
    if len(cores) <= workers:
        return None
    pool = frozenset(usable).difference(*cores[:workers])
    return Placement(cores[index], pool)


@functools.cache
def placement() -> Placement | None:
    """This worker's placement (:func:`plan` on this host), or None; read once per process, before it moves."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < (os.cpu_count() or 1):
        return None  # confined already
    index = gpu_index()
    return None if index is None else plan(mine, workers_on_host(), index, siblings)


def place_measuring() -> None:
    """For a run: move this process (the tuner) to its measuring cores; its GPU worker runs there too, and its
    compile processes run on :func:`pool_cpus`. :func:`unplace` puts it back where it was at the run's end (a
    process that goes on, a notebook's, is not left on one core)."""
    global _placed, _before
    place = placement()
    if place is None or _placed is not None:
        return
    _before = frozenset(os.sched_getaffinity(0))
    os.sched_setaffinity(0, place.measuring)
    _placed = place


def unplace() -> None:
    """Undo :func:`place_measuring`, if it moved this process."""
    global _placed
    if _placed is not None:
        os.sched_setaffinity(0, _before)
        _placed = None


def own_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on now, or None where the platform cannot say."""
    return frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def pool_cpus() -> frozenset[int] | None:
    """Where this process's compile processes run: the pool's cores while it is placed, else where it runs
    itself."""
    return _placed.pool if _placed is not None else own_cpus()


def place_pool(cpus: frozenset[int] | None) -> None:
    """In a compile process: run on ``cpus``, its tuner's :func:`pool_cpus`."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)


def siblings(cpu: int) -> set[int]:
    """The CPUs of ``cpu``'s core (its hyperthreads), from the kernel's topology files; ``{cpu}`` without them."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return {cpu}
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def gpu_index() -> int | None:
    """The host's index of the first GPU this process sees (0 when it sees them all); None when
    ``CUDA_VISIBLE_DEVICES`` names it otherwise (a UUID)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return 0
    first = visible.split(",")[0].strip()
    return int(first) if first.isdigit() else None


def default_workers() -> int:
    """Compile processes for this worker: its share of the host's cores and of the free memory at about
    :data:`COMPILE_GB` each. The host's cores are shared by the workers on it (:func:`workers_on_host`), so
    that N workers on one host start N pools that fit it together: the pool's cores while the worker is placed
    (:func:`place_measuring`), else the host's less two for its tuner and GPU worker; a worker already confined
    to some of the cores takes those."""
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gb = 8.0
    if _placed is not None:
        sharing = workers_on_host()
        cores = len(_placed.pool) // sharing
    else:
        host = os.cpu_count() or 2
        mine = len(own_cpus() or range(host))
        sharing = workers_on_host() if mine >= host else 1
        cores = mine // sharing - 2
    return max(0, min(cores, int(mem_gb / sharing / COMPILE_GB)))


def workers_on_host() -> int:
    """How many workers this host runs beside this one, this one included: one per GPU it sees of the host's
    GPUs (``CUDA_VISIBLE_DEVICES=0`` on a host of two GPUs: two), as ``evotune worker`` is run."""
    gpus = host_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not gpus or visible is None:
        return 1
    seen = len([d for d in visible.split(",") if d.strip()])
    return max(1, gpus // max(1, min(seen, gpus)))


def host_gpus() -> int:
    """NVIDIA GPUs on this host, counted from the driver's files (the tuner process never starts CUDA)."""
    found = list(Path("/proc/driver/nvidia/gpus").glob("*"))
    if not found:
        found = [p for p in Path("/dev").glob("nvidia*") if p.name.removeprefix("nvidia").isdigit()]
    return len(found)
