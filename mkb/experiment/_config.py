"""Reads an experiment's TOML config into a typed, validated `ExperimentConfig` (models, problems, arms, budgets, seeds)."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mkb.agent import ARM_KINDS, Budget, ModelConfig

DEFAULT_DSLS = ("cute", "tirx")


class ConfigError(ValueError):
    """An experiment config that cannot be planned; the message names the file and the field."""


@dataclass(frozen=True)
class ModelSpec:
    """One model of the experiment: how litellm calls it and what the experiment may spend on it."""

    config: ModelConfig
    concurrency: int = 4  # attempts of this model running at once
    rpm: int | None = None  # requests per minute the provider allows, for the whole run (on Ray, cluster-wide): mkb.agent._pace
    tpm: int | None = None  # tokens per minute (likewise); `concurrency` bounds parallel attempts, the agent backs off on 429
    usd_cap: float | None = None  # spend at which this model's attempts pause
    price_in_per_mtok: float | None = None  # USD per million input tokens, for the dry-run estimate
    price_out_per_mtok: float | None = None

    @property
    def name(self) -> str:
        return self.config.name


@dataclass(frozen=True)
class Assumptions:
    """What the dry-run estimate assumes where nothing was measured yet (printed with every estimate)."""

    grading_s: float = 25.0  # GPU seconds per grading (grader overhead ~1.1 s + eager/candidate compile and timing)
    submissions_share: float = 0.7  # share of the submission budget an attempt uses
    output_tokens_share: float = 0.25  # share of the output-token budget an attempt uses
    input_tokens_per_output_token: float = 8.0  # prompts re-send the conversation: input grows with turns
    attempt_wall_s: float = 1800.0  # wall-clock of one attempt, for the ETA


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything a plan is built from. Secrets never appear: a model names the variable holding its key."""

    name: str
    models: tuple[ModelSpec, ...]
    problems: tuple[int, ...]
    dsls: tuple[str, ...] = DEFAULT_DSLS
    arms: tuple[str, ...] = ARM_KINDS
    replicates: int = 3
    budget: Budget = field(default_factory=Budget)
    seed: int = 0
    header: str = "neutral"
    gpu: str = "NVIDIA H200"
    max_infra_retries: int = 3
    infra_backoff_s: float = 30.0
    missing_skill: str = "empty_slot"  # "empty_slot" (mkb) or "skip" (upstream: no attempt, lift 0 in its analysis)
    score: str = "s"  # what `mkb-analyze` reports by default: "s" (over eager) or "s_upstream" (upstream's baseline)
    assumptions: Assumptions = field(default_factory=Assumptions)
    source: str = ""  # where the config came from (path), for messages

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
        return d

    def identity(self) -> dict[str, Any]:
        """What makes the experiment: coordinates and how each attempt runs. Operational settings (concurrency, rate
        limits, USD caps, prices, retries, estimate assumptions) are left out, so raising a cap resumes the same plan."""
        d = self.as_dict()
        for k in ("assumptions", "max_infra_retries", "infra_backoff_s"):
            d.pop(k)
        # the score is fixed with the plan (chosen before any data), but a plan that keeps the default hashes as it did
        # before the setting existed, so the plans already in stores still match their configs
        if d["score"] == "s":
            d.pop("score")
        d["models"] = [m["config"] for m in d["models"]]
        return d

    def sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True, default=str).encode()).hexdigest()

    def model(self, name: str) -> ModelSpec:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


def config_from_dict(d: dict[str, Any], *, source: str = "<plan event>") -> ExperimentConfig:
    """The inverse of `ExperimentConfig.as_dict` (a plan event's `config`), validated like a TOML file."""
    d = dict(d)
    models = tuple(ModelSpec(config=ModelConfig(**m["config"]), **{k: v for k, v in m.items() if k != "config"})
                   for m in d.pop("models"))
    cfg = ExperimentConfig(models=models, budget=Budget(**d.pop("budget")), assumptions=Assumptions(**d.pop("assumptions", {})),
                           problems=tuple(d.pop("problems")), dsls=tuple(d.pop("dsls")), arms=tuple(d.pop("arms")),
                           source=source, **d)
    validate(cfg)
    return cfg


def _take(table: dict, cls, where: str, *, rename: dict[str, str] | None = None) -> dict:
    known = {f.name for f in fields(cls)} | set(rename or {})
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}\nhint: known keys: {', '.join(sorted(known))}")
    return {(rename or {}).get(k, k): v for k, v in table.items()}


def _problems(value: Any, where: str) -> tuple[int, ...]:
    from mkb.experiment._problems import all_problems

    known = all_problems()
    if value == "all":
        return tuple(sorted(known))
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ConfigError(f"{where}: problems must be \"all\" or a non-empty list of problem numbers, got {value!r}")
    missing = [v for v in value if v not in known]
    if missing:
        raise ConfigError(f"{where}: no problem numbered {', '.join(map(str, missing))}\nhint: `mkb-run problems list`")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: problems lists a number twice: {value}")
    return tuple(sorted(value))


