"""The built-in workloads, each owning its fields, its inputs, its reference and its baselines.

:mod:`evotune.core.problem` finds them by kind (``BUILTIN_WORKLOADS``), then through the
``evotune.workloads`` entry points.
"""
