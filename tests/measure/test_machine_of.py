"""One machine rule: `mkb.measure.machine_of` and its column form `mkb.analysis._compile.machine_expr` agree on every
name form a store holds (a recorded model, a driver name, an unknown name, nothing)."""

from __future__ import annotations

import polars as pl
import pytest

from mkb.analysis._compile import machine_expr
from mkb.measure import GPU_MODELS, machine_of, model_of

CASES = [
    ("NVIDIA H200", "H200"), ("NVIDIA H200", None), ("NVIDIA H100 80GB HBM3", None), ("NVIDIA GB200", None),
    ("NVIDIA B200", None), ("NVIDIA B300 SXM6", None), ("NVIDIA GB300", None), ("Tesla V100", None), ("cpu", None),
    (None, None), (None, "H200"), ("NVIDIA H100", "H200"),  # a recorded model wins over the name
]


@pytest.mark.parametrize(("gpu", "gpu_model"), CASES)
def test_the_column_form_equals_the_scalar_rule(gpu, gpu_model) -> None:
    df = pl.DataFrame({"gpu": [gpu], "gpu_model": [gpu_model]}, schema={"gpu": pl.Utf8, "gpu_model": pl.Utf8})
    assert df.select(m=machine_expr())["m"][0] == machine_of(gpu, gpu_model)


def test_a_name_that_contains_another_models_name_gets_the_longer_one() -> None:
    assert model_of("NVIDIA GB200") == "GB200" and model_of("NVIDIA GB300") == "GB300"
    assert machine_of("NVIDIA H200", None) == "H200" and machine_of("Tesla V100") == "Tesla V100"
    assert {model_of(f"NVIDIA {m.model}") for m in GPU_MODELS} == {m.model for m in GPU_MODELS}


def test_a_kind_without_a_gpu_model_column_uses_the_name() -> None:
    df = pl.DataFrame({"gpu": ["NVIDIA H200", "mystery"]})
    assert df.select(m=machine_expr(gpu_model=None))["m"].to_list() == ["H200", "mystery"]
