"""The L2 flushes a GPU time may be measured after, as studies, landscapes and confirmations record them.

``dirty`` overwrites a buffer twice the size of L2 before each sample, leaving dirty lines that the timed kernel
writes back; ``clean`` then reads a second such buffer, so the write-back happens before the sample
(:mod:`evotune.measurement.oracle` does both). A record that names no flush was measured after the dirty one:
the only one there was then.
"""

from __future__ import annotations

from typing import Literal, get_args

Flush = Literal["dirty", "clean"]
FLUSHES: tuple[Flush, ...] = get_args(Flush)
UNRECORDED_FLUSH: Flush = "dirty"
