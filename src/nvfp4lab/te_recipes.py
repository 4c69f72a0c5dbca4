"""TransformerEngine's recipe classes under TE's own names: what a TE user writes, mapped to
:class:`nvfp4lab.NVFP4Recipe`.

* :class:`NVFP4BlockScaling`: TE main's fields and defaults (``common/recipe/__init__.py`` @ d0067d0da)
  with the environment unset: ``disable_rht``, ``disable_stochastic_rounding``,
  ``disable_2d_quantization``, ``row_scaled_activation``, ``nvfp4_4over6``,
  ``nvfp4_4over6_e4m3_use_256``, ``nvfp4_4over6_err_mode``, ``fp4_format``, ``fp8_format``,
  ``fp8_dpa``, ``fp8_mha``, ``backward_override``.
* :class:`NVFP4PerTokenBlockScaling`: open PR 3045's subclass (seed 001), adding ``per_token_rht``,
  ``per_token_sr`` and ``per_token_weight_2d`` (all False): x, W and dy per token with the PR's
  numerics, RHT and SR off unless opted in. The PR forces ``disable_rht = not per_token_rht``,
  ``disable_stochastic_rounding = not per_token_sr``, ``disable_2d_quantization = True``,
  ``row_scaled_activation = False`` and ``nvfp4_4over6 = "none"``; here those fields default to what
  the PR forces and an explicit contrary value raises ValueError instead of being overwritten.

TE reads its environment in the dataclass defaults; here the defaults are plain values and only
``from_env`` reads variables, with TE's parsing: a boolean is on only for the exact string "1" ("0"
and "" are off; any other value, which TE would silently read as off, raises ValueError here),
``NVTE_NVFP4_4OVER6*`` must be one of none / weights / activations / all (case-sensitive, as TE's
assert), ``NVTE_NVFP4_4OVER6_ERR_MODE`` is upper-cased then MAE or MSE, ``NVTE_BACKWARD_OVERRIDE``
is high_precision or dequantized. ``NVTE_NVFP4_PER_TOKEN=1`` turns ``NVFP4BlockScaling.from_env`` into
the PR's per-token recipe, as the PR does.

Both classes are frozen and validated at construction, including the rules of the
:class:`~nvfp4lab.NVFP4Recipe` they map to (:meth:`to_recipe`); :func:`from_recipe_fields` maps back
(``NVFP4Recipe.to_te``) and the repr spells the TE constructor. Every nvfp4lab layer, ``convert`` and
``autocast`` accept them where they take a recipe. This module sits below :mod:`nvfp4lab.recipes`,
which registers the NVFP4Recipe class here (:func:`register_recipe_class`).
"""
from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass
from typing import Mapping, Optional

TE_RHT_SIGN_MASK = 0xD7E8  # TE's fixed wgrad sign vector (the only mask TE's recipes use)
SCOPES = ("none", "weights", "activations", "all")
ERR_MODES = ("MAE", "MSE")
BACKWARD_OVERRIDES = (None, "high_precision", "dequantized")


class Format(enum.Enum):
    """TE's ``Format`` values that its NVFP4 recipe accepts (E2M1 data, E4M3 scales) and the others."""

    E2M1 = "E2M1"
    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"


_RECIPE_CLASS: list = []  # [NVFP4Recipe], registered by nvfp4lab.recipes (this module cannot import it)


def register_recipe_class(cls) -> None:
    """Called once by :mod:`nvfp4lab.recipes`: the class :meth:`NVFP4BlockScaling.to_recipe` builds."""
    _RECIPE_CLASS[:] = [cls]


# ------------------------------------------------------------------------- TE's env parsing
def env_flag(env: Mapping[str, str], name: str) -> Optional[bool]:
    """TE's ``os.getenv(name, "0") == "1"``: None when unset, True for "1", False for "0" or "";
    ValueError for any other value (TE would read it as off without a word)."""
    raw = env.get(name)
    if raw is None:
        return None
    if raw not in ("0", "1", ""):
        raise ValueError(f"environment variable {name}={raw!r}: TE reads only the exact string '1' as on "
                         "(anything else as off); set it to 1 or 0")
    return raw == "1"


def env_scope(env: Mapping[str, str], name: str) -> Optional[str]:
    """A 4over6 scope variable as TE asserts it: None when unset, else one of :data:`SCOPES` (exact)."""
    raw = env.get(name)
    if raw is None:
        return None
    if raw not in SCOPES:
        raise ValueError(f"environment variable {name} must be one of {', '.join(SCOPES)} (TE's exact spelling), got {raw!r}")
    return raw


