"""The lab's recipe catalogue: named sets of per-role quantization formats.

A recipe says how each of the three tensors of a Linear layer is stored for its GEMMs (spec section 4):

    weight W      rowwise copy -> fprop (y = x W^T)       columnwise copy -> dgrad (dx = dy W)
    activation x  rowwise copy -> fprop                    columnwise copy -> wgrad (dW = dy^T x)
    gradient dy   rowwise copy -> dgrad                    columnwise copy -> wgrad

Every role therefore needs both copies in training, so each role's format asks for rowwise and
columnwise outputs; :meth:`LabRecipe.fprop_formats` narrows weight and activation to the rowwise copy
the forward pass reads. The formats are plain :class:`NVFP4QuantConfig` / :class:`MXFP8QuantConfig`
(or :class:`BF16Format` for the unquantized baseline), so a recipe maps one-to-one onto a later
``NVFP4Recipe`` (weight / input / grad quantizers).

NVFP4 recipes are built from features, and named ``nvfp4`` followed by them in this fixed order:

    w2d        16x16 weight blocks (one scale per tile, shared by both weight copies)
    pt         per-token (row-scaled) activations: one amax per token row (per column for the
               columnwise copy)
    4o6mae ... 4over6 on weights and activations (never gradients): 4o6mae, 4o6mse (E = 256),
               4o6mae448, 4o6mse448 (E = 448); 4o6w is MAE, E = 256 on the weights only
    rht        random Hadamard transform on the wgrad operands (columnwise x and dy)
    sr         stochastic rounding of the gradients (both copies)

``te`` is TE's default NVFP4BlockScaling recipe (2D weights, RHT on wgrad, SR on gradients), i.e.
``nvfp4-w2d-rht-sr``, which is accepted as an alias.
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
from dataclasses import dataclass
from typing import Optional, Union

from ..config import MXFP8QuantConfig, NVFP4QuantConfig


@dataclass(frozen=True)
class BF16Format:
    """No block scaling: the tensor is rounded to bfloat16 (what a BF16 training run feeds its GEMMs)."""

    rowwise: bool = True
    columnwise: bool = True


TensorFormat = Union[NVFP4QuantConfig, MXFP8QuantConfig, BF16Format]
ROLES = ("weight", "activation", "gradient")


@dataclass(frozen=True)
class LabRecipe:
    name: str
    summary: str
    weight: TensorFormat
    activation: TensorFormat
    gradient: TensorFormat

    def format_of(self, role: str) -> TensorFormat:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        return getattr(self, role)

    def fprop_formats(self) -> tuple[TensorFormat, TensorFormat]:
        """(activation, weight) formats with only the rowwise copy, the operands of y = x W^T."""
        return _rowwise_only(self.activation), _rowwise_only(self.weight)

    def describe(self) -> dict:
        """JSON-friendly view of the three formats."""
        return {role: describe_format(self.format_of(role)) for role in ROLES}


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
    out["e4m3_max"] = fmt.e4m3_max
    return out


# ------------------------------------------------------------------------------ NVFP4 features
# name -> (error mode, E, applies to activations too). 4o6w keeps activations plain so that their
# columnwise copy can take the RHT (TE rejects RHT together with 4over6 on the same tensor).
FOUR_OVER_SIX_VARIANTS = {
    "4o6mae": ("mae", 256.0, True),
    "4o6mse": ("mse", 256.0, True),
    "4o6mae448": ("mae", 448.0, True),
    "4o6mse448": ("mse", 448.0, True),
    "4o6w": ("mae", 256.0, False),
}
NVFP4_FEATURES = ("w2d", "pt", *FOUR_OVER_SIX_VARIANTS, "rht", "sr")
_FEATURE_TEXT = {
    "w2d": "16x16 weights",
    "pt": "per-token activations",
    "4o6mae": "4over6 MAE E=256 on W and x",
    "4o6mse": "4over6 MSE E=256 on W and x",
    "4o6mae448": "4over6 MAE E=448 on W and x",
    "4o6mse448": "4over6 MSE E=448 on W and x",
    "4o6w": "4over6 MAE E=256 on W only",
    "rht": "RHT on wgrad operands",
    "sr": "SR on gradients",
}


def nvfp4_recipe(features=(), name: Optional[str] = None) -> LabRecipe:
    """Build the NVFP4 recipe with the given features (see the module docstring); ValueError when the
    features cannot be combined."""
    features = tuple(features)
    unknown = [f for f in features if f not in NVFP4_FEATURES]
    if unknown:
        raise ValueError(f"unknown NVFP4 feature(s) {unknown}; known: {', '.join(NVFP4_FEATURES)}")
    if len(set(features)) != len(features):
        raise ValueError(f"repeated NVFP4 feature in {list(features)}")
    fos = [f for f in features if f in FOUR_OVER_SIX_VARIANTS]
    if len(fos) > 1:
        raise ValueError(f"pick one 4over6 variant, got {fos}")
    fos_mode, fos_e, fos_on_x = FOUR_OVER_SIX_VARIANTS[fos[0]] if fos else (None, None, False)
    w2d, pt, rht, sr = ("w2d" in features), ("pt" in features), ("rht" in features), ("sr" in features)
    # The wgrad GEMM contracts over tokens; an RHT along tokens cancels only when both operands carry
    # it (H H^T = I), so RHT must be on x's and dy's columnwise copies together, and x's copy can
    # take it only when x is neither per-token nor 4over6 (TE rejects both combinations).
    if rht and pt:
        raise ValueError("features 'rht' and 'pt' cannot be combined: per-token activations do not take the RHT, "
                         "and the wgrad RHT must be applied to both x and dy to cancel")
    if rht and fos_on_x:
        raise ValueError(f"features 'rht' and '{fos[0]}' cannot be combined: 4over6 activations do not take the RHT "
                         "(use '4o6w', 4over6 on weights only)")
    both = dict(rowwise=True, columnwise=True)
    weight = NVFP4QuantConfig(block="16x16" if w2d else "1x16", four_over_six=fos_mode, e4m3_max=fos_e, **both)
    activation = NVFP4QuantConfig(per_token=pt, rht=rht, four_over_six=fos_mode if fos_on_x else None,
                                  e4m3_max=fos_e if fos_on_x else None, **both)
    gradient = NVFP4QuantConfig(rht=rht, stochastic_rounding=sr, **both)
    ordered = [f for f in NVFP4_FEATURES if f in features]
    canonical = "-".join(["nvfp4", *ordered])
    summary = "NVFP4 1x16 per-tensor, round-to-nearest" if not ordered else "NVFP4 + " + ", ".join(_FEATURE_TEXT[f] for f in ordered)
    if canonical == TE_CANONICAL:
        summary = "TE default NVFP4BlockScaling: 16x16 weights, RHT on wgrad operands, SR on gradients"
    return LabRecipe(name or canonical, summary, weight, activation, gradient)


TE_CANONICAL = "nvfp4-w2d-rht-sr"
ALIASES = {TE_CANONICAL: "te"}  # canonical name -> catalogue name


def _build_catalogue() -> dict[str, LabRecipe]:
    both = dict(rowwise=True, columnwise=True)
    recipes = [
        LabRecipe("bf16", "BF16 baseline (no block scaling)", BF16Format(), BF16Format(), BF16Format()),
        LabRecipe("mxfp8", "MXFP8 E4M3, 1x32 blocks, E8M0 scales", *(MXFP8QuantConfig(**both),) * 3),
        LabRecipe("mxfp8-hybrid", "MXFP8, E4M3 weights/activations, E5M2 gradients (TE Format.HYBRID)",
                  MXFP8QuantConfig(**both), MXFP8QuantConfig(**both), MXFP8QuantConfig(fp8_format="e5m2", **both)),
    ]
    fos_choices = [None, *FOUR_OVER_SIX_VARIANTS]
    combos = []
    for w2d, pt, fos, rht, sr in itertools.product((False, True), (False, True), fos_choices, (False, True), (False, True)):
        features = [f for f, on in (("w2d", w2d), ("pt", pt), (fos, fos is not None), ("rht", rht), ("sr", sr)) if on]
        try:
            recipe = nvfp4_recipe(features)
        except ValueError:
            continue  # not a valid combination
        combos.append((features, recipe))
    # single features first, then pairs, ...; within a size, in feature order
    combos.sort(key=lambda fr: (len(fr[0]), [NVFP4_FEATURES.index(f) for f in fr[0]]))
    for _, recipe in combos:
        recipes.append(dataclasses.replace(recipe, name=ALIASES.get(recipe.name, recipe.name)))
    return {r.name: r for r in recipes}


CATALOGUE: dict[str, LabRecipe] = _build_catalogue()

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
        key = ALIASES.get(n, n)
        if key not in CATALOGUE:
            unknown.append(n)
        elif CATALOGUE[key] not in out:
            out.append(CATALOGUE[key])
    if unknown:
        known = [*CATALOGUE, *ALIASES]
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
                 f"'{TE_CANONICAL}' is an alias of 'te')")
    return lines
