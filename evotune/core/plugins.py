"""Finding search spaces: built-ins by name, a user's module by file path, or an entry point.

A space module defines ``SPACE``, a :class:`evotune.core.space.SearchSpace`.
Nothing is imported that the user did not name: built-ins come from the
``search_spaces`` package shipped with evotune, a ``.py`` path is loaded only
when an experiment names it, and entry points only when asked for by name.

Example::

    from evotune.core.plugins import load_space, builtin_names
    builtin_names()                      # ['cute_blackwell_gemm', 'cute_hopper_gemm', ...]
    load_space("triton_matmul").size
    load_space("my_spaces/stencil.py")   # a user's file
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from importlib.metadata import entry_points
from pathlib import Path

from evotune.core.space import SearchSpace

ENTRY_POINT_GROUP = "evotune.search_spaces"


class SpaceNotFound(LookupError):
    pass


class SpaceLoadError(SpaceNotFound):
    """The space's module was found but raised while loading."""


class SpaceInvalid(SpaceLoadError):
    """The space's module loaded, but its ``SPACE`` is missing or not a :class:`SearchSpace`."""


def builtin_names() -> list[str]:
    # the built-in spaces are found where the package is, not imported: each is loaded by name when asked for
    spec = importlib.util.find_spec("search_spaces")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    return sorted(m.name for m in pkgutil.iter_modules(folders) if not m.name.startswith("_"))


def entry_point_names() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def load_space(name: str, base_dir: Path | None = None) -> SearchSpace:
    """The space called ``name``: a built-in, an entry point, or a path to a ``.py`` file.

    A relative path is taken from ``base_dir`` (the experiment file's folder),
    then from the working directory.
    """
    if name.endswith(".py"):
        return _from_file(name, base_dir)
    if name in builtin_names():
        return _space_of(importlib.import_module(f"search_spaces.{name}"), name)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            obj = ep.load()
            if isinstance(obj, SearchSpace):
                obj.source = name
                return obj
            return _space_of(obj, name)
    raise SpaceNotFound(name)


def _from_file(name: str, base_dir: Path | None) -> SearchSpace:
    candidates = [Path(name)] if Path(name).is_absolute() else [
        *([base_dir / name] if base_dir else []), Path.cwd() / name]
    for path in candidates:
        if path.is_file():
            spec = importlib.util.spec_from_file_location(f"evotune_user_space_{path.stem}", path)
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # the user's code: any error is theirs to see, in one line
                raise SpaceLoadError(f"{path}: {type(exc).__name__}: {exc}".replace("\n", " ")) from exc
            return _space_of(module, name, source=str(path))
    raise SpaceNotFound(name)


def _space_of(module: object, name: str, source: str | None = None) -> SearchSpace:
    """The module's ``SPACE``; ``name`` is how the user named it (in errors), ``source`` how workers load it."""
    if not hasattr(module, "SPACE"):
        raise SpaceInvalid(f"{name} defines no SPACE; it must define SPACE = evotune.core.space.SearchSpace(...)")
    space = module.SPACE
    if not isinstance(space, SearchSpace):
        kind = type(space).__name__
        shown = repr(space) if len(repr(space)) <= 40 else repr(space)[:37] + "..."
        raise SpaceInvalid(f"{name} defines SPACE = {shown} ({'an' if kind[0] in 'aeiou' else 'a'} {kind}), "
                           "not an evotune.core.space.SearchSpace")
    # always where this loader found it: a space made from another (dataclasses.replace of a built-in's
    # SPACE) carries the other's source, and its workers would load the other one
    space.source = source or name
    return space
