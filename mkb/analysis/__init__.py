"""The read side: turns an event store into the DESIGN Definitions' tables, statistics, reports and exports.

Imports neither torch, the DSLs nor litellm, so anyone can re-analyse anyone's dataset.
"""

from mkb.analysis._export import export_dataset, problems_table, verdicts_table
from mkb.analysis._stats import (
    DEFAULT_COMPONENTS, BootstrapSpec, DETECT_LIFT, PlanDesign, VarianceComponents, cell_lift_simple, cluster_bootstrap,
    contrast_table, holm, lift_table, plan_power_table, power_table, problem_table, standing_table, two_part_table,
    variance_components,
)
from mkb.analysis._tables import SCORES, MixedVersionsError, NOISE_ARM, ScoreError, Tables, build_pairs, load_tables

__all__ = [
    "BootstrapSpec", "DEFAULT_COMPONENTS", "DETECT_LIFT", "PlanDesign", "VarianceComponents", "plan_power_table", "variance_components", "MixedVersionsError", "NOISE_ARM", "SCORES", "ScoreError", "Tables", "build_pairs", "cell_lift_simple",
    "cluster_bootstrap", "contrast_table", "export_dataset", "power_table", "problem_table", "holm", "lift_table", "load_tables", "problems_table", "standing_table", "two_part_table", "verdicts_table",
]
