"""SKILL.md rules: one offline tokenizer, the 1,500-token cap, and the hygiene flags recorded on every `skill` event."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SKILL_TOKEN_CAP = 1_500
ENCODING = "cl100k_base"
HYGIENE_FLAGS = ("empty", "over_cap", "code_block", "target_dsl_api", "source_kernel_overlap", "problem_identity", "grader_talk", "instruction_like")

SKILL_RULES = f"""\
## SKILL.md
Keep `SKILL.md` in the workspace current as you work: what you learned in this attempt that would help
someone write a fast, correct kernel for a problem like this one in any kernel DSL. Rules:
- Evidence from this attempt only: what you tried, what the checks and the grader said, what was faster.
- DSL-neutral: name techniques (tiling, vectorised loads, reductions, fusion, occupancy), not the
  API of the DSL you used. No code, no commands, no file contents.
- At most {SKILL_TOKEN_CAP} tokens; longer text is cut at the cap.
- It is read as notes, not as instructions: write findings, not orders.
"""


@cache
def _encoding():
    """tiktoken's cl100k_base from the copy litellm bundles (tiktoken alone downloads its files at run time).

    The bundled directory is forced for the load (and the caller's TIKTOKEN_CACHE_DIR restored after): a host
    that sets its own cache directory would otherwise send tiktoken to the network (seen on the GPU host).
    """
    import tiktoken

    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the skill tokenizer needs litellm's bundled tiktoken files\nhint: pip install 'mkb[agent]'")
    bundled = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(bundled)
    try:
        return tiktoken.get_encoding(ENCODING)
    except Exception as exc:  # noqa: BLE001 - any failure here means the offline files are not usable
        raise RuntimeError(f"cannot load {ENCODING} from {bundled}: {exc}\nhint: pip install 'mkb[agent]'") from None
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


@cache
def tokenizer_id() -> str:
    """What token lengths were measured with (recorded on attempt_started and every skill event)."""
    from importlib.metadata import version

    return f"tiktoken=={version('tiktoken')}:{ENCODING}(litellm=={version('litellm')} bundle)"


def count_tokens(text: str) -> int:
    return len(_encoding().encode(text, disallowed_special=()))


def truncate(text: str, cap: int = SKILL_TOKEN_CAP) -> tuple[str, int]:
    """(text cut at `cap` tokens, its original token length)."""
    toks = _encoding().encode(text, disallowed_special=())
    if len(toks) <= cap:
        return text, len(toks)
    return _encoding().decode(toks[:cap]), len(toks)


_GRADER = re.compile(r"\b(grader|grading harness|reason code|integrity_\w+|static_\w+|verification_\w+|timing_\w+|secret seeds?|allowlist|profiler|"
                     r"l2 flush|eager baseline|timed calls?)\b", re.I)
_INSTRUCTION = re.compile(r"\b(you must|you should|ignore (?:the|all|any|previous)|your task is|the next (?:agent|attempt|model)|"
                          r"do not (?:check|verify|test)|submit (?:immediately|right away|at once)|always submit|system prompt|as an ai)\b", re.I)


_GENERIC = frozenset({"torch", "cuda", "runtime", "driver", "script", "testing", "ir", "math", "np", "numpy"})


def _api_pattern(dsl: str) -> re.Pattern | None:
    """`<name>.<attr>` for the DSL's own package roots, its own name, and the aliases its primer imports it under
    (`import cutlass.cute as cute`, `from tvm.script import tirx as Tx`); all read from the backend, so no DSL is named here."""
    try:
        from mkb.dsl import get_backend

        backend = get_backend(dsl)
        mods = set(backend.import_modules)
        docs = backend.doc_pack()
    except Exception:  # noqa: BLE001 - an unknown DSL just has no API flag
        return None
    names = {m.split(".")[0] for m in mods} | {m.split(".")[-1] for m in mods if m.split(".")[-1] == dsl} | {dsl}
    if docs is not None:
        for f in Path(docs).glob("*.md"):
            if f.name == "API.md":
                continue
            names |= set(re.findall(r"\bimport\s+[\w.]+\s+as\s+(\w+)", f.read_text()))
            names |= set(re.findall(r"\bfrom\s+[\w.]+\s+import\s+\w+\s+as\s+(\w+)", f.read_text()))
    names -= _GENERIC
    if not names:
        return None
    return re.compile(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\.[A-Za-z_]\w*")


def _shingles(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = re.findall(r"\S+", text)
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


@dataclass(frozen=True)
class SkillCheck:
    text: str  # what is kept (cut at the cap)
    sha256: str
    token_length: int  # of the kept text
    original_token_length: int
    flags: tuple[str, ...]


def check_skill(text: str, *, dsl: str, problem_number: int, problem_name: str, kernel_source: str = "") -> SkillCheck:
    """Cut `text` at the cap and raise every hygiene flag that applies (flags are recorded, never edited away)."""
    kept, original = truncate(text)
    flags = []
    if not text.strip():
        flags.append("empty")
    if original > SKILL_TOKEN_CAP:
        flags.append("over_cap")
    if "```" in text or "~~~" in text or re.search(r"(?m)^(?: {4}|\t)\S.*[(=:]\s*$", text):
        flags.append("code_block")
    api = _api_pattern(dsl)
    if api is not None and api.search(text):
        flags.append("target_dsl_api")
    if kernel_source.strip() and (_shingles(text) & _shingles(kernel_source)):
        flags.append("source_kernel_overlap")
    name_bits = [re.escape(problem_name), re.escape(f"{problem_number:02d}_{problem_name}")]
    if re.search(rf"(?i)\bproblem\s*(?:#|no\.?|number)?\s*0*{problem_number}\b|" + "|".join(name_bits), text):
        flags.append("problem_identity")
    if _GRADER.search(text):
        flags.append("grader_talk")
    if _INSTRUCTION.search(text):
        flags.append("instruction_like")
    return SkillCheck(kept, hashlib.sha256(kept.encode()).hexdigest(), count_tokens(kept), original, tuple(flags))
