"""``evotune.autotune``, the decorator: ``triton.autotune``'s arguments in its order, then evotune's.

What the tuned kernel does is :mod:`evotune.triton_tuning.autotuner`'s; this module imports nothing of it
until a kernel is decorated, so that ``import evotune`` stays light (the tuned kernel brings the strategies
and the study storage).

Example::

    @evotune.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})], key=["n"])
    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr): ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evotune.core.space import SearchSpace
    from evotune.triton_tuning.autotuner import Autotuner
    from evotune.triton_tuning.cache import CacheArg


def autotune(configs: Sequence[Any] | None = None, key: Sequence[str] = (),
             prune_configs_by: dict[str, Any] | None = None, reset_to_zero: Sequence[str] | None = None,
             restore_value: Sequence[str] | None = None, pre_hook: Callable[..., Any] | None = None,
             post_hook: Callable[..., Any] | None = None, warmup: int | None = None, rep: float | None = None,
             use_cuda_graph: bool = False, do_bench: Callable[..., Any] | None = None, cache_results: bool = False,
             *, space: SearchSpace | None = None, budget: int = 64, mode: str = "online", cache: CacheArg = None,
             confirm: int = 3) -> Callable[[Any], Autotuner]:
    """Decorator for a ``triton.jit`` kernel, with ``triton.autotune``'s arguments in its order and its behaviour.

    Triton's arguments: ``configs``, ``key``, ``prune_configs_by``, ``reset_to_zero``, ``restore_value``,
    ``pre_hook``, ``post_hook`` as in Triton; ``warmup``: launches before timing (default 3); ``rep``: at most
    this many ms of sampling per configuration (the GPU oracle; default 100); ``use_cuda_graph``: accepted, and
    changes nothing: the GPU oracle always times a configuration from CUDA graphs (a ``do_bench`` of yours times
    as it does); ``do_bench``: Triton's, ``do_bench(call, quantiles=(0.5, 0.2, 0.8))``, its first figure taken
    as the time in ms; ``cache_results``: accepted, and changes nothing: decisions always persist, where
    ``cache`` says (``cache=False``: in memory only).

    evotune's, keyword-only: ``space``: an evotune :class:`~evotune.core.space.SearchSpace` instead of
    ``configs`` (meta-parameters plus ``num_warps``/``num_stages``; its named constraints prune with reasons,
    reading the launch as ``ctx.args``); ``budget``: configurations timed per key (a list no longer is timed
    whole, as Triton does; a larger set is searched by evotune's ``default`` strategy); ``confirm``: the
    fastest few re-timed side by side before the decision (0 or 1: no confirmation); ``mode``: ``"online"``
    (tune a key on its first call) or ``"cache-only"`` (never time; an unseen key takes the nearest tuned
    key's configuration, logged); ``cache``: where decisions persist (a storage URL or a folder; default
    ``$EVOTUNE_AUTOTUNE_CACHE``, else ``~/.cache/evotune/autotune/autotune.db``).

    Shared memory and registers of each compiled configuration are checked against the device before it is
    timed; under the Triton interpreter (``TRITON_INTERPRET=1``) there is no compiled kernel and that check
    is skipped, and without ``do_bench`` the interpreter is timed by the wall clock. The decorator may also be
    applied to a kernel imported from elsewhere, ``evotune.autotune(...)(module.kernel)``, leaving its module
    as it is.
    """

    def decorator(fn: Any) -> Autotuner:
        from evotune.triton_tuning.autotuner import Autotuner

        return Autotuner(fn, fn.arg_names, configs, key, reset_to_zero, restore_value, pre_hook, post_hook,
                         prune_configs_by, warmup, rep, use_cuda_graph, do_bench, cache_results, space=space,
                         budget=budget, mode=mode, cache=cache, confirm=confirm)

    return decorator
