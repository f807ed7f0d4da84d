"""Tuning Triton kernels: ``evotune.autotune``, a drop-in for ``triton.autotune``, and ``tune-kernel`` /
``export-configs``.

Modules: ``decorator.py`` (``evotune.autotune``), ``autotuner.py`` (the tuned kernel: key, per-key launch cache,
Triton's attributes), ``measure.py`` (one configuration at one launch: built, checked against the device, timed
with the hooks), ``configs.py`` (configurations as a search space), ``pruning.py`` (constraints, then
``prune_configs_by``), ``toolchain.py`` (the build a decision is keyed by: Triton, backend, tools, codegen knobs),
``plain.py`` (a plain jit kernel tuned from outside), ``hooks.py`` (``reset_to_zero``, ``restore_value`` and the
user's hooks), ``search.py`` (one key: measured in evotune's tuning loop, confirmed, decided), ``timers.py``
(Oracle, do_bench, wall clock), ``resources.py`` (building a configuration; shared memory and registers of the
compiled kernel), ``compile_ahead.py`` (a list built side by side), ``cache.py`` (``DecisionStore``: the studies,
the decisions and their location), ``neighbours.py`` (nearest keys, transfer sources), ``ahead.py``
(``tune-kernel``: keys from a TOML file), ``export.py`` and ``commands.py`` (``export-configs``: JSON and vLLM's
fused-MoE files).

Nothing is imported here: ``import evotune`` imports ``decorator.py`` alone.
"""
