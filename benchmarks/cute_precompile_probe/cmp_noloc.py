"""Compare two post-pipeline bytecode files with locations printed and without."""
import sys
import cutlass.cute  # noqa: F401
from cutlass._mlir import ir
a, b = sys.argv[1:3]
with ir.Context():
    ma, mb = ir.Module.parse(open(a, "rb").read()), ir.Module.parse(open(b, "rb").read())
    for dbg in (True, False):
        ta = ma.operation.get_asm(enable_debug_info=dbg, print_generic_op_form=True)
        tb = mb.operation.get_asm(enable_debug_info=dbg, print_generic_op_form=True)
        print("debug_info", dbg, "equal", ta == tb, len(ta), len(tb))
        if dbg:
            import difflib
            d = [l for l in difflib.unified_diff(ta.splitlines(), tb.splitlines(), lineterm="", n=0) if l[:1] in "+-"]
            print("\n".join(x[:200] for x in d[:8]))
