"""Claims: which worker is measuring which point, so that several workers can share one study.

Before a worker measures a point it claims the point's key for the study. A
claim is exclusive: a second worker asking for the same key is refused, and
proposes something else. A claim lapses when its lease runs out, or at once
when its owner is a process on this host that no longer exists (a worker that
was killed), so no point is lost to a dead worker either.

The claims also keep the study's budget for all its workers together: the
budget check and the claim are one step under the study's claims lock, and
a claim is marked done once its trial is stored, so the count under the lock
is "keys done, or held by a live worker". Without that, two workers that both
count 199 trials for a budget of 200 both claim a point and the study ends
with 201.

Where claims live follows the storage: a table ``evotune_claims`` in the same
database for RDB URLs (sqlite, PostgreSQL, MySQL; the lock is a transaction
that serialises per study), or a ``.claims`` file beside a ``journal:`` file
(appended under an exclusive file lock).

Example::

    claims = make_claims("sqlite:///runs/x.db", "x/gemm_bf16_tn_4096x4096x4096/ga/seed0", lease_s=600)
    if claims.claim(space.key(point), budget=200, finished=keys_in_study).mine:
        ...measure it, store its trial...
        claims.finish(space.key(point))
"""

from __future__ import annotations

import time
from pathlib import Path

from evotune.storage.claims.base import Claim, Claims, NoClaims
from evotune.storage.claims.file import FileClaims
from evotune.storage.claims.rdb import RdbClaims

__all__ = ["Claim", "Claims", "FileClaims", "NoClaims", "RdbClaims", "make_claims", "wait_for_others"]


def make_claims(url: str, study: str, lease_s: float = 3600.0, owner: str | None = None) -> Claims:
    """The claims of ``study`` kept beside the storage at ``url``."""
    if url.startswith("journal:"):
        return FileClaims(Path(url.removeprefix("journal:") + ".claims"), study, lease_s, owner)
    if "://" in url:
        return RdbClaims(url, study, lease_s, owner)
    return NoClaims(study, lease_s, owner)


def wait_for_others(url: str, studies: list[str], poll_s: float = 0.5) -> None:
    """Return once no other live worker holds a point of ``studies``: each such point is stored, or its worker gone."""
    for study in studies:
        claims = make_claims(url, study)
        while claims.active():
            time.sleep(poll_s)
