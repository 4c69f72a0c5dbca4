"""``nvfp4lab.autocast``: the recipe of every nvfp4lab layer built without one, or high precision.

TE users write ``with te.autocast(enabled=True, recipe=...)``; the same works here::

    model = nvfp4lab.convert(model)                       # layers without a recipe of their own
    with nvfp4lab.autocast(recipe=nvfp4lab.NVFP4BlockScaling(disable_rht=True)):
        loss = model(x).float().pow(2).mean()             # quantized with that recipe
    with nvfp4lab.autocast(enabled=False):
        y_eval = model(x)                                 # the same model in high precision

* A layer built without a recipe (``Linear(..., recipe=None)``, ``convert(model)``) quantizes with the
  innermost active context's recipe; outside every context with TE's default NVFP4 recipe, as before
  (TE runs layers outside its autocast in high precision; nvfp4lab layers keep quantizing).
* A layer built with a recipe keeps it inside any context.
* ``enabled=False`` runs every nvfp4lab layer (with or without a recipe of its own) in high
  precision: ``torch.nn.functional.linear`` on its high-precision weight.
* ``recipe=None`` means TE's default NVFP4 recipe (as TE: an inner ``autocast()`` does not inherit the
  outer recipe). Recipes: :class:`~nvfp4lab.NVFP4Recipe`, :class:`~nvfp4lab.MXFP8Recipe`, or TE's
  names (:class:`~nvfp4lab.NVFP4BlockScaling`, :class:`~nvfp4lab.NVFP4PerTokenBlockScaling`).
* Contexts nest; leaving one restores the enclosing state, also on an exception. ``autocast`` is
  also a decorator.

The state is a plain module-level stack read by the layers at forward time, so it is fixed when a
graph is made: ``torch.compile`` reads it while tracing (the compiled code guards on it and
recompiles when another state is active at call time) and a CUDA graph captures the kernels of the
state active during capture; replaying it under another state does not change them (re-capture,
as with TE). The stack is process-wide, not per thread.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

from .recipes import NVFP4Recipe, resolve_recipe


@dataclass(frozen=True)
class AutocastState:
    """One active context: whether layers quantize, and the recipe of layers built without one."""

    enabled: bool
    recipe: object


_DEFAULT = AutocastState(True, NVFP4Recipe.te_default())
_STACK: list = []


class autocast(contextlib.ContextDecorator):  # noqa: N801 (TE's name, used as ``with nvfp4lab.autocast(...)``)
    """Context manager (and decorator) setting the recipe of recipe-less nvfp4lab layers, or turning
    every nvfp4lab layer to high precision (``enabled=False``); see the module docstring."""

    def __init__(self, enabled: bool = True, recipe=None):
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
        self.state = AutocastState(enabled, resolve_recipe(recipe))
        self._depth: Optional[int] = None

    def __enter__(self) -> "autocast":
        if self._depth is not None:
            raise RuntimeError("this autocast context is already active; create a new one to nest")
        _STACK.append(self.state)
        self._depth = len(_STACK)
        return self

    def __exit__(self, *exc) -> bool:
        if self._depth != len(_STACK):
            raise RuntimeError("nvfp4lab.autocast contexts must be left in the reverse order of entry")
        _STACK.pop()
        self._depth = None
        return False

    def _recreate_cm(self) -> "autocast":
        # as a decorator: a fresh context per call (recursive calls nest)
        return autocast(self.state.enabled, self.state.recipe)

    def __repr__(self) -> str:
        return f"nvfp4lab.autocast(enabled={self.state.enabled}, recipe={self.state.recipe!r})"


def autocast_state() -> AutocastState:
    """The innermost active context's state; outside every context: enabled, TE's default NVFP4 recipe."""
    return _STACK[-1] if _STACK else _DEFAULT


def autocast_enabled() -> bool:
    """Whether nvfp4lab layers quantize now (False inside ``autocast(enabled=False)``)."""
    return autocast_state().enabled


def autocast_recipe():
    """The recipe of layers built without one, now."""
    return autocast_state().recipe
