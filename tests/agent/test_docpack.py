"""Doc packs: the committed API.md of each DSL is what the installed DSL generates (so the pack version names real content)."""

from __future__ import annotations

import pytest

from mkb.agent._docpack import build_api_reference, doc_pack_version


@pytest.mark.dsl
@pytest.mark.parametrize("dsl,module", [("cute", "cutlass"), ("tirx", "tvm")])
def test_api_reference_is_current_and_reproducible(dsl, module):
    pytest.importorskip(module)
    changed, path, version = build_api_reference(dsl, write=False)
    assert not changed, f"{path} is stale: run `mkb-run docpack`"
    text = path.read_text()
    assert " at 0x" not in text and text.count("\n- ") > 100
    assert version == doc_pack_version(dsl)
