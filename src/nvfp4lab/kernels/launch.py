"""Custom ops that cost no dispatch in eager mode, and Triton launches that cost no argument binding.

A custom op is what torch.compile and CUDA-graph capture need: an opaque call with a shape-only fake
implementation. Each call through the dispatcher costs host time, the more so through
``torch.library.custom_op``'s Python layers (autograd wrapper, dynamo guard, aliasing check), which
cost several times the kernel launch they wrap. :func:`custom_op` therefore defines the op on the
``nvfp4lab`` library directly (schema inferred from the annotations, one implementation for every
device, a fake implementation), so a compiled graph calls it through the C++ dispatcher alone, and
returns a callable that runs the implementation itself unless the call is traced (:func:`tracing`):
torch.compile, an infrastructure dispatch mode (fake tensors, proxy tracing, functionalization) or a
tensor subclass input. CUDA-graph capture is eager mode: the kernels the implementation launches are
captured as they would be through the op.

:func:`launch` starts a ``@triton.jit`` kernel. The first launch of a kernel for a given set of
constexprs, launch options and argument specialization goes through Triton's own ``kernel[grid](...)``
(which compiles and binds); later ones call the compiled kernel's launcher directly, skipping
Triton's per-call argument binding and cache-key computation. The specialization key is Triton's:
each tensor's dtype and 16-byte alignment, each int's 16-divisibility, value 1 and width, the type of
other arguments, and the device. Every kernel passed to it takes its runtime arguments first and its
constexprs after them. Under the interpreter, and whenever a Triton launch hook is installed (e.g. the
Proton profiler), every launch takes Triton's path.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Iterable

import torch
from triton.runtime.jit import JITFunction

from .pdl import pdl_meta

try:  # Triton >= 3.4
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older Triton: hooks live on CompiledKernel
    _knobs = None

__all__ = ["EagerCustomOp", "Launch", "aligned", "arg_key", "custom_op", "interpreting", "keep_buffers", "launch",
           "tracing"]

# Triton reads TRITON_INTERPRET when a kernel is defined (at import), so this module reads it then too
_INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreting() -> bool:
    """Whether Triton runs this package's kernels under its interpreter (then no inline PTX, no bf16
    ``tl.dot``, no register cap)."""
    return _INTERPRETING

_INFRA_MODES = (torch._C._TorchDispatchModeKey.FAKE, torch._C._TorchDispatchModeKey.PROXY,
                torch._C._TorchDispatchModeKey.FUNCTIONAL)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def tracing(x) -> bool:
    """True when an op on ``x`` must go through the dispatcher: torch.compile traces, an
    infrastructure dispatch mode is active, ``x`` is not a plain tensor (a subclass), or it is a meta
    tensor (the fake implementations then give the outputs' shapes, as for any torch op on meta)."""
    if torch.compiler.is_compiling() or type(x) not in _PLAIN or x.is_meta:
        return True
    get = torch._C._get_dispatch_mode
    fake, proxy, functional = _INFRA_MODES
    return get(fake) is not None or get(proxy) is not None or get(functional) is not None


_LIBRARY = torch.library.Library("nvfp4lab", "FRAGMENT")


class EagerCustomOp:
    """An op of the ``nvfp4lab`` library whose implementation is called directly when the call is
    not traced (see the module docstring). ``op`` is the registered overload."""

    def __init__(self, name: str, impl: Callable, mutates_args: Iterable[str]):
        namespace, op_name = name.split("::")
        if namespace != "nvfp4lab":
            raise ValueError(f"custom ops of this package live in the nvfp4lab namespace, got {name!r}")
        schema = torch.library.infer_schema(impl, mutates_args=tuple(mutates_args))
        _LIBRARY.define(op_name + schema)
        _LIBRARY.impl(op_name, self._dispatched, "CompositeExplicitAutograd")
        self.name = name
        self.impl = impl
        self.op = getattr(getattr(torch.ops, namespace), op_name).default
        self.__doc__ = impl.__doc__
        self.__name__ = impl.__name__

    def _dispatched(self, *args, **kwargs):
        """The implementation as the dispatcher calls it (see :func:`keep_buffers`)."""
        _DISPATCH.depth = getattr(_DISPATCH, "depth", 0) + 1
        try:
            return self.impl(*args, **kwargs)
        finally:
            _DISPATCH.depth -= 1

    def register_fake(self, fn: Callable) -> Callable:
        torch.library.register_fake(self.name, fn, lib=_LIBRARY)
        return fn

    def __call__(self, *args, **kwargs):
        if tracing(args[0]):
            return self.op(*args, **kwargs)
        return self.impl(*args, **kwargs)


def custom_op(name: str, *, mutates_args: Iterable[str] = ()):
    """Decorator: register ``fn`` as the custom op ``name`` and return an :class:`EagerCustomOp`."""
    def wrap(fn: Callable) -> EagerCustomOp:
        return EagerCustomOp(name, fn, mutates_args)

    return wrap


# ------------------------------------------------------------------------------ kept buffers
_DISPATCH = threading.local()


def keep_buffers(device: torch.device) -> bool:
    """Whether a kernel family may keep a zeroed buffer between calls (the amax scratch, the stream
    GEMM's counters): not under stream capture (the graph gets buffers of its own) and not inside a
    custom op called through the dispatcher (a compiled graph's call: Inductor's CUDA graphs route
    every allocation of their runs to the graphs' pool and refuse a tensor born there that outlives
    them)."""
    if getattr(_DISPATCH, "depth", 0):
        return False
    return device.type != "cuda" or not torch.cuda.is_current_stream_capturing()


# --------------------------------------------------------------------------------------- launches
def _hooks():
    """Triton's launch enter / exit hooks, as its own launcher passes them."""
    if _knobs is not None:
        return _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
    from triton.compiler import CompiledKernel  # pragma: no cover

    return CompiledKernel.launch_enter_hook, CompiledKernel.launch_exit_hook  # pragma: no cover


_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
_CAPABILITY: dict = {}


def _capability(device: int):
    """The compute capability of CUDA device ``device`` (an index), or None under the interpreter."""
    if _INTERPRETING:
        return None
    capability = _CAPABILITY.get(device)
    if capability is None:
        capability = _CAPABILITY[device] = torch.cuda.get_device_capability(device)
    return capability


def _hook_active(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


_I32_MIN, _I32_MAX, _U64_FROM = -(1 << 31), (1 << 31) - 1, 1 << 63
_TENSORS = (torch.Tensor, torch.nn.Parameter)


def arg_key(arg):
    """What Triton specializes a kernel on for one runtime argument: a tensor's dtype and 16-byte
    alignment, an int's 16-divisibility, value 1 and width, the type of anything else."""
    kind = type(arg)
    if kind in _TENSORS:
        return arg.dtype, arg.data_ptr() & 15 == 0
    if kind is int:
        return arg & 15 == 0, arg == 1, _I32_MIN <= arg <= _I32_MAX, arg >= _U64_FROM
    return kind


def aligned(t: torch.Tensor) -> bool:
    """Whether a tensor's data pointer is 16-byte aligned (Triton specializes pointers on it)."""
    return t.data_ptr() & 15 == 0


# Triton's launch options a Launch's meta may hold beside the kernel's constexprs
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_pdl")


class Launch:
    """One kernel with a fixed grid, constexprs and launch options (``meta``), for callers that launch
    it many times with arguments of one specialization: they keep the Launch in a cache whose key
    holds everything Triton specializes on (:func:`arg_key` of each argument) and the grid's inputs.

    The first call goes through ``kernel[grid](*args, **meta)`` (with PDL on where the device has it,
    :func:`~nvfp4lab.kernels.pdl.pdl_meta`); later calls run the compiled kernel's launcher directly on the current
    device and stream. ``verify = True`` (the GPU test tier) checks on every call that the arguments still have the
    first call's specialization."""

    verify = False
    __slots__ = ("kernel", "grid", "meta", "handle", "tail", "device", "spec")

    def __init__(self, kernel, grid: tuple, meta: dict):
        unknown = set(meta).difference(kernel.arg_names, LAUNCH_OPTIONS)
        if unknown:  # Triton's interpreter would ignore them; a GPU compile fails
            raise ValueError(f"{kernel.__name__}: meta names {sorted(unknown)} that are neither its parameters nor "
                             f"launch options {LAUNCH_OPTIONS}")
        self.kernel = kernel
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.meta = meta
        self.handle = None
        self.tail = None
        self.device = None
        self.spec = None

    def __call__(self, *args) -> None:
        handle = self.handle
        kernel = self.kernel
        if handle is None or type(kernel) is not JITFunction:
            self._first(args)
            return
        enter, leave = _hooks()
        device = _current_device()  # CUDA is initialized: the first launch went through Triton
        if _hook_active(enter) or _hook_active(leave) or device != self.device or self.tail is None:
            kernel[self.grid](*args, **pdl_meta(kernel, self.meta, _capability(device)))
            return
        if Launch.verify and tuple(map(arg_key, args)) != self.spec:
            raise RuntimeError(f"{kernel.__name__}: arguments of another specialization than the first call's "
                               f"({tuple(map(arg_key, args))} != {self.spec}): the caller's cache key misses a property")
        grid = self.grid
        # no hook is active: the launcher gets None for both, so it does not call the (empty) hook chains
        handle.run(grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(device), handle.function,
                   handle.packed_metadata, None, None, None, *args, *self.tail)

    def _first(self, args) -> None:
        kernel = self.kernel
        if type(kernel) is not JITFunction:  # the interpreter
            kernel[self.grid](*args, **self.meta)
            return
        device = _current_device()
        meta = pdl_meta(kernel, self.meta, _capability(device))
        handle = kernel[self.grid](*args, **meta)
        if self.handle is None:
            self.handle = handle
            self.device = device
            self.tail = _constexpr_tail(kernel, len(args), meta)
            self.spec = tuple(map(arg_key, args))


def _constexpr_tail(kernel: JITFunction, n_args: int, meta: dict):
    """The constexpr values (``meta``'s, else the defaults) of the parameters after the first
    ``n_args``, or None when those are not exactly the kernel's constexprs (then every launch takes
    Triton's path)."""
    params = kernel.params
    if any(p.is_constexpr for p in params[:n_args]) or not all(p.is_constexpr for p in params[n_args:]):
        return None
    return tuple(meta[p.name] if p.name in meta else p.default for p in params[n_args:])


_LAUNCHES: dict = {}


def launch(kernel, grid: tuple, args: tuple, meta: dict) -> None:
    """Launch ``kernel[grid](*args, **meta)`` (``args``: the runtime arguments in parameter order,
    ``meta``: constexprs and launch options) through a :class:`Launch` cached on the grid, the meta
    and every argument's specialization: for launch sites that are not hot enough for a cache of their
    own."""
    if type(kernel) is not JITFunction:  # the interpreter
        Launch(kernel, grid, meta)(*args)
        return
    key = (id(kernel), tuple(grid), tuple(meta.items()), tuple(map(arg_key, args)))
    bound = _LAUNCHES.get(key)
    if bound is None:
        bound = _LAUNCHES[key] = Launch(kernel, grid, meta)
    bound(*args)
