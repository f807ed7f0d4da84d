"""Options of the measuring oracles (``gpu`` and ``cpu``): one typed object from the experiment file to the worker.

The experiment parser builds an :class:`OracleOptions` from the ``[oracle]``
table and checks it there, where errors can name the file and the field;
the evaluator reads ``timeout_s`` and ``workers``, and hands ``timing`` to the
GPU worker process (both classes are frozen and picklable), whose
:class:`evotune.measurement.oracle.Oracle` samples by it. Every default is
written here and nowhere else.

Example::

    OracleOptions(timeout_s=60, timing=TimingOptions(min_samples=10, max_samples=60),
                  confirm=ConfirmOptions(top_k=3))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from evotune.core.flush import Flush


@dataclass(frozen=True)
class TimingOptions:
    """How the GPU oracle samples one kernel: at least ``min_samples`` timed launches and at most
    ``max_samples``, stopping once the 95% CI of the median is within ``ci_target`` of it, each after an
    L2 flush of the kind ``flush`` names (one of :data:`evotune.core.flush.FLUSHES`). The default is the clean
    one: its isolated times predict a layer's time inside a decode step (``benchmarks/decode_step.py``: 2.1% off
    on an H100, the dirty one's 18.7%)."""

    min_samples: int = 20
    max_samples: int = 300
    ci_target: float = 0.01
    flush: Flush = "clean"


@dataclass(frozen=True)
class ConfirmOptions:
    """How the confirmation stage runs; ``top_k = 0`` turns it off."""

    top_k: int = 5  # best configurations re-timed beside the baselines
    # Configurations whose search time is within this fraction of the fastest one's enter the stage too (at
    # most screen_max in all): a search figure can be off by more than the gap between the leaders, and a
    # winner measured slow once would otherwise never be looked at again. The stage races them down to top_k.
    screen: float = 0.15
    screen_max: int = 40
    ci_target: float = 0.005  # stop once every median's 95% CI is within this fraction of it
    per_round: int = 10  # samples per item per round
    min_rounds: int = 3
    max_rounds: int = 60
    max_seconds: float = 120.0  # wall time for the rounds, after the warm-up
    warmup_s: float = 1.0  # work before the first round, to bring the clocks up
    drift: float = 0.03  # relative change that is reported (start vs end, confirmed vs search)
    # Each round opens with the next item (A B C, B C A, C A B, ...): the item that opens a round follows the
    # bookkeeping between rounds, a moment the GPU idles, and no item should take that place every time. (On an
    # H200 held at its power cap, copies of one launch confirmed together spread up to 3% in either order:
    # benchmarks/confirm_order.py.)
    rotate: bool = True


@dataclass(frozen=True)
class OracleOptions:
    """What a measuring evaluator needs from the ``[oracle]`` table."""

    timeout_s: float = 300.0  # a candidate that takes longer is killed and marked timeout
    workers: int | None = None  # gpu: compile processes; None: this worker's share of the host's cores and memory
    #                             (host.default_workers)
    timing: TimingOptions = field(default_factory=TimingOptions)
    confirm: ConfirmOptions = field(default_factory=ConfirmOptions)  # gpu: the confirmation stage after a search
