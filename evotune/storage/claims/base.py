"""The claims machinery every storage shares: owners, a claim's row, the lock's transaction, and
:class:`Claims` itself (the claim, the budget check, lapsed owners), plus :class:`NoClaims`."""

from __future__ import annotations

import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from enum import Enum

HOST = socket.gethostname()

HELD, DONE, SKIP = "held", "done", "skip"  # a claim's states; a released claim is gone


class Claim(Enum):
    """What :meth:`Claims.claim` answers."""

    NEW = "new"  # this worker holds the key now: measure it
    TAKEOVER = "takeover"  # taken from a lapsed or dead owner, who may have finished it: look again before measuring
    TAKEN = "taken"  # another live worker holds it, or it is done: leave it
    FULL = "full"  # the keys done or held live already fill the budget: stop

    @property
    def mine(self) -> bool:
        """Whether this worker holds the key now (``NEW`` or ``TAKEOVER``)."""
        return self in (Claim.NEW, Claim.TAKEOVER)


def owner_id() -> str:
    """This process: every run in it (a run resumed after Ctrl-C, say) owns the claims of the runs before."""
    return f"{HOST}:{os.getpid()}"


def owner_dead(owner: str) -> bool:
    """True when ``owner`` was a process on this host that is gone (killed, crashed or finished)."""
    host, _, rest = owner.partition(":")
    if host != HOST:
        return False  # another host's worker: only its lease can tell
    try:
        pid = int(rest.split(":", 1)[0])
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError):
        return False
    return False


@dataclass(frozen=True)
class Row:
    """One claim: who holds it, until when, and whether its point is still being measured."""

    owner: str
    expires: float
    state: str  # HELD: being measured; DONE: its trial is in the study; SKIP: it cost nothing (not counted)


class _Transaction(ABC):
    """The claims of one study, read and written while holding the study's claims lock."""

    @abstractmethod
    def get(self, key: str) -> Row | None: ...

    @abstractmethod
    def held(self) -> dict[str, Row]:
        """Every claim in state HELD, lapsed ones included."""

    @abstractmethod
    def done_count(self) -> int: ...

    @abstractmethod
    def done_keys(self) -> set[str]: ...

    @abstractmethod
    def put(self, key: str, state: str, expires: float) -> None:
        """Write the claim of ``key`` as this worker's, in ``state``."""

    @abstractmethod
    def drop(self, key: str) -> None: ...