def env_err_mode(env: Mapping[str, str]) -> Optional[str]:
    """``NVTE_NVFP4_4OVER6_ERR_MODE`` upper-cased, as TE does: None when unset, else MAE or MSE."""
    raw = env.get("NVTE_NVFP4_4OVER6_ERR_MODE")
    if raw is None:
        return None
    if raw.upper() not in ERR_MODES:
        raise ValueError(f"environment variable NVTE_NVFP4_4OVER6_ERR_MODE must be MAE or MSE, got {raw!r}")
    return raw.upper()


def env_backward_override(env: Mapping[str, str]) -> tuple[bool, Optional[str]]:
    """(set?, value) of ``NVTE_BACKWARD_OVERRIDE``: high_precision or dequantized (TE's assert); unset
    means TE's None (quantized backward)."""
    raw = env.get("NVTE_BACKWARD_OVERRIDE")
    if raw is None:
        return False, None
    if raw not in BACKWARD_OVERRIDES:
        raise ValueError(f"environment variable NVTE_BACKWARD_OVERRIDE must be high_precision or dequantized "
                         f"(unset for TE's default), got {raw!r}")
    return True, raw


def backward_mode(override: Optional[str]) -> str:
    """TE's ``backward_override`` -> :attr:`NVFP4Recipe.backward` (None is the quantized backward)."""
    return "quantized" if override is None else override


def _check_format(name: str, value, want: Format) -> Format:
    if isinstance(value, str) and value in Format.__members__:
        value = Format[value]
    if not isinstance(value, Format):
        raise TypeError(f"{name} must be a Format (or its name), got {type(value).__name__}")
    if value is not want:
        raise ValueError(f"{name} must be Format.{want.name} for NVFP4 (TE: 'Only {want.name} is supported for "
                         f"NVFP4 scaling'), got Format.{value.name}")
    return value


