"""Ahead of time: ``python -m evotune tune-kernel MODULE:KERNEL --keys KEYS.toml`` fills the cache.

``MODULE`` is a dotted module name or a ``.py`` path, ``KERNEL`` a kernel in it decorated
with ``evotune.autotune``, or a plain ``triton.jit`` kernel with ``--space FILE:NAME --key
NAMES`` (its candidates and key, :mod:`evotune.triton_tuning.plain`). The keys file lists the keys
to tune and names the module's function that builds one key's launch::

    launch = "make_args"     # optional (this is the default): MODULE.make_args(**key)

    [[key]]                  # one table per key: the arguments of make_args
    M = 64
    N = 64
    K = 64

``make_args(**key)`` returns ``(grid, args)`` or ``(grid, args, kwargs)``: the kernel is
launched as ``KERNEL[grid](*args, **kwargs)``, less any configuration in ``kwargs`` (a launch
built for a plain kernel passes one: ``BLOCK_SIZE_M=...``, ``num_warps=...``), which tunes that key (in ``online`` mode,
whatever the decorator says) and stores the decision in the cache (``--cache``, else the
decorator's, else the default location).

A bad reference or keys file raises :class:`AheadError`: one line naming the file and
the field, before anything is tuned (a value of another type than the launch function's
annotation says, ``M = "512"`` for ``make_args(M: int, ...)``, included). So does a machine
where Triton finds no GPU while its interpreter is off. ``progress`` hears of each key as
it starts and as it is decided (:class:`KeyProgress`).
"""

from __future__ import annotations

import enum
import inspect
import os
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from evotune.storage.study import timing_seconds
from evotune.triton_tuning.autotuner import Autotuner
from evotune.triton_tuning.build_processes import LaunchRef, ProcessBuilds, processes, signature
from evotune.triton_tuning.cache import Decision
from evotune.triton_tuning.plain import without_config
from evotune.triton_tuning.references import AheadError, load_kernel

INTERPRETER_HINT = "set TRITON_INTERPRET=1 to run on the CPU through Triton's interpreter"

# a launch function's annotation -> (what the value must be, in words; the check)
_TYPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "float": ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
}


class Stage(enum.Enum):
    STARTED = "started"
    DECIDED = "decided"


@dataclass(frozen=True)
class KeyProgress:
    """One key of the keys file, as it starts (``STARTED``) and once it is decided (``DECIDED``: its evaluations,
    the new ones among them, the decision and the seconds it took)."""

    stage: Stage
    index: int  # from 0
    total: int
    entry: dict[str, Any]  # the key's table in the keys file
    evaluations: int = 0  # configurations measured for the key, by any process, ever
    new: int = 0  # of those, measured now
    decision: Decision | None = None  # None: a single configuration, nothing to time
    seconds: float = 0.0
    #: of those seconds, the GPU's on timing: the new evaluations' and the confirmation's (compiles not counted)
    timing_s: float = 0.0


@dataclass
class KeysFile:
    path: Path
    launch: Callable[..., Any]
    launch_name: str
    keys: list[dict[str, Any]]


def load_keys(path: Path, module: ModuleType) -> KeysFile:
    if not path.is_file():
        raise AheadError(f"{path}: no such file")
    try:
        doc = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AheadError(f"{path}: not valid TOML ({exc})") from None
    unknown = [k for k in doc if k not in ("launch", "key")]
    if unknown:
        raise AheadError(f"{path}: {unknown[0]}: unknown field (accepted: launch, key)")
    name = doc.get("launch", "make_args")
    if not isinstance(name, str):
        raise AheadError(f"{path}: launch: expected the name of a function of {module.__name__}, got {name!r}")
    launch = getattr(module, name, None)
    if not callable(launch):
        raise AheadError(f"{path}: launch: {module.__name__} has no function {name!r}")
    keys = doc.get("key")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, dict) for k in keys):
        raise AheadError(f"{path}: key: expected at least one [[key]] table")
    sig = inspect.signature(launch)
    open_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    accepted = f"{name}({', '.join(sig.parameters)})"
    for i, key in enumerate(keys):
        for field, value in key.items():
            if not open_kwargs and field not in sig.parameters:
                raise AheadError(f"{path}: key[{i}].{field}: not an argument of {accepted}")
            if not isinstance(value, (int, float, str, bool)):
                raise AheadError(f"{path}: key[{i}].{field}: expected a number, a string or a boolean, got "
                                 f"{type(value).__name__}")
            param = sig.parameters.get(field)
            annotation = None if param is None else _annotation_name(param.annotation)
            if annotation in _TYPES and not _TYPES[annotation][1](value):
                raise AheadError(f"{path}: key[{i}].{field}: expected {_TYPES[annotation][0]} ({name}'s "
                                 f"{field}: {annotation}), got {value!r}")
        try:
            sig.bind(**key)
        except TypeError as exc:
            raise AheadError(f"{path}: key[{i}]: {exc} (the arguments of {accepted})") from None
    return KeysFile(path, launch, name, keys)


def _annotation_name(annotation: Any) -> str | None:
    """``int`` for ``M: int`` (a type, or its name where annotations are strings); None for anything else."""
    if isinstance(annotation, str):
        return annotation
    return getattr(annotation, "__name__", None) if isinstance(annotation, type) else None