class Claims(ABC):
    """The claims of one study. Every method is one atomic step under the study's claims lock.

    The budget is counted in the claims themselves: a slot is used by every key
    that is DONE (its trial is stored) or HELD by a live worker (being measured,
    this worker's included). A claim held by a dead or lapsed owner uses no slot:
    under the lock, the study is read again (``look``) to tell a point its owner
    stored just before dying (marked DONE) from one it never finished (dropped).
    """

    #: whether other workers may add trials to the study (if not, the tuner never reads it back)
    shared = True

    def __init__(self, study: str, lease_s: float, owner: str | None = None):
        self.study, self.lease_s = study, float(lease_s)
        self.owner = owner or owner_id()

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[_Transaction]:
        """Hold the study's claims lock; what the transaction writes is visible to others once it ends."""

    def claim(self, key: str, budget: int | None = None, finished: AbstractSet[str] = frozenset(),
              look: Callable[[], AbstractSet[str]] | None = None) -> Claim:
        """Take ``key`` for this worker, if a slot of ``budget`` is free.

        ``finished``: keys the caller knows to be in the study; ``look``: reads
        the study again and returns them all (called only when a lapsed claim
        may hide a stored trial). Returns :attr:`Claim.NEW`, :attr:`Claim.TAKEOVER`
        (from a lapsed or dead owner, who may have finished it: look again before
        measuring), :attr:`Claim.TAKEN` when another live worker holds it or it is
        done, or :attr:`Claim.FULL` when the keys done or held live already fill ``budget``.
        """
        with self._transaction() as tx:
            now = time.time()
            row = tx.get(key)
            if row is not None and row.state != HELD:
                return Claim.TAKEN
            theirs = row is not None and row.owner != self.owner
            if row is not None and theirs and not self._expired(row.owner, row.expires, now):
                return Claim.TAKEN
            if budget is not None:
                used = self._used(tx, key, finished, look, now)
                row = tx.get(key)
                if row is not None and row.state != HELD:
                    return Claim.TAKEN  # its dead owner had stored it
                if used >= budget:
                    return Claim.FULL
            tx.put(key, HELD, now + self.lease_s)
            return Claim.TAKEOVER if theirs else Claim.NEW

    def finish(self, key: str, counted: bool = True) -> None:
        """The trial of ``key`` is stored (``counted``), or the point cost nothing: nobody measures it again."""
        with self._transaction() as tx:
            tx.put(key, DONE if counted else SKIP, time.time())

    def finish_all(self, keys: list[str]) -> None:
        """The trials of ``keys`` are stored: :meth:`finish` for each, in one step."""
        with self._transaction() as tx:
            now = time.time()
            for key in keys:
                tx.put(key, DONE, now)

    def release(self, key: str) -> None:
        """Give back a claim whose point was not measured (the evaluation was interrupted)."""
        with self._transaction() as tx:
            row = tx.get(key)
            if row is not None and row.state == HELD and row.owner == self.owner:
                tx.drop(key)

    def begin(self, finished: AbstractSet[str], look: Callable[[], AbstractSet[str]] | None = None) -> None:
        """A run starts on the study: count every stored trial (a study resumed from before claims were
        kept has trials without one), drop what an interrupted run of this process left held, and free
        the keys marked done whose trial is not in the study (lost with a torn last journal line, say)
        so that they are measured again and the study still ends at its budget.

        ``look`` reads the study again under the lock before a done key is freed: another worker may
        have stored it since ``finished`` was read (a key is marked done only once its trial is stored).
        """
        with self._transaction() as tx:
            for key, row in tx.held().items():
                if row.owner == self.owner and key not in finished:
                    tx.drop(key)
            done = tx.done_keys()
            lost = done - finished
            if lost and look is not None:
                finished = look()
                lost = done - finished
            for key in lost:
                tx.drop(key)
            now = time.time()
            for key in finished - done:
                tx.put(key, DONE, now)

    def room(self, budget: int) -> int:
        """Slots of ``budget`` that are free: neither done nor held by a live worker (lapsed claims settle later)."""
        with self._transaction() as tx:
            return budget - self._used(tx, "", frozenset(), None, time.time())

    @contextmanager
    def holding(self, key: str, poll_s: float = 0.5) -> Iterator[None]:
        """Hold ``key`` for the block, waiting while another live worker holds it: a lock across workers (for
        keys that are never finished)."""
        while not self.claim(key).mine:
            time.sleep(poll_s)
        try:
            yield
        finally:
            self.release(key)

    def active(self) -> set[str]:
        """Keys other live workers are measuring."""
        now = time.time()
        with self._transaction() as tx:
            return {k for k, r in tx.held().items()
                    if r.owner != self.owner and not self._expired(r.owner, r.expires, now)}

    def _used(self, tx: _Transaction, key: str, finished: AbstractSet[str],
              look: Callable[[], AbstractSet[str]] | None, now: float) -> int:
        """Budget slots in use, other than ``key``'s: keys DONE or HELD live. Settles lapsed claims."""
        held = tx.held()
        lapsed = [k for k, r in held.items() if self._expired(r.owner, r.expires, now)]
        if look is not None and any(k not in finished for k in lapsed):
            finished = look()  # an owner may have died between storing its trial and marking it DONE
        for k in lapsed:
            if k in finished:
                tx.put(k, DONE, now)
            elif look is not None:
                tx.drop(k)  # never stored: the slot is free, the point anyone's to take
        live = sum(1 for k in held if k != key and k not in lapsed)
        return tx.done_count() + live

    def _expired(self, owner: str, expires: float, now: float) -> bool:
        return owner != self.owner and (expires < now or owner_dead(owner))


class NoClaims(Claims):
    """For storages that live in one process (in-memory): nobody else can measure anything."""

    shared = False

    @contextmanager
    def _transaction(self) -> Iterator[_Transaction]:
        raise NotImplementedError  # every method below answers without one

    def claim(self, key: str, budget: int | None = None, finished: AbstractSet[str] = frozenset(),
              look: Callable[[], AbstractSet[str]] | None = None) -> Claim:
        return Claim.NEW  # the tuner counts its own trials against the budget

    def finish(self, key: str, counted: bool = True) -> None:
        pass

    def finish_all(self, keys: list[str]) -> None:
        pass

    def release(self, key: str) -> None:
        pass

    def room(self, budget: int) -> int:
        return budget

    def begin(self, finished: AbstractSet[str], look: Callable[[], AbstractSet[str]] | None = None) -> None:
        pass

    def active(self) -> set[str]:
        return set()
