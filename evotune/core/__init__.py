"""The core: what a tuning run is about, with no knowledge of how it runs.

Problems and their workloads, the GPU table, search spaces and their feasible
points, the landscape format, evaluation results, budgets, the compile-results
file and the tuning-result cache. Nothing here imports from another evotune
sub-package.
"""