def parse_config(data: dict[str, Any], *, source: str = "<config>") -> ExperimentConfig:
    """Validate a parsed TOML document (tables [experiment], [budget], [assumptions], [[models]])."""
    where = source
    unknown = sorted(set(data) - {"experiment", "budget", "models", "assumptions"})
    if unknown:
        raise ConfigError(f"{where}: unknown table(s) {', '.join(unknown)}\nhint: tables are [experiment], [budget], [assumptions], [[models]]")
    exp = dict(data.get("experiment") or {})
    if "name" not in exp or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", str(exp["name"])):
        raise ConfigError(f"{where}: [experiment] name is required: letters, digits, '_', '.', '-' (at most 64)")
    if "problems" not in exp:
        raise ConfigError(f"{where}: [experiment] problems is required (\"all\" or a list of numbers)")
    exp["problems"] = _problems(exp["problems"], f"{where} [experiment]")
    for key in ("dsls", "arms"):
        if key in exp:
            if not isinstance(exp[key], list) or not exp[key]:
                raise ConfigError(f"{where}: [experiment] {key} must be a non-empty list")
            exp[key] = tuple(exp[key])
    kw = _take(exp, ExperimentConfig, f"{where} [experiment]")
    for bad in ("models", "budget", "assumptions", "source"):
        if bad in exp:
            raise ConfigError(f"{where}: [experiment] {bad} is not set here\nhint: use the [{bad}] table")
    budget = Budget(**_take(dict(data.get("budget") or {}), Budget, f"{where} [budget]"))
    assumptions = Assumptions(**_take(dict(data.get("assumptions") or {}), Assumptions, f"{where} [assumptions]"))
    models = []
    raw_models = data.get("models") or []
    if not isinstance(raw_models, list) or not raw_models:
        raise ConfigError(f"{where}: at least one [[models]] table is required")
    spec_keys = {f.name for f in fields(ModelSpec)} - {"config"}
    for i, m in enumerate(raw_models):
        mw = f"{where} [[models]] #{i + 1}"
        m = dict(m)
        if "api_key" in m:
            raise ConfigError(f"{mw}: api_key must not be written in a config (it would be recorded)\nhint: set api_key_env to the name of an environment variable")
        spec_kw = {k: m.pop(k) for k in list(m) if k in spec_keys}
        try:
            cfg = ModelConfig(**_take(m, ModelConfig, mw))
        except TypeError as exc:
            raise ConfigError(f"{mw}: {exc}") from None
        models.append(ModelSpec(config=cfg, **spec_kw))
    try:
        cfg = ExperimentConfig(models=tuple(models), budget=budget, assumptions=assumptions, source=source, **kw)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    validate(cfg)
    return cfg


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate a TOML config file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(data, source=str(path))


def validate(cfg: ExperimentConfig) -> None:
    """The rules a plan relies on; each failure names the field and what would fix it."""
    w = cfg.source or "<config>"
    from mkb.agent._types import HEADERS

    bad_arms = [a for a in cfg.arms if a not in ARM_KINDS]
    if bad_arms:
        raise ConfigError(f"{w}: unknown arm(s) {bad_arms}\nhint: arms are {', '.join(ARM_KINDS)}")
    if "solo" not in cfg.arms:
        raise ConfigError(f"{w}: arms must include solo (every other arm is scored against it and takes its skill)")
    if len(set(cfg.arms)) != len(cfg.arms) or len(set(cfg.dsls)) != len(cfg.dsls):
        raise ConfigError(f"{w}: arms and dsls must not repeat")
    needs_other = [a for a in cfg.arms if a in ("transfer", "placebo", "wrong")]
    if needs_other and len(cfg.dsls) < 2:
        raise ConfigError(f"{w}: arms {needs_other} need at least two DSLs")
    if cfg.replicates < 1:
        raise ConfigError(f"{w}: replicates must be >= 1")
    if "same" in cfg.arms and cfg.replicates < 2:
        raise ConfigError(f"{w}: the same arm takes the skill of replicate (r+1) mod R and needs replicates >= 2\nhint: drop 'same' from arms or raise replicates")
    if cfg.header not in HEADERS:
        raise ConfigError(f"{w}: header must be one of {', '.join(HEADERS)}")
    if cfg.missing_skill not in ("empty_slot", "skip"):
        raise ConfigError(f"{w}: missing_skill must be empty_slot or skip")
    if cfg.score not in ("s", "s_upstream"):
        raise ConfigError(f"{w}: score must be s (speedup over eager) or s_upstream (over the problem's reference, as upstream "
                          f"times it), got {cfg.score!r}")
    if cfg.max_infra_retries < 0 or cfg.infra_backoff_s < 0:
        raise ConfigError(f"{w}: max_infra_retries and infra_backoff_s must be >= 0")
    names = [m.name for m in cfg.models]
    if len(set(names)) != len(names):
        raise ConfigError(f"{w}: a model is listed twice: {names}")
    for m in cfg.models:
        t = m.config.temperature
        if cfg.replicates >= 2 and (t is None or t <= 0):
            raise ConfigError(f"{w}: model {m.name}: temperature {t} with {cfg.replicates} replicates makes replicates copies, not samples"
                              "\nhint: use a temperature > 0 (1.0 is the usual default)")
        if m.concurrency < 1:
            raise ConfigError(f"{w}: model {m.name}: concurrency must be >= 1")
        for k in ("rpm", "tpm", "usd_cap", "price_in_per_mtok", "price_out_per_mtok"):
            v = getattr(m, k)
            if v is not None and v < 0:
                raise ConfigError(f"{w}: model {m.name}: {k} must be >= 0")
    b = cfg.budget
    if b.submissions < 1 or b.turns < 1 or b.output_tokens < 1:
        raise ConfigError(f"{w}: [budget] submissions, turns and output_tokens must be >= 1")
