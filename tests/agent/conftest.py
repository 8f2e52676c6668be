"""Fixtures for the agent tests."""

from __future__ import annotations

import pytest

from agent_helpers import Runner, require_sandbox


@pytest.fixture
def runner(tmp_path) -> Runner:
    return Runner(tmp_path)


@pytest.fixture
def sandbox_available() -> None:
    require_sandbox()
