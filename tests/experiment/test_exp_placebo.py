"""Placebo notes: within 10% of the transfer skill's token length, whole sentences only, empty and too-long targets flagged."""

from __future__ import annotations

import pytest

from mkb.experiment import choose_placebo, count_tokens
from mkb.experiment._placebo import PLACEBO_DIR, _units


def test_within_ten_percent_from_3_to_2000_tokens():
    # the agent caps a SKILL.md at 1,500 tokens; every length it can write has a placebo within 10%
    for target in [*range(3, 60), *range(60, 2001, 17), 1500, 2000]:
        p = choose_placebo(target)
        assert abs(p.tokens - target) <= 0.1 * target, (target, p.tokens, p.source)
        assert p.tokens == count_tokens(p.text) and not p.flags


def test_never_cuts_a_sentence():
    sentences = {s for (_, _, _, s) in _units()}
    for target in (40, 333, 777, 1400):
        text = choose_placebo(target).text
        for para in text.split("\n\n"):
            assert para.strip()
            # every paragraph is a run of whole sentences of the notes
            rest = para
            while rest:
                match = next((s for s in sentences if rest.startswith(s)), None)
                assert match, rest[:80]
                rest = rest[len(match):].lstrip(" ")


def test_empty_and_too_long_are_flagged():
    e = choose_placebo(0)
    assert e.text == "" and e.flags == ("empty",)
    long = choose_placebo(10_000)
    assert "placebo_length_mismatch" in long.flags and long.tokens < 10_000


def test_notes_are_documented():
    readme = (PLACEBO_DIR / "README.md").read_text()
    assert "Who wrote them and how" in readme
    for f in sorted(PLACEBO_DIR.glob("*.md")):
        if f.name != "README.md":
            assert f.name in readme
