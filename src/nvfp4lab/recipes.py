"""Training recipes: which quantization each operand of a linear layer's three GEMMs gets.

A linear layer runs three TN GEMMs (spec section 4):

    fprop  y  = x W^T      x rowwise         W rowwise
    dgrad  dx = dy W       dy rowwise        W columnwise
    wgrad  dW = dy^T x     dy columnwise     x columnwise     (RHT goes on these two copies)

so each of the three tensors (``"input"`` x, ``"weight"`` W, ``"grad"`` dy) is used in two roles, one
per copy. :meth:`NVFP4Recipe.config_for` maps a role to the :class:`~nvfp4lab.config.NVFP4QuantConfig`
of that copy; :meth:`NVFP4Recipe.tensor_config` gives the config that produces both copies of a tensor
in one quantize call (one read of the tensor).

Recipes are frozen dataclasses validated at construction. Named presets build the common ones; the
environment override layer (:meth:`NVFP4Recipe.from_env`) is explicit: no recipe ever reads the
environment unless ``from_env`` is called.

TE's own recipe classes (``NVFP4BlockScaling``, PR 3045's ``NVFP4PerTokenBlockScaling``, with TE's field
names) live in :mod:`nvfp4lab.te_recipes`; :func:`resolve_recipe` accepts them and
:meth:`NVFP4Recipe.from_te` / :meth:`NVFP4Recipe.to_te` map between the two.

Recipe names (the one registry, as torchao's ``Float8LinearRecipeName`` / ``from_recipe_name``): every
catalogue (``nvfp4lab lab``, ``nvfp4lab train``) is a list of names that :func:`from_recipe_name` turns
into a recipe. A name is ``bf16`` (no quantization), ``mxfp8``, ``mxfp8-hybrid``, or ``nvfp4`` followed
by features from :data:`NVFP4_FEATURES`, in that order (e.g. ``nvfp4-w2d-rht-sr``); ``te`` is TE's
default NVFP4BlockScaling, ``nvfp4-w2d-rht-sr``.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass
from typing import Mapping, Optional, Union

from . import te_recipes
from .config import NUMERICS, SCALE_LAYOUTS, HashOnce, MXFP8QuantConfig, NVFP4QuantConfig
from .rht import DEFAULT_RHT_SIGN_MASK
from .te_recipes import TE_RECIPE_TYPES, env_backward_override, env_flag

TENSORS = ("input", "weight", "grad")  # the three tensors of a linear layer: x, W, dy
# role -> (tensor, copy): the operand copies the three GEMMs read (spec section 4)
ROLES = {
    "input_fprop": ("input", "rowwise"),
    "input_wgrad": ("input", "columnwise"),
    "weight_fprop": ("weight", "rowwise"),
    "weight_dgrad": ("weight", "columnwise"),
    "grad_dgrad": ("grad", "rowwise"),
    "grad_wgrad": ("grad", "columnwise"),
}
FOUR_OVER_SIX_SCOPES = (None, "weights", "activations", "all")
FOUR_OVER_SIX_ERR_MODES = ("mae", "mse")
BACKWARD_MODES = ("quantized", "dequantized", "high_precision")


def _in_scope(scope: Optional[str], tensor: str) -> bool:
    """Whether a 4over6 scope covers ``tensor`` (gradients are never covered)."""
    if scope is None or tensor == "grad":
        return False
    return scope == "all" or (scope == "weights") == (tensor == "weight")


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _check_role(role: str) -> tuple[str, str]:
    if role not in ROLES:
        raise ValueError(f"role must be one of {tuple(ROLES)}, got {role!r}")
    return ROLES[role]


def _check_tensor_name(tensor: str) -> None:
    if tensor not in TENSORS:
        raise ValueError(f"tensor must be one of {TENSORS}, got {tensor!r}")


# the variables NVFP4Recipe.from_env reads (its docstring says what each sets)
NVFP4_ENV_VARIABLES = (
    "NVTE_NVFP4_DISABLE_RHT", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING", "NVTE_NVFP4_DISABLE_2D_QUANTIZATION",
    "NVTE_NVFP4_ROW_SCALED_ACTIVATION", "NVTE_NVFP4_PER_TOKEN_ACTIVATION", "NVFP4LAB_PER_TOKEN_GRADIENTS",
    "NVTE_NVFP4_4OVER6", "NVTE_NVFP4_4OVER6_ERR_MODE", "NVTE_NVFP4_4OVER6_E4M3_USE_256", "NVTE_BACKWARD_OVERRIDE",
    "NVFP4LAB_RHT_SIGN_MASK", "NVTE_NVFP4_PER_TOKEN", "NVTE_NVFP4_PER_TOKEN_RHT", "NVTE_NVFP4_PER_TOKEN_SR",
    "NVTE_NVFP4_PER_TOKEN_WEIGHT_2D",
)


@dataclass(frozen=True)
class NVFP4Recipe(HashOnce):
    """NVFP4 training recipe (TE's ``NVFP4BlockScaling`` options plus the seeds').

    weight_2d: weights use 16x16 blocks (one scale per tile, shared by both copies); else 1x16.
        With TE main's per-token activations the weight stays per tensor (its scalar amax works
        unchanged against a per-token operand in :func:`nvfp4lab.nvfp4_gemm`).
    rht: random Hadamard transform on the wgrad operands (columnwise copies of input and grad), with
        sign mask ``rht_sign_mask`` (TE's fixed 0xD7E8).
    stochastic_rounding: stochastic rounding of the gradient (both copies). Never on input or weight.
    per_token_activations: one amax per row of x (rowwise copy) and per column of x (columnwise copy);
        TE main's ``row_scaled_activation`` (seed 000).
    per_token_gradients: the same for dy (an nvfp4lab option with TE main's numerics).
    numerics: "te_main", or "te_pr3045" for PR 3045's per-token recipe (seed 001,
        ``NVFP4PerTokenBlockScaling``): x, W and dy all per token (amax (M,)/(K,) for x, (N,)/(K,) for
        W, (M,)/(N,) for dy) with that PR's cast numerics (:class:`NVFP4QuantConfig`) and GEMM epilogue
        order; weight_2d is then its 2D weight (16x16 blocks, the per-tensor amax copied into the
        vectors), rht its fp32 RHT on the wgrad copies, stochastic_rounding SR on dy. Needs
        per_token_activations and per_token_gradients, no 4over6.
    four_over_six_scope: 4over6 scope, None / "weights" / "activations" / "all". Never on gradients.
    four_over_six_err_mode: "mae" (TE's default) or "mse" (fouroversix's default).
    four_over_six_e256_scope: which 4over6 tensors use E = 256 as the global-scale constant (the
        others 448); TE's ``nvfp4_4over6_e4m3_use_256``, default "all". Tensors without 4over6
        always use 448.
    backward: "quantized" (NVFP4 dgrad and wgrad GEMMs), "dequantized" (the backward GEMMs run in
        high precision on the dequantized forward operands, dy unquantized) or "high_precision"
        (the backward GEMMs run on the original x and W). TE's ``NVTE_BACKWARD_OVERRIDE``. rht,
        stochastic_rounding and the input's columnwise copy only act in "quantized" mode.
    scale_layout: block-scale layout of every quantized operand ("swizzled" = cuBLAS GEMM order).

    Rules (ValueError at construction): 4over6 never on gradients; with TE main's numerics RHT excludes
    per-token on the tensor that carries it (input or grad), and per_token_gradients needs
    backward="quantized"; RHT excludes 4over6 on activations; "te_pr3045" as above; every role's
    config must satisfy :class:`NVFP4QuantConfig`'s rules.
    """

    weight_2d: bool = True
    rht: bool = True
    rht_sign_mask: int = DEFAULT_RHT_SIGN_MASK
    stochastic_rounding: bool = True
    per_token_activations: bool = False
    per_token_gradients: bool = False
    four_over_six_scope: Optional[str] = None
    four_over_six_err_mode: str = "mae"
    four_over_six_e256_scope: Optional[str] = "all"
    backward: str = "quantized"
    scale_layout: str = "swizzled"
    numerics: str = "te_main"

    def __post_init__(self):
        for name in ("weight_2d", "rht", "stochastic_rounding", "per_token_activations", "per_token_gradients"):
            _check_bool(name, getattr(self, name))
        if isinstance(self.rht_sign_mask, bool) or not isinstance(self.rht_sign_mask, int) or not 0 <= self.rht_sign_mask < (1 << 16):
            raise ValueError(f"rht_sign_mask must be a 16-bit integer, got {self.rht_sign_mask!r}")
        if self.four_over_six_scope in ("grad", "grads", "gradients"):
            raise ValueError(f"four_over_six_scope={self.four_over_six_scope!r}: 4over6 is never applied to gradients "
                             f"(scopes: {FOUR_OVER_SIX_SCOPES})")
        if self.four_over_six_scope not in FOUR_OVER_SIX_SCOPES:
            raise ValueError(f"four_over_six_scope must be one of {FOUR_OVER_SIX_SCOPES}, got {self.four_over_six_scope!r}")
        if self.four_over_six_err_mode not in FOUR_OVER_SIX_ERR_MODES:
            raise ValueError(f"four_over_six_err_mode must be one of {FOUR_OVER_SIX_ERR_MODES}, got {self.four_over_six_err_mode!r}")
        if self.four_over_six_e256_scope not in FOUR_OVER_SIX_SCOPES:
            raise ValueError(f"four_over_six_e256_scope must be one of {FOUR_OVER_SIX_SCOPES}, got {self.four_over_six_e256_scope!r}")
        if self.backward not in BACKWARD_MODES:
            raise ValueError(f"backward must be one of {BACKWARD_MODES}, got {self.backward!r}")
        if self.scale_layout not in SCALE_LAYOUTS:
            raise ValueError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {self.scale_layout!r}")
        if self.numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, got {self.numerics!r}")
        main = self.numerics == "te_main"
        rules = [
            (main and self.rht and self.per_token_activations, "rht and per_token_activations",
             "TE main's per-token NVFP4 does not take RHT, and the input's columnwise (wgrad) copy is per-token too "
             "(PR 3045's recipe does: numerics='te_pr3045')"),
            (main and self.rht and self.per_token_gradients, "rht and per_token_gradients",
             "TE main's per-token NVFP4 does not take RHT, and the gradient's columnwise (wgrad) copy is per-token too "
             "(PR 3045's recipe does: numerics='te_pr3045')"),
            (self.rht and _in_scope(self.four_over_six_scope, "input"), f"rht and four_over_six_scope={self.four_over_six_scope!r}",
             "TE rejects RHT with 4over6, and the input's columnwise copy would need both"),
            (main and self.per_token_gradients and self.backward != "quantized", f"per_token_gradients and backward={self.backward!r}",
             "gradients are only quantized with backward='quantized'"),
            (not main and not (self.per_token_activations and self.per_token_gradients),
             "numerics='te_pr3045' without per_token_activations and per_token_gradients",
             "PR 3045's recipe quantizes x, W and dy per token"),
            (not main and self.four_over_six_scope is not None,
             f"numerics='te_pr3045' and four_over_six_scope={self.four_over_six_scope!r}", "PR 3045 forces 4over6 off"),
        ]
        for bad, names, why in rules:
            if bad:
                raise ValueError(f"incompatible recipe options {names}: {why}")
        for tensor in TENSORS:  # every role must be a valid NVFP4QuantConfig
            try:
                self.tensor_config(tensor, rowwise=True, columnwise=True)
            except ValueError as err:
                raise ValueError(f"recipe gives the {tensor!r} tensor an invalid config: {err}") from None

    __hash__ = HashOnce.__hash__

    # ------------------------------------------------------------------------------- presets
    @classmethod
    def te_default(cls, **overrides) -> "NVFP4Recipe":
        """TE's ``NVFP4BlockScaling()`` defaults: 16x16 weights, RHT on the wgrad operands, stochastic
        rounding of gradients, per-tensor amax everywhere, E = 448."""
        return cls(**overrides)

    @classmethod
    def per_token(cls, *, gradients: bool = False, **overrides) -> "NVFP4Recipe":
        """Per-token activations (TE main's row-scaled activation, seed 000, i.e.
        ``NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True)``) with per-tensor 16x16
        weights and stochastic rounding of gradients; RHT off (TE main's per-token NVFP4 does not take
        it). ``gradients=True`` also makes dy per-token (an nvfp4lab option; PR 3045's recipe, with its
        own numerics, is :meth:`pr3045`)."""
        base = dict(rht=False, per_token_activations=True, per_token_gradients=gradients)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def pr3045(cls, **overrides) -> "NVFP4Recipe":
        """PR 3045's ``NVFP4PerTokenBlockScaling()`` (seed 001): x, W and dy per token with that PR's
        numerics, 1x16 weights, RHT and SR off (``weight_2d``, ``rht``, ``stochastic_rounding`` are its
        ``per_token_weight_2d``, ``per_token_rht``, ``per_token_sr``)."""
        base = dict(numerics="te_pr3045", weight_2d=False, rht=False, stochastic_rounding=False,
                    per_token_activations=True, per_token_gradients=True)
        base.update(overrides)
        return cls(**base)

    @classmethod
    def from_te(cls, te_recipe) -> "NVFP4Recipe":
        """The recipe of a TE-named one (:class:`nvfp4lab.NVFP4BlockScaling`,
        :class:`nvfp4lab.NVFP4PerTokenBlockScaling`)."""
        if not isinstance(te_recipe, TE_RECIPE_TYPES):
            raise TypeError(f"te_recipe must be an NVFP4BlockScaling or NVFP4PerTokenBlockScaling, got {type(te_recipe).__name__}")
        return te_recipe.to_recipe()

    def to_te(self):
        """This recipe under TE's names (an :class:`nvfp4lab.NVFP4BlockScaling` or
        :class:`nvfp4lab.NVFP4PerTokenBlockScaling`); ValueError naming what TE cannot express. The
        scale layout is not part of it (TE's GEMM takes swizzled scales)."""
        return te_recipes.from_recipe_fields(dataclasses.asdict(self))

    @classmethod
    def four_over_six(cls, scope: str = "all", err_mode: str = "mae", **overrides) -> "NVFP4Recipe":
        """4over6 (PR 2972) on ``scope`` with TE's MAE error and E = 256 for the 4over6 tensors;
        16x16 weights and stochastic rounding of gradients stay on. RHT is off when the scope covers
        activations (TE rejects RHT with 4over6), else on."""
        base = dict(four_over_six_scope=scope, four_over_six_err_mode=err_mode, rht=not _in_scope(scope, "input"))
        base.update(overrides)
        return cls(**base)

    # --------------------------------------------------------------------------- role -> config
    def tensor_config(self, tensor: str, *, rowwise: bool = True, columnwise: bool = False) -> NVFP4QuantConfig:
        """The config quantizing ``tensor`` ("input", "weight" or "grad") to the requested copies in
        one call. RHT is set only when the columnwise copy is requested (it only acts there)."""
        _check_tensor_name(tensor)
        four_over_six = self.four_over_six_err_mode if _in_scope(self.four_over_six_scope, tensor) else None
        e4m3_max = 448.0
        if four_over_six is not None and _in_scope(self.four_over_six_e256_scope, tensor):
            e4m3_max = 256.0
        if tensor == "weight":  # per tensor with TE main's numerics, per token with PR 3045's
            options = dict(block="16x16" if self.weight_2d else "1x16", per_token=self.numerics == "te_pr3045")
        elif tensor == "input":
            options = dict(per_token=self.per_token_activations, rht=self.rht and columnwise)
        else:
            options = dict(per_token=self.per_token_gradients, rht=self.rht and columnwise,
                           stochastic_rounding=self.stochastic_rounding)
        return NVFP4QuantConfig(
            rowwise=rowwise, columnwise=columnwise, four_over_six=four_over_six, e4m3_max=e4m3_max,
            rht_sign_mask=self.rht_sign_mask, scale_layout=self.scale_layout, numerics=self.numerics, **options,
        )

    def config_for(self, role: str) -> NVFP4QuantConfig:
        """The config of one GEMM operand copy; ``role`` is one of :data:`ROLES`
        (e.g. "input_fprop" = x rowwise, "grad_wgrad" = dy columnwise)."""
        tensor, copy = _check_role(role)
        return self.tensor_config(tensor, rowwise=copy == "rowwise", columnwise=copy == "columnwise")

    # ------------------------------------------------------------------------- environment layer
    @classmethod
    def from_env(cls, base: Optional["NVFP4Recipe"] = None, environ: Optional[Mapping[str, str]] = None) -> "NVFP4Recipe":
        """``base`` (default :meth:`te_default`) with the overrides set in ``environ`` (default
        ``os.environ``). Only this method reads the environment; values are parsed as TE parses them
        (:mod:`nvfp4lab.te_recipes`: a switch is on only for "1", off for "0" or "", any other value
        raises). Variables (unset = keep ``base``):

        ========================================  ======================================================
        NVTE_NVFP4_DISABLE_RHT=0|1                rht = not value
        NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING    stochastic_rounding = not value
        NVTE_NVFP4_DISABLE_2D_QUANTIZATION        weight_2d = not value
        NVTE_NVFP4_ROW_SCALED_ACTIVATION=0|1      per_token_activations (TE main)
        NVTE_NVFP4_PER_TOKEN_ACTIVATION=0|1       per_token_activations (PR 2931's name)
        NVFP4LAB_PER_TOKEN_GRADIENTS=0|1          per_token_gradients (no TE name)
        NVTE_NVFP4_4OVER6=none|weights|activations|all           four_over_six_scope
        NVTE_NVFP4_4OVER6_ERR_MODE=MAE|MSE (any case)            four_over_six_err_mode
        NVTE_NVFP4_4OVER6_E4M3_USE_256=none|weights|activations|all  four_over_six_e256_scope
        NVTE_BACKWARD_OVERRIDE=dequantized|high_precision        backward (unset: keep base)
        NVFP4LAB_RHT_SIGN_MASK=<int, e.g. 0xD7E8>                rht_sign_mask (no TE name)
        NVTE_NVFP4_PER_TOKEN=1                    PR 3045's recipe (:meth:`pr3045`), as that PR's
                                                  env switch: then NVTE_NVFP4_PER_TOKEN_RHT / _SR /
                                                  _WEIGHT_2D set rht / stochastic_rounding / weight_2d
                                                  (default off), and the knobs the PR forces
                                                  (DISABLE_*, ROW_SCALED_ACTIVATION, 4OVER6) are
                                                  overruled as it does
        ========================================  ======================================================

        A ``base`` with PR 3045's numerics reads the PR's variables (and keeps its numerics). An incompatible result raises
        the recipe's ValueError (e.g. per-token activations need NVTE_NVFP4_DISABLE_RHT=1 on top of
        the TE default, as TE's quantizers refuse RHT with row-scaled activations).
        """
        env = os.environ if environ is None else environ
        base = cls.te_default() if base is None else base
        if not isinstance(base, cls):
            raise TypeError(f"base must be an {cls.__name__} or None, got {type(base).__name__}")
        changes: dict = {}
        te = te_recipes.NVFP4BlockScaling._env_fields(env)  # TE main's variables, TE's parsing
        for te_name, field, invert in (("disable_rht", "rht", True), ("disable_stochastic_rounding", "stochastic_rounding", True),
                                       ("disable_2d_quantization", "weight_2d", True),
                                       ("row_scaled_activation", "per_token_activations", False)):
            if te_name in te:
                changes[field] = te[te_name] != invert
        for te_name, field in (("nvfp4_4over6", "four_over_six_scope"), ("nvfp4_4over6_e4m3_use_256", "four_over_six_e256_scope")):
            if te_name in te:
                changes[field] = None if te[te_name] == "none" else te[te_name]
        if "nvfp4_4over6_err_mode" in te:
            changes["four_over_six_err_mode"] = te["nvfp4_4over6_err_mode"].lower()
        if "backward_override" in te:
            changes["backward"] = te_recipes.backward_mode(te["backward_override"])
        for name, field in (("NVTE_NVFP4_PER_TOKEN_ACTIVATION", "per_token_activations"),
                            ("NVFP4LAB_PER_TOKEN_GRADIENTS", "per_token_gradients")):
            value = env_flag(env, name)
            if value is not None:
                changes[field] = changes.get(field, False) or value
        raw = env.get("NVFP4LAB_RHT_SIGN_MASK")
        if raw:
            try:
                changes["rht_sign_mask"] = int(raw, 0)
            except ValueError:
                raise ValueError(f"environment variable NVFP4LAB_RHT_SIGN_MASK must be an integer, got {raw!r}") from None
        per_token = env_flag(env, "NVTE_NVFP4_PER_TOKEN")
        if per_token or base.numerics == "te_pr3045":  # (the PR's subclass ignores NVTE_NVFP4_PER_TOKEN=0)
            pt = te_recipes.NVFP4PerTokenBlockScaling._env_fields(env)
            keep = {k: v for k, v in changes.items() if k in ("backward", "rht_sign_mask", "four_over_six_err_mode",
                                                                 "four_over_six_e256_scope")}
            if base.numerics != "te_pr3045":  # the PR's switch on a TE main recipe: its defaults
                base = cls.pr3045(backward=base.backward, scale_layout=base.scale_layout, rht_sign_mask=base.rht_sign_mask)
            changes = dict(keep, numerics="te_pr3045", per_token_activations=True, per_token_gradients=True,
                           four_over_six_scope=None)
            for te_name, field in (("per_token_rht", "rht"), ("per_token_sr", "stochastic_rounding"),
                                   ("per_token_weight_2d", "weight_2d")):
                if te_name in pt:
                    changes[field] = pt[te_name]
        try:
            return dataclasses.replace(base, **changes)
        except ValueError as exc:  # name the variables that made the combination
            given = ", ".join(f"{name}={env[name]!r}" for name in NVFP4_ENV_VARIABLES if env.get(name))
            raise ValueError(f"the recipe of the environment ({given or 'no variable set'}) is not valid: {exc}") from None

    def replace(self, **changes) -> "NVFP4Recipe":
        """A copy with ``changes`` applied (validated like a new recipe)."""
        return dataclasses.replace(self, **changes)


def _backward_from_env(env: Mapping[str, str]) -> Optional[str]:
    """NVTE_BACKWARD_OVERRIDE as TE reads it (None: unset, keep the base)."""
    is_set, override = env_backward_override(env)
    return te_recipes.backward_mode(override) if is_set else None


MXFP8_RECIPE_FORMATS = ("e4m3", "hybrid")  # E4M3 everywhere, or E5M2 gradients (TE's Format.HYBRID)


@dataclass(frozen=True)
class MXFP8Recipe(HashOnce):
    """MXFP8 training recipe (TE's ``MXFP8BlockScaling``): E8M0 scales per 32 elements.

    fp8_format: "e4m3" everywhere (TE's default) or "hybrid" (E5M2 gradients).
    backward: as in :class:`NVFP4Recipe`.

    There is no MXFP8 GEMM kernel: every GEMM runs on the dequantized operands in fp32 (exact
    products; only the summation order differs from an MXFP8 tensor-core GEMM) and rounds once to the
    output dtype. Layers need in/out features that are multiples of 32.
    """

    fp8_format: str = "e4m3"
    backward: str = "quantized"
    scale_layout: str = "compact"

    def __post_init__(self):
        if self.fp8_format not in MXFP8_RECIPE_FORMATS:
            raise ValueError(f"fp8_format must be one of {MXFP8_RECIPE_FORMATS}, got {self.fp8_format!r}")
        if self.backward not in BACKWARD_MODES:
            raise ValueError(f"backward must be one of {BACKWARD_MODES}, got {self.backward!r}")
        if self.scale_layout not in SCALE_LAYOUTS:
            raise ValueError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {self.scale_layout!r}")

    __hash__ = HashOnce.__hash__

    @classmethod
    def te_default(cls, **overrides) -> "MXFP8Recipe":
        """TE's ``MXFP8BlockScaling()``: E4M3 for every tensor."""
        return cls(**overrides)

    def tensor_config(self, tensor: str, *, rowwise: bool = True, columnwise: bool = False) -> MXFP8QuantConfig:
        _check_tensor_name(tensor)
        fmt = "e5m2" if (tensor == "grad" and self.fp8_format == "hybrid") else "e4m3"
        return MXFP8QuantConfig(rowwise=rowwise, columnwise=columnwise, fp8_format=fmt, scale_layout=self.scale_layout)

    def config_for(self, role: str) -> MXFP8QuantConfig:
        tensor, copy = _check_role(role)
        return self.tensor_config(tensor, rowwise=copy == "rowwise", columnwise=copy == "columnwise")

    @classmethod
    def from_env(cls, base: Optional["MXFP8Recipe"] = None, environ: Optional[Mapping[str, str]] = None) -> "MXFP8Recipe":
        """``base`` with NVTE_BACKWARD_OVERRIDE applied (the only MXFP8 variable); explicit only."""
        env = os.environ if environ is None else environ
        base = cls.te_default() if base is None else base
        if not isinstance(base, cls):
            raise TypeError(f"base must be an {cls.__name__} or None, got {type(base).__name__}")
        backward = _backward_from_env(env)
        return base if backward is None else dataclasses.replace(base, backward=backward)

    def replace(self, **changes) -> "MXFP8Recipe":
        return dataclasses.replace(self, **changes)


RECIPE_TYPES = (NVFP4Recipe, MXFP8Recipe)
te_recipes.register_recipe_class(NVFP4Recipe)


def resolve_recipe(recipe):
    """A layer's ``recipe`` argument: None means TE's default NVFP4 recipe; a TE-named one
    (:mod:`nvfp4lab.te_recipes`) its :class:`NVFP4Recipe`; anything else must be a recipe."""
    if recipe is None:
        return NVFP4Recipe.te_default()
    if isinstance(recipe, TE_RECIPE_TYPES):
        return recipe.to_recipe()
    if not isinstance(recipe, RECIPE_TYPES):
        raise TypeError(f"recipe must be an NVFP4Recipe, an MXFP8Recipe, an NVFP4BlockScaling / "
                        f"NVFP4PerTokenBlockScaling or None, got {type(recipe).__name__}")
    return recipe


def block_multiple(recipe) -> int:
    """Feature dims (in and out) must be multiples of this for ``recipe``: 16 (NVFP4) or 32 (MXFP8)."""
    return 32 if isinstance(recipe, MXFP8Recipe) else 16


# ------------------------------------------------------------------------------ recipe names
# NVFP4 feature -> (the NVFP4Recipe fields it sets, description). A name lists its features in this
# order; "nvfp4" alone is 1x16 per-tensor round-to-nearest everywhere (no 2D weights, RHT or SR).
NVFP4_FEATURES = {
    "w2d": (dict(weight_2d=True), "16x16 weights"),
    "pt": (dict(per_token_activations=True), "per-token activations"),
    "ptg": (dict(per_token_gradients=True), "per-token gradients"),
    "pr3045": (dict(numerics="te_pr3045", per_token_activations=True, per_token_gradients=True),
               "PR 3045 per-token recipe (x, W, dy per token, its numerics)"),
    "4o6mae": (dict(four_over_six_scope="all", four_over_six_err_mode="mae"), "4over6 MAE E=256 on W and x"),
    "4o6mse": (dict(four_over_six_scope="all", four_over_six_err_mode="mse"), "4over6 MSE E=256 on W and x"),
    "4o6mae448": (dict(four_over_six_scope="all", four_over_six_err_mode="mae", four_over_six_e256_scope=None),
                  "4over6 MAE E=448 on W and x"),
    "4o6mse448": (dict(four_over_six_scope="all", four_over_six_err_mode="mse", four_over_six_e256_scope=None),
                  "4over6 MSE E=448 on W and x"),
    "4o6w": (dict(four_over_six_scope="weights", four_over_six_err_mode="mae"), "4over6 MAE E=256 on W only"),
    "rht": (dict(rht=True), "RHT on wgrad operands"),
    "sr": (dict(stochastic_rounding=True), "SR on gradients"),
    "hpbwd": (dict(backward="high_precision"), "high-precision backward GEMMs"),
    "dqbwd": (dict(backward="dequantized"), "backward GEMMs on dequantized operands"),
}
FOUR_OVER_SIX_FEATURES = tuple(f for f in NVFP4_FEATURES if f.startswith("4o6"))
_NVFP4_BASE = dict(weight_2d=False, rht=False, stochastic_rounding=False)
ALIASES = {"te": "nvfp4-w2d-rht-sr"}  # short name -> full name
_OTHER_RECIPES = {  # name -> (builder, description)
    "bf16": (lambda: None, "BF16 baseline (no block scaling)"),
    "mxfp8": (MXFP8Recipe, "MXFP8 E4M3, 1x32 blocks, E8M0 scales (TE MXFP8BlockScaling)"),
    "mxfp8-hybrid": (lambda: MXFP8Recipe(fp8_format="hybrid"), "MXFP8, E4M3 weights/activations, E5M2 gradients (TE Format.HYBRID)"),
}
TE_SUMMARY = "TE default NVFP4BlockScaling: 16x16 weights, RHT on wgrad operands, SR on gradients"

Recipe = Union[NVFP4Recipe, MXFP8Recipe, None]


def _nvfp4_features(name: str) -> tuple:
    """The features of an NVFP4 recipe name (ValueError for a name that is not one)."""
    parts = name.split("-")
    if parts[0] != "nvfp4":
        raise ValueError(f"unknown recipe {name!r}")
    features = tuple(parts[1:])
    unknown = [f for f in features if f not in NVFP4_FEATURES]
    if unknown:
        raise ValueError(f"recipe {name!r}: unknown NVFP4 feature(s) {unknown}; known: {', '.join(NVFP4_FEATURES)}")
    order = list(NVFP4_FEATURES)
    if list(features) != sorted(set(features), key=order.index):
        canonical = "-".join(["nvfp4", *sorted(set(features), key=order.index)])
        raise ValueError(f"recipe {name!r}: features appear once each, in the order {', '.join(order)} "
                         f"(did you mean {canonical}?)")
    if sum(f in FOUR_OVER_SIX_FEATURES for f in features) > 1:
        raise ValueError(f"recipe {name!r}: pick one 4over6 variant")
    if sum(f in ("hpbwd", "dqbwd") for f in features) > 1:
        raise ValueError(f"recipe {name!r}: pick one backward mode")
    return features


def from_recipe_name(name: str) -> Recipe:
    """The recipe a name stands for (see the module docstring): None for ``bf16``, an
    :class:`MXFP8Recipe` or an :class:`NVFP4Recipe` (swizzled scales, as for training). ValueError for
    an unknown name or features that cannot be combined (the recipe's own rules)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    name = ALIASES.get(name, name)
    if name in _OTHER_RECIPES:
        return _OTHER_RECIPES[name][0]()
    options = dict(_NVFP4_BASE)
    for feature in _nvfp4_features(name):
        options.update(NVFP4_FEATURES[feature][0])
    try:
        return NVFP4Recipe(**options)
    except ValueError as err:
        raise ValueError(f"recipe {name!r}: {err}") from None


def recipe_summary(name: str) -> str:
    """One line saying what the named recipe quantizes how."""
    name = ALIASES.get(name, name)
    if name in _OTHER_RECIPES:
        return _OTHER_RECIPES[name][1]
    if name == ALIASES["te"]:
        return TE_SUMMARY
    features = _nvfp4_features(name)
    if not features:
        return "NVFP4 1x16 per-tensor, round-to-nearest"
    return "NVFP4 + " + ", ".join(NVFP4_FEATURES[f][1] for f in features)


def display_name(name: str) -> str:
    """The short name of a recipe when it has one (``te``), else the name."""
    for short, full in ALIASES.items():
        if name == full:
            return short
    return name


def nvfp4_recipe_names(features) -> list:
    """Every valid NVFP4 recipe name built from a subset of ``features`` (at most one 4over6 variant),
    single features first, then pairs, ...; within a size, in feature order."""
    order = list(NVFP4_FEATURES)
    plain = [f for f in features if f not in FOUR_OVER_SIX_FEATURES]
    fos = [f for f in features if f in FOUR_OVER_SIX_FEATURES]
    names = []
    for choice in [None, *fos]:
        for on in itertools.product((False, True), repeat=len(plain)):
            chosen = [f for f, keep in zip(plain, on) if keep] + ([choice] if choice else [])
            chosen.sort(key=order.index)
            name = "-".join(["nvfp4", *chosen])
            try:
                from_recipe_name(name)
            except ValueError:
                continue
            names.append((len(chosen), [order.index(f) for f in chosen], name))
    return [name for *_, name in sorted(names)]
