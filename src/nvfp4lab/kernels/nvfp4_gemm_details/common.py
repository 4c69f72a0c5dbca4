"""Helpers shared by the NVFP4 GEMM paths: the reference epilogue (alpha, bias, out_old, cast) as a
device function, scale-buffer addressing, and host-side operand preparation."""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ...layout import roundup
from ..formats import f32_to_bf16_rne, to_f32
from ..swizzle import swizzle_offset


@functools.lru_cache(maxsize=None)
def gemm_inv(e4m3_max_a: float, e4m3_max_b: float) -> float:
    """fl32(1 / (36 E_a E_b)) as a Python float holding an exact fp32 value."""
    return torch.tensor(1.0 / (36.0 * e4m3_max_a * e4m3_max_b), dtype=torch.float32).item()


# The layout name of an operand given as its exact BF16 values q * s (rows, K) (an NVFP4Operand): no scales.
EXPANDED = "expanded"


class Operand(NamedTuple):
    """One GEMM operand as the kernels take it."""
    data: torch.Tensor  # packed codes (rows, K/2) uint8, unit stride along K; or BF16 q * s (rows, K) (expanded;
    # unit stride along K or along the rows; a grouped GEMM's B: (E, N, K))
    scale: torch.Tensor  # E4M3 scales: 2-D compact / padded, or the flat swizzled buffer (unused when expanded)
    scale_stride: int  # row stride of a compact / padded scale matrix (0 when swizzled)
    cols4: int  # roundup(K/16, 4) // 4: 4-column groups of the swizzled layout (0 otherwise)
    swizzled: bool
    amax: torch.Tensor  # fp32, flat: (1,) | per row | per expert

    @property
    def expanded(self) -> bool:
        """Whether ``data`` holds the BF16 values q * s already (only the dequant_mm path takes these)."""
        return self.data.dtype == torch.bfloat16


def scale_args(scale: torch.Tensor, layout: str, k: int):
    """(tensor, row stride, cols4, swizzled?) for a scale buffer of the given layout."""
    k16 = k // 16
    if layout == EXPANDED:
        return scale, 0, 0, False
    if layout == "swizzled":
        return (scale if scale.dim() == 1 else scale.reshape(-1)), 0, roundup(k16, 4) // 4, True
    if scale.dim() != 2 or scale.stride(1) != 1:
        scale = scale.contiguous()
    return scale, scale.stride(0), 0, False


def operand(data: torch.Tensor, scale: torch.Tensor, layout: str, amax: torch.Tensor, k: int) -> Operand:
    """An :class:`Operand` from a rowwise copy's parts (``layout``: the scale layout). Expanded values may also
    come column-major (the transpose of a row-major matrix: cuBLAS reads either)."""
    if data.stride(-1) != 1 and not (layout == EXPANDED and data.stride(-2) == 1):
        data = data.contiguous()
    if amax.dim() != 1 or amax.dtype != torch.float32:
        amax = amax.reshape(-1).to(torch.float32)
    return Operand(data, *scale_args(scale, layout, k), amax)


def words(data: torch.Tensor) -> torch.Tensor:
    """Packed codes (rows, K/2) uint8 viewed as int32 words (rows, K/8): 8 codes per word, code i of a
    word in bits 4i..4i+3 (little-endian bytes). A copy only when the view is impossible (misaligned)."""
    try:
        return data.view(torch.int32)
    except RuntimeError:  # a row stride or storage offset that is not a multiple of 4 bytes
        return data.clone(memory_format=torch.contiguous_format).view(torch.int32)


@triton.jit
def scale_offsets(rows, cols, stride, cols4, SWIZZLED: tl.constexpr):
    """Byte offsets of scale entries (rows[:, None], cols[None, :]) in a compact/padded (row stride
    ``stride``) or swizzled (cuBLAS 128x4, ``cols4`` = roundup(K/16,4)/4) scale buffer."""
    if SWIZZLED:
        return swizzle_offset(rows[:, None], cols[None, :], cols4)
    else:
        return rows[:, None] * stride + cols[None, :]


