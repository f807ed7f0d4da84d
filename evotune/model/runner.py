"""Running a plan: one worker process per GPU on one storage, keys dealt by claims, the outcomes recorded.

The record (:class:`Ledger`) is an Optuna study named by the plan (``tune-model/MODEL/tpN/DTYPE``) in the run's
storage (default ``OUT/tune_model.db``; a PostgreSQL URL shares it across hosts): one user attribute per decided
key holding its :class:`~evotune.model.outcome.Outcome`. Before a worker tunes a key it claims the key in the same
storage (:mod:`evotune.storage.claims`): a key decided or held by a live worker is left to it, so no key is tuned
twice; a key held by a worker that died (SIGKILL) is taken over by the next run, whose tuner resumes from what the
key's study holds. A second run skips every decided key.

Workers: ``--gpus N`` starts N worker processes, each seeing one GPU (``CUDA_VISIBLE_DEVICES``). They are forked
from one server process that imported what a worker needs once (torch, Triton, Optuna, the tuner and its kernels:
:mod:`evotune.measurement.processes`), so that a worker starts in milliseconds and goes straight to its GPU, instead
of each paying seconds of imports side by side with the others; each worker records when it started and when it
began its first evaluation (:meth:`Ledger.workers`). Worker ``i`` walks the kernels from the ``i``-th on, each
kernel's keys in increasing batch size, so workers start on different kernels and each key after a kernel's first
has a tuned neighbour. Every worker uses one Triton cache directory, so a configuration one compiled is loaded by
the others. On a host without a GPU, under the Triton interpreter (``TRITON_INTERPRET=1``), the N workers are CPU
processes. ``--workers-per-gpu W`` starts W workers on each GPU, which take turns on it
(:mod:`evotune.measurement.gpu_turn`): each holds the GPU through a key's tuning and gives it up while it waits for a
configuration's build, so one times while another waits, and no two ever time at once.

The parent process prints one progress line (keys done, evaluations, an ETA from this run's pace) and waits for
the workers; Ctrl-C stops them, each giving back its claim (nothing is recorded for a key whose tuning was cut).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna

from evotune.measurement import gpu_turn
from evotune.measurement.base import first_evaluation
from evotune.measurement.host import own_cpus
from evotune.measurement.kernel_cache import cache_root
from evotune.measurement.processes import Inherited, as_child, start_method
from evotune.model.autotune_api import build_processes_for
from evotune.model.models import ModelError, load_model
from evotune.model.outcome import KeyTuner, Outcome, WorkerStart
from evotune.model.plan import Plan, make_plan, only, parse_batch_sizes, parse_kernels
from evotune.model.preload import DEFAULT_TUNER, worker_preload
from evotune.running.cost_model import process_start_time
from evotune.storage.claims import Claim, make_claims
from evotune.storage.study import checked_for_children, make_storage

OUTCOME = "outcome:"  # the record's attribute prefix, then the key's ident
WORKER = "worker:"  # ... then a worker's index: its WorkerStart
POLL_S = 0.5
INTERRUPT_GRACE_S = 5.0


def autotune_cache(out: Path) -> str:
    """The run's autotune cache (``OUT/autotune.db``): the default tuner's studies and decisions."""
    return f"sqlite:///{(out / 'autotune.db').resolve()}"


@dataclass(frozen=True)
class RunOptions:
    """What every worker of a run is started with (passed to it as JSON)."""

    model: str
    tp: int
    dtype: str | None
    batch_sizes: str
    storage: str
    out: str
    tuner: str = DEFAULT_TUNER
    kernels: str = "all"  # the families tuned (--kernels)
    workers_per_gpu: int = 1  # workers taking turns on each GPU (--workers-per-gpu)

    def plan(self) -> Plan:
        return only(make_plan(load_model(self.model), self.tp, self.dtype, parse_batch_sizes(self.batch_sizes)),
                    parse_kernels(self.kernels))


class Ledger:
    """The run's record: each decided key's outcome, in the storage the claims live in."""

    def __init__(self, url: str, name: str):
        self.url, self.name = url, name
        self.storage = make_storage(url)
        for _ in range(5):  # workers starting together race to create the study; the loser finds it
            try:
                self.study_id = self.storage.get_study_id_from_name(name)
                break
            except KeyError:
                try:
                    self.study_id = self.storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], name)
                    break
                except optuna.exceptions.DuplicatedStudyError:
                    continue
        self.claims = make_claims(url, name)

    def outcomes(self) -> dict[str, Outcome]:
        attrs = self.storage.get_study_user_attrs(self.study_id)
        return {k.removeprefix(OUTCOME): Outcome.from_json(v) for k, v in attrs.items() if k.startswith(OUTCOME)}

    def record(self, outcome: Outcome) -> None:
        self.storage.set_study_user_attr(self.study_id, OUTCOME + outcome.key, outcome.to_json())

    def note_start(self, index: int, start: WorkerStart) -> None:
        self.storage.set_study_user_attr(self.study_id, f"{WORKER}{index}", start.to_json())

    def workers(self) -> dict[int, WorkerStart]:
        """Each worker's start and first evaluation, by its index (the latest run's, where a run was resumed)."""
        attrs = self.storage.get_study_user_attrs(self.study_id)
        return {int(k.removeprefix(WORKER)): WorkerStart.from_json(v) for k, v in attrs.items()
                if k.startswith(WORKER)}


def load_tuner(options: RunOptions, plan: Plan) -> KeyTuner:
    """``--tuner MODULE:FUNCTION`` (a dotted module or a ``.py`` path): ``FUNCTION(plan, out)`` makes the tuner."""
    module_name, sep, name = options.tuner.rpartition(":")
    if not sep:
        raise ModelError(f"--tuner: expected MODULE:FUNCTION, got {options.tuner!r}")
    if module_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
        if spec is None or spec.loader is None or not Path(module_name).is_file():
            raise ModelError(f"--tuner: {module_name}: no such file")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ModelError(f"--tuner: {module_name}: cannot import it ({exc})") from None
    make = getattr(module, name, None)
    if not callable(make):
        raise ModelError(f"--tuner: {module_name} has no function {name!r}")
    tuner: KeyTuner = make(plan, Path(options.out))
    return tuner


def work(options: RunOptions, index: int, workers: int, tuner: KeyTuner | None = None) -> int:
    """One worker's loop: claim undecided keys, tune, record; until every key is decided or held by a live worker.
    How many keys this worker decided."""
    plan = options.plan()
    if tuner is None:
        with gpu_turn.held():  # its CUDA context and whatever it starts on the GPU, outside another's timing
            tuner = load_tuner(options, plan)
    ledger = Ledger(options.storage, plan.ident)

    def look() -> set[str]:
        return set(ledger.outcomes())

    ledger.claims.begin(look(), look)
    try:
        return _deal(plan, index, tuner, ledger, look, _StartNote(ledger, index))
    finally:
        close = getattr(tuner, "close", None)  # a tuner holding processes (a GPU evaluator's) lets them go
        if callable(close):
            close()


class _StartNote:
    """Records this worker's :class:`WorkerStart` once its first evaluation has begun (after the key it was in)."""

    def __init__(self, ledger: Ledger, index: int):
        self.ledger, self.index, self.done = ledger, index, False

    def __call__(self) -> None:
        first = first_evaluation()
        if not self.done and first is not None:
            self.ledger.note_start(self.index, WorkerStart(process_start_time(), first, os.getpid()))
            self.done = True


