"""The grader's names for mkb.problems' one problem lookup (kept so the worker's harness imports stay stable)."""

from __future__ import annotations

from mkb.problems import find_problem as problem_path
from mkb.problems import load_problem_module as load_problem
from mkb.problems import problem_number

__all__ = ["load_problem", "problem_number", "problem_path"]
