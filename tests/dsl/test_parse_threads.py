"""Static checks parse kernels correctly from many threads at once (mkb._ast: CPython's AST constructor race)."""

from __future__ import annotations

import ast
import gc
import sys
import threading

import pytest

import mkb._ast as mkb_ast
from mkb.dsl import get_backend
from mkb.problems import baselines


def _provoke():
    """Make a thread switch likely inside the AST constructor: a Python GC callback and a tiny switch interval."""
    old_interval, old_threshold = sys.getswitchinterval(), gc.get_threshold()

    def callback(_phase, _info) -> None:
        sum(range(200))  # Python bytecode: the interpreter may hand the GIL to another parsing thread here

    gc.callbacks.append(callback)
    gc.set_threshold(100)
    sys.setswitchinterval(1e-6)

    def restore() -> None:
        gc.callbacks.remove(callback)
        gc.set_threshold(*old_threshold)
        sys.setswitchinterval(old_interval)

    return restore


def test_static_rules_from_many_threads_give_each_kernel_its_own_findings() -> None:
    kernels = [(b.dsl, b.path.read_text()) for b in baselines([1, 23, 28], dsls=["cute", "tirx"])]
    expected = {src: get_backend(dsl).static_rules(src) for dsl, src in kernels}
    errors: list[BaseException] = []
    wrong: list[str] = []

    def work() -> None:
        for _ in range(15):
            for dsl, src in kernels:
                try:
                    if get_backend(dsl).static_rules(src) != expected[src]:
                        wrong.append(dsl)
                except BaseException as exc:  # noqa: BLE001 - the race surfaces as SystemError / RecursionError
                    errors.append(exc)

    restore = _provoke()
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        restore()
    assert not errors, errors[:3]
    assert not wrong


def test_a_collision_with_a_parse_outside_mkb_is_parsed_again(monkeypatch) -> None:
    real, calls = ast.parse, []

    def collides_twice(source, filename="<unknown>"):
        calls.append(filename)
        if len(calls) <= 2:
            raise SystemError("AST constructor recursion depth mismatch (before=24, after=20)")
        return real(source, filename)

    monkeypatch.setattr(mkb_ast.ast, "parse", collides_twice)
    tree = mkb_ast.parse("def solve(*inputs):\n    return inputs\n", "kernel.py")
    assert [type(n).__name__ for n in tree.body] == ["FunctionDef"]
    assert calls == ["kernel.py"] * 3


def test_a_lasting_collision_other_system_errors_and_syntax_errors_are_raised(monkeypatch) -> None:
    with pytest.raises(SyntaxError):
        mkb_ast.parse("def solve(:\n")
    monkeypatch.setattr(mkb_ast.ast, "parse", lambda *_a: (_ for _ in ()).throw(SystemError("something else")))
    with pytest.raises(SystemError, match="something else"):
        mkb_ast.parse("x = 1")
    n = []

    def always(*_a):
        n.append(1)
        raise SystemError("AST constructor recursion depth mismatch (before=3, after=1)")

    monkeypatch.setattr(mkb_ast.ast, "parse", always)
    with pytest.raises(SystemError, match="mismatch"):
        mkb_ast.parse("x = 1")
    assert len(n) == mkb_ast.ATTEMPTS


@pytest.mark.parametrize("depth", [3_000, 200_000])  # the AST constructor's RecursionError; the parser's MemoryError
def test_a_kernel_nested_too_deeply_is_a_syntax_finding_not_a_failed_check(depth) -> None:
    """A source that cannot be built (a real RecursionError, not a collision, or the parser's stack) is the kernel's fault."""
    deep = "def solve(x):\n    return " + "-" * depth + "1\n"
    findings = get_backend("tirx").static_rules(deep)
    assert [f.rule for f in findings] == ["syntax_error"], findings
    with pytest.raises(SyntaxError, match="nests too deeply|too many|recursion"):
        mkb_ast.parse(deep)
