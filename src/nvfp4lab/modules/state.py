"""A layer's recipe in its state_dict: the ``_extra_state`` entry of :class:`~nvfp4lab.Linear`,
:class:`~nvfp4lab.GroupedLinear` and :class:`~nvfp4lab.modules.inference.InferenceLinear`.

The entry is a uint8 tensor holding UTF-8 JSON (a tensor, as TransformerEngine keeps its extra state,
so safetensors files and ``torch.load(weights_only=True)`` take it)::

    {"format": "nvfp4lab.recipe", "version": 1,
     "recipe": {"type": "NVFP4Recipe", "fields": {"weight_2d": true, ...}}}

padded with spaces to :data:`EXTRA_STATE_BYTES` (JSON ignores trailing whitespace), so every recipe's
entry has the same size: a distributed checkpoint (``torch.distributed.checkpoint.load``) reads the
saved entry in place into the fresh model's entry and refuses a size mismatch before any recipe is
compared; with equal sizes it loads, and the recipe check below names the differing fields.
Entries written without the padding still decode.

Loading a state_dict into a converted layer checks that the saved recipe equals the layer's and
refuses a different one with a ValueError naming the layer and the fields that differ. A state_dict
without the entry (a plain model's) loads as before and keeps the layer's recipe. A layer without a
recipe of its own (it follows :class:`nvfp4lab.autocast`) saves the recipe active when the state_dict
is taken and accepts any saved recipe (it keeps following the context).
"""
from __future__ import annotations

import dataclasses
import json

import torch

from ..layout import roundup
from ..recipes import RECIPE_TYPES

EXTRA_STATE_FORMAT = "nvfp4lab.recipe"
EXTRA_STATE_VERSION = 1
EXTRA_STATE_BYTES = 1024  # the entry's size (longer JSON rounds up to a multiple of it; recipes take about 400 bytes)
_RECIPE_CLASSES = {cls.__name__: cls for cls in RECIPE_TYPES}


def recipe_to_dict(recipe) -> dict:
    """``{"type": class name, "fields": {field: value}}`` (JSON-ready) of an NVFP4Recipe or MXFP8Recipe."""
    if not isinstance(recipe, RECIPE_TYPES):
        raise TypeError(f"recipe must be an NVFP4Recipe or MXFP8Recipe, got {type(recipe).__name__}")
    return {"type": type(recipe).__name__, "fields": dataclasses.asdict(recipe)}


def recipe_from_dict(data) -> object:
    """Inverse of :func:`recipe_to_dict`; ValueError on an unknown type or field (the recipe's own
    checks run as at construction)."""
    if not isinstance(data, dict) or not isinstance(data.get("fields"), dict):
        raise ValueError(f"a recipe record must be {{'type': ..., 'fields': {{...}}}}, got {data!r}")
    cls = _RECIPE_CLASSES.get(data.get("type"))
    if cls is None:
        raise ValueError(f"unknown recipe type {data.get('type')!r} (known: {sorted(_RECIPE_CLASSES)})")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data["fields"]) - known)
    if unknown:
        raise ValueError(f"{cls.__name__} has no fields {unknown} (saved by a newer nvfp4lab?)")
    return cls(**data["fields"])


def recipe_differences(saved, current) -> str:
    """'field: saved -> current' for each field that differs (the type when the classes differ)."""
    if type(saved) is not type(current):
        return f"type: {type(saved).__name__} -> {type(current).__name__}"
    a, b = dataclasses.asdict(saved), dataclasses.asdict(current)
    return ", ".join(f"{k}: {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k])


def encode_extra_state(recipe) -> torch.Tensor:
    encoded = json.dumps({"format": EXTRA_STATE_FORMAT, "version": EXTRA_STATE_VERSION, "recipe": recipe_to_dict(recipe)},
                         sort_keys=True).encode("utf-8")
    return torch.frombuffer(bytearray(encoded.ljust(roundup(len(encoded), EXTRA_STATE_BYTES), b" ")), dtype=torch.uint8)


def decode_extra_state(state) -> object:
    """The recipe held by an extra-state entry; ValueError on another format or a newer version."""
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.dim() != 1:
        raise ValueError(f"extra state must be a 1-D uint8 tensor of JSON (nvfp4lab {EXTRA_STATE_FORMAT}), "
                         f"got {type(state).__name__}")
    try:
        data = json.loads(bytes(state.cpu().tolist()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"extra state is not {EXTRA_STATE_FORMAT} JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != EXTRA_STATE_FORMAT:
        raise ValueError(f"extra state has format {data.get('format') if isinstance(data, dict) else None!r}, "
                         f"expected {EXTRA_STATE_FORMAT!r}")
    if data.get("version") != EXTRA_STATE_VERSION:
        raise ValueError(f"extra state has {EXTRA_STATE_FORMAT} version {data.get('version')!r}; this nvfp4lab "
                         f"reads version {EXTRA_STATE_VERSION}")
    return recipe_from_dict(data.get("recipe"))


class RecipeStateMixin:
    """get/set_extra_state for a module with a ``recipe`` attribute (see the module docstring)."""

    def get_extra_state(self) -> torch.Tensor:
        return encode_extra_state(self.recipe)

    def set_extra_state(self, state) -> None:
        saved = decode_extra_state(state)
        if getattr(self, "follows_autocast", False):
            return
        if saved != self.recipe:
            raise ValueError(f"the saved recipe differs ({recipe_differences(saved, self.recipe)})")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        key = prefix + "_extra_state"
        layer = prefix[:-1] or "<root>"
        if key in state_dict:  # checked before anything of this layer is copied
            try:
                self.set_extra_state(state_dict[key])
            except ValueError as exc:
                raise ValueError(f"layer {layer!r} ({type(self).__name__}): {exc}; this layer has recipe "
                                 f"{self.recipe!r}") from None
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        if key not in state_dict and key in missing_keys:  # a plain model's state_dict: keep this layer's recipe
            missing_keys.remove(key)
