"""The candidates of one key, before anything is timed: the space's named constraints, then ``prune_configs_by``.

Constraints prune first, each point counted under the first one that rejects it, with its reason (logged on
``evotune.autotune``); then, as ``triton.autotune`` does, ``early_config_prune(configs, named_args, **kwargs)``
keeps the configurations it returns and, when more than ``top_k`` are left,
``perf_model(**named_args, **kwargs, **config.all_kwargs())`` ranks them and the ``top_k`` best are kept (a
float <= 1: that share, at least one).

``early_config_prune`` is given the listed configurations (of a space: its feasible points as configurations)
and may return any configurations: each is matched to a candidate by its values (``all_kwargs()`` and
``pre_hook``, as ``triton.Config`` compares them), not by identity. Of a list, one equal to none of them is
added to the candidates (:meth:`~evotune.triton_tuning.configs.Candidates.extended`) and timed like the others; of a
space, one that is not a feasible point of it is left out, logged. Nothing left is Triton's error,
:func:`autotuner_error` ("Autotuner error: No valid autotuner configs after pruning. ...").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from evotune.core.space import FeasibleSet, Point
from evotune.triton_tuning.configs import Candidates, LaunchContext

log = logging.getLogger("evotune.autotune")
#: the message of Triton's autotuner when ``early_config_prune`` keeps nothing
EARLY_PRUNED_ALL = ("No valid autotuner configs after pruning. `early_config_prune` should return at least one "
                    "config.")


@dataclass(frozen=True)
class PruneBy:
    """``prune_configs_by`` of ``triton.autotune``, typed."""

    early_config_prune: Callable[..., Any] | None = None
    perf_model: Callable[..., Any] | None = None
    top_k: int | float = 1.0

    @classmethod
    def of(cls, prune_configs_by: dict[str, Any] | None) -> PruneBy:
        given = prune_configs_by or {}
        return cls(given.get("early_config_prune"), given.get("perf_model"), given.get("top_k", 1.0))


def autotuner_error(message: str) -> Exception:
    """Triton's ``AutotunerError`` (a ``triton.TritonError``; its text is "Autotuner error: " and ``message``)."""
    try:
        from triton.runtime.errors import AutotunerError
    except ImportError:  # a Triton without it: its base class, with the same text
        from triton import TritonError

        base: Exception = TritonError(f"Autotuner error: {message}")
        return base
    error: Exception = AutotunerError(message)
    return error


def prune(candidates: Candidates, args: dict[str, Any], nargs: dict[str, Any], kwargs: dict[str, Any],
          by: PruneBy, name: str, listed_configs: Sequence[Any] | None = None) -> tuple[Candidates, FeasibleSet]:
    """The candidates (a list's, with any configuration ``early_config_prune`` added) and their points left for
    a launch with arguments ``args`` after every pruning. ``listed_configs``: what ``early_config_prune`` is given
    of a list (the user's own list, as Triton gives it; default: the candidates' configurations)."""
    fs = candidates.feasible(LaunchContext(args=args))
    for reason, count in fs.pruned.most_common():
        log.info("%s: %d configurations pruned by %s", name, count, fs.reasons[reason])
    if not len(fs):
        why = "; ".join(f"{count} by {fs.reasons[r]}" for r, count in fs.pruned.most_common())
        raise autotuner_error(f"No valid autotuner configs after pruning. The constraints of {candidates.space.name} "
                              f"keep none for this launch ({why}).")
    points = [fs.point(r) for r in range(len(fs))]
    if candidates.listed is not None:
        order = {candidates.space.key(p): i for i, p in enumerate(candidates.listed)}
        points.sort(key=lambda p: order[candidates.space.key(p)])
    if by.early_config_prune:
        offered = list(listed_configs) if listed_configs is not None and candidates.listed is not None \
            else [candidates.config(p) for p in points]
        kept = by.early_config_prune(offered, nargs, **kwargs)
        if not kept:
            raise autotuner_error(EARLY_PRUNED_ALL)
        if candidates.listed is not None and any(candidates.find(c) is None for c in kept):
            candidates = candidates.extended(name, kept)
            log.info("%s: early_config_prune returned configurations not listed: timed with the others", name)
        points = _matched(candidates, fs, kept, name)
        if not points:
            raise autotuner_error(EARLY_PRUNED_ALL)
    if by.perf_model:
        top_k = by.top_k
        if isinstance(top_k, float) and top_k <= 1.0:
            top_k = max(1, int(len(points) * top_k))
        elif not isinstance(top_k, int):
            raise TypeError("Error while pruning configs, top_k must be either 1) a float <= 1.0 or 2) an int")
        if len(points) > top_k:
            space = candidates.space
            est = {space.key(p): by.perf_model(**nargs, **kwargs, **candidates.config(p).all_kwargs())
                   for p in points}
            points = sorted(points, key=lambda p: est[space.key(p)])[:top_k]
    if len(points) < len(fs):
        log.info("%s: %d of %d configurations left by prune_configs_by", name, len(points), len(fs))
    return candidates, FeasibleSet.from_codes(candidates.space, [candidates.space.encode(p) for p in points])


def _matched(candidates: Candidates, fs: FeasibleSet, kept: Sequence[Any], name: str) -> list[Point]:
    """The candidates' points equal to the configurations ``early_config_prune`` kept, in its order, once each;
    of a space, only its feasible points (the others are logged)."""
    out: dict[str, Point] = {}
    for config in kept:
        point = candidates.find(config)
        if point is None or (candidates.listed is None and point not in fs):
            log.warning("%s: early_config_prune returned %s, which is not a feasible point of %s: left out", name,
                        config, candidates.space.name)
            continue
        out.setdefault(candidates.space.key(point), point)
    return list(out.values())
