"""Experiment files: TOML in, a validated :class:`Experiment` out.

Every mistake becomes one :class:`ExperimentError` whose text names the file,
the field and what is accepted, e.g.::

    experiments/x.toml: budget.trials: must be a positive integer, got 0

The full reference is in README.md ("Experiment file"). Paths to inputs
(landscapes, a space's ``.py`` file) are relative to the experiment file;
outputs (storage, plots, best-config export) to the working directory.

Example::

    exp = load_experiment("experiments/quickstart.toml")
    exp.strategies[0].name, exp.budget.trials   # ('ga', 200)
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from evotune.core import hardware as hw
from evotune.core.budget import Budget
from evotune.core.flush import FLUSHES
from evotune.core.problem import Problem
from evotune.measurement.options import ConfirmOptions, OracleOptions, TimingOptions
from evotune.running.experiment_fields import (
    ExperimentError as ExperimentError,  # callers of load_experiment import both
)
from evotune.running.experiment_fields import FieldReader


class OracleKind(StrEnum):
    """``oracle.kind``: what answers for a point. Its ``value`` is what the file, the studies and messages say."""

    REPLAY = "replay"  # a recorded landscape's answer, charged its recorded cost
    GPU = "gpu"
    CPU = "cpu"  # numpy kernels in an isolated process (the tests' fault space)

    @property
    def measures(self) -> bool:
        """Whether the points are run (each by the space's ``build``, on the wall clock), not looked up."""
        return self is not OracleKind.REPLAY


@dataclass(frozen=True)
class StrategySpec:
    name: str
    seed: int = 0
    repeats: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    where: str = "strategy"  # its place in the file, for error messages: strategy or strategy[i]

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.repeats))


@dataclass
class Experiment:
    path: Path
    name: str
    spaces: list[str]  # one or more kernel families, each tuned on every problem
    oracle: OracleKind
    landscapes: list[Path]
    problems: list[Problem]
    hardware: str | None
    strategies: list[StrategySpec]
    budget: Budget
    storage: str
    plots_dir: Path
    best_path: Path
    description: str = ""
    oracle_options: OracleOptions = field(default_factory=OracleOptions)  # gpu and cpu oracles
    record_storage: str = ""  # where `evotune record` keeps its studies: never the tuning storage
    # landscapes, "shipped" (the shipped landscapes of the space) and "cache", for strategies that transfer
    sources: list[Path | str] = field(default_factory=list)
    compiled_dir: Path | None = None  # compile-only files whose resource use the estimates (seeding) take

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def check_outputs(self, best: bool = True, plots: bool = True) -> None:
        """Refuse (:class:`ExperimentError`) an ``outputs.best`` or ``outputs.plots`` that cannot be written, before
        a run that would write it at its end has opened anything; nothing is created to find out."""
        for wanted, fieldname, path, folder in ((best, "outputs.best", self.best_path, False),
                                                (plots, "outputs.plots", self.plots_dir, True)):
            why = unwritable(path, folder) if wanted else None
            if why:
                raise ExperimentError(self.path, fieldname, why)


def unwritable(path: Path, folder: bool) -> str | None:
    """Why a file (or with ``folder``, a folder to write files in) cannot be written at ``path``, found without
    creating anything; None when it can. The folders it would be made in are made as it is written."""
    if path.exists():
        if folder != path.is_dir():
            return f"{path} is {'a file, not a folder' if folder else 'a folder, not a file'}"
        if not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
            return f"{path} is not writable"
        return None
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"cannot write {path}: {above} is a file, not a folder"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"cannot write {path}: folder {above} is not writable"
    return None


