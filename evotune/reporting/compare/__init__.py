"""Compare search strategies on recorded landscapes, in memory: no Optuna storage, no GPU.

``python -m evotune compare --landscape PATH ... --strategy NAME ... --budget N ... --repeats R --seed S --out DIR``
drives every strategy directly with ``ask(1)`` / ``tell`` against each landscape
(Kernel Tuner cache files or evotune landscapes, read by ``load_landscape``)
and writes, under ``DIR``:

* ``summary.csv``: one row per (landscape, strategy, budget), columns :data:`SUMMARY_COLUMNS`;
* ``runs.csv``: one row per run (landscape, strategy, budget, seed), columns :data:`RUN_COLUMNS`;
* ``<landscape>.png``: fraction of the optimum against evaluations, one curve per
  strategy (median over the repeats, inter-quartile band);
* ``README.md``: what the files hold, the definitions below and :data:`KT_CAVEAT`.

Definitions
-----------
* **Evaluation**: one distinct point the landscape holds, failed entries included.
  Points the landscape lacks are infeasible and cost nothing: with
  ``space = landscape.space()`` a strategy is only ever handed recorded points.
* **fraction** = optimum time / best time found within the budget (0 when
  nothing valid was found); 1.0 is the landscape's optimum.
* **evals_to_95 / evals_to_99**: the number of evaluations until the best found
  is within 5% / 1% of the optimum (``optimum / best >= 0.95 / 0.99``);
  **budget + 1 when it is never reached** within the budget.
* **score**: the methodology score of Willemsen et al. (2024), averaged over the
  evaluation counts n = 1..budget of
  ``(best(n) - random(n)) / (optimum - random(n))``, on time (lower is better):
  1 = the optimum, 0 = as good as random search, negative = worse than random.
  ``random(n)`` is the *expected* best time of n points drawn uniformly without
  replacement from the landscape's points, computed exactly
  (:func:`expected_random_best`). A failed point has no time: until a run (or a
  random sample) holds a valid point, its best counts as the slowest valid time
  of the landscape. Where ``random(n)`` is already the optimum, the term is 1 if
  the run is at the optimum too, else 0. The summary's score is the mean over the
  repeats, which equals the score of the mean curve (the score is linear in best(n)).
* **ask_ms**: the strategy's own time per evaluation (``ask(1)`` plus ``tell``),
  in milliseconds; for ``kt:`` strategies, Kernel Tuner's ``strategy_time``.

Every budget is read off one long run per (landscape, strategy, seed) up to the
largest budget: the first n evaluations of a run are exactly the run a budget
of n would have made, for every strategy whose proposals do not depend on the
budget. No evotune strategy reads its budget. Of Kernel Tuner's,
``simulated_annealing`` (its cooling schedule) and ``dual_annealing`` (scipy's
``maxfun``) do: they get one run per budget instead.

Kernel Tuner (``kt:NAME``, needs ``pip install '.[bench]'``) runs in its
simulation mode (``kernel_tuner.tune_cache``) on a temporary, uncompressed
Kernel Tuner copy of the same landscape; the configurations it evaluated, in
order and without repeats, are mapped back to the landscape's times so the
same metrics apply. It is seeded through Python's ``random`` and NumPy's global
generator (seed + r, as for evotune), and scipy's Latin hypercube sampler,
which Kernel Tuner leaves unseeded, draws its seed from that stream: the
sequence of evaluations is then the same for a seed, in this process and
across processes; the generators and the sampler are restored after each run.
:data:`KT_CAVEAT` applies.

Modules: :mod:`~evotune.reporting.compare.metrics` (fraction, evaluations to a fraction,
the score), :mod:`~evotune.reporting.compare.runs` (the plan, the landscapes as targets,
the runs), :mod:`~evotune.reporting.compare.kernel_tuner_sim` (Kernel Tuner, the only
code here that touches process-wide state), :mod:`~evotune.reporting.compare.outputs`
(CSVs, README, plots, the printed table).

Deterministic for a given ``--seed`` (repeat r uses seed + r): every column of
both CSVs except the two ``ask_ms`` timings.

Example::

    from evotune.reporting.compare import make_compare_plan, compare
    result = compare(make_compare_plan(["pnpoly.json.gz"], ["ga", "random"], ["25", "50"], "5", "0", "out"))
"""


from evotune.reporting.compare.kernel_tuner_sim import (
    KT_BUDGET_DEPENDENT,
    KT_CAVEAT,
    KT_PREFIX,
    KT_STRATEGIES,
    KernelTunerSim,
    budget_dependent,
    kt_cache_document,
)
from evotune.reporting.compare.metrics import (
    Case,
    Run,
    best_so_far,
    evals_to,
    expected_random_best,
    fraction_curve,
    geometric_mean,
    run_metrics,
    run_score,
)
from evotune.reporting.compare.outputs import (
    RUN_COLUMNS,
    SUMMARY_COLUMNS,
    plot_landscape,
    summary_table,
    write_csv,
    write_readme,
)
from evotune.reporting.compare.plan import CompareError, ComparePlan
from evotune.reporting.compare.runs import (
    MAX_SEED,
    NEEDS,
    Result,
    available,
    compare,
    make_compare_plan,
    run_evotune,
)

__all__ = [
    "KT_BUDGET_DEPENDENT",
    "KT_CAVEAT",
    "KT_PREFIX",
    "KT_STRATEGIES",
    "MAX_SEED",
    "NEEDS",
    "RUN_COLUMNS",
    "SUMMARY_COLUMNS",
    "Case",
    "CompareError",
    "ComparePlan",
    "KernelTunerSim",
    "Result",
    "Run",
    "available",
    "best_so_far",
    "budget_dependent",
    "compare",
    "evals_to",
    "expected_random_best",
    "fraction_curve",
    "geometric_mean",
    "kt_cache_document",
    "make_compare_plan",
    "plot_landscape",
    "run_evotune",
    "run_metrics",
    "run_score",
    "summary_table",
    "write_csv",
    "write_readme",
]
