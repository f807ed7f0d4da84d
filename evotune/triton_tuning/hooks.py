"""The hooks around each timed launch, as ``triton.autotune`` makes them.

Without a ``pre_hook`` of the user's, ``reset_to_zero`` arguments are zeroed before each launch and
``restore_value`` arguments copied; without a ``post_hook``, the copies are written back after it. So a
kernel that updates its outputs in place leaves them as one launch would, however often it was timed.
``pre_hook(kwargs, reset_only=False)`` and ``post_hook(kwargs, exception)`` are Triton's call shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class Hooks:
    """``pre`` and ``post``: the user's hooks, or the defaults for ``reset_to_zero`` and ``restore_value``."""

    def __init__(self, reset_to_zero: Sequence[str], restore_value: Sequence[str],
                 pre_hook: Callable[..., Any] | None = None, post_hook: Callable[..., Any] | None = None):
        self.reset_to_zero, self.restore_value = list(reset_to_zero), list(restore_value)
        self.restore_copies: dict[str, Any] = {}
        self.pre: Callable[..., Any] = pre_hook or (self._pre if self.reset_to_zero or self.restore_value
                                                    else _no_pre)
        self.post: Callable[..., Any] = post_hook or (self._post if self.restore_value else _no_post)

    def _pre(self, kwargs: dict[str, Any], reset_only: bool = False) -> None:
        for n in self.reset_to_zero:
            if kwargs[n] is not None:
                kwargs[n].zero_()
        if not reset_only:
            self.restore_copies = {n: kwargs[n].clone() for n in self.restore_value if kwargs[n] is not None}

    def _post(self, kwargs: dict[str, Any], exception: BaseException | None) -> None:
        for n, value in self.restore_copies.items():
            kwargs[n].copy_(value)
        self.restore_copies = {}


def _no_pre(kwargs: dict[str, Any], reset_only: bool = False) -> None:
    return None


def _no_post(kwargs: dict[str, Any], exception: BaseException | None) -> None:
    return None
