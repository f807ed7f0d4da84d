"""The landscapes shipped inside the package (evotune/landscapes/): every file the repository names exists, and an
installed evotune finds the same ones from any folder as a checkout does."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT, copy_checkout

from evotune.core.landscape import SHIPPED

# a path under the shipped folder, as text names it or as code joins it ("evotune" / "landscapes" / ...)
NAMED = re.compile(r"evotune/landscapes(?:/[\w.-]+)+")


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--", *patterns], cwd=ROOT, capture_output=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.stdout.decode().split("\0") if name]


def test_every_shipped_landscape_the_repository_names_exists():
    """Scripts, docs, tests and experiments name shipped files and folders by path: none names one that is not
    there (a benchmark that names a renamed file fails only when someone runs it)."""
    assert SHIPPED == ROOT / "evotune" / "landscapes" and (SHIPPED / "kerneltuner" / "LICENSE").is_file()
    missing = []
    for path in _tracked("*.py", "*.md", "*.toml"):
        text = path.read_text().replace('" / "', "/")
        for match in NAMED.finditer(text):
            named = match.group(0).rstrip(".")
            if not (ROOT / named).exists():
                missing.append(f"{path.relative_to(ROOT)}: {named}")
    assert not missing


def test_every_experiments_landscapes_and_sources_exist():
    """An experiment file's paths are relative to its own folder."""
    missing = []
    for path in _tracked("experiments/*.toml", "examples/*.toml", "examples/**/*.toml"):
        doc = tomllib.loads(path.read_text())
        named = [*doc.get("oracle", {}).get("landscapes", []),
                 *(s for s in doc.get("sources", []) if s not in ("shipped", "cache"))]
        missing += [f"{path.relative_to(ROOT)}: {n}" for n in named if not (path.parent / n).is_file()]
    assert not missing


def _venv(where: Path, checkout: Path) -> Path:
    """A virtual environment with ``checkout`` installed from its wheel (``pip install``, no dependencies): they
    come from this interpreter's site-packages, named in a .pth file, so nothing is downloaded (``venv
    --system-site-packages`` alone would miss them when this interpreter is itself a venv's)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(where)], check=True)
    python = where / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (Path(site) / "outer_site_packages.pth").write_text("\n".join(ours) + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(checkout)],
                   cwd=where, check=True, capture_output=True)
    return python


@pytest.mark.slow  # a venv, a wheel built and installed, and two short replays
def test_an_installed_evotune_finds_the_same_shipped_sources_from_any_folder(tmp_path):
    """The same replay (``default``, transferring from the shipped landscapes of its space) run by an installed
    evotune inside the checkout and from another folder: the same sources, the same result."""
    checkout = copy_checkout(tmp_path / "checkout")
    python = _venv(tmp_path / "venv", checkout)
    target = SHIPPED / "h100" / "cute_hopper_gemm_gemm_int8_tn_64x4096x11008.json.gz"
    exp = tmp_path / "shipped.toml"
    exp.write_text(f"""
name = "shipped"
space = "cute_hopper_gemm"
[oracle]
kind = "replay"
landscapes = [{str(target)!r}]
[strategy]
name = "default"
[budget]
trials = 12
[storage]
url = "journal:runs/shipped.journal"
[outputs]
best = "runs/shipped_best.json"
""")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(cwd: Path) -> tuple[str, dict]:
        cwd.mkdir(exist_ok=True)
        env["EVOTUNE_TUNED"] = str(cwd / "tuned.json")
        where = subprocess.run([python, "-c", "import evotune; print(evotune.__file__)"], cwd=cwd, env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
        proc = subprocess.run([python, "-m", "evotune", "run", str(exp), "--no-progress", "--no-plots"], cwd=cwd,
                              env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        (best,) = json.loads((cwd / "runs" / "shipped_best.json").read_text())
        return where, best

    inside, in_checkout = run(checkout)
    outside, elsewhere = run(tmp_path / "elsewhere")
    assert Path(inside).is_relative_to(checkout) and Path(outside).is_relative_to(tmp_path / "venv")
    names = [s["name"] for s in elsewhere["sources"]]
    assert "landscape:cute_hopper_gemm_gemm_int8_tn_64x4096x4096" in names  # a shipped one, found from anywhere
    assert elsewhere["sources"] == in_checkout["sources"]
    assert (elsewhere["config"], elsewhere["time_ms"]) == (in_checkout["config"], in_checkout["time_ms"])
