"""Quantization options of one tensor, validated once.

:class:`NVFP4QuantConfig` holds every option of an NVFP4 quantization (TE's quantizer flags and the
seeds'); :class:`MXFP8QuantConfig` the MXFP8 ones. Both are frozen and check their own rules at
construction, so every backend (reference, Triton) receives a valid combination.
"""
from __future__ import annotations

import dataclasses
import functools
import numbers
from dataclasses import dataclass
from typing import Optional

import torch

from .rht import DEFAULT_RHT_SIGN_MASK

SCALE_LAYOUTS = ("compact", "padded", "swizzled")
BLOCKS = ("1x16", "16x16")
FOUR_OVER_SIX_MODES = (None, "mae", "mse")
E4M3_MAXES = (448.0, 256.0)
# Whose numerics a quantization follows: TE main's (spec section 3.1, the default) or open PR 3045's
# per-token cast (amax floored at 1e-12 in S_enc, enc = S_enc / s, code 0 in blocks of scale 0).
NUMERICS = ("te_main", "te_pr3045")


class HashOnce:
    """Mixin of the frozen configs and recipes: the hash of their fields is computed at first use and
    kept (they key the launch-plan caches that every eager call looks up), and pickles leave it out
    (string hashes differ between processes). Each class sets ``__hash__ = HashOnce.__hash__`` in its
    body, where ``dataclass`` would otherwise generate one."""

    def __hash__(self) -> int:
        value = self.__dict__.get("_hash")
        if value is None:
            value = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", value)
        return value

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


