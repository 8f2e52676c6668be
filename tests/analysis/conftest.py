"""Shared synthetic datasets for the analysis tests (written once per session: they are the slow part)."""

import pytest

from mkb.analysis.synthetic import SynthSpec, write_synthetic


@pytest.fixture(scope="session")
def planted_lift(tmp_path_factory):
    spec = SynthSpec(seed=11, effects={"transfer": 0.35, "placebo": 0.0, "same": 0.2, "wrong": 0.0},
                     p_infra=0.01, p_unfinished=0.005, n_annotated=4, p_pair_regrade=0.9)
    return write_synthetic(spec, str(tmp_path_factory.mktemp("lift") / "ds"))


@pytest.fixture(scope="session")
def zero_effect_noisy(tmp_path_factory):
    spec = SynthSpec(seed=23, effects={"transfer": 0.0, "placebo": 0.0, "same": 0.0, "wrong": 0.0}, noise=1.2)
    return write_synthetic(spec, str(tmp_path_factory.mktemp("zero") / "ds"))