def check_device() -> None:
    """:class:`AheadError` (one line, with the hint) when Triton finds no GPU to launch on and its interpreter is
    off: said before anything is tuned, in place of Triton's traceback at the first launch."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    from triton.runtime import driver

    try:
        driver.active  # noqa: B018  (the property finds the GPU's driver)
    except RuntimeError as exc:
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise AheadError(f"no GPU found: {INTERPRETER_HINT} (Triton says: {said})") from None


def tune_kernel(ref: str, keys_path: Path, cache: str | None = None, space: str | None = None,
                key_names: str | None = None, progress: Callable[[KeyProgress], None] | None = None,
                compile_cost: float = 0.0, upcoming: Sequence[dict[str, Any]] = ()
                ) -> list[tuple[dict[str, Any], Any, Decision | None]]:
    """Tune every key of the file; (the key's fields, the chosen triton.Config, its decision) for each.
    ``compile_cost`` (evaluations' worth of time a compile takes): above 0, each key's search weighs the
    configurations not built for an earlier key of the same specialisation by it. ``upcoming``: keys (as the file
    gives them) to be tuned after the file's, whose configurations, with those of the file's later keys, the build
    processes build while they idle (``Autotuner.upcoming``)."""
    kernel, module = load_kernel(ref, space, key_names)
    kernel.compile_cost = float(compile_cost)
    keys = load_keys(keys_path, module)
    check_device()
    if cache is not None:
        kernel.use_cache(cache)
    kernel.mode = "online"
    # every key's launch is built once before any key is tuned: a key its function refuses stops the command
    # before the other keys' tuning, not after it
    # (the first key's launch is kept for its tuning; the others, gigabytes each for a model's experts, are made
    # again when their turn comes)
    kept = [build_launch(keys, 0, keys.keys[0])]
    for i, key in enumerate(keys.keys[1:], 1):
        build_launch(keys, i, key)
    tell = progress or (lambda event: None)
    out = []
    total = len(keys.keys)
    for i, key in enumerate(keys.keys):
        tell(KeyProgress(Stage.STARTED, i, total, key))
        started = time.perf_counter()
        grid, args, kwargs = kept.pop() if kept else build_launch(keys, i, key)
        kwargs = without_config(kernel, kwargs)
        fields = kernel.key_fields(dict(zip(kernel.arg_names, args, strict=False)), kwargs)
        # a later key's fields: this key's, with the values the keys file gives (the same tensors' dtypes)
        kernel.upcoming = [{**fields, **{n: later[n] for n in fields if n in later}}
                           for later in [*keys.keys[i + 1:], *upcoming]]
        before = _evaluations(kernel, fields)
        # other processes can make this launch: they build the search's proposals (build_processes.py)
        launch = LaunchRef(ref, space, key_names, keys.launch_name, tuple(key.items()), signature(args, kwargs))
        kernel.builds = lambda depth, searched, launch=launch: ProcessBuilds(launch, searched.key,
                                                                             min(depth, processes()))
        try:
            kernel[grid](*args, **kwargs)
        finally:
            kernel.builds, kernel.upcoming = None, []  # this file's builders and later keys, not a later launch's
        decision = kernel.decisions.get(tuple(fields.values()))
        after = _evaluations(kernel, fields)
        tell(KeyProgress(Stage.DECIDED, i, total, key, after, after - before, decision,
                         time.perf_counter() - started, _timing_s(kernel, fields, before, decision)))
        out.append((fields, kernel.best_config, decision))
    return out


def build_launch(keys: KeysFile, i: int, key: dict[str, Any]) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """(grid, args, kwargs) of key ``i``, from the keys file's launch function; :class:`AheadError` naming the key
    when the function fails on its values or returns something else."""
    try:
        launch = keys.launch(**key)
    except Exception as exc:  # the key's values as the function takes them: one line naming the key
        said = (str(exc).strip().splitlines() or [""])[0]
        raise AheadError(f"{keys.path}: key[{i}]: {keys.launch_name}(**key[{i}]) failed: "
                         f"{type(exc).__name__}: {said}") from None
    if not isinstance(launch, tuple) or len(launch) not in (2, 3):
        raise AheadError(f"{keys.path}: launch: {keys.launch_name} must return (grid, args) or "
                         f"(grid, args, kwargs), got {type(launch).__name__} for key[{i}]")
    grid, args, kwargs = (*launch, {}) if len(launch) == 2 else launch
    return grid, tuple(args), dict(kwargs)


def _evaluations(kernel: Autotuner, fields: dict[str, Any]) -> int:
    """The configurations measured for the key so far (its study's trials)."""
    store = kernel.decision_store.existing(fields, kernel.candidates.space)
    return 0 if store is None else len(store.history())


def _timing_s(kernel: Autotuner, fields: dict[str, Any], before: int, decision: Decision | None) -> float:
    """The GPU's seconds on timing the key now: its trials after the first ``before`` and, when the decision was
    made now, its confirmation."""
    store = kernel.decision_store.existing(fields, kernel.candidates.space)
    trials = [] if store is None else store.history()[before:]
    return timing_seconds(trials, decision.confirmation if trials and decision is not None else None)