def _deal(plan: Plan, index: int, tuner: KeyTuner, ledger: Ledger, look: Callable[[], set[str]],
          note: Callable[[], None]) -> int:
    """Claim undecided keys, worker ``index``'s kernels first, tune and record each; how many were decided."""
    kernels = plan.kernels[index % len(plan.kernels):] + plan.kernels[:index % len(plan.kernels)]
    decided = 0
    idle = 0  # passes in a row that took no key while no other live worker held one
    while True:
        claimed_any = False
        for kernel in kernels:
            for key in kernel.keys:
                done = look()
                if key.ident in done:
                    continue
                got = ledger.claims.claim(key.ident, finished=done, look=look)
                if not got.mine:
                    continue
                if got is Claim.TAKEOVER and key.ident in look():
                    ledger.claims.finish(key.ident)
                    continue
                claimed_any = True
                try:
                    with gpu_turn.held():  # where workers share a GPU: nothing of this key overlaps another's
                        outcome = tuner.tune(key)
                except BaseException:
                    ledger.claims.release(key.ident)
                    raise
                ledger.record(outcome)
                ledger.claims.finish(key.ident)
                decided += 1
                note()
        if claimed_any:
            idle = 0
            continue
        if {k.ident for k in plan.keys} <= look():
            return decided
        if ledger.claims.active():  # keys other live workers are tuning: one of them may die and leave its key
            idle = 0
            time.sleep(POLL_S)
            continue
        # undecided keys that no live worker holds: a worker that died held them, and the next pass takes them
        # over; a second such pass that takes nothing ends this worker (the next run gets what is left)
        idle += 1
        if idle > 1:
            return decided


