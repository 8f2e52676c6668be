"""Counts tokens the way the plan records them, so placebo lengths are matched with one named tokenizer.

One function to swap: when the agent records its own tokenizer, `count_tokens` and `TOKENIZER` change here only.
The encoding is tiktoken's cl100k_base from the copy litellm bundles (no network); a model's own tokenizer would
differ by a few percent, which the 10% placebo window absorbs, and the name is on every plan event.
"""

from __future__ import annotations

TOKENIZER = "tiktoken:cl100k_base (litellm-bundled, offline)"


class TokenizerUnavailable(RuntimeError):
    """The offline encoding is not installed (the `agent` extra brings litellm and tiktoken)."""


def _encoding():
    """The agent's skill tokenizer (one loader: `mkb.agent._skill`), or a clear error naming what is missing."""
    try:
        from mkb.agent._skill import _encoding as skill_encoding

        return skill_encoding()
    except (ImportError, RuntimeError) as exc:
        raise TokenizerUnavailable(f"placebo lengths need the {TOKENIZER} tokenizer, which needs litellm and tiktoken: "
                                   f"{str(exc).splitlines()[0]}\nhint: pip install 'mkb[agent]'") from None


def count_tokens(text: str) -> int:
    """Token length of `text` under TOKENIZER."""
    if not text:
        return 0
    return len(_encoding().encode(text, disallowed_special=()))
