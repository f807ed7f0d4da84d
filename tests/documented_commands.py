"""The shell commands README.md and the pages under docs/ show, read from their fenced ```bash blocks, each with what
the docs test does with it: run it, or leave it out for the reason the page (or a rule) gives.

A page says why a block, or some of its commands, is not run in an HTML comment on the line(s) just above the
block's opening fence (invisible once rendered):

- ``<!-- gpu -->``: every command of the block needs a GPU;
- ``<!-- not run: REASON -->``: no command of the block is run, for REASON;
- ``<!-- not run "TEXT": REASON -->``: the block's commands that contain TEXT are not run, for REASON;
- ``<!-- needs: MODULE ... -->``: the block's commands run where every MODULE imports, and are skipped elsewhere
  (an optional extra's package);

and a command whose line ends in ``# needs a GPU`` is not run. Two rules need no marker: installing
(``pip install ...``) and the test command itself (``python -m pytest ...``). Every other command is run."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path

SHELL_FENCES = ("bash", "sh", "shell", "console", "zsh")  # only ```bash is read: the others are refused
_FENCE = re.compile(r"^```\s*(\w*)\s*$")
_COMMENT = re.compile(r"^<!--\s*(.*?)\s*-->\s*$")
_NOT_RUN = re.compile(r'^not run(?: "(?P<text>[^"]+)")?:\s*(?P<reason>\S.*)$')
_NEEDS = re.compile(r"^needs:\s*(?P<modules>\S.*)$")
_INSTALL = re.compile(r"^(python3? -m )?pip install\b")
_TEST_COMMAND = re.compile(r"^python3? -m pytest\b")
GPU_COMMENT = "# needs a GPU"


class Action(enum.Enum):
    RUN = "run"
    INSTALL = "install"  # by rule
    TEST_COMMAND = "the test command"  # by rule: the suite is what runs it
    NOT_RUN = "not run"  # a marker says why


@dataclass(frozen=True)
class Command:
    """One command of a page (continuation lines joined), where it is, and what the docs test does with it."""

    page: Path
    line: int
    text: str
    action: Action
    reason: str = ""
    needs: tuple[str, ...] = ()  # modules it needs (RUN only): skipped where one does not import

    def where(self, root: Path) -> str:
        return f"{self.page.relative_to(root)}:{self.line}"


class MarkerError(ValueError):
    """A page's marker or fence the docs test cannot read: the message names the page and the line."""


@dataclass(frozen=True)
class _Marker:
    reason: str
    text: str | None = None  # None: the whole block
    needs: tuple[str, ...] = ()


def _marker(comment: str, page: Path, line: int) -> _Marker:
    if comment == "gpu":
        return _Marker("needs a GPU")
    if m := _NOT_RUN.match(comment):
        return _Marker(m["reason"], m["text"])
    if m := _NEEDS.match(comment):
        return _Marker("", needs=tuple(m["modules"].split()))
    raise MarkerError(f"{page}:{line}: {comment!r} above a bash block is not a marker the docs test knows "
                      '(gpu, not run: REASON, not run "TEXT": REASON, needs: MODULE ...)')


def _commands(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The block's commands: continuation lines joined, comment lines and blank lines left out."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in lines:
        text = raw.strip()
        if pending is not None:
            first, head = pending
            text, pending = f"{head} {text}", None
            number = first
        if text.endswith("\\"):
            pending = (number, text[:-1].rstrip())
            continue
        if text and not text.startswith("#"):
            out.append((number, text))
    if pending is not None:
        out.append(pending)
    return out


def _action(number: int, text: str, markers: list[_Marker], page: Path) -> Command:
    needs = tuple(module for m in markers for module in m.needs)
    if text.endswith(GPU_COMMENT):
        return Command(page, number, text, Action.NOT_RUN, "needs a GPU")
    for m in markers:
        if not m.needs and (m.text is None or m.text in text):
            return Command(page, number, text, Action.NOT_RUN, m.reason)
    if _INSTALL.match(text):
        return Command(page, number, text, Action.INSTALL, "installs")
    if _TEST_COMMAND.match(text):
        return Command(page, number, text, Action.TEST_COMMAND, "the test command")
    return Command(page, number, text, Action.RUN, needs=needs)


def read_page(page: Path) -> list[Command]:
    """Every command of ``page``'s ```bash blocks, in order. Raises :class:`MarkerError` for a marker it does not
    know, a marker that names text no command of its block holds, or a shell block fenced as other than bash."""
    lines = page.read_text().splitlines()
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence or not fence[1]:
            if fence:  # an unnamed block: skip to its end
                i += 1
                while i < len(lines) and not lines[i].startswith("```"):
                    i += 1
            i += 1
            continue
        language, start = fence[1], i
        i += 1
        body: list[tuple[int, str]] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1
        if language in SHELL_FENCES and language != "bash":
            raise MarkerError(f"{page}:{start + 1}: a shell block fenced as ```{language}: fence it as ```bash, "
                              "so that the docs test reads it")
        if language != "bash":
            continue
        markers: list[_Marker] = []
        above = start - 1
        while above >= 0 and (comment := _COMMENT.match(lines[above])):
            markers.append(_marker(comment[1], page, above + 1))
            above -= 1
        block = [_action(number, text, markers, page) for number, text in _commands(body)]
        for m in markers:
            if m.text is not None and not any(m.text in c.text for c in block):
                raise MarkerError(f'{page}:{start}: the marker names "{m.text}", which no command of its block holds')
        commands.extend(block)
    return commands


def documented_pages(root: Path) -> list[Path]:
    """README.md, then every page under docs/, in name order."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
