"""Counts tokens the way the plan records them, so placebo lengths are matched with one named tokenizer.

One function to swap: when the agent records its own tokenizer, `count_tokens` and `TOKENIZER` change here only.
The encoding is tiktoken's cl100k_base from the copy litellm bundles (no network); a model's own tokenizer would
differ by a few percent, which the 10% placebo window absorbs, and the name is on every plan event.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from pathlib import Path

TOKENIZER = "tiktoken:cl100k_base (litellm-bundled, offline)"


class TokenizerUnavailable(RuntimeError):
    """The offline encoding is not installed (the `agent` extra brings litellm and tiktoken)."""


@cache
def _encoding():
    # litellm's own import fetches a price map over the network; only its bundled tiktoken files are needed
    spec = importlib.util.find_spec("litellm")
    try:
        import tiktoken
    except ImportError:
        tiktoken = None
    if spec is None or tiktoken is None or not spec.submodule_search_locations:
        raise TokenizerUnavailable(f"placebo lengths need the {TOKENIZER} tokenizer, which needs litellm and tiktoken"
                                   "\nhint: pip install 'mkb[agent]'")
    bundled = Path(spec.submodule_search_locations[0]) / "litellm_core_utils" / "tokenizers"
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(bundled)
    try:
        return tiktoken.get_encoding("cl100k_base")
    except Exception as exc:
        raise TokenizerUnavailable(f"cannot load cl100k_base from {bundled}: {exc}") from None
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


def count_tokens(text: str) -> int:
    """Token length of `text` under TOKENIZER."""
    if not text:
        return 0
    return len(_encoding().encode(text, disallowed_special=()))
