"""The confirmation stage: re-time the best configurations and the baselines side by side.

A search times each point once, at whatever moment it came up: a baseline timed
before the search from an idle GPU, and a point that happened to land in a fast
mode, both show up in a speed-up that does not hold when run again (the minimum
over a thousand measurements is biased low). Confirmation removes both:

1. the GPU is brought up to its working clocks by at least ``warmup_s`` of work;
2. every item (the top configurations and every baseline) is timed in rounds,
   ``per_round`` samples each, interleaved, each round opening with the next item
   (A B C, B C A, C A B, ...), so that a drift of the clocks or of the machine, and
   the pause between rounds, touch every item alike;
3. rounds go on until every median's 95% confidence interval is within
   ``ci_target`` of it (at least ``min_rounds``, at most ``max_rounds``);
   configurations race: from ``min_rounds`` on, one whose interval lies wholly
   above the ``top_k``-th fastest configuration's is out of the running and is
   timed no more (baselines always stay; its figure so far is kept apart), so
   many candidates cost little more than the few that remain;
4. each item's median over the first and over the last rounds are compared: a
   difference above ``drift`` says the machine moved during the stage, and a
   confirmed time more than ``drift`` away from the item's search time says the
   search figure was not representative. Both are reported, not hidden.

The logic here knows nothing of GPUs: it is handed a ``take(name, n)`` that
returns ``n`` fresh samples in milliseconds, so the tests drive it with a fake timer.

Example::

    result = confirm_rounds(["cfg0", "cfg1", "torch.matmul"], take, ConfirmOptions(ci_target=0.005))
    result.items["cfg0"].median_ms, result.items["cfg0"].ci95_ms, result.warnings
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from evotune.measurement.options import ConfirmOptions
from evotune.measurement.oracle import ci_half_width, summarize


@dataclass
class ConfirmedItem:
    """One configuration or baseline after the confirmation rounds."""

    median_ms: float
    ci95_ms: tuple[float, float]
    samples: int
    start_ms: float  # median of the first third of the rounds
    end_ms: float  # median of the last third of the rounds
    search_ms: float | None = None  # the time the search measured, for configurations

    @property
    def ci95_rel(self) -> float:
        return ci_half_width(self.median_ms, self.ci95_ms)

    @property
    def drift_rel(self) -> float:
        """How far the end of the stage is from its start, relative to the start."""
        return abs(self.end_ms - self.start_ms) / self.start_ms

    @property
    def search_rel(self) -> float | None:
        """How far the confirmed time is from the search time, relative to the confirmed time."""
        return None if self.search_ms is None else abs(self.search_ms - self.median_ms) / self.median_ms


@dataclass
class Confirmation:
    items: dict[str, ConfirmedItem]
    rounds: int
    converged: bool  # every CI reached ci_target
    seconds: float
    warnings: list[str] = field(default_factory=list)
    screened: int = 0  # configurations that entered the stage
    # configurations out of the running, as timed up to the round they dropped out in (wider intervals)
    raced_out: dict[str, ConfirmedItem] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def plain(items: dict[str, ConfirmedItem]) -> dict[str, Any]:
            return {k: {**asdict(v), "ci95_ms": list(v.ci95_ms)} for k, v in items.items()}

        return {"items": plain(self.items), "raced_out": plain(self.raced_out), "rounds": self.rounds,
                "converged": self.converged, "seconds": self.seconds, "warnings": list(self.warnings),
                "screened": self.screened}


def confirm_rounds(names: Sequence[str], take: Callable[[str, int], list[float]], options: ConfirmOptions,
                   search_ms: dict[str, float] | None = None, warm: Callable[[float], None] | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> Confirmation:
    """Time ``names`` in interleaved rounds until every median is tight; see the module docstring.

    ``take(name, n)`` returns ``n`` new samples (ms) of that item; ``warm(seconds)``, when given,
    keeps the device busy for that long first; ``search_ms`` holds the search-time figures of the
    configurations among ``names`` (baselines have none).
    """
    if not names:
        return Confirmation({}, 0, True, 0.0)
    if warm is not None and options.warmup_s > 0:
        warm(options.warmup_s)
    search_ms = search_ms or {}
    started = clock()
    per_round: dict[str, list[list[float]]] = {n: [] for n in names}
    alive = list(names)
    raced_out: dict[str, ConfirmedItem] = {}
    rounds, converged = 0, False
    while rounds < options.max_rounds:
        first = rounds % len(alive) if options.rotate else 0
        for n in alive[first:] + alive[:first]:
            per_round[n].append(list(take(n, options.per_round)))
        rounds += 1
        if rounds < options.min_rounds:
            continue
        running = _race(alive, {n: summarize(_flat(per_round[n])) for n in alive}, search_ms, options.top_k)
        raced_out.update({n: _item(per_round[n], search_ms.get(n)) for n in alive if n not in running})
        alive = running
        if all(_ci_rel(_flat(per_round[n])) <= options.ci_target for n in alive):
            converged = True
            break
        if clock() - started > options.max_seconds:
            break
    items = {n: _item(per_round[n], search_ms.get(n)) for n in alive}
    result = Confirmation(items, rounds, converged, clock() - started, screened=sum(n in search_ms for n in names),
                          raced_out=raced_out)
    result.warnings = _warnings(result, options)
    return result


def newer(record: dict[str, Any], than: dict[str, Any] | None) -> bool:
    """Whether a stored confirmation ``record`` (dated, with items) replaces ``than`` as a problem's newest."""
    return bool(record and record.get("items")) and record.get("date", "") >= (than or {}).get("date", "")


