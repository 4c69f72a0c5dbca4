"""Helpers shared by the dequantize and MXFP8 kernel families: exact code decodes, the output cast,
the fp32 reciprocal and the tile-override check of their launchers.

The decodes place the code's bits in an fp32 word so that it reads as ``value * 2^-k`` for every code
(subnormals included) and finish with one exact power-of-two multiply: no conversion instructions.
"""
from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from . import formats


def rcp_f32(v: float) -> float:
    """fl32(1/v) as a Python float that is exactly an fp32 value (no later conversion rounds it)."""
    return struct.unpack("f", struct.pack("f", 1.0 / v))[0]


@triton.jit
def e2m1_decode_exact(code):
    """E2M1 code (int32) -> fp32 from bits: the magnitude bits placed at fp32 bits 24..22 read as
    exactly value * 2^-126 for all 8 magnitudes (0.5 lands on the fp32 subnormal 2^-127), so one exact
    multiply by 2^126 finishes it. 4 integer ops + 1 multiply, no conversion instruction."""
    bits = ((code & 7) << 22) | ((code & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37


@triton.jit
def e4m3_decode_exact(code):
    """E4M3 bits (int32) -> fp32 the same way: bits 26..20 hold value * 2^-120 (subnormals included),
    times 2^120 exactly; 0x7F / 0xFF are NaN. Same values as ``formats.e4m3_decode``, fewer ops."""
    bits = ((code & 0x7F) << 20) | ((code & 0x80) << 24)
    val = bits.to(tl.float32, bitcast=True) * 1.329227995784916e36
    return tl.where((code & 0x7F) == 0x7F, float("nan"), val)


@triton.jit
def cast_to_out(v, out_ptr, SOFT_BF16: tl.constexpr):
    """fp32 -> the output pointer's dtype, rounding to nearest even (see :func:`soft_bf16_cast`)."""
    if SOFT_BF16:
        return formats.f32_to_bf16_rne(v)
    else:
        return v.to(out_ptr.dtype.element_ty)


def soft_bf16_cast(out_dtype: torch.dtype, device: torch.device) -> bool:
    """bf16 output under the interpreter (CPU tensors): its own fp32 -> bf16 cast truncates."""
    return out_dtype == torch.bfloat16 and device.type != "cuda"


def check_tile(block_rows: int, block_cols: int, *, min_cols: int, row_multiple: int = 1, max_rows: int = 128) -> None:
    """Tile overrides (benchmark tuning) must be powers of two; rows <= 128 keep a tile inside one
    128-row band of a swizzled scale buffer."""
    for name, v in (("block_rows", block_rows), ("block_cols", block_cols)):
        if v <= 0 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if block_rows > max_rows or block_rows % row_multiple:
        raise ValueError(f"block_rows must be a multiple of {row_multiple} and <= {max_rows}, got {block_rows}")
    if block_cols < min_cols:
        raise ValueError(f"block_cols must be >= {min_cols}, got {block_cols}")