@triton.jit
def epilogue(acc, offs_m, offs_n, mask_m, mask_n, rows_a, rows_b, expert, a_amax_ptr, b_amax_ptr, bias_ptr,
             out_ptr, N, stride_om, stride_on, inv_e, A_AMAX_ROWS: tl.constexpr, B_AMAX_MODE: tl.constexpr,
             BIAS_MODE: tl.constexpr, ACCUMULATE: tl.constexpr, OUT_BF16: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SOFT_BF16: tl.constexpr, EPI_PR3045: tl.constexpr = False,
             A_AMAX_EXPERT: tl.constexpr = False):
    """alpha per element from the two amax vectors, bias, out_old, cast: the reference's roundings
    (:func:`nvfp4lab.ref.gemm.apply_alpha`, with its rescaled alpha where fl(amax_a * amax_b)
    overflows for finite amaxes). SOFT_BF16: bf16 bias / out_old loaded by bits (the interpreter).
    EPI_PR3045: PR 3045's order fl(fl(fl(amax_a[i] * acc) * amax_b[j]) * inv_e) instead of
    acc * fl(fl(amax_a[i] * amax_b[j]) * inv_e) (:func:`nvfp4lab.ref.gemm.pr3045_scaled`). A_AMAX_EXPERT: A's
    amax of the tile's expert (grouped)."""
    if A_AMAX_EXPERT:
        amax_a = tl.load(a_amax_ptr + expert + tl.zeros((BLOCK_M,), dtype=tl.int32))
    elif A_AMAX_ROWS:
        amax_a = tl.load(a_amax_ptr + rows_a)
    else:
        amax_a = tl.load(a_amax_ptr + tl.zeros((BLOCK_M,), dtype=tl.int32))
    if B_AMAX_MODE == 2:
        amax_b = tl.load(b_amax_ptr + rows_b)
    elif B_AMAX_MODE == 1:
        amax_b = tl.load(b_amax_ptr + expert + tl.zeros((BLOCK_N,), dtype=tl.int32))
    else:
        amax_b = tl.load(b_amax_ptr + tl.zeros((BLOCK_N,), dtype=tl.int32))
    if BIAS_MODE == 1:
        bias = to_f32(tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0), SOFT_BF16)[None, :]
    elif BIAS_MODE == 2:
        bias = to_f32(tl.load(bias_ptr + expert * N + offs_n, mask=mask_n, other=0.0), SOFT_BF16)[None, :]
    else:
        bias = 0.0
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n.to(tl.int64)[None, :] * stride_on
    omask = mask_m[:, None] & mask_n[None, :]
    finish(acc, amax_a[:, None], amax_b[None, :], bias, out_ptrs, omask, inv_e, BIAS_MODE != 0, ACCUMULATE, OUT_BF16,
           SOFT_BF16, EPI_PR3045)


@triton.jit
def gemm_alpha(a2, b2, inv_e):
    """(alpha, alpha_low, overflow): alpha = fl(fl(a2 * b2) * inv_e) as TE's cuBLAS alpha; where fl(a2 * b2)
    overflows for finite amaxes (``overflow``), alpha_low = fl(fl(fl(a2 / 2^64) * fl(b2 / 2^64)) * inv_e), whose
    product with acc is scaled back by 2^64 twice (:func:`nvfp4lab.ref.gemm.apply_alpha`)."""
    prod = a2 * b2
    overflow = (tl.abs(prod) == float("inf")) & (tl.abs(a2) < float("inf")) & (tl.abs(b2) < float("inf"))
    alpha_low = ((a2 * 5.421010862427522e-20) * (b2 * 5.421010862427522e-20)) * inv_e  # 2^-64 each (exact)
    return prod * inv_e, alpha_low, overflow


@triton.jit
def store_alphas(a_amax_ptr, b_amax_ptr, alpha_ptr, num, inv_e, A_PER_EXPERT: tl.constexpr, B_PER_EXPERT: tl.constexpr,
                 BLOCK: tl.constexpr):
    """cuBLAS' alphas: alpha[e] (e < ``num``) = fl(fl(amax_a * amax_b) * inv_e) with A's and B's amax of expert e
    (A_PER_EXPERT / B_PER_EXPERT) or the one; fl(fl(alpha_low * 2^64) * 2^64) where fl(amax_a * amax_b) overflows
    (:mod:`.dequant_mm`). alpha[num] = 0 (cuBLAS' beta). BLOCK: a power of 2 above ``num``."""
    offs = tl.arange(0, BLOCK)
    idx = tl.where(offs < num, offs, 0)
    zero = tl.zeros((BLOCK,), dtype=tl.int32)
    amax_a = tl.load(a_amax_ptr + (idx if A_PER_EXPERT else zero))
    amax_b = tl.load(b_amax_ptr + (idx if B_PER_EXPERT else zero))
    alpha, alpha_low, overflow = gemm_alpha(amax_a, amax_b, inv_e)
    alpha = tl.where(overflow, (alpha_low * 1.8446744073709552e19) * 1.8446744073709552e19, alpha)
    tl.store(alpha_ptr + offs, tl.where(offs < num, alpha, 0.0), mask=offs <= num)


@triton.jit
def finish(acc, a2, b2, bias, out_ptrs, omask, inv_e, HAS_BIAS: tl.constexpr, ACCUMULATE: tl.constexpr,
           OUT_BF16: tl.constexpr, SOFT_BF16: tl.constexpr, EPI_PR3045: tl.constexpr):
    """The epilogue's arithmetic and store, once the operands are loaded: ``a2`` (BLOCK_M, 1) and ``b2``
    ((1 or BLOCK_M), BLOCK_N) amaxes, ``bias`` fp32 broadcastable to the tile (read when HAS_BIAS)."""
    if EPI_PR3045:
        res = ((acc * a2) * b2) * inv_e
    else:
        alpha, alpha_low, overflow = gemm_alpha(a2, b2, inv_e)
        rescaled = ((acc * alpha_low) * 1.8446744073709552e19) * 1.8446744073709552e19  # 2^64 twice (exact)
        res = tl.where(overflow, rescaled, acc * alpha)
    if HAS_BIAS:
        res = res + bias
    if ACCUMULATE:
        res = res + to_f32(tl.load(out_ptrs, mask=omask, other=0.0), SOFT_BF16)
    if OUT_BF16:
        tl.store(out_ptrs, f32_to_bf16_rne(res), mask=omask)
    else:
        tl.store(out_ptrs, res.to(out_ptrs.dtype.element_ty), mask=omask)
