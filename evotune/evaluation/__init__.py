"""Evaluation: build -> verify -> time, or replay a recorded landscape."""

from evotune.evaluation.base import Evaluator
from evotune.evaluation.result import EvalResult, Status

__all__ = ["EvalResult", "Evaluator", "Status"]
