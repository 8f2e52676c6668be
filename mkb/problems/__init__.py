"""Problems: the contract, discovery and loading, the catalog and the per-DSL task statements."""

from mkb.problems._contract import FAMILIES, Output, ProblemMeta

__all__ = ["FAMILIES", "Output", "ProblemMeta"]
