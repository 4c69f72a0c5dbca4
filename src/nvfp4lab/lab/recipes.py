"""The lab's recipe catalogue: the registry's recipes (:mod:`nvfp4lab.recipes`) as per-tensor formats.

A recipe says how each of the three tensors of a Linear layer is stored for its GEMMs (spec section 4):

    weight W      rowwise copy -> fprop (y = x W^T)       columnwise copy -> dgrad (dx = dy W)
    activation x  rowwise copy -> fprop                    columnwise copy -> wgrad (dW = dy^T x)
    gradient dy   rowwise copy -> dgrad                    columnwise copy -> wgrad

Every tensor therefore needs both copies in training, so each format asks for rowwise and columnwise
outputs; :meth:`LabRecipe.fprop_formats` narrows weight and activation to the rowwise copy the forward
pass reads. The formats are the recipe's own :meth:`~nvfp4lab.NVFP4Recipe.tensor_config` of the
``"weight"``, ``"input"`` and ``"grad"`` tensors with compact scales (or :class:`BF16Format` for the
unquantized baseline). The catalogue is ``bf16``, ``mxfp8``, ``mxfp8-hybrid`` and every valid NVFP4
name over :data:`LAB_FEATURES`; ``te`` stands for ``nvfp4-w2d-rht-sr``.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Union

from ..config import MXFP8QuantConfig, NVFP4QuantConfig
from ..recipes import ALIASES, display_name, from_recipe_name, nvfp4_recipe_names, recipe_summary


@dataclass(frozen=True)
class BF16Format:
    """No block scaling: the tensor is rounded to bfloat16 (what a BF16 training run feeds its GEMMs)."""

    rowwise: bool = True
    columnwise: bool = True


TensorFormat = Union[NVFP4QuantConfig, MXFP8QuantConfig, BF16Format]


@dataclass(frozen=True)
class LabRecipe:
    """A named recipe's formats of W, x (the recipe's "input") and dy (its "grad")."""

    name: str
    summary: str
    weight: TensorFormat
    activation: TensorFormat
    gradient: TensorFormat

    def fprop_formats(self) -> tuple[TensorFormat, TensorFormat]:
        """(activation, weight) formats with only the rowwise copy, the operands of y = x W^T."""
        return _rowwise_only(self.activation), _rowwise_only(self.weight)

    def describe(self) -> dict:
        """JSON-friendly view of the three formats."""
        return {name: describe_format(getattr(self, name)) for name in ("weight", "activation", "gradient")}


def _rowwise_only(fmt: TensorFormat) -> TensorFormat:
    return dataclasses.replace(fmt, rowwise=True, columnwise=False)


def describe_format(fmt: TensorFormat) -> dict:
    if isinstance(fmt, BF16Format):
        return {"format": "bf16"}
    if isinstance(fmt, MXFP8QuantConfig):
        return {"format": "mxfp8", "fp8_format": fmt.fp8_format}
    out = {"format": "nvfp4", "block": fmt.block}
    for key in ("per_token", "rht", "stochastic_rounding"):
        if getattr(fmt, key):
            out[key] = True
    if fmt.four_over_six:
        out["four_over_six"] = fmt.four_over_six
    if fmt.numerics != "te_main":
        out["numerics"] = fmt.numerics
    out["e4m3_max"] = fmt.e4m3_max
    return out


def lab_recipe(name: str) -> LabRecipe:
    """The registry recipe ``name`` as lab formats (ValueError for an unknown or invalid name)."""
    recipe = from_recipe_name(name)
    if recipe is None:
        weight = activation = gradient = BF16Format()
    else:
        recipe = recipe.replace(scale_layout="compact")
        weight, activation, gradient = (recipe.tensor_config(t, rowwise=True, columnwise=True)
                                        for t in ("weight", "input", "grad"))
    return LabRecipe(display_name(ALIASES.get(name, name)), recipe_summary(name), weight, activation, gradient)


# The NVFP4 features the lab sweeps (the backward-mode and per-token-gradient features change no
# format it measures, or are measured by ``nvfp4lab train``).
LAB_FEATURES = ("w2d", "pt", "4o6mae", "4o6mse", "4o6mae448", "4o6mse448", "4o6w", "rht", "sr")
CATALOGUE: dict[str, LabRecipe] = {
    r.name: r for r in map(lab_recipe, ["bf16", "mxfp8", "mxfp8-hybrid", *nvfp4_recipe_names(LAB_FEATURES)])
}

# What `nvfp4lab lab` runs without --recipes: the baselines, each NVFP4 feature alone, every 4over6
# variant, and TE's default with and without 4over6 weights (sized to finish in < 3 min on 2 CPU cores).
DEFAULT_RECIPES = (
    "bf16", "mxfp8", "nvfp4", "nvfp4-w2d", "nvfp4-pt", "nvfp4-rht", "nvfp4-sr",
    "nvfp4-4o6mae", "nvfp4-4o6mse", "nvfp4-4o6mae448", "nvfp4-4o6mse448",
    "te", "nvfp4-w2d-4o6w-rht-sr",
)


def split_names(names, defaults) -> list[str]:
    """Recipe names as the CLI and the API take them (one string, or items that may each hold a
    comma-separated list; None means ``defaults``) -> a flat list of names."""
    if names is None:
        names = list(defaults)
    elif isinstance(names, str):
        names = [names]
    return [n.strip() for item in names for n in str(item).split(",") if n.strip()]


def resolve_recipes(names=None) -> list[LabRecipe]:
    """Names (or comma-separated lists of names) -> recipes, in the given order, duplicates dropped.

    None -> :data:`DEFAULT_RECIPES`; "all" -> the whole catalogue. ValueError names the unknown ones.
    """
    flat = split_names(names, DEFAULT_RECIPES)
    if not flat:
        raise ValueError("no recipe named; use 'list' to see the catalogue")
    if "all" in flat:
        return list(CATALOGUE.values())
    out, unknown = [], []
    for n in flat:
        key = display_name(ALIASES.get(n, n))
        if key not in CATALOGUE:
            unknown.append(n)
        elif CATALOGUE[key] not in out:
            out.append(CATALOGUE[key])
    if unknown:
        known = [*CATALOGUE, *ALIASES.values()]
        hints = [f"{n} -> did you mean {', '.join(close)}?" for n in unknown if (close := difflib.get_close_matches(n, known, n=3))]
        raise ValueError(f"unknown recipe(s): {', '.join(unknown)}. "
                         + (" ".join(hints) + " " if hints else "")
                         + f"{len(CATALOGUE)} recipes are known (e.g. {', '.join(DEFAULT_RECIPES[:4])}, te) or 'all'; "
                         "`nvfp4lab lab --list-recipes` lists them")
    return out


def catalogue_lines() -> list[str]:
    """One line per catalogue recipe: name, default marker, summary."""
    width = max(len(n) for n in CATALOGUE)
    lines = [f"{'name':<{width}}  default  summary"]
    for name, recipe in CATALOGUE.items():
        mark = "   *   " if name in DEFAULT_RECIPES else "       "
        lines.append(f"{name:<{width}}  {mark}  {recipe.summary}")
    lines.append(f"({len(CATALOGUE)} recipes; '*' = run by default; 'all' runs every one; "
                 f"'{ALIASES['te']}' is an alias of 'te')")
    return lines
