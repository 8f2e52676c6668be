"""The skill tokenizer loads litellm's bundled cl100k_base even where the host points tiktoken's cache elsewhere.

The GPU host sets its own TIKTOKEN_CACHE_DIR; honouring it sent tiktoken to the network (no network there), so the
skill check of the first attempt crashed. The loader forces the bundled directory and restores the caller's value.
"""

from __future__ import annotations

import os

import pytest


def test_a_foreign_tiktoken_cache_dir_neither_breaks_the_tokenizer_nor_is_lost(monkeypatch, tmp_path):
    pytest.importorskip("litellm")
    from mkb.agent._skill import _encoding

    elsewhere = tmp_path / "empty-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(elsewhere))
    _encoding.cache_clear()
    try:
        assert len(_encoding().encode("hello world")) == 2
    finally:
        _encoding.cache_clear()
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(elsewhere)
    assert not elsewhere.exists()  # nothing was fetched into it
