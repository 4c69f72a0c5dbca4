"""Custom ops that cost no dispatch in eager mode.

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
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

__all__ = ["EagerCustomOp", "custom_op", "tracing"]

_INFRA_MODES = (torch._C._TorchDispatchModeKey.FAKE, torch._C._TorchDispatchModeKey.PROXY,
                torch._C._TorchDispatchModeKey.FUNCTIONAL)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def tracing(x) -> bool:
    """True when an op on ``x`` must go through the dispatcher: torch.compile traces, an
    infrastructure dispatch mode is active, or ``x`` is not a plain tensor (a subclass)."""
    if torch.compiler.is_compiling() or type(x) not in _PLAIN:
        return True
    get = torch._C._get_dispatch_mode
    return any(get(key) is not None for key in _INFRA_MODES)


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
        _LIBRARY.impl(op_name, impl, "CompositeExplicitAutograd")
        self.name = name
        self.impl = impl
        self.op = getattr(getattr(torch.ops, namespace), op_name).default
        self.__doc__ = impl.__doc__
        self.__name__ = impl.__name__

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
