"""README's pictures, drawn from the current code into this folder: ``python docs/images/make.py``.

* ``quickstart_Xgemm_4096x4096_convergence.png``, with its data beside it,
  ``quickstart_Xgemm_4096x4096_convergence.csv`` (per strategy and evaluation: the median and the inter-quartile
  range over the seeds of the fraction of the optimum found): README's quickstart
  (``python -m evotune run experiments/quickstart.toml``) run afresh in a temporary folder, then drawn as
  ``evotune plot`` draws it. ``tests/test_quickstart.py`` fails when the quickstart's curves no longer match the
  CSV; then run this and commit both files.
* ``kernel_quality.png``: the confirmed ratios of ``benchmarks/confirmed/h100.json`` (its data), as
  ``python benchmarks/kernel_quality.py`` draws them.

Nothing else is written: the quickstart's studies, outputs and tuning-result cache stay in the temporary folder.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from evotune.cli import main as evotune  # noqa: E402
from evotune.reporting.plots import evaluation_bands, load_runs, plot_convergence, write_bands  # noqa: E402
from evotune.running.experiment import load_experiment  # noqa: E402

QUICKSTART = ROOT / "experiments" / "quickstart.toml"


def quickstart(out: Path) -> list[Path]:
    """Run the quickstart in a temporary folder; draw its convergence figure and write its curves into ``out``."""
    exp = load_experiment(QUICKSTART)
    here, cache = Path.cwd(), os.environ.get("EVOTUNE_TUNED")
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the experiment's outputs are relative to the working directory
        os.environ["EVOTUNE_TUNED"] = str(Path(tmp) / "tuned.json")
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # its report: the figure says what matters here
                code = evotune(["run", str(QUICKSTART), "--no-progress", "--no-plots"])
            if code != 0:
                raise SystemExit(f"{QUICKSTART}: the quickstart failed (exit code {code})")
            (runs,) = load_runs(exp.storage, exp.name)
        finally:
            os.chdir(here)
            if cache is None:
                os.environ.pop("EVOTUNE_TUNED", None)
            else:
                os.environ["EVOTUNE_TUNED"] = cache
    stem = f"{runs.experiment}_{runs.problem_key}_convergence"
    return [plot_convergence(runs, out / f"{stem}.png"), write_bands(evaluation_bands(runs), out / f"{stem}.csv")]


def kernel_quality(out: Path) -> list[Path]:
    """The confirmed ratios' bar chart, drawn by benchmarks/kernel_quality.py's own code."""
    spec = importlib.util.spec_from_file_location("kernel_quality", ROOT / "benchmarks" / "kernel_quality.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    path = out / "kernel_quality.png"
    module.bar_chart(module.load_confirmed(module.CONFIRMED), path, module.CHART_TITLE)
    return [path]


def compact(path: Path) -> Path:
    """Rewrite a PNG in 64 colours: a third of matplotlib's size, no visible change to a line chart (the
    repository's size is kept small)."""
    from PIL import Image  # matplotlib's own dependency

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    small.save(path, "PNG", optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE, help="where the pictures go (default: this folder)")
    args = ap.parse_args(argv)
    for path in [*quickstart(args.out), *kernel_quality(args.out)]:
        print(compact(path) if path.suffix == ".png" else path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
