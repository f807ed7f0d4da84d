"""What ``tune-model`` uses of ``evotune.autotune``, imported here only: its ahead-of-time entry point and what
it reports per key, its count of Triton's compiles, its build processes (their number, start and stop), its module
loader, the six fields of a vLLM Triton configuration and the check of a vLLM config file. (``preload.py`` reads the
build processes' module list from their module itself: the command line's first step, before these imports.)"""

from __future__ import annotations

from evotune.triton_tuning.ahead import KeyProgress, tune_kernel
from evotune.triton_tuning.build_processes import for_cores as build_processes_for
from evotune.triton_tuning.build_processes import processes as build_processes
from evotune.triton_tuning.build_processes import shutdown as stop_build_processes
from evotune.triton_tuning.build_processes import start as start_build_processes
from evotune.triton_tuning.compile_count import CompileCount
from evotune.triton_tuning.export import VLLM_FIELDS, check_vllm_config
from evotune.triton_tuning.export import ExportError as VllmFileError
from evotune.triton_tuning.references import AheadError, load_module

__all__ = ["VLLM_FIELDS", "AheadError", "CompileCount", "KeyProgress", "VllmFileError",
           "build_processes", "build_processes_for", "check_vllm_config", "load_module", "start_build_processes",
           "stop_build_processes", "tune_kernel"]