# ---------------------------------------------------------------------------------- classes
@dataclass(frozen=True, repr=False)
class NVFP4BlockScaling:
    """TE's ``NVFP4BlockScaling`` (main), see the module docstring. :meth:`to_recipe` gives the
    :class:`~nvfp4lab.NVFP4Recipe`: weight_2d = not disable_2d_quantization, rht = not disable_rht
    (sign mask 0xD7E8), stochastic_rounding = not disable_stochastic_rounding, per_token_activations =
    row_scaled_activation, four_over_six_scope / _e256_scope = nvfp4_4over6 / nvfp4_4over6_e4m3_use_256
    ("none" -> None), four_over_six_err_mode = nvfp4_4over6_err_mode lower-cased, backward =
    backward_override (None -> "quantized"), swizzled scales. fp8_dpa / fp8_mha must stay False
    (nvfp4lab quantizes Linear layers only)."""

    disable_rht: bool = False
    disable_stochastic_rounding: bool = False
    disable_2d_quantization: bool = False
    row_scaled_activation: bool = False
    nvfp4_4over6: str = "none"
    nvfp4_4over6_e4m3_use_256: str = "all"
    nvfp4_4over6_err_mode: str = "MAE"
    fp4_format: Format = Format.E2M1
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None

    def __post_init__(self):
        self._force_per_token_settings()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("bool", bool) and not isinstance(value, bool):
                raise TypeError(f"{f.name} must be a bool, got {type(value).__name__}")
        object.__setattr__(self, "fp4_format", _check_format("fp4_format", self.fp4_format, Format.E2M1))
        object.__setattr__(self, "fp8_format", _check_format("fp8_format", self.fp8_format, Format.E4M3))
        for name in ("nvfp4_4over6", "nvfp4_4over6_e4m3_use_256"):
            if getattr(self, name) not in SCOPES:
                raise ValueError(f"{name} must be one of {SCOPES}, got {getattr(self, name)!r}")
        if self.nvfp4_4over6_err_mode not in ERR_MODES:
            raise ValueError(f"nvfp4_4over6_err_mode must be one of {ERR_MODES}, got {self.nvfp4_4over6_err_mode!r}")
        if self.backward_override not in BACKWARD_OVERRIDES:
            raise ValueError(f"backward_override must be one of {BACKWARD_OVERRIDES}, got {self.backward_override!r}")
        for name in ("fp8_dpa", "fp8_mha"):
            if getattr(self, name):
                raise ValueError(f"{name}=True: nvfp4lab quantizes Linear layers only (no attention)")
        if _RECIPE_CLASS:  # the rules of the recipe it maps to (TE raises them when it builds the quantizers)
            try:
                self.to_recipe()
            except ValueError as err:
                raise ValueError(f"{self!r} is not a valid recipe: {err}") from None

    def _force_per_token_settings(self) -> None:
        """Nothing on TE main's class (PR 3045's subclass forces its knobs here)."""

    def recipe_fields(self) -> dict:
        """The :class:`~nvfp4lab.NVFP4Recipe` fields this TE recipe stands for (class docstring)."""
        return dict(
            weight_2d=not self.disable_2d_quantization, rht=not self.disable_rht, rht_sign_mask=TE_RHT_SIGN_MASK,
            stochastic_rounding=not self.disable_stochastic_rounding,
            per_token_activations=self.row_scaled_activation, per_token_gradients=False,
            four_over_six_scope=None if self.nvfp4_4over6 == "none" else self.nvfp4_4over6,
            four_over_six_err_mode=self.nvfp4_4over6_err_mode.lower(),
            four_over_six_e256_scope=None if self.nvfp4_4over6_e4m3_use_256 == "none" else self.nvfp4_4over6_e4m3_use_256,
            backward=backward_mode(self.backward_override), numerics="te_main",
        )

    def to_recipe(self):
        """The :class:`~nvfp4lab.NVFP4Recipe` of this TE recipe (GEMM-swizzled scales, as TE's)."""
        return _RECIPE_CLASS[0](**self.recipe_fields())

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        """The TE constructor call, non-default fields only (e.g. NVFP4BlockScaling(disable_rht=True))."""
        defaults = type(self)()
        args = [f"{f.name}={_show(getattr(self, f.name))}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(defaults, f.name)]
        return f"{type(self).__name__}({', '.join(args)})"

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "NVFP4BlockScaling":
        """What TE builds from the environment (``os.environ`` by default): ``NVTE_NVFP4_DISABLE_RHT``,
        ``_DISABLE_STOCHASTIC_ROUNDING``, ``_DISABLE_2D_QUANTIZATION``, ``_ROW_SCALED_ACTIVATION``,
        ``NVTE_NVFP4_4OVER6``, ``_4OVER6_E4M3_USE_256``, ``_4OVER6_ERR_MODE``, ``NVTE_BACKWARD_OVERRIDE``
        (TE's parsing, module docstring). ``NVTE_NVFP4_PER_TOKEN=1`` returns PR 3045's
        :class:`NVFP4PerTokenBlockScaling` instead, as that PR's base class turns per-token."""
        env = os.environ if environ is None else environ
        if cls is NVFP4BlockScaling and env_flag(env, "NVTE_NVFP4_PER_TOKEN"):
            return NVFP4PerTokenBlockScaling.from_env(env)
        return cls(**cls._env_fields(env))

    @classmethod
    def _env_fields(cls, env: Mapping[str, str]) -> dict:
        fields = {}
        for name, field in (("NVTE_NVFP4_DISABLE_RHT", "disable_rht"),
                            ("NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING", "disable_stochastic_rounding"),
                            ("NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "disable_2d_quantization"),
                            ("NVTE_NVFP4_ROW_SCALED_ACTIVATION", "row_scaled_activation")):
            value = env_flag(env, name)
            if value is not None:
                fields[field] = value
        for name, field in (("NVTE_NVFP4_4OVER6", "nvfp4_4over6"), ("NVTE_NVFP4_4OVER6_E4M3_USE_256", "nvfp4_4over6_e4m3_use_256")):
            value = env_scope(env, name)
            if value is not None:
                fields[field] = value
        err_mode = env_err_mode(env)
        if err_mode is not None:
            fields["nvfp4_4over6_err_mode"] = err_mode
        is_set, override = env_backward_override(env)
        if is_set:
            fields["backward_override"] = override
        return fields


# the knobs PR 3045 forces on its per-token recipe: field -> the forced value, from the recipe
_PR3045_FORCED = {
    "disable_rht": lambda r: not r.per_token_rht,
    "disable_stochastic_rounding": lambda r: not r.per_token_sr,
    "disable_2d_quantization": lambda r: True,
    "row_scaled_activation": lambda r: False,
    "nvfp4_4over6": lambda r: "none",
}


@dataclass(frozen=True, repr=False)
class NVFP4PerTokenBlockScaling(NVFP4BlockScaling):
    """PR 3045's ``NVFP4PerTokenBlockScaling`` (open PR, head 690ffea4), see the module docstring.

    per_token_rht: RHT on the wgrad copies of x and dy, PR 3045's fp32 transform (no bf16 rounding).
    per_token_sr: stochastic rounding of dy (both copies).
    per_token_weight_2d: W as 16x16 blocks with one per-tensor amax copied into the (N,) / (K,) vectors.

    :meth:`to_recipe`: ``NVFP4Recipe(numerics="te_pr3045", per_token_activations=True,
    per_token_gradients=True, weight_2d=per_token_weight_2d, rht=per_token_rht,
    stochastic_rounding=per_token_sr, backward=...)``. ``disable_rht``, ``disable_stochastic_rounding``,
    ``disable_2d_quantization`` default to None (= the value the PR forces) and
    ``row_scaled_activation`` / ``nvfp4_4over6`` may only keep their forced values.
    """

    disable_rht: Optional[bool] = None
    disable_stochastic_rounding: Optional[bool] = None
    disable_2d_quantization: Optional[bool] = None
    per_token_rht: bool = False
    per_token_sr: bool = False
    per_token_weight_2d: bool = False

    def _force_per_token_settings(self) -> None:
        for name in ("per_token_rht", "per_token_sr", "per_token_weight_2d"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        for name, forced in _PR3045_FORCED.items():
            value, want = getattr(self, name), forced(self)
            if value is not None and value != want:
                raise ValueError(f"NVFP4PerTokenBlockScaling forces {name}={want!r} (PR 3045), got {value!r}; "
                                 "opt into RHT / SR / 2D weights with per_token_rht / per_token_sr / per_token_weight_2d")
            object.__setattr__(self, name, want)

    def recipe_fields(self) -> dict:
        fields = super().recipe_fields()
        fields.update(numerics="te_pr3045", per_token_activations=True, per_token_gradients=True,
                      weight_2d=self.per_token_weight_2d, rht=self.per_token_rht, stochastic_rounding=self.per_token_sr,
                      four_over_six_scope=None)
        return fields

    def replace(self, **changes):
        # the forced knobs follow the per_token_* options unless given
        unforced = {name: None for name in ("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization")}
        return dataclasses.replace(self, **{**unforced, **changes})

    def __repr__(self) -> str:
        defaults = type(self)()
        shown = [f for f in dataclasses.fields(self) if f.name not in _PR3045_FORCED]
        args = [f"{f.name}={_show(getattr(self, f.name))}" for f in shown if getattr(self, f.name) != getattr(defaults, f.name)]
        return f"{type(self).__name__}({', '.join(args)})"

    @classmethod
    def _env_fields(cls, env: Mapping[str, str]) -> dict:
        """PR 3045's variables (``NVTE_NVFP4_PER_TOKEN_RHT`` / ``_SR`` / ``_WEIGHT_2D``) plus TE main's
        that the PR does not force (4over6 E and error mode, backward override); the forced ones are
        read (a malformed value still raises) and then overruled, as in the PR."""
        fields = super()._env_fields(env)
        for name in _PR3045_FORCED:
            fields.pop(name, None)
        for name, field in (("NVTE_NVFP4_PER_TOKEN_RHT", "per_token_rht"), ("NVTE_NVFP4_PER_TOKEN_SR", "per_token_sr"),
                            ("NVTE_NVFP4_PER_TOKEN_WEIGHT_2D", "per_token_weight_2d")):
            value = env_flag(env, name)
            if value is not None:
                fields[field] = value
        return fields


TE_RECIPE_TYPES = (NVFP4BlockScaling, NVFP4PerTokenBlockScaling)


def _show(value) -> str:
    return f"Format.{value.name}" if isinstance(value, Format) else repr(value)


def from_recipe_fields(fields: Mapping) -> NVFP4BlockScaling:
    """The TE recipe of an :class:`~nvfp4lab.NVFP4Recipe`'s fields (``NVFP4Recipe.to_te``); ValueError
    naming what TE's recipes cannot express (per-token gradients with TE main's numerics, an RHT sign
    mask other than 0xD7E8). The scale layout is nvfp4lab's storage choice and not part of it."""
    f = dict(fields)
    problems = []
    if f["rht"] and f["rht_sign_mask"] != TE_RHT_SIGN_MASK:
        problems.append(f"rht_sign_mask={f['rht_sign_mask']:#06x} (TE's recipes use 0xD7E8)")
    common = dict(nvfp4_4over6_err_mode=f["four_over_six_err_mode"].upper(),
                  nvfp4_4over6_e4m3_use_256=f["four_over_six_e256_scope"] or "none",
                  backward_override=None if f["backward"] == "quantized" else f["backward"])
    if f["numerics"] == "te_pr3045":
        if problems:
            raise ValueError(f"no TE recipe expresses {', '.join(problems)}")
        return NVFP4PerTokenBlockScaling(per_token_rht=f["rht"], per_token_sr=f["stochastic_rounding"],
                                         per_token_weight_2d=f["weight_2d"], **common)
    if f["per_token_gradients"]:
        problems.append("per_token_gradients=True with TE main's numerics (TE main's row-scaled mode covers "
                        "forward activations only; PR 3045's recipe is numerics='te_pr3045')")
    if problems:
        raise ValueError(f"no TE recipe expresses {', '.join(problems)}")
    return NVFP4BlockScaling(disable_rht=not f["rht"], disable_stochastic_rounding=not f["stochastic_rounding"],
                             disable_2d_quantization=not f["weight_2d"], row_scaled_activation=f["per_token_activations"],
                             nvfp4_4over6=f["four_over_six_scope"] or "none", **common)