def visible_gpus() -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` where set, else what ``nvidia-smi -L`` lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return len([d for d in env.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listed.splitlines() if line.startswith("GPU "))


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def worker_count(gpus: str) -> tuple[int, list[str] | None]:
    """(workers, the device each sees, or None for CPU workers) for ``--gpus all|N``; :class:`ModelError` for more
    GPUs than the host has."""
    have = visible_gpus()
    if gpus != "all" and not (gpus.isdigit() and int(gpus) > 0):
        raise ModelError(f"--gpus: expected all or a positive integer, got {gpus!r}")
    if have == 0:
        if not interpreting():
            raise ModelError(f"--gpus {gpus}: this host has no GPU (set TRITON_INTERPRET=1 to run the workers on "
                             "the CPU through Triton's interpreter)")
        return (1 if gpus == "all" else int(gpus)), None
    want = have if gpus == "all" else int(gpus)
    if want > have:
        raise ModelError(f"--gpus {gpus}: this host has {have} GPU{'s' if have != 1 else ''}")
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d.strip() for d in env.split(",") if d.strip()] if env else [str(i) for i in range(have)]
    return want, ids[:want]


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    evaluations: int
    eta_s: float | None

    def line(self) -> str:
        eta = "-" if self.eta_s is None else _duration(self.eta_s)
        return f"tune-model: keys {self.done}/{self.total} done, {self.evaluations} evaluations, ETA {eta}"


def _duration(s: float) -> str:
    n = round(s)
    return f"{n // 3600}h{n % 3600 // 60:02d}m" if n >= 3600 else f"{n // 60}m{n % 60:02d}s"


def run(options: RunOptions, devices: tuple[int, list[str] | None],
        progress: Callable[[Progress], None] | None = None) -> dict[str, Outcome]:
    """Start the workers, follow the record until they end, and return every decided key's outcome."""
    ctx = start_method(worker_preload(options.tuner))  # running already when the command line started it
    plan = options.plan()
    ledger = Ledger(options.storage, plan.ident)
    total = len(plan.keys)
    before = len(ledger.outcomes())
    gpus, ids = devices
    count = gpus * options.workers_per_gpu
    procs = []
    payload = json.dumps(asdict(options))
    started = time.monotonic()
    shared = {**os.environ, **worker_env(options, count)}
    # workers sharing a GPU take turns on it (gpu_turn): one lock file a GPU, on this host, gone with the run
    turns = tempfile.mkdtemp(prefix="evotune-gpu-turns-") if options.workers_per_gpu > 1 else None
    try:
        for i in range(count):
            env = {**shared, **({"CUDA_VISIBLE_DEVICES": ids[i % gpus]} if ids is not None else {})}
            if turns is not None:
                env[gpu_turn.ENV] = os.path.join(turns, "cpu" if ids is None else f"gpu{ids[i % gpus]}")
            proc = ctx.Process(target=as_child, args=(Inherited(env, own_cpus()), worker_process, payload, i, count),
                               name=f"tune-model worker {i}")
            proc.start()  # the first waits for the server's imports; the others fork at once
            procs.append(proc)
        last = None
        while True:
            # the server reaps the workers that end (their pids are not left as zombies, which the claims would
            # take for live owners, so that a dead worker's key is taken over)
            running = any(p.is_alive() for p in procs)
            outcomes = ledger.outcomes()
            now = Progress(len(outcomes), total, sum(o.evaluations for o in outcomes.values()),
                           _eta(len(outcomes) - before, total - len(outcomes), time.monotonic() - started))
            # a new line when a key is decided (the ETA alone moves with the clock)
            if progress is not None and (last is None or (now.done, now.evaluations) != (last.done, last.evaluations)):
                progress(now)
                last = now
            if not running:
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        # Ctrl-C reached the workers too (one process group): each gives back the claim of the key it was tuning
        # and ends; a worker still running after a moment (the interrupt was sent to this process alone) is
        # interrupted now
        for p in procs:
            p.join(INTERRUPT_GRACE_S)
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGINT)
                p.join()
        raise
    finally:
        if turns is not None:
            shutil.rmtree(turns, ignore_errors=True)
    failed = [i for i, p in enumerate(procs) if p.exitcode != 0]
    outcomes = ledger.outcomes()
    if failed:
        raise WorkerError(f"worker {failed[0]} ended with exit code {procs[failed[0]].exitcode}; "
                          f"{len(outcomes)}/{total} keys are decided and kept: run the same command to go on")
    return outcomes


def worker_main(argv: list[str]) -> int:
    """A worker (``OPTIONS_JSON INDEX WORKERS``): 2 with one line for a bad input, 130 when interrupted (its claim
    given back), else 0."""
    options = RunOptions(**json.loads(argv[0]))
    try:
        work(options, int(argv[1]), int(argv[2]))
    except ModelError as exc:
        print(f"evotune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def worker_process(payload: str, index: int, count: int) -> None:
    """A worker forked from the server (:func:`~evotune.measurement.processes.as_child` gave it the run's
    environment and its GPU): it ends with :func:`worker_main`'s exit code."""
    code = worker_main([payload, str(index), str(count)])
    # everything the worker decided is in the storage; its build processes were told to stop (the tuner's close):
    # it ends now rather than wait for them to be reaped (seconds of CUDA teardown each)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def worker_env(options: RunOptions, workers: int = 1) -> dict[str, str]:
    """What every worker's environment adds: one Triton cache for all of them (the one the GPU evaluator's
    processes use: a configuration compiled for one key is loaded, not compiled again, by every worker's keys of the
    same specialisation), the storages made and checked here once, not in each worker (about a second of Alembic a
    process), and each worker's share of the host's cores for its build processes (``EVOTUNE_COMPILE_THREADS``,
    unless set: as many as its share of the cores takes; each would otherwise start one a core of the host)."""
    triton_cache = os.environ.get("TRITON_CACHE_DIR") or str(cache_root() / "triton")
    checked = checked_for_children([options.storage, *([autotune_cache(Path(options.out))]
                                                       if options.tuner == DEFAULT_TUNER else [])])
    share = (os.cpu_count() or 1) // max(1, workers)
    builds = os.environ.get("EVOTUNE_COMPILE_THREADS") or str(build_processes_for(share))
    return {"TRITON_CACHE_DIR": triton_cache, **checked, "EVOTUNE_COMPILE_THREADS": builds}


class WorkerError(RuntimeError):
    """A worker process failed: what was decided is kept."""


def _eta(decided_now: int, left: int, elapsed: float) -> float | None:
    if left == 0:
        return 0.0
    return None if decided_now <= 0 else elapsed / decided_now * left