def _race(alive: list[str], stats: dict[str, tuple[float, tuple[float, float], int]], search_ms: dict[str, float],
          top_k: int) -> list[str]:
    """``alive`` without the configurations that are out of the running: those whose 95% CI lies wholly above
    the CI of the ``top_k``-th fastest configuration (by median). Baselines (no search time) always stay."""
    configs = sorted((n for n in alive if n in search_ms), key=lambda n: stats[n][0])
    if len(configs) <= top_k:
        return alive
    bar = stats[configs[top_k - 1]][1][1]
    return [n for n in alive if n not in search_ms or stats[n][1][0] <= bar]


def _flat(rounds: list[list[float]]) -> list[float]:
    return [s for r in rounds for s in r]


def _ci_rel(samples: list[float]) -> float:
    med, ci, _ = summarize(samples)
    return ci_half_width(med, ci)


def _item(rounds: list[list[float]], search_ms: float | None) -> ConfirmedItem:
    samples = _flat(rounds)
    med, ci, _ = summarize(samples)
    third = max(1, len(rounds) // 3)
    start, _, _ = summarize(_flat(rounds[:third]))
    end, _, _ = summarize(_flat(rounds[-third:]))
    return ConfirmedItem(med, ci, len(samples), start, end, search_ms)


def _warnings(result: Confirmation, options: ConfirmOptions) -> list[str]:
    out = []
    if not result.converged:
        worst = max(result.items, key=lambda n: result.items[n].ci95_rel)
        out.append(f"confirmation stopped after {result.rounds} rounds before every 95% CI reached "
                   f"{options.ci_target:.1%} (widest: {worst}, {result.items[worst].ci95_rel:.1%})")
    for name, it in result.items.items():
        if it.drift_rel > options.drift:
            out.append(f"{name}: {it.start_ms:.4g} ms at the start of the confirmation and {it.end_ms:.4g} ms at "
                       f"the end ({it.drift_rel:.1%} apart): the machine's speed moved during the stage")
        rel = it.search_rel
        if rel is not None and rel > options.drift:
            out.append(f"{name}: confirmed at {it.median_ms:.4g} ms, {rel:.1%} away from the {it.search_ms:.4g} ms "
                       "measured during the search")
    return out
