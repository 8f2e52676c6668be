"""Compiler-error cleanup: short, ANSI-free `file:line: Type: message` lines without MLIR or source dumps."""

from __future__ import annotations

from pathlib import Path

from mkb.dsl._errors import format_exception, strip_ansi

KERNEL = Path("/tmp/ws/kernel.py")


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001
        return e


def test_ansi_codes_are_stripped() -> None:
    assert strip_ansi("\x1b[91m\x1b[1merror\x1b[0m: x") == "error: x"


def test_dsl_diagnostic_keeps_the_candidate_line_and_drops_noise() -> None:
    msg = (
        "\n\x1b[91m\x1b[1merror[TYPE_UNSTABLE_JOIN]:\x1b[0m variable `acc` changes type\n"
        "  \x1b[94m-->\x1b[0m /tmp/ws/kernel.py:42:9\n"
        "   |\n"
        "42 |     acc = acc + 1\n"
        "   |     ^^^^^^^^^^^^^\n"
        '  loc("kernel.py":42:9)\n'
        "  %0 = arith.addi %a, %b : i32\n"
    )
    lines = format_exception(_raise(RuntimeError(msg)), KERNEL)
    assert lines[0].startswith("kernel.py:42: RuntimeError: error[TYPE_UNSTABLE_JOIN]")
    text = "\n".join(lines)
    assert "\x1b" not in text and "arith.addi" not in text and "loc(" not in text
    assert len(lines) <= 8


def test_generated_source_dump_is_cut() -> None:
    src = "#include <cuda.h>\n" + "\n".join(f"int x{i} = {i};" for i in range(500))
    msg = "NVRTC compilation failed:\nkernel.cu(12): error: identifier \"foo\" is undefined\n" + "Source code:\n" + src
    lines = format_exception(_raise(RuntimeError(msg)), KERNEL)
    assert len(lines) <= 8 and all(len(ln) <= 310 for ln in lines)
    assert any("identifier" in ln for ln in lines)


def test_line_comes_from_the_candidates_own_frame(tmp_path: Path) -> None:
    kernel = tmp_path / "kernel.py"
    kernel.write_text("def solve():\n    x = 1\n    raise ValueError('bad shape')\n")
    ns: dict = {}
    exec(compile(kernel.read_text(), str(kernel), "exec"), ns)
    try:
        ns["solve"]()
    except ValueError as e:
        lines = format_exception(e, kernel)
    assert lines == ("kernel.py:3: ValueError: bad shape",)


def test_long_messages_are_truncated() -> None:
    lines = format_exception(_raise(RuntimeError("\n".join(f"line {i} " + "x" * 500 for i in range(40)))), KERNEL)
    assert len(lines) <= 8 and all(len(ln) <= 310 for ln in lines)
