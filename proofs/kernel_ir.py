"""The Triton kernels as Triton compiles them: TTIR text for sm_90, built on the CPU from a recorded launch.

:func:`compile_ttir` binds a launch's arguments to the kernel's parameters exactly as Triton's JIT does when it
launches (each argument's type and specialisation from ``native_specialize_impl``: an integer is ``i32`` below
``2^31``, ``i64`` from there, the constant ``1`` a constexpr; a tensor a typed pointer; a host tensor descriptor a
``tensordesc``), builds the kernel's IR from its source and runs the ``ttir`` stage of the CUDA backend for compute
capability 9.0 (inlining every helper, folding the constexprs, canonicalising), no GPU needed. The text is cached
in-process by the kernel's source hash (its helpers' sources included), signature and constexprs.

Under ``TRITON_INTERPRET=1`` (the test suite on a CPU) ``@triton.jit`` makes interpreter objects instead of
``JITFunction`` s; :class:`JitWorld` then rebuilds each kernel and every helper it reaches as a ``JITFunction`` over
the same code, in a copy of its module's globals whose interpreter objects are replaced the same way, so the code
generator sees the kernel as a GPU process would. The source Triton parses is the function's own text as
``inspect`` finds it: a kernel compiled from edited text registers that text with ``linecache`` under a name of its
own (``tests/faults.py`` does), and then that text is what compiles.
"""

from __future__ import annotations

import contextlib
import re
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["JitWorld", "compile_ttir", "is_kernel", "kernel_name"]

CAPABILITY = 90  # sm_90 (Hopper): the GPUs the kernels are tuned for
WARP_SIZE = 32
_TTIR_CACHE: dict[tuple, str] = {}


def is_kernel(obj: Any) -> bool:
    """A ``@triton.jit`` object: a ``JITFunction``, or the interpreter's stand-in for one."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return isinstance(obj, (JITFunction, InterpretedFunction))


def kernel_name(obj: Any) -> str:
    """The Python name of a ``@triton.jit`` object's function."""
    return obj.fn.__name__


class JitWorld:
    """``JITFunction`` s for ``@triton.jit`` objects, whatever mode Triton decorated them in. One world per check run:
    its copies of module globals hold the bindings of the moment (a planted fault included)."""

    def __init__(self) -> None:
        self._made: dict[int, Any] = {}

    def jit(self, obj: Any) -> Any:
        from triton.runtime.jit import JITFunction

        if isinstance(obj, JITFunction):
            return obj
        key = id(obj)
        if key not in self._made:
            fn = obj.fn
            scope = dict(fn.__globals__)
            copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
            copy.__kwdefaults__, copy.__annotations__ = fn.__kwdefaults__, dict(fn.__annotations__)
            copy.__qualname__, copy.__module__, copy.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
            made = JITFunction(copy, **_jit_options(obj))
            self._made[key] = made  # before the globals: helpers may reach this function again
            for name, value in list(scope.items()):
                if is_kernel(value):
                    scope[name] = self.jit(value)
        return self._made[key]


def _jit_options(obj: Any) -> dict:
    kwargs = getattr(obj, "kwargs", {}) or {}
    return {k: kwargs[k] for k in ("do_not_specialize", "do_not_specialize_on_alignment", "noinline") if k in kwargs}


