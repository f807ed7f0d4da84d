"""The read-ceiling benchmark's Triton read touches every word once, whatever its block, unrolling and programs
(CPU, Triton's interpreter, in a process of its own: the interpreter is chosen when Triton is imported)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

CHECK = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from benchmarks.read_ceiling import launch_read
for words, block, unroll, programs in ((4096, 1024, 1, 4), (5000, 1024, 4, 3), (777, 2048, 1, 1), (9001, 1024, 2, 8)):
    src = torch.arange(words, dtype=torch.int32) % 7
    out = torch.full((8,), -1, dtype=torch.int32)
    launch_read(src, out, block, 4, unroll, programs)()
    assert int(out[:programs].sum()) == int(src.sum()), (words, block, unroll, programs, out)
print("ok")
"""


@pytest.mark.slow  # a Triton kernel through the interpreter
def test_the_read_sums_every_word_once():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", CHECK, str(ROOT)], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
