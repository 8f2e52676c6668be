"""Problems: the contract, discovery and loading, the catalog and the per-DSL task statements."""

from mkb.problems._contract import FAMILIES, UPSTREAM_ASPECTS, UPSTREAM_COMMIT, Output, ProblemMeta, Upstream
from mkb.problems._loader import Problem, ProblemError, discover, get_problem, load_problem, problem_hash, problems, validate

__all__ = [
    "FAMILIES", "Output", "Problem", "ProblemError", "ProblemMeta", "UPSTREAM_ASPECTS", "UPSTREAM_COMMIT", "Upstream",
    "discover", "get_problem", "load_problem",
    "problem_hash", "problems", "validate",
]