def _bind(jit: Any, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """``(bound, options)``: every parameter's value in parameter order (defaults filled in) and the launch options
    (``num_warps`` and the like: keywords that are not parameters)."""
    names = jit.arg_names
    if len(args) > len(names):
        raise ValueError(f"{jit.fn.__name__} takes {len(names)} arguments, the launch passes {len(args)}")
    given = dict(zip(names, args))
    options = {}
    for key, value in kwargs.items():
        if key in names:
            given[key] = value
        else:
            options[key] = value
    bound = {}
    for param in jit.params:
        if param.name in given:
            bound[param.name] = given[param.name]
        elif param.has_default:
            bound[param.name] = param.default
        else:
            raise ValueError(f"the launch of {jit.fn.__name__} passes no {param.name}")
    options.pop("launch_pdl", None)  # a launch attribute, not a compile option
    return bound, options


def compile_ttir(world: JitWorld, kernel: Any, args: tuple, kwargs: dict) -> tuple[str, dict]:
    """The kernel's TTIR (sm_90, locations stripped) for a launch ``kernel[grid](*args, **kwargs)`` and the
    signature Triton specialises it to (parameter name -> type, ``constexpr`` for the constants)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    from triton.runtime.jit import native_specialize_impl

    jit = world.jit(kernel)
    target = GPUTarget("cuda", CAPABILITY, WARP_SIZE)
    backend = make_backend(target)
    bound, launch_options = _bind(jit, args, kwargs)
    specialization = []
    for param in jit.params:
        value = bound[param.name]
        if param.is_constexpr:
            specialization.append(("constexpr", value))
        else:
            specialization.append(native_specialize_impl(type(backend), value, param.is_const,
                                                         not param.do_not_specialize,
                                                         not param.do_not_specialize_on_alignment))
    options, signature, constexprs, attrs = jit._pack_args(backend, launch_options, bound, specialization, None)
    key = (jit.cache_key, tuple(sorted(signature.items())), repr(sorted(constexprs.items(), key=str)),
           repr(sorted(attrs.items())), repr(sorted(vars(options).items())))
    if key not in _TTIR_CACHE:
        from triton._C.libtriton import ir

        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        source = ASTSource(jit, signature, constexprs, attrs)
        with _compiling(world):
            module = source.make_ir(target, options, backend.get_codegen_implementation(options),
                                    backend.get_module_map(), context)
            module = backend.make_ttir(module, {}, options, CAPABILITY)
        _TTIR_CACHE[key] = _name_params(_strip_attributes(_strip_locations(module.str())), signature)
    return _TTIR_CACHE[key], signature


@contextlib.contextmanager
def _compiling(world: JitWorld) -> Iterator[None]:
    """The code generator's view of Triton while compiling. Under ``TRITON_INTERPRET=1`` Triton's own library
    functions (``tl.zeros``, ``tl.sigmoid``, ``tl.cdiv``, the tensor methods that forward to them) are interpreter
    objects and its ``constexpr_function`` s return bare values; for the compile they are ``JITFunction`` s of the
    same code (``world``) and the interpreter flag is off, and both are put back after it."""
    import triton.language as tl
    from triton import knobs
    from triton.runtime.interpreter import InterpretedFunction

    swapped = []
    for name, value in list(vars(tl.core).items()):  # the interpreter's leaked patches of tl.core (module docstring)
        original = _unpatched(value, vars(tl).get(name))
        if original is not value:
            swapped.append((tl.core, name, value))
            setattr(tl.core, name, original)
    for owner in (tl, tl.core, tl.standard, tl.math):
        for name, value in list(vars(owner).items()):
            if isinstance(value, InterpretedFunction):
                swapped.append((owner, name, value))
    for name, value in list(vars(tl.core.tensor).items()):
        cells = [c.cell_contents for c in (getattr(value, "__closure__", None) or ())]
        if len(cells) == 1 and isinstance(cells[0], InterpretedFunction):  # a member forwarding to a library function
            swapped.append((tl.core.tensor, name, value))
    try:
        for owner, name, value in swapped:
            if owner is tl.core and getattr(tl.core, name) is not value:
                continue  # an unwrapped leak, set above
            target = value if isinstance(value, InterpretedFunction) else value.__closure__[0].cell_contents
            setattr(owner, name, world.jit(target))
        if getattr(knobs.runtime, "interpret", False):
            with knobs.runtime.scope():
                knobs.runtime.interpret = False
                yield
        else:
            yield
    finally:
        for owner, name, value in reversed(swapped):
            setattr(owner, name, value)


def _unpatched(value: Any, exported: Any) -> Any:
    """``value`` without the Triton interpreter's patches. The interpreter patches ``triton.language`` for each kernel
    it runs and puts it back after, but a library function called inside the kernel (``tl.sum``: its module sees
    ``triton.language.core``) patches ``tl.core`` again and never puts that back. A patched builtin keeps the original
    as its ``member`` default; any other leaked name is the one ``triton.language`` exports (``exported``), which the
    kernel's own patches gave back."""
    while callable(value) and (getattr(value, "__kwdefaults__", None) or {}).get("member") is not None:
        value = value.__kwdefaults__["member"]
    source = getattr(value, "func", value)  # a functools.partial's function
    if exported is not None and value is not exported and "interpreter" in str(getattr(source, "__module__", "")):
        return exported
    return value


def _strip_locations(text: str) -> str:
    """The printed module without its debug locations (``#loc`` lines and ``loc(...)`` suffixes), keeping the SSA
    names the locations gave (the Python variable names: ``%q_ptr``, ``%slot``)."""
    lines = [line for line in text.splitlines() if not line.startswith("#loc")]
    out = []
    for line in lines:
        while " loc(" in line:
            start = line.index(" loc(")
            depth, end = 0, start + 4
            for end in range(start + 4, len(line)):
                depth += line[end] == "("
                depth -= line[end] == ")"
                if depth == 0:
                    break
            line = line[:start] + line[end + 1:]
        out.append(line)
    return "\n".join(out)


def _strip_attributes(text: str) -> str:
    """Argument attributes (``{tt.divisibility = 16 : i32}``: alignment hints, no values) out of the signature."""
    return re.sub(r" \{tt\.[a-z_]+ = [^{}]*\}", "", text)


def _name_params(text: str, signature: dict) -> str:
    """The kernel's arguments named by its parameters, in order (the printer names an argument after a variable
    it was assigned to, ``w_ptr = QW`` prints ``%QW`` as ``%w_ptr``); a descriptor's shape and stride arguments
    ``X.shape.i`` / ``X.stride.i`` after it."""
    header = next(line for line in text.splitlines() if line.strip().startswith("tt.func"))
    printed = re.findall(r"%([\w.$-]+): ", header[header.index("("):])
    names = [name for name, kind in signature.items() if kind != "constexpr"]
    rename, i = {}, 0
    for name in names:
        if i >= len(printed):
            raise ValueError(f"the kernel's TTIR has fewer arguments than its signature ({names})")
        rename[printed[i]] = name
        i += 1
        if str(signature[name]).startswith("tensordesc"):
            while i < len(printed) and re.search(r"\.(shape|stride)\.\d+$", printed[i]):
                part = re.search(r"(shape|stride)\.\d+$", printed[i]).group(0)
                rename[printed[i]] = f"{name}.{part}"
                i += 1
    if i != len(printed):
        raise ValueError(f"the kernel's TTIR arguments {printed} do not match its signature {names}")
    if all(old == new for old, new in rename.items()):
        return text
    return re.sub(r"%([\w.$-]+)", lambda m: "%" + rename.get(m.group(1), m.group(1)), text)
