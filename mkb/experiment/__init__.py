"""The experiment: plans from a config, claims and resume, scheduling of the arms, executors (local and Ray)."""

from mkb.experiment._config import Assumptions, ConfigError, ExperimentConfig, ModelSpec, load_config, parse_config
from mkb.experiment._estimate import Estimate, estimate
from mkb.experiment._executor import Executor, PlanMismatch, Progress, RunReport, current_versions
from mkb.experiment._placebo import Placebo, choose_placebo, notes_sha256
from mkb.experiment._plan import SKILL_ARMS, Coordinate, Plan, build_plan, cross_family_derangement
from mkb.experiment._replay import ReplayError, ReplayGrader
from mkb.experiment._tokens import TOKENIZER, count_tokens
from mkb.experiment._upstream import UPSTREAM_SHIPPED, UpstreamFormatError, import_results

__all__ = [
    "Assumptions", "ConfigError", "Coordinate", "Estimate", "Executor", "ExperimentConfig", "ModelSpec", "Placebo", "Plan",
    "PlanMismatch", "Progress", "ReplayError", "ReplayGrader", "RunReport", "SKILL_ARMS", "TOKENIZER", "UPSTREAM_SHIPPED",
    "UpstreamFormatError", "build_plan", "choose_placebo", "count_tokens", "cross_family_derangement", "current_versions",
    "estimate", "import_results", "load_config", "notes_sha256", "parse_config",
]
