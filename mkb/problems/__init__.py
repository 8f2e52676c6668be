"""Problems: the contract, discovery and loading, the catalog and the per-DSL task statements."""

from mkb.problems._contract import FAMILIES, UPSTREAM_ASPECTS, UPSTREAM_COMMIT, Output, ProblemMeta, Upstream
from mkb.problems._loader import (
    Baseline, Problem, ProblemError, baselines, discover, find_problem, get_problem, load_problem, load_problem_module,
    problem_hash, problem_number, problems, validate,
)

__all__ = [
    "FAMILIES", "Output", "Problem", "ProblemError", "ProblemMeta", "UPSTREAM_ASPECTS", "UPSTREAM_COMMIT", "Upstream",
    "Baseline", "baselines", "discover", "find_problem", "get_problem", "load_problem", "load_problem_module",
    "problem_hash", "problem_number", "problems", "validate",
]
