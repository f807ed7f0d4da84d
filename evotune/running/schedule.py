"""Which studies a worker runs, and whether alone or beside other workers.

An experiment's studies come in groups, one per target (a problem in a space:
every strategy and seed of it). Whatever a worker takes up of a group costs it
that group's fixed cost once (its baselines looked up or timed, its transfer
sources read, its first compiles), however few points it then measures. So a
worker goes through the groups in three passes, and takes the largest piece
that no other worker has taken:

1. whole problems: a group no worker has taken, and every study of it that no
   worker has taken meanwhile;
2. whole studies: the studies of groups other workers took that nobody has
   started (more seeds than workers);
3. shared points: every study it did not run that is not finished yet (its owner
   is still at it, or died), joined: the points are shared through the point
   claims, as with ``split = "points"``.

With many problems and few workers, pass 1 deals the problems out and pays each
one's fixed cost once, and pass 3 finishes the last ones together; with fewer
problems than workers, the workers left without a problem join one (pass 3).
No count of workers is needed. ``split = "points"`` is the plain alternative:
every worker runs every study, sharing points, and pays every group's fixed cost.

Taking a group or a study is a claim (``group:NAME``, ``study:NAME``) in the
namespace :func:`namespace` names in the storage's claims, held until the worker is done
(:meth:`Schedule.release`), lapsing with a killed worker. It only decides who
goes first: every point is still claimed on its own before it is measured, so
the trials budget and "no point twice" hold for any interleaving.

A group's confirmation is claimed too (``confirm:NAME@TRIALS``), once per number
of trials its studies hold: the worker that finishes a group's last study
confirms it, and a run that measures nothing new confirms nothing again.

Example::

    schedule = Schedule("sqlite:///runs/exp.db", "exp", [("exp/g", ["exp/g/ga/seed0", "exp/g/ga/seed1"])])
    for turn in schedule.turns(unfinished=lambda name: True):
        ...run study turn.study of group turn.group, alone when turn.whole...
    schedule.release()
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from evotune.storage.claims import make_claims

SPLITS = ("problems", "points")
OWN_LEASE_S = 24 * 3600.0  # a group or study taken by a worker on another host that died is joined in pass 3 anyway


def namespace(experiment: str) -> str:
    """The claims namespace of an experiment's schedule (apart from every study's own point claims)."""
    return f"{experiment}#schedule"


@dataclass(frozen=True)
class Turn:
    """One study for this worker: ``group`` and ``study`` index the groups given to :class:`Schedule`;
    ``whole``: nobody else was running it when it was taken."""

    group: int
    study: int
    whole: bool


class Schedule:
    """The order in which this worker takes up ``groups`` (name, study names) of ``experiment``, whose studies
    and claims are kept at ``url``, and what it takes alone."""

    def __init__(self, url: str, experiment: str, groups: list[tuple[str, list[str]]], split: str = "problems",
                 owner: str | None = None):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        self.url, self.groups, self.split = url, groups, split
        self.claims = make_claims(url, namespace(experiment), OWN_LEASE_S, owner)  # owner: this process by default
        self._held: list[str] = []
        self._ran: set[tuple[int, int]] = set()

    def turns(self, unfinished: Callable[[str], bool], resume_finished: bool = True) -> Iterator[Turn]:
        """The studies to run, one at a time; each is taken when it is asked for, so other workers can take
        the rest meanwhile. ``unfinished(study name)``: whether a study still wants points (pass 3);
        ``resume_finished``: passes 1 and 2 take finished studies too (a lone run resumes and reports them;
        a worker that joins late need not pay their fixed costs)."""
        alone = not self.claims.shared  # storage in one process: nobody to split with, every study is resumed
        if self.split == "problems" and not alone:
            wanted = (lambda name: True) if resume_finished else unfinished
            for g, (group, names) in enumerate(self.groups):
                if self._take(f"group:{group}"):
                    yield from self._whole(g, names, wanted)
            for g, (_, names) in enumerate(self.groups):
                yield from self._whole(g, names, wanted)
        for g, (_, names) in enumerate(self.groups):
            for s, name in enumerate(names):
                if (g, s) not in self._ran and (alone or self.split == "points" or unfinished(name)):
                    self._ran.add((g, s))
                    yield Turn(g, s, whole=False)

    def _whole(self, g: int, names: list[str], wanted: Callable[[str], bool]) -> Iterator[Turn]:
        for s, name in enumerate(names):
            if (g, s) not in self._ran and wanted(name) and self._take(f"study:{name}"):
                self._ran.add((g, s))
                yield Turn(g, s, whole=True)

    def _take(self, key: str) -> bool:
        if self.claims.claim(key).mine:
            self._held.append(key)
            return True
        return False

    @contextmanager
    def confirming(self, group: int, trials: int) -> Iterator[bool]:
        """Whether this worker confirms ``group``, whose studies hold ``trials`` trials: True for one worker
        per number of trials. The claim is kept once the block ends, and given back when it raises."""
        key = f"confirm:{self.groups[group][0]}@{trials}"
        mine = self.claims.claim(key).mine
        try:
            yield mine
        except BaseException:
            if mine:
                self.claims.release(key)
            raise
        if mine:
            self.claims.finish(key)

    def release(self) -> None:
        """Give back every group and study this worker took: a later run starts afresh."""
        for key in self._held:
            self.claims.release(key)
        self._held.clear()