def _check_bools(config, names) -> None:
    """Each named field of ``config`` is a bool (1, "yes" or a numpy bool would be stored as given)."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class NVFP4QuantConfig(HashOnce):
    """Options of one NVFP4 quantization.

    block: "1x16" (activations, gradients) or "16x16" (weights; one scale per 16x16 tile, shared by the
        rowwise and columnwise outputs).
    rowwise / columnwise: which outputs to produce. Columnwise is the rowwise quantization of x^T.
    per_token: one fp32 amax per row of the matrix being quantized (rows of x for rowwise, columns of x
        for columnwise) instead of one per tensor.
    rht: 16-point random Hadamard transform of the columnwise output (sign mask ``rht_sign_mask``).
    four_over_six: None, "mae" or "mse": pick map-to-4 or map-to-6 block scales by that error.
    e4m3_max: the global-scale constant E (448, or 256 for 4over6). None: 256 with 4over6, else 448.
    stochastic_rounding: round the E2M1 codes stochastically (gradients).
    scale_layout: "compact" (R, C/16) unpadded, "padded" (roundup(R,128), roundup(C/16,4)) zero-padded,
        or "swizzled" (the padded shape holding the cuBLAS 128x4 byte order).
    numerics: "te_main" (TE main, spec 3.1) or "te_pr3045" (TE PR 3045's per-token cast, needs
        per_token): S_enc = fl(2688 / max(amax, 1e-12)), enc = fl(S_enc / s) (0 where s == 0); the
        stored amax stays the raw max |x|; its dequantize and GEMM use that raw amax. With it, ``rht``
        is PR 3045's fp32 transform (no bf16 rounding, :func:`nvfp4lab.rht.apply_rht_fp32`) and
        block="16x16" is its 2D weight: TE main's per-tensor 16x16 cast whose scalar amax is copied into
        the per-token amax vectors.
    """

    block: str = "1x16"
    rowwise: bool = True
    columnwise: bool = False
    per_token: bool = False
    rht: bool = False
    rht_sign_mask: int = DEFAULT_RHT_SIGN_MASK
    four_over_six: Optional[str] = None
    e4m3_max: Optional[float] = None
    stochastic_rounding: bool = False
    scale_layout: str = "compact"
    numerics: str = "te_main"

    def __post_init__(self):
        _check_bools(self, ("rowwise", "columnwise", "per_token", "rht", "stochastic_rounding"))
        if self.numerics not in NUMERICS:
            raise ValueError(f"numerics must be one of {NUMERICS}, got {self.numerics!r}")
        if self.block not in BLOCKS:
            raise ValueError(f"block must be one of {BLOCKS}, got {self.block!r}")
        if not (self.rowwise or self.columnwise):
            raise ValueError("rowwise and columnwise: at least one output must be requested")
        if self.four_over_six not in FOUR_OVER_SIX_MODES:
            raise ValueError(f"four_over_six must be one of {FOUR_OVER_SIX_MODES}, got {self.four_over_six!r}")
        if self.e4m3_max is None:
            object.__setattr__(self, "e4m3_max", 256.0 if self.four_over_six else 448.0)
        if not isinstance(self.e4m3_max, numbers.Real) or isinstance(self.e4m3_max, bool):
            raise TypeError(f"e4m3_max must be a number (448 or 256) or None, got {type(self.e4m3_max).__name__} {self.e4m3_max!r}")
        object.__setattr__(self, "e4m3_max", float(self.e4m3_max))
        if self.e4m3_max not in E4M3_MAXES:
            raise ValueError(f"e4m3_max must be 448 or 256, got {self.e4m3_max}")
        if isinstance(self.rht_sign_mask, bool) or not isinstance(self.rht_sign_mask, int):
            raise TypeError(f"rht_sign_mask must be an int (a 16-bit mask), got {type(self.rht_sign_mask).__name__}")
        if not 0 <= self.rht_sign_mask < (1 << 16):
            raise ValueError(f"rht_sign_mask must be a 16-bit integer, got {self.rht_sign_mask!r}")
        if self.scale_layout not in SCALE_LAYOUTS:
            raise ValueError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {self.scale_layout!r}")
        main = self.numerics == "te_main"
        rules = [
            (not main and not self.per_token, "numerics='te_pr3045' without per_token",
             "PR 3045's numerics are those of its per-token cast"),
            (not main and self.four_over_six is not None, "numerics='te_pr3045' and four_over_six",
             "PR 3045 forces 4over6 off"),
            (not main and self.e4m3_max != 448.0, f"numerics='te_pr3045' and e4m3_max={self.e4m3_max:g}",
             "PR 3045's per-token cast uses E = 448"),
            (self.rht and self.four_over_six is not None, "rht and four_over_six", "TE rejects RHT with 4over6"),
            (main and self.rht and self.per_token, "rht and per_token",
             "TE main's per-token (row-scaled) NVFP4 does not take RHT (PR 3045's fp32 RHT does: numerics='te_pr3045')"),
            (self.rht and self.block == "16x16", "rht and block='16x16'", "RHT applies to 1x16 activations/gradients, never to 2D weights"),
            (main and self.per_token and self.block == "16x16", "per_token and block='16x16'",
             "2D blocks need one amax per tensor (PR 3045's 2D weight copies it into the vectors: numerics='te_pr3045')"),
            (self.stochastic_rounding and self.four_over_six is not None, "stochastic_rounding and four_over_six",
             "4over6 picks a scale by round-to-nearest error"),
        ]
        for bad, names, why in rules:
            if bad:
                raise ValueError(f"incompatible options {names}: {why}")
        if not self.rht:
            object.__setattr__(self, "rht_sign_mask", 0)

    __hash__ = HashOnce.__hash__

    @property
    def block_rows(self) -> int:
        return 16 if self.block == "16x16" else 1

    @property
    def broadcast_2d(self) -> bool:
        """PR 3045's 2D weight: a per-tensor 16x16 cast (:meth:`per_tensor_2d`) whose scalar amax is
        copied into the per-token amax vectors."""
        return self.numerics == "te_pr3045" and self.block == "16x16"

    def per_tensor_2d(self) -> "NVFP4QuantConfig":
        """The TE-main per-tensor config of a :attr:`broadcast_2d` cast (the codes and scales it writes)."""
        return dataclasses.replace(self, per_token=False, numerics="te_main")


FP8_FORMATS = ("e4m3", "e5m2")  # the element encodings of MXFP8 data


@dataclass(frozen=True)
class MXFP8QuantConfig(HashOnce):
    """Options of one MXFP8 quantization: E4M3 (or E5M2, for gradients) data, one E8M0 scale per 32
    elements along K (rowwise) or along M (columnwise; data stays (M, K), not transposed)."""

    rowwise: bool = True
    columnwise: bool = False
    fp8_format: str = "e4m3"
    scale_layout: str = "compact"

    def __post_init__(self):
        _check_bools(self, ("rowwise", "columnwise"))
        if not (self.rowwise or self.columnwise):
            raise ValueError("rowwise and columnwise: at least one output must be requested")
        if self.fp8_format not in FP8_FORMATS:
            raise ValueError(f"fp8_format must be one of {FP8_FORMATS}, got {self.fp8_format!r}")
        if self.scale_layout not in SCALE_LAYOUTS:
            raise ValueError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {self.scale_layout!r}")

    __hash__ = HashOnce.__hash__


def with_copies(config, rowwise: bool, columnwise: bool):
    """``config`` (an NVFP4 or MXFP8 config) asking for exactly these copies; cached in eager mode
    (configs are frozen), so rebuilding a one-copy container costs no validation."""
    if config.rowwise == rowwise and config.columnwise == columnwise:
        return config
    if torch.compiler.is_compiling():  # dynamo traces the build, not the cache
        return dataclasses.replace(config, rowwise=rowwise, columnwise=columnwise)
    return _with_copies_cached(config, rowwise, columnwise)


@functools.lru_cache(maxsize=1024)
def _with_copies_cached(config, rowwise: bool, columnwise: bool):
    return dataclasses.replace(config, rowwise=rowwise, columnwise=columnwise)


def operand_config(config: NVFP4QuantConfig, columnwise: bool) -> NVFP4QuantConfig:
    """The config of one copy of ``config`` used as a rowwise GEMM operand: that copy alone, and for the
    columnwise copy without RHT (its values are RHT(x^T) already). Cached in eager mode."""
    if torch.compiler.is_compiling():
        return dataclasses.replace(config, rowwise=True, columnwise=False, rht=config.rht and not columnwise)
    return _operand_config_cached(config, columnwise)


@functools.lru_cache(maxsize=1024)
def _operand_config_cached(config, columnwise: bool):
    return dataclasses.replace(config, rowwise=True, columnwise=False, rht=config.rht and not columnwise)