# [oracle] keys that set how the GPU oracle samples (see evotune/measurement/oracle.py)
TIMING_OPTIONS = tuple(f.name for f in fields(TimingOptions))
# [oracle] keys of the confirmation stage -> ConfirmOptions fields
CONFIRM_OPTIONS = {"confirm_top": "top_k", "confirm_ci": "ci_target", "confirm_screen": "screen"}
#: what an experiment without a ``sources`` key transfers from (``sources = []``: nothing but its own studies)
DEFAULT_SOURCES = ("shipped", "cache")
#: where an experiment's plots go unless ``[outputs] plots`` says otherwise: beside its other outputs under runs/,
#: so that a run inside a checkout leaves its tracked files (and README's pictures, under docs/images/) alone
PLOTS_DIR = Path("runs/plots")
_TOP = {"name", "description", "space", "hardware", "oracle", "problem", "strategy", "budget", "storage", "outputs",
        "sources", "compiled"}


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment file. Raises ExperimentError on any problem."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ExperimentError(path, "(file)", "no such file") from None
    except OSError as exc:
        raise ExperimentError(path, "(file)", f"cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ExperimentError(path, "(syntax)", f"not valid TOML: {exc}") from None
    return _Parser(path, raw).parse()


class _Parser(FieldReader):
    def __init__(self, path: Path, raw: dict[str, Any]):
        super().__init__(path)
        self.raw = raw

    def parse(self) -> Experiment:
        raw = self.raw
        self.no_unknown(raw, _TOP, "")
        name = self.string(raw, "name", "name", default=self.path.stem)
        description = raw.get("description", "")
        if not isinstance(description, str):
            raise self.fail("description", f"must be a string, got {description!r}")
        spaces = self.space_names(raw.get("space"))
        oracle_t = self.table(raw, "oracle", {"kind", "landscapes", "timeout_s", "workers", *TIMING_OPTIONS,
                                              *CONFIRM_OPTIONS}, "")
        oracle = self.oracle_kind(oracle_t)
        landscapes = self.landscapes(oracle_t, oracle)
        hardware = self.hardware(raw, oracle)
        problems = self.problems(raw.get("problem"), oracle, hardware)
        if "landscape" in spaces and oracle is not OracleKind.REPLAY:
            raise self.fail("space", "'landscape' takes its space from recorded landscapes: "
                                     "needs oracle.kind = 'replay'")
        if oracle is OracleKind.REPLAY and len(spaces) > 1:
            raise self.fail("space", "a replay oracle takes one space (its landscapes record one)")
        for space in spaces:
            self.check_space(space)
        strategies = self.strategies(raw.get("strategy"))
        budget = self.budget()
        storage_t = self.table(raw, "storage", {"url", "record_url"}, "")
        storage = self.storage_url(storage_t, "url", f"sqlite:///runs/{name}.db")
        record_storage = self.storage_url(storage_t, "record_url", self.derived_record_url(storage))
        if record_storage == storage and not storage.endswith(":memory:"):
            raise self.fail("storage.record_url", "must differ from storage.url: recording is kept apart "
                                                  "from the tuning results that best, plot and dashboard read")
        outputs = self.table(raw, "outputs", {"plots", "best"}, "")
        plots_dir = Path(self.string(outputs, "plots", "outputs.plots", default=str(PLOTS_DIR)))
        best_path = Path(self.string(outputs, "best", "outputs.best", default=f"runs/{name}_best.json"))
        options = self.oracle_options(oracle_t, oracle)
        compiled_dir = None
        if "compiled" in raw:
            compiled_dir = self.path.parent / self.string(raw, "compiled", "compiled")
            if not compiled_dir.is_dir():
                raise self.fail("compiled", f"no folder {compiled_dir} (compile-only files, "
                                            "from `evotune record --compile-only`)")
        return Experiment(self.path, name, spaces, oracle, landscapes, problems, hardware, strategies, budget,
                          storage, plots_dir, best_path, description, options, record_storage, self.sources(),
                          compiled_dir)

    def sources(self) -> list[Path | str]:
        """``sources``: recorded landscapes (paths), "shipped" (the landscapes shipped with evotune for the space)
        and "cache" (the tuning-result cache), beside the studies; without the key, "shipped" and "cache"."""
        value = self.raw.get("sources", list(DEFAULT_SOURCES))
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail("sources", f"must be a list of landscape paths, \"shipped\" and \"cache\", got {value!r}")
        out: list[Path | str] = []
        for v in value:
            if v in DEFAULT_SOURCES:
                out.append(v)
                continue
            p = Path(v) if Path(v).is_absolute() else self.path.parent / v
            if not p.is_file():
                raise self.fail("sources", f"no such file {v!r} (paths are relative to the experiment file; "
                                           "\"shipped\" names the shipped landscapes, \"cache\" the tuning-result "
                                           "cache)")
            out.append(p)
        return out

    def derived_record_url(self, storage: str) -> str:
        from evotune.storage.study import record_storage_url  # optuna and sqlalchemy: only once the rest is checked

        try:
            return record_storage_url(storage)
        except Exception as exc:  # sqlalchemy's URL parser: any error is a bad URL
            raise self.fail("storage.url", f"cannot read {storage!r} as a database URL: {exc}") from None

    def storage_url(self, storage_t: dict[str, Any], key: str, default: str) -> str:
        url = self.string(storage_t, key, f"storage.{key}", default=default)
        if not (url.startswith(("sqlite:///", "postgresql", "mysql", "journal:"))):
            raise self.fail(f"storage.{key}", f"unsupported URL {url!r}; accepted: sqlite:///PATH, "
                                              "postgresql://..., mysql://..., journal:PATH")
        from evotune.storage.url import StorageError, with_driver  # sqlalchemy: only once the rest is checked

        try:
            return with_driver(url)  # postgresql:// takes whichever PostgreSQL driver is installed
        except StorageError as exc:
            raise self.fail(f"storage.{key}", str(exc)) from None

    def oracle_kind(self, oracle_t: dict[str, Any]) -> OracleKind:
        name = self.string(oracle_t, "kind", "oracle.kind", default=OracleKind.REPLAY.value)
        try:
            return OracleKind(name)
        except ValueError:
            accepted = ", ".join(k.value for k in OracleKind)
            raise self.fail("oracle.kind", f"unknown oracle {name!r}; accepted: {accepted}") from None

    def oracle_options(self, oracle_t: dict[str, Any], oracle: OracleKind) -> OracleOptions:
        given = {k: v for k, v in oracle_t.items() if k not in ("kind", "landscapes")}
        allowed = {OracleKind.GPU: {"timeout_s", "workers", *TIMING_OPTIONS, *CONFIRM_OPTIONS},
                   OracleKind.CPU: {"timeout_s"}}.get(oracle, set())
        for k in given:
            if k not in allowed:
                raise self.fail(f"oracle.{k}", f"not used with oracle.kind = {oracle.value!r}")
        for k in ("timeout_s", "ci_target", "confirm_ci"):
            if self.positive_number(given, k, f"oracle.{k}") is not None:
                given[k] = float(given[k])
        if given.get("flush", FLUSHES[0]) not in FLUSHES:
            raise self.fail("oracle.flush", f"must be one of {', '.join(FLUSHES)}, got {given['flush']!r}")
        screen = given.get("confirm_screen")
        if screen is not None and (isinstance(screen, bool) or not isinstance(screen, (int, float))
                                   or not 0 <= screen <= 10):
            raise self.fail("oracle.confirm_screen", f"must be a number from 0 to 10, got {screen!r}")
        for k in ("workers", "min_samples", "max_samples", "confirm_top"):
            self.positive_int(given, k, f"oracle.{k}", minimum=0 if k in ("workers", "confirm_top") else 1)
        confirm = ConfirmOptions(**{field: given.pop(key) for key, field in CONFIRM_OPTIONS.items() if key in given})
        # only the keys the file sets: the rest take the defaults of options.py
        timing = TimingOptions(**{k: given.pop(k) for k in TIMING_OPTIONS if k in given})
        if timing.max_samples < timing.min_samples:
            if "max_samples" in oracle_t:
                raise self.fail("oracle.max_samples", f"must be at least min_samples ({timing.min_samples})")
            raise self.fail("oracle.min_samples", f"must be at most max_samples ({timing.max_samples}, the default)")
        return OracleOptions(**given, timing=timing, confirm=confirm)

    def landscapes(self, oracle_t: dict[str, Any], oracle: OracleKind) -> list[Path]:
        value = oracle_t.get("landscapes")
        if oracle is not OracleKind.REPLAY:
            if value is not None:
                raise self.fail("oracle.landscapes", "only used with oracle.kind = 'replay'")
            return []
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise self.fail("oracle.landscapes", "missing: a replay oracle needs a list of landscape file paths")
        out = []
        for v in value:
            p = Path(v) if Path(v).is_absolute() else self.path.parent / v
            if not p.is_file():
                raise self.fail("oracle.landscapes", f"no such file {v!r} (paths are relative to the experiment file)")
            out.append(p)
        return out

    def hardware(self, raw: dict[str, Any], oracle: OracleKind) -> str | None:
        value = raw.get("hardware", "auto" if oracle is OracleKind.GPU else None)
        if value is None:
            return None
        if not isinstance(value, str) or (value != "auto" and value not in hw.names()):
            raise self.fail("hardware", f"unknown hardware {value!r}; accepted: auto, {', '.join(hw.names())}")
        return value

    def problems(self, value: Any, oracle: OracleKind, hardware: str | None = None) -> list[Problem]:
        if value is None:
            if oracle is OracleKind.REPLAY:
                return []  # each landscape brings its own problem
            raise self.fail("problem", "missing: give at least one [[problem]] with m, n, k, dtype")
        from evotune.core.problem import FieldError, get_workload, workload_names

        out = []
        for where, item in self.tables(value, "problem", "kind (default gemm) and the workload's fields"):
            kind = item.get("kind", "gemm")
            if not isinstance(kind, str) or kind not in workload_names():
                raise self.fail(f"{where}.kind", f"unknown workload {kind!r}; accepted: {', '.join(workload_names())}")
            workload = get_workload(kind)
            self.no_unknown(item, {"kind", *workload.fields}, f"{where}.")
            try:
                out.append(workload.parse({k: v for k, v in item.items() if k != "kind"}))
            except FieldError as exc:
                raise self.fail(f"{where}.{exc.field}", exc.message) from None
            gpu = hw.get_hardware(hardware) if hardware not in (None, "auto") else None  # "auto": targets.py
            if gpu is not None and out[-1].dtype == "fp8" and not gpu.has("fp8"):
                raise self.fail(f"{where}.dtype", f"fp8 needs FP8 tensor cores (sm_89 and newer); {gpu.name} "
                                                  f"({gpu.arch}) has none")
        if oracle is OracleKind.REPLAY and out:
            raise self.fail("problem", "a replay oracle takes its problems from its landscapes; remove [[problem]]")
        return out

    def space_names(self, value: Any) -> list[str]:
        if value is None:
            raise self.fail("space", "missing (required): a space name, a .py path, or a list of them")
        items = value if isinstance(value, list) else [value]
        if not items or not all(isinstance(v, str) and v for v in items):
            raise self.fail("space", f"must be a non-empty string or list of strings, got {value!r}")
        if len(set(items)) != len(items):
            raise self.fail("space", f"names a space twice: {items}")
        return items

    def check_space(self, space: str) -> None:
        if space == "landscape":
            return
        from evotune.core.plugins import (
            SpaceInvalid,
            SpaceLoadError,
            SpaceNotFound,
            builtin_names,
            entry_point_names,
            load_space,
        )

        try:
            load_space(space, self.path.parent)
        except SpaceInvalid as exc:
            raise self.fail("space", str(exc)) from None
        except SpaceLoadError as exc:
            raise self.fail("space", f"cannot load {space!r}: {exc}") from None
        except SpaceNotFound:
            known = ["landscape", *builtin_names(), *entry_point_names()]
            raise self.fail("space", f"unknown space {space!r}; accepted: {', '.join(known)}, "
                                     "or a path to a .py file that defines SPACE") from None

    def strategies(self, value: Any) -> list[StrategySpec]:
        from evotune.search.strategies import STRATEGIES
        from evotune.search.strategies.base import OptionError

        if value is None:
            raise self.fail("strategy", f"missing: give [strategy] with name = one of {', '.join(sorted(STRATEGIES))}")
        out = []
        for where, item in self.tables(value, "strategy", "name, seed, repeats, options"):
            self.no_unknown(item, {"name", "seed", "repeats", "options"}, f"{where}.")
            name = self.string(item, "name", f"{where}.name")
            if name not in STRATEGIES:
                raise self.fail(f"{where}.name",
                                f"unknown strategy {name!r}; accepted: {', '.join(sorted(STRATEGIES))}")
            seed = self.positive_int(item, "seed", f"{where}.seed", default=0, minimum=0)
            repeats = self.positive_int(item, "repeats", f"{where}.repeats", default=1)
            options = item.get("options", {})
            if not isinstance(options, dict):
                raise self.fail(f"{where}.options", "must be a table")
            try:
                STRATEGIES[name].parse_options(options)
            except OptionError as exc:
                raise self.fail(f"{where}.options.{exc.name}", str(exc).split(": ", 1)[1]) from None
            out.append(StrategySpec(name, seed, repeats, dict(options), where))
        return out

    def budget(self) -> Budget:
        b = self.table(self.raw, "budget", {"trials", "seconds", "plateau"}, "")
        trials = self.positive_int(b, "trials", "budget.trials")
        seconds = self.positive_number(b, "seconds", "budget.seconds")
        plateau = self.positive_int(b, "plateau", "budget.plateau")
        if trials is None and seconds is None:
            raise self.fail("budget", "give trials and/or seconds")
        return Budget(trials, float(seconds) if seconds is not None else None, plateau)
