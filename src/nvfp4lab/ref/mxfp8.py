"""MXFP8 reference numerics (spec sections 2.3 and 13).

Per block of 32 elements (along K for rowwise, along M for columnwise):

    c    = e8m0_round_up(fl(bamax * fl(1/max)))      max = 448 (E4M3) or 57344 (E5M2)
    mult = 2^(127 - c)                                exact, built from bits
    q    = fp8_satRNE(fl(x * mult))

The scale is 2^ceil(log2(bamax/max)) (TE's rule, not the OCP floor rule), so nothing saturates.
An all-zero block gets code 0 (2^-127).
"""
from __future__ import annotations

import torch

from ..rht import saturate_finite
from ..tensors import MXFP8Tensor
from . import codecs
from .swizzle import apply_scale_layout, compact_scales

_F32 = torch.float32
_FORMATS = {
    "e4m3": (codecs.E4M3_MAX, codecs.e4m3_encode, codecs.e4m3_decode),
    "e5m2": (codecs.E5M2_MAX, codecs.e5m2_encode, codecs.e5m2_decode),
}


def quantize_rows(y: torch.Tensor, fp8_format: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize (R, C) along rows in blocks of 32 -> (data (R, C) uint8, scale (R, C/32) uint8 E8M0)."""
    fmt_max, encode, _ = _FORMATS[fp8_format]
    rows, cols = y.shape
    y = y.to(_F32)
    bamax = y.abs().reshape(rows, cols // 32, 32).amax(dim=2)
    rcp = torch.tensor(1.0 / fmt_max, dtype=_F32).item()  # max_norm_rcp: double 1/max rounded to fp32
    scale = codecs.e8m0_encode_round_up(bamax * rcp)
    mult = codecs.e8m0_quant_multiplier(scale).repeat_interleave(32, dim=1)
    return encode(y * mult), scale


def quantize(x: torch.Tensor, config):
    """Reference MXFP8 quantization of a 2-D (M, K) tensor with a :class:`MXFP8QuantConfig`."""
    rowwise = columnwise = None
    if config.rowwise:
        data, scale = quantize_rows(x, config.fp8_format)
        rowwise = (data, apply_scale_layout(scale, config.scale_layout))
    if config.columnwise:
        data_t, scale_t = quantize_rows(x.t(), config.fp8_format)
        # compact columnwise scale is (M/32, K); padded is (roundup(M/32,4), roundup(K,128));
        # swizzled is the swizzle of its transpose (spec section 8).
        if config.scale_layout == "swizzled":
            col_scale = apply_scale_layout(scale_t, "swizzled")
        elif config.scale_layout == "padded":
            col_scale = apply_scale_layout(scale_t, "padded").t().contiguous()
        else:
            col_scale = scale_t.t().contiguous()
        columnwise = (data_t.t().contiguous(), col_scale)
    return MXFP8Tensor.from_parts(x.shape, x.dtype, config, rowwise=rowwise, columnwise=columnwise)


def columnwise_scale_compact(t) -> torch.Tensor:
    """Columnwise scale of an :class:`MXFP8Tensor` in compact (M/32, K) form, whatever its layout."""
    m, k = t.shape[0], t.shape[1]
    if t.scale_layout == "swizzled":
        return compact_scales(t.columnwise_scale, "swizzled", k, m // 32).t()
    return t.columnwise_scale[: m // 32, :k]


def _scaled(q: torch.Tensor, factor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """dtype(fl(q * 2^(c-127))), a finite q's product past dtype's range saturating to its max: a block
    of bf16 or fp32 maxima rounds to 256 * 2^120 = 2^128, which no fp32 holds (TE's kernel gives inf)."""
    return saturate_finite(q * factor, dtype, torch.isfinite(q)).to(dtype)


def dequantize(t, dtype: torch.dtype, which: str = "rowwise") -> torch.Tensor:
    """out = dtype(2^(c-127) * float(fp8)), in x's (M, K) orientation for both copies (saturating)."""
    _, _, decode = _FORMATS[t.fp8_format]
    m, k = t.shape
    if which == "rowwise":
        scale = compact_scales(t.rowwise_scale, t.scale_layout, m, k // 32)
        factor = codecs.e8m0_decode(scale).repeat_interleave(32, dim=1)
        return _scaled(decode(t.rowwise_data), factor, dtype)
    scale = columnwise_scale_compact(t)
    factor = codecs.e8m0_decode(scale).repeat_interleave(32, dim=0)
    return _scaled(decode(t.columnwise_data), factor, dtype)
