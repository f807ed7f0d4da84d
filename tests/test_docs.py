"""The docs say what runs: every command README.md and docs/ show is run in a fresh clone, or its page says why not
(:mod:`documented_commands`); README's links resolve; the MkDocs site builds with ``--strict``, outside the
checkout; README's test command is the one CI runs."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QUICKSTART_COMMAND, ROOT, git_status
from documented_commands import Action, Command, MarkerError, documented_pages, read_page

README = ROOT / "README.md"
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def documented_commands() -> list[Command]:
    return [c for page in documented_pages(ROOT) for c in read_page(page)]


def test_the_reader_of_documented_commands_knows_markers_rules_and_continuations(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("""Text.

```bash
pip install '.[test]'
python -m evotune run a.toml \\
    --no-progress
# a comment line
python -m pytest -q
python -m evotune record b.toml   # needs a GPU
```

<!-- gpu -->
```bash
python -m evotune run gpu.toml
```

<!-- not run "dashboard": a server -->
<!-- needs: kernel_tuner -->
```bash
python -m evotune best c.toml
python -m evotune dashboard c.toml
```

```python
print("not a shell block")
```
""")
    got = [(c.line, c.text, c.action, c.reason, c.needs) for c in read_page(page)]
    assert got == [
        (4, "pip install '.[test]'", Action.INSTALL, "installs", ()),
        (5, "python -m evotune run a.toml --no-progress", Action.RUN, "", ()),
        (8, "python -m pytest -q", Action.TEST_COMMAND, "the test command", ()),
        (9, "python -m evotune record b.toml   # needs a GPU", Action.NOT_RUN, "needs a GPU", ()),
        (14, "python -m evotune run gpu.toml", Action.NOT_RUN, "needs a GPU", ()),
        (20, "python -m evotune best c.toml", Action.RUN, "", ("kernel_tuner",)),
        (21, "python -m evotune dashboard c.toml", Action.NOT_RUN, "a server", ()),
    ]


@pytest.mark.parametrize(("text", "message"), [
    ("<!-- skip -->\n```bash\nls\n```\n", "is not a marker the docs test knows"),
    ('<!-- not run "absent": why -->\n```bash\nls\n```\n', 'names "absent", which no command of its block holds'),
    ("```sh\nls\n```\n", "fence it as ```bash"),
])
def test_a_marker_the_reader_does_not_know_is_refused_naming_the_page_and_line(tmp_path, text, message):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n" + text)
    with pytest.raises(MarkerError, match=re.escape(message)) as caught:
        read_page(page)
    assert str(caught.value).startswith(f"{page}:")


def test_every_documented_command_is_run_or_its_page_says_why_not():
    """Reading every page raises no MarkerError; the commands a user starts with are among those run."""
    commands = documented_commands()
    run = {c.text for c in commands if c.action is Action.RUN}
    assert "python -m evotune run experiments/quickstart.toml" in run
    assert "TRITON_INTERPRET=1 python examples/triton_autotune/matmul.py" in run
    assert all(c.reason for c in commands if c.action is not Action.RUN)


def test_readmes_test_command_is_the_one_ci_runs():
    last = (ROOT / ".ci" / "run").read_text().rstrip("\n").splitlines()[-1]
    assert last in {c.text for c in read_page(README) if c.action is Action.TEST_COMMAND}


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading (MkDocs gives the same to these pages' headings)."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := _HEADING.match(line)):
            anchors.add(_slug(m[1]))
    return anchors


def test_readmes_relative_links_point_at_files_and_headings_that_exist():
    links = [m[1] for m in _LINK.finditer(README.read_text()) if not re.match(r"^[a-z]+:", m[1])]
    assert any(link.startswith("docs/") for link in links)
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = (ROOT / path) if path else README
        if not target.exists():
            broken.append(f"{link}: no file {path}")
        elif anchor and anchor not in _anchors(target):
            broken.append(f"{link}: {path or 'README.md'} has no heading #{anchor}")
    assert not broken, "README.md links to what does not exist:\n" + "\n".join(broken)


def test_the_docs_site_builds_strict_outside_the_checkout(tmp_path):
    """``mkdocs build --strict`` fails on a broken link or anchor, a page left out of the nav, or a warning."""
    pytest.importorskip("mkdocs", reason="needs mkdocs: pip install '.[docs]' (.ci/run installs it)")
    before = git_status(ROOT)
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # a hang guard, not a time limit
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "site" / "autotune" / "index.html").is_file()
    assert git_status(ROOT) == before


@pytest.mark.slow  # the documented commands, a few seconds each, in the quickstart's clone
def test_documented_commands_run_in_a_fresh_clone(quickstart, tmp_path):
    """Each command a page shows, run as a user runs it, in reading order (README first, then the pages under docs/),
    in the clone the quickstart ran in: evotune importable as ``pip install .`` makes it, a home of its own (so
    evotune's caches are where the docs say, under ``~/.cache/evotune``). Each must succeed, and together they
    change no tracked file. The commands of ``evotune.autotune`` run on the CPU through Triton's interpreter. A
    command two pages show alike runs once, where it is first shown: run again in the same clone it would repeat what
    its first run checked. README's quickstart command is the one the ``quickstart`` fixture ran in the clone."""
    pytest.importorskip("torch", reason="needs torch (its CPU build will do) for evotune.autotune's commands")
    pytest.importorskip("triton", reason="needs triton for evotune.autotune's commands")
    checkout, _ = quickstart
    env = {k: v for k, v in checkout.env.items() if k not in ("XDG_CACHE_HOME", "EVOTUNE_TUNED",
                                                              "EVOTUNE_KERNEL_CACHE", "EVOTUNE_AUTOTUNE_CACHE")}
    env["HOME"] = str(tmp_path / "home")
    env["PYTHONPATH"] = str(checkout.path)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` is this one
    failed, missing, ran = [], [], {QUICKSTART_COMMAND}
    for command in documented_commands():
        if command.action is not Action.RUN or command.text in ran:
            continue
        absent = [m for m in command.needs if importlib.util.find_spec(m) is None]
        if absent:
            missing.append(f"{command.where(ROOT)} needs {', '.join(absent)}")
            continue
        ran.add(command.text)
        proc = subprocess.run(["bash", "-c", command.text], cwd=checkout.path, env=env, capture_output=True,
                              text=True, timeout=1800)  # a hang guard, not a time limit
        if proc.returncode != 0:
            failed.append(f"{command.where(ROOT)}: {command.text}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    assert not failed, "\n".join(failed)
    assert git_status(checkout.path) == ""
    if missing:
        print("not run here:", *missing, sep="\n  ")
