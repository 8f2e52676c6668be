"""The experiment: plans from a config, claims and resume, scheduling of the arms, executors (local and Ray)."""

from mkb.experiment._config import Assumptions, ConfigError, ExperimentConfig, ModelSpec, load_config, parse_config
from mkb.experiment._estimate import Estimate, estimate
from mkb.experiment._placebo import Placebo, choose_placebo, notes_sha256
from mkb.experiment._plan import SKILL_ARMS, Coordinate, Plan, build_plan, cross_family_derangement
from mkb.experiment._tokens import TOKENIZER, count_tokens

__all__ = [
    "Assumptions", "ConfigError", "Coordinate", "Estimate", "ExperimentConfig", "ModelSpec", "Placebo", "Plan",
    "SKILL_ARMS", "TOKENIZER", "build_plan", "choose_placebo", "count_tokens", "cross_family_derangement", "estimate",
    "load_config", "notes_sha256", "parse_config",
]
