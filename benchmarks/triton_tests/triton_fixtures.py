"""A pytest plugin: the fixtures Triton's unit tests take from Triton's own conftest, for a test file run alone.

``device`` (``$TRITON_TEST_DEVICE``, default ``cuda``) and ``fresh_knobs`` (``triton.knobs`` as the test leaves
them are set back afterwards, the environment variables they export included). A ``conftest.py`` beside the
test file that defines them wins over these.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def device() -> str:
    return os.environ.get("TRITON_TEST_DEVICE", "cuda")


@pytest.fixture
def fresh_knobs() -> Iterator[Any]:
    from triton import knobs

    groups = [g for g in vars(knobs).values() if isinstance(g, knobs.base_knobs)]
    with contextlib.ExitStack() as stack:
        for group in groups:
            stack.enter_context(group.scope())
        yield knobs
