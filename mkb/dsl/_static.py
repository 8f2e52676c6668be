"""Static rules of the Solution contract, checked on a candidate's AST and shared by every DSL backend.

Why on the AST and not on text: aliases (`import torch as t`, `from torch import backends as b`,
`g = torch.cuda.graph`) are resolved to full dotted names before matching, so renaming a module does
not hide a forbidden use, while the same words inside strings or comments do not trip a rule.
The same resolution follows the other ways a module is reached: as an attribute of another module
(`logging.os`, `logging.threading`: any `<object>.os` is treated as `os`, and reaching a process-level
module that way is itself forbidden), and through a container (`[torch][0]`, `{"t": torch}["t"]`, a
name bound to such a container, and any module kept in a container literal at all).
Static rules are a first filter (free, before any GPU time); the grader enforces at run time what
an AST cannot see (identities of torch callables, numerics flags, environment, threads, streams).

Each finding carries a rule id; the grader reports it as the reason code `static_<rule>`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from mkb._ast import parse
from mkb.dsl._backend import StaticFinding

# rule id -> one-line meaning (the prompt and docs list these; tests cover each one).
RULES: dict[str, str] = {
    "syntax_error": "kernel.py does not parse",
    "no_solve": "no top-level `solve` function",
    "torch_compile": "torch.compile / torch.jit / dynamo / inductor",
    "triton": "Triton",
    "raw_cuda": "raw CUDA or C++: cpp_extension, load_inline, jiterator, cupy, numba, pycuda, NVRTC, module loading",
    "ctypes": "ctypes / cffi",
    "subprocess": "subprocess, os.system/exec/spawn/fork, multiprocessing, signal",
    "threads": "threading, concurrent.futures, asyncio",
    "cuda_graph": "CUDA graphs (torch.cuda.graph, CUDAGraph, stream capture)",
    "dsl_library": "kernels imported from DSL or kernel libraries (quack, flashinfer, tvm.topi/contrib/relax, ...)",
    "other_dsl": "using another DSL or dialect than the variant's",
    "harness_import": "importing the problem (reference, make_inputs), mkb or the grader",
    "introspection": "inspecting the caller or the process (sys._getframe, inspect.stack, gc.get_objects, sys.modules), "
                     "or whether the grader is watching (the profiler's or the dispatcher's state)",
    "environ_write": "writing os.environ / putenv",
    "numerics_flag": "setting global torch numerics flags (tf32, matmul precision, determinism, cudnn, default dtype)",
    "monkeypatch": "assigning attributes of torch, os, sys or other library modules, or registering operator "
                   "implementations with torch's dispatcher (torch.library, py_impl, torch._C._dispatch_*)",
    "obfuscation": "__import__, importlib, eval/exec/compile, dunder escapes, dynamic getattr on modules",
    "process_exit": "ending the process (sys.exit, os._exit, exit, quit)",
}

# (dotted prefix, rule). A name matches when it equals the prefix or starts with prefix + ".".
_SHARED_PREFIXES: tuple[tuple[str, str], ...] = (
    ("torch.compile", "torch_compile"),
    ("torch.jit", "torch_compile"),
    ("torch._dynamo", "torch_compile"),
    ("torch._inductor", "torch_compile"),
    ("torch.export", "torch_compile"),
    ("torch.fx", "torch_compile"),
    ("triton", "triton"),
    ("torch.utils.cpp_extension", "raw_cuda"),
    ("torch.cuda.jiterator", "raw_cuda"),
    ("torch.cuda._compile_kernel", "raw_cuda"),  # NVRTC from torch (the grader's own SM hold is built this way)
    ("torch.ops.load_library", "raw_cuda"),
    ("torch.classes.load_library", "raw_cuda"),
    ("cupy", "raw_cuda"),
    ("cupyx", "raw_cuda"),
    ("numba", "raw_cuda"),
    ("pycuda", "raw_cuda"),
    ("cuda.bindings.nvrtc", "raw_cuda"),
    ("cuda.nvrtc", "raw_cuda"),
    ("cuda.core", "raw_cuda"),
    ("cuda.cuda", "raw_cuda"),
    ("ctypes", "ctypes"),
    ("cffi", "ctypes"),
    ("_ctypes", "ctypes"),
    ("subprocess", "subprocess"),
    ("multiprocessing", "subprocess"),
    ("pty", "subprocess"),
    ("signal", "subprocess"),
    ("os.system", "subprocess"),
    ("os.popen", "subprocess"),
    ("os.fork", "subprocess"),
    ("os.forkpty", "subprocess"),
    ("os.kill", "subprocess"),
    ("os.killpg", "subprocess"),
    ("threading", "threads"),
    ("_thread", "threads"),
    ("concurrent", "threads"),
    ("asyncio", "threads"),
    ("torch.cuda.graph", "cuda_graph"),
    ("torch.cuda.graphs", "cuda_graph"),
    ("torch.cuda.CUDAGraph", "cuda_graph"),
    ("torch.cuda.make_graphed_callables", "cuda_graph"),
    ("quack", "dsl_library"),
    ("flashinfer", "dsl_library"),
    ("flash_attn", "dsl_library"),
    ("flash_attn_interface", "dsl_library"),
    ("xformers", "dsl_library"),
    ("apex", "dsl_library"),
    ("vllm", "dsl_library"),
    ("sgl_kernel", "dsl_library"),
    ("sglang", "dsl_library"),
    ("deep_gemm", "dsl_library"),
    ("transformer_engine", "dsl_library"),
    ("liger_kernel", "dsl_library"),
    ("fla", "dsl_library"),
    ("tirx_kernels", "dsl_library"),
    ("cutlass_library", "dsl_library"),
    ("cutlass_cppgen", "dsl_library"),
    ("cutlass.examples", "dsl_library"),
    ("examples", "dsl_library"),
    ("tvm.topi", "dsl_library"),
    ("tvm.contrib", "dsl_library"),
    ("tvm.relax", "dsl_library"),
    ("tvm.relay", "dsl_library"),
    ("tvm.tirx.bench", "dsl_library"),
    ("mkb", "harness_import"),
    ("problem", "harness_import"),
    ("problems", "harness_import"),
    ("reference", "harness_import"),
    ("make_inputs", "harness_import"),
    ("__main__", "harness_import"),
    # a kernel that knows when it is profiled or watched by a dispatch mode can be honest only then
    ("torch.profiler", "introspection"),
    ("torch.autograd.profiler", "introspection"),
    ("torch.autograd.profiler_util", "introspection"),
    ("torch.cuda.profiler", "introspection"),
    ("torch._C._autograd", "introspection"),
    ("torch._C._get_dispatch_mode", "introspection"),
    ("torch._C._len_torch_dispatch_stack", "introspection"),
    ("torch._C._get_dispatch_stack_at", "introspection"),
    ("torch.utils._python_dispatch", "introspection"),
    ("torch._C._is_torch_function_mode_enabled", "introspection"),
    # an implementation registered for an aten operator (torch.library.Library("aten", "IMPL").impl("max", ...)) changes
    # what every caller of it computes, the grader's own comparisons included, with no Python name rebound
    ("torch.library", "monkeypatch"),
    ("torch._library", "monkeypatch"),
    ("torch._ops", "monkeypatch"),
    ("torch._custom_op", "monkeypatch"),
    ("torch._custom_ops", "monkeypatch"),
    ("torch._decomp", "monkeypatch"),
    ("torch._refs", "monkeypatch"),
    ("torch._prims", "monkeypatch"),
    ("torch.overrides", "introspection"),
    ("sys._getframe", "introspection"),
    ("sys.modules", "introspection"),
    ("sys.settrace", "introspection"),
    ("sys.setprofile", "introspection"),
    ("sys.audit", "introspection"),
    ("sys.addaudithook", "introspection"),
    ("inspect.stack", "introspection"),
    ("inspect.currentframe", "introspection"),
    ("inspect.getouterframes", "introspection"),
    ("inspect.getmodule", "introspection"),
    ("inspect.getsource", "introspection"),
    ("traceback.extract_stack", "introspection"),
    ("traceback.walk_stack", "introspection"),
    ("gc", "introspection"),
    ("os.putenv", "environ_write"),
    ("os.unsetenv", "environ_write"),
    ("os.environ.update", "environ_write"),
    ("os.environ.setdefault", "environ_write"),
    ("os.environ.pop", "environ_write"),
    ("os.environ.popitem", "environ_write"),
    ("os.environ.clear", "environ_write"),
    ("os.environ.__setitem__", "environ_write"),
    ("os.environ.__delitem__", "environ_write"),
    ("torch.set_float32_matmul_precision", "numerics_flag"),
    ("torch.use_deterministic_algorithms", "numerics_flag"),
    ("torch.set_deterministic_debug_mode", "numerics_flag"),
    ("torch.set_flush_denormal", "numerics_flag"),
    ("torch.set_default_dtype", "numerics_flag"),
    ("torch.set_default_tensor_type", "numerics_flag"),
    ("torch.backends.cudnn.flags", "numerics_flag"),
    ("torch.backends.cuda.preferred_blas_library", "numerics_flag"),
    ("torch.backends.cuda.preferred_linalg_library", "numerics_flag"),
    ("sys.exit", "process_exit"),
    ("os._exit", "process_exit"),
    ("os.abort", "process_exit"),
    ("exit", "process_exit"),
    ("quit", "process_exit"),
    ("builtins", "obfuscation"),
    ("__builtins__", "obfuscation"),
    ("importlib", "obfuscation"),
    ("__import__", "obfuscation"),
    ("eval", "obfuscation"),
    ("exec", "obfuscation"),
    ("compile", "obfuscation"),
    ("globals", "obfuscation"),
    ("vars", "obfuscation"),
    ("marshal", "obfuscation"),
    ("pickle", "obfuscation"),
    ("dill", "obfuscation"),
    ("runpy", "obfuscation"),
    ("pkgutil", "obfuscation"),
    ("zipimport", "obfuscation"),
    ("posix", "obfuscation"),
    ("nt", "obfuscation"),
    ("_posixsubprocess", "subprocess"),
    ("_signal", "subprocess"),
)

_OS_PREFIX_CALLS = ("os.exec", "os.spawn", "os.posix_spawn")  # os.execv, os.spawnl, ... (prefix of the last part)
# attribute names that mean raw module loading / launching or graph capture, whatever object they hang on
_RAW_CUDA_ATTRS = frozenset(
    {
        "cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData",
        "cuLibraryLoadFromFile", "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
        "cudaLaunchKernel", "nvrtcCreateProgram", "nvrtcCompileProgram", "load_inline", "load_module",
        "RawKernel", "RawModule", "ElementwiseKernel",
    }
)
_GRAPH_ATTR_PREFIXES = ("cuGraph", "cudaGraph", "cuStreamBeginCapture", "cudaStreamBeginCapture")
# attribute names that register or replace an operator's implementation, whatever object they hang on
# (torch.ops.aten.max.default.py_impl(...), torch._C._dispatch_library(...), a Library object's impl/define/fallback)
_DISPATCH_ATTRS = frozenset({"py_impl", "_dispatch_library", "_DispatchModule", "_dispatch_impl", "_dispatch_override",
                             "_set_python_dispatcher", "_dispatch_tls_set_dispatch_key_included",
                             "_dispatch_tls_set_dispatch_key_excluded", "_dispatch_tls_local_include_set",
                             "_dispatch_tls_local_exclude_set", "_enable_python_dispatcher", "_EnablePythonDispatcher",
                             "_set_dispatch_mode", "_push_on_torch_dispatch_stack", "_push_on_torch_function_stack",
                             "register_fake", "register_kernel", "register_autograd", "impl_abstract"})
# dunder attributes used to escape a sandbox or reach globals of other modules
_DUNDER_ESCAPES = frozenset(
    {
        "__globals__", "__code__", "__closure__", "__subclasses__", "__getattribute__", "__setattr__",
        "__delattr__", "__dict__", "__builtins__", "__import__", "__loader__", "__spec__", "__bases__", "__mro__",
        "__reduce__", "__reduce_ex__", "f_back", "f_globals", "f_locals", "gi_frame", "tb_frame",
    }
)
# modules whose attributes a kernel must not assign (numerics flags are reported as such)
_PATCH_ROOTS = frozenset({"torch", "os", "sys", "builtins", "time", "gc", "numpy", "inspect", "cutlass", "tvm", "tvm_ffi", "cuda"})
# module roots a dynamic getattr must not be used on
_GETATTR_ROOTS = frozenset({"torch", "os", "sys", "builtins", "importlib", "cutlass", "tvm", "tvm_ffi", "cuda", "inspect", "gc"})
_HARNESS_NAMES = frozenset({"reference", "make_inputs", "eager", "META"})
# module names that, reached as an attribute of any object (`logging.os`, `x.threading`), are taken as the
# module itself: stdlib modules re-export what they import, so `logging.os.environ` is `os.environ`
_MODULE_ATTRS = frozenset(
    {
        "os", "sys", "posix", "nt", "builtins", "importlib", "threading", "_thread", "concurrent", "asyncio",
        "subprocess", "_posixsubprocess", "multiprocessing", "ctypes", "_ctypes", "cffi", "gc", "inspect",
        "marshal", "pickle", "runpy", "pkgutil", "zipimport",
    }
)
# of those, the ones that are only a way around an import rule when reached through another object
_MODULE_ATTRS_ESCAPE = frozenset({"os", "sys", "posix", "nt", "builtins", "importlib"})
# module objects that must not be hidden in containers (`[torch][0]` evades alias resolution)
_CONTAINER_ROOTS = _PATCH_ROOTS | _GETATTR_ROOTS | _MODULE_ATTRS | {"logging", "torch", "time"}


@dataclass(frozen=True)
class RuleSet:
    """The shared rules plus what one DSL adds (modules of the other DSLs, forbidden calls of its own)."""

    extra_prefixes: tuple[tuple[str, str], ...] = ()
    extra_call_kwargs: tuple[tuple[str, str, str], ...] = ()  # (dotted suffix of a call, keyword, rule)


def _match(name: str, prefixes: tuple[tuple[str, str], ...]) -> str | None:
    for prefix, rule in prefixes:
        if name == prefix or name.startswith(prefix + "."):
            return rule
    return None


class _Visitor(ast.NodeVisitor):
    def __init__(self, rules: RuleSet) -> None:
        # the DSL's own rules come first so that e.g. `tvm.s_tir` is other_dsl before anything broader
        self.prefixes = rules.extra_prefixes + _SHARED_PREFIXES
        self.call_kwargs = rules.extra_call_kwargs
        self.aliases: dict[str, str] = {}
        self.containers: dict[str, dict] = {}  # name -> index -> resolved name, for `m = [torch]`
        self.modules: set[str] = set()  # dotted names bound by `import a.b` (a, a.b)
        self.findings: list[StaticFinding] = []
        self._seen: set[tuple[str, int | None]] = set()

    # --- helpers -------------------------------------------------------------------------------
    def add(self, rule: str, message: str, node: ast.AST | None) -> None:
        line = getattr(node, "lineno", None)
        if (rule, line) in self._seen:
            return
        self._seen.add((rule, line))
        self.findings.append(StaticFinding(rule=rule, message=message, line=line))

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression refers to, through import and assignment aliases."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)  # only names bound by an import (or an alias of one)
        if isinstance(node, ast.Attribute):
            if node.attr in _MODULE_ATTRS:
                return node.attr  # `<anything>.os` is the os module (stdlib re-exports)
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                if node.args[1].value in _MODULE_ATTRS:
                    return node.args[1].value
                base = self.resolve(node.args[0])
                return f"{base}.{node.args[1].value}" if base else None
        if isinstance(node, ast.Subscript):
            return self._resolve_item(node)
        return None

    def _container(self, node: ast.AST) -> dict | None:
        """index -> resolved name of a container literal (or a name bound to one), None if not one."""
        if isinstance(node, ast.Name):
            return self.containers.get(node.id)
        if isinstance(node, (ast.List, ast.Tuple)):
            return {i: self.resolve(e) for i, e in enumerate(node.elts)}
        if isinstance(node, ast.Dict):
            return {k.value: self.resolve(v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}
        return None

    def _resolve_item(self, node: ast.Subscript) -> str | None:
        items = self._container(node.value)
        if not items:
            return None
        key = node.slice
        if isinstance(key, ast.UnaryOp) and isinstance(key.op, ast.USub) and isinstance(key.operand, ast.Constant):
            key = ast.Constant(-key.operand.value) if isinstance(key.operand.value, int) else key
        if isinstance(key, ast.Constant):
            k = key.value
            if isinstance(k, int) and not isinstance(k, bool) and k < 0 and all(isinstance(i, int) for i in items):
                k += len(items)
            return items.get(k)
        return None

    def _check_container(self, node: ast.AST) -> None:
        """A module kept in a container literal is a way around alias resolution: forbidden."""
        values = node.values if isinstance(node, ast.Dict) else node.elts
        for v in values:
            if isinstance(v, ast.Starred):
                v = v.value
            name = self.resolve(v) if isinstance(v, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) else None
            if name and self._is_module(name):
                self.add("obfuscation", f"module `{name}` kept in a container is forbidden ({RULES['obfuscation']})", node)

    def _is_module(self, name: str) -> bool:
        root = name.split(".")[0]
        if name in self.modules or name in _MODULE_ATTRS:
            return root in _CONTAINER_ROOTS or name in _MODULE_ATTRS
        # `from torch import backends`: a lower-case name directly under a sensitive root may be a module
        parts = name.split(".")
        return root in _CONTAINER_ROOTS and (len(parts) == 1 or name in {"torch.backends", "torch.cuda", "os.environ", "os.path"}
                                             or (len(parts) >= 2 and parts[1] == "backends"))

    def check_name(self, name: str | None, node: ast.AST, *, what: str = "use of") -> None:
        if not name:
            return
        rule = _match(name, self.prefixes)
        if rule is None:
            last = name.rsplit(".", 1)[-1]
            if any(name.startswith(p) for p in _OS_PREFIX_CALLS):
                rule = "subprocess"
            elif last in _RAW_CUDA_ATTRS:
                rule = "raw_cuda"
            elif last.startswith(_GRAPH_ATTR_PREFIXES):
                rule = "cuda_graph"
            elif last in _DISPATCH_ATTRS:
                rule = "monkeypatch"
        if rule is not None:
            self.add(rule, f"{what} `{name}` is forbidden ({RULES[rule]})", node)

    # --- imports ---------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.check_name(a.name, node, what="import of")
            parts = a.name.split(".")
            self.modules.update(".".join(parts[: i + 1]) for i in range(len(parts)))
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                root = a.name.split(".")[0]
                self.aliases.setdefault(root, root)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add("harness_import", "relative imports are forbidden (kernel.py stands alone)", node)
            return
        mod = node.module or ""
        self.check_name(mod, node, what="import from")
        for a in node.names:
            if a.name == "*":
                continue
            full = f"{mod}.{a.name}"
            if a.name in _MODULE_ATTRS:
                if a.name in _MODULE_ATTRS_ESCAPE and mod.split(".")[0] != a.name:
                    self.add("obfuscation", f"importing module `{a.name}` from `{mod}` is forbidden ({RULES['obfuscation']})", node)
                self.check_name(a.name, node, what="import of")
                self.aliases[a.asname or a.name] = a.name
                continue
            if a.name in _HARNESS_NAMES:
                self.add("harness_import", f"importing `{a.name}` from `{mod}` is forbidden ({RULES['harness_import']})", node)
            self.check_name(full, node, what="import of")
            self.aliases[a.asname or a.name] = full

    # --- names and attributes --------------------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            target = self.aliases.get(node.id)
            if target is not None and target != node.id:
                self.check_name(target, node)
            elif node.id in {"__import__", "eval", "exec", "compile", "globals", "vars", "exit", "quit", "__builtins__", "breakpoint"}:
                rule = "process_exit" if node.id in {"exit", "quit"} else "obfuscation"
                self.add(rule, f"use of `{node.id}` is forbidden ({RULES[rule]})", node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in _DUNDER_ESCAPES:
            self.add("obfuscation", f"attribute `{node.attr}` is forbidden ({RULES['obfuscation']})", node)
        if node.attr in _MODULE_ATTRS:
            rule = _match(node.attr, self.prefixes)
            if node.attr in _MODULE_ATTRS_ESCAPE or rule is None:
                rule = "obfuscation"
            self.add(rule, f"reaching module `{node.attr}` as an attribute of another object is forbidden ({RULES[rule]})", node)
        name = self.resolve(node)
        if name is not None and isinstance(node.ctx, ast.Load):
            self.check_name(name, node)
        elif name is None and (node.attr in _RAW_CUDA_ATTRS or node.attr in _DISPATCH_ATTRS
                               or node.attr.startswith(_GRAPH_ATTR_PREFIXES)):
            self.check_name(node.attr, node)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        name = self._resolve_item(node)
        if name is not None and isinstance(node.ctx, ast.Load):
            self.check_name(name, node)
        self.generic_visit(node)

    def visit_List(self, node: ast.AST) -> None:
        if not isinstance(getattr(node, "ctx", ast.Load()), (ast.Store, ast.Del)):
            self._check_container(node)
        self.generic_visit(node)

    visit_Tuple = visit_List
    visit_Set = visit_List
    visit_Dict = visit_List

    # --- assignments -----------------------------------------------------------------------------
    def _check_target(self, t: ast.AST, node: ast.AST) -> None:
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._check_target(e, node)
            return
        if isinstance(t, ast.Starred):
            self._check_target(t.value, node)
            return
        if isinstance(t, ast.Subscript):
            base = self.resolve(t.value)
            if base == "os.environ":
                self.add("environ_write", "writing `os.environ[...]` is forbidden", node)
            elif base in {"sys.modules", "globals", "vars", "builtins.__dict__"}:
                self.add("introspection" if base == "sys.modules" else "obfuscation", f"writing `{base}[...]` is forbidden", node)
            return
        if isinstance(t, ast.Attribute):
            name = self.resolve(t)
            if not name:
                return
            root = name.split(".")[0]
            if name.startswith("torch.backends."):
                self.add("numerics_flag", f"assigning `{name}` is forbidden ({RULES['numerics_flag']})", node)
            elif name.startswith("os.environ"):
                self.add("environ_write", f"assigning `{name}` is forbidden", node)
            elif root in _PATCH_ROOTS:
                self.add("monkeypatch", f"assigning `{name}` is forbidden ({RULES['monkeypatch']})", node)

    def _record_alias(self, targets: list[ast.AST], value: ast.AST | None) -> None:
        if value is None:
            return
        name = self.resolve(value) if isinstance(value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) else None
        items = self._container(value) if isinstance(value, (ast.List, ast.Tuple, ast.Dict, ast.Name)) else None
        for t in targets:
            if isinstance(t, ast.Name):
                if items and any(items.values()):
                    self.containers[t.id] = items
                else:
                    self.containers.pop(t.id, None)
                if name:
                    self.aliases[t.id] = name
                else:
                    self.aliases.pop(t.id, None)

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_target(t, node)
        self.generic_visit(node)
        self._record_alias(node.targets, node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target, node)
        self.generic_visit(node)
        self._record_alias([node.target], node.value)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._check_target(t, node)
        self.generic_visit(node)

    # --- calls -----------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in {"getattr", "setattr", "delattr", "hasattr"} and node.args:
            base = self.resolve(node.args[0])
            root = base.split(".")[0] if base else None
            literal = len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            if func.id in {"setattr", "delattr"} and root in _PATCH_ROOTS:
                target = f"{base}.{node.args[1].value}" if literal else f"{base}.<dynamic>"
                rule = "numerics_flag" if target.startswith("torch.backends") else "monkeypatch"
                if target.startswith("os.environ"):
                    rule = "environ_write"
                self.add(rule, f"{func.id} on `{target}` is forbidden ({RULES[rule]})", node)
            elif func.id in {"getattr", "hasattr"} and root in _GETATTR_ROOTS and not literal:
                self.add("obfuscation", f"dynamic {func.id} on `{base}` is forbidden ({RULES['obfuscation']})", node)
            elif literal:
                self.check_name(f"{base}.{node.args[1].value}" if base else None, node)
        name = self.resolve(func)
        if name:
            for suffix, kw, rule in self.call_kwargs:
                if (name == suffix or name.endswith("." + suffix)) and any(k.arg == kw for k in node.keywords):
                    self.add(rule, f"`{name}(..., {kw}=...)` is forbidden ({RULES[rule]})", node)
        self.generic_visit(node)


def check_source(source: str, *, rules: RuleSet = RuleSet()) -> tuple[StaticFinding, ...]:
    """All findings for one kernel.py source, in line order; an empty tuple means clean."""
    try:
        tree = parse(source, "kernel.py")
    except SyntaxError as e:
        return (StaticFinding(rule="syntax_error", message=f"kernel.py:{e.lineno}: {e.msg}", line=e.lineno),)
    v = _Visitor(rules)
    v.visit(tree)
    has_solve = any(
        (isinstance(n, ast.FunctionDef) and n.name == "solve")
        or (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "solve" for t in n.targets))
        for n in tree.body
    )
    if not has_solve:
        v.add("no_solve", "kernel.py defines no top-level `def solve(*inputs)`", None)
    return tuple(sorted(v.findings, key=lambda f: (f.line or 0, f.rule)))
