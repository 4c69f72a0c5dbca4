"""Helpers shared by the dequantize and MXFP8 kernel families: the output cast, the fp32 reciprocal and
the tile-override check of their launchers (the code decodes they use live in :mod:`.formats`)."""
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
