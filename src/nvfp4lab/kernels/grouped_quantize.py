"""Grouped (MoE) NVFP4 quantize: x (M, K) split along M into experts, each split quantized alone, in
two launches whatever the number of splits (an amax pass, then one cast pass).

Both passes tile x exactly as the single-tensor quantize (:mod:`.nvfp4_quantize`) does, so the grid
depends only on (M, K), never on the split sizes: the offsets (int64 (n + 1,), on the device) are read
by the kernels (no host sync, CUDA-graph capturable), and every tile looks up the split of each of its
rows (``_split_of``: binary lifting, log2(n) gathered loads per row or 16-row group).

* ``_grouped_amax_kernel``: per-split amaxes. A tile may straddle splits (rowwise-only splits have any
  size), so it loops over the splits its rows cover and folds one masked max per split by
  ``atomic_max`` on the int32 view of zeroed fp32 buffers (same NaN handling as the single pass).
  Per-token row amaxes are per row, as in the single pass; per-token column amaxes are (n, K).
* the cast is ``_quantize_kernel`` with GROUPED=True: outer amaxes gathered per row (rowwise) or per
  16-row group (columnwise), columnwise blocks written into the bulk layout of
  :class:`~nvfp4lab.tensors.GroupedNVFP4Tensor`. Same device functions as the single op, so every split
  gets the bits of quantizing it alone; SR block counters are bulk block indices (split 0 and a single
  split reproduce the single op's random bits for the same seed; the others differ, statistically alike).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..config import NVFP4QuantConfig
from ..tensors import GroupedNVFP4Tensor
from . import nvfp4_quantize as kq
from .nvfp4_quantize import _abs_bits, _load_tile, _rht_tile, _split_of

# amax modes: 0 none, 1 per split, 2 per row / per (split, column), 3 per split of the bf16 RHT output
G_NONE, G_SPLIT, G_PER_TOKEN, G_SPLIT_RHT = 0, 1, 2, 3


@triton.jit
def _fold_per_split(ptr, r, split, s_lo, s_hi, ok):
    """atomic_max(ptr[s], max of r over the rows of split s) for s in [s_lo, s_hi] (r int32 [BLOCK_M])."""
    for s in range(s_lo, s_hi + 1):
        v = tl.max(tl.where(ok & (split == s), r, 0), axis=0)
        tl.atomic_max(ptr + s, v, sem="relaxed")


@triton.jit
def _grouped_amax_kernel(
    x_ptr, row_amax_ptr, col_amax_ptr, offsets_ptr, num_splits, M, K,
    ROW_MODE: tl.constexpr, COL_MODE: tl.constexpr, RHT_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT_BF16: tl.constexpr, SPLIT_STEPS: tl.constexpr,
):
    rows, cols, row_ok, col_ok, pid_m, pid_k, xf = _load_tile(x_ptr, M, K, BLOCK_M, BLOCK_K)
    abs_bits = _abs_bits(xf)
    split = _split_of(rows, offsets_ptr, num_splits, SPLIT_STEPS)
    s_lo = tl.min(tl.where(row_ok, split, num_splits), axis=0)
    s_hi = tl.max(tl.where(row_ok, split, 0), axis=0)
    if (ROW_MODE == 1) or (COL_MODE == 1):
        r = tl.max(abs_bits, axis=1)
        r = tl.where(r > 0x7F800000, 0x7FC00000, r)  # any NaN -> the canonical NaN, above +inf
        if ROW_MODE == 1:
            _fold_per_split(row_amax_ptr, r, split, s_lo, s_hi, row_ok)
        if COL_MODE == 1:
            _fold_per_split(col_amax_ptr, r, split, s_lo, s_hi, row_ok)
    if ROW_MODE == 2:
        rt = tl.max(abs_bits, axis=1)
        rt = tl.where(rt > 0x7F800000, 0x7FC00000, rt)
        tl.atomic_max(row_amax_ptr + rows, rt, mask=row_ok, sem="relaxed")
    if COL_MODE == 2:
        for s in range(s_lo, s_hi + 1):
            c = tl.max(tl.where((row_ok & (split == s))[:, None], abs_bits, 0), axis=0)
            c = tl.where(c > 0x7F800000, 0x7FC00000, c)
            tl.atomic_max(col_amax_ptr + s * K + cols, c, mask=col_ok, sem="relaxed")
    if COL_MODE == 3:
        # 16-row groups never straddle splits here (splits are multiples of 16 for columnwise output)
        y = _rht_tile(xf, BLOCK_M, RHT_MASK, x_ptr.dtype.element_ty == tl.bfloat16, DOT_BF16)
        ry = tl.max(_abs_bits(y), axis=1)
        ry = tl.where(ry > 0x7F800000, 0x7FC00000, ry)
        _fold_per_split(col_amax_ptr, ry, split, s_lo, s_hi, row_ok)


def _split_steps(num_splits: int) -> int:
    return max(0, (num_splits - 1).bit_length())


def _amax_shapes(m, k, n, row_mode, col_mode):
    row = {G_NONE: (0,), G_SPLIT: (n,), G_PER_TOKEN: (m,)}[row_mode]
    col = {G_NONE: (0,), G_SPLIT: (n,), G_SPLIT_RHT: (n,), G_PER_TOKEN: (n, k)}[col_mode]
    return row, col


@torch.library.custom_op("nvfp4lab::nvfp4_grouped_amax", mutates_args=())
def nvfp4_grouped_amax(x: torch.Tensor, offsets: torch.Tensor, row_mode: int, col_mode: int,
                       rht_sign_mask: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-split outer amaxes of x (M, K) split at the device int64 offsets (n + 1,)."""
    m, k = x.shape
    n = offsets.numel() - 1
    row_shape, col_shape = _amax_shapes(m, k, n, row_mode, col_mode)
    row_amax = torch.zeros(row_shape, dtype=torch.float32, device=x.device)
    col_amax = torch.zeros(col_shape, dtype=torch.float32, device=x.device)
    if x.numel() == 0 or (row_mode == G_NONE and col_mode == G_NONE):
        return row_amax, col_amax
    kind = "amax-rht" if col_mode == G_SPLIT_RHT else ("amax-pertoken" if G_PER_TOKEN in (row_mode, col_mode) else "amax")
    bm, bk, warps = kq._tile(m, k, rht=col_mode == G_SPLIT_RHT, four_over_six=False, kind=kind)
    grid = (triton.cdiv(m, bm) * triton.cdiv(k, bk),)
    row_view = row_amax.view(torch.int32) if row_mode else col_amax.view(torch.int32)
    col_view = col_amax.view(torch.int32) if col_mode else row_amax.view(torch.int32)
    _grouped_amax_kernel[grid](
        x, row_view, col_view, offsets, n, m, k,
        ROW_MODE=row_mode, COL_MODE=col_mode, RHT_MASK=rht_sign_mask,
        BLOCK_M=bm, BLOCK_K=bk, DOT_BF16=not kq._interpreting(), SPLIT_STEPS=_split_steps(n),
        num_warps=warps, enable_fp_fusion=False,
    )
    return row_amax, col_amax


@nvfp4_grouped_amax.register_fake
def _nvfp4_grouped_amax_fake(x, offsets, row_mode, col_mode, rht_sign_mask):
    m, k = x.shape
    row_shape, col_shape = _amax_shapes(m, k, offsets.shape[0] - 1, row_mode, col_mode)
    return x.new_empty(row_shape, dtype=torch.float32), x.new_empty(col_shape, dtype=torch.float32)


def _cast_shapes(m, k, rowwise, columnwise):
    return [(m, k // 2) if rowwise else (0,), (m, k // 16) if rowwise else (0,),
            (k * m // 2,) if columnwise else (0,), (k * m // 16,) if columnwise else (0,)]


@torch.library.custom_op("nvfp4lab::nvfp4_grouped_quantize_cast", mutates_args=())
def nvfp4_grouped_quantize_cast(
    x: torch.Tensor, offsets: torch.Tensor, row_amax: Optional[torch.Tensor], col_amax: Optional[torch.Tensor],
    seed_tensor: Optional[torch.Tensor], seed: int, rowwise: bool, columnwise: bool, block_2d: bool, per_token: bool,
    rht_sign_mask: int, four_over_six: int, e4m3_max: float, stochastic_rounding: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cast pass of the grouped quantize into the bulk buffers (compact scales); absent outputs are (0,)."""
    m, k = x.shape
    n = offsets.numel() - 1
    shapes = _cast_shapes(m, k, rowwise, columnwise)
    # every byte of a present buffer belongs to a row of some split, and every row is written
    row_data, row_scale, col_data, col_scale = (kq._uninitialized(s, x.device) for s in shapes)
    if x.numel() == 0:
        return row_data, row_scale, col_data, col_scale
    kq.launch_cast(x, (row_data, row_scale, col_data, col_scale), row_amax, col_amax, seed_tensor, seed, rowwise,
                   columnwise, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding,
                   "compact", offsets=offsets, num_splits=n, split_steps=_split_steps(n))
    return row_data, row_scale, col_data, col_scale


@nvfp4_grouped_quantize_cast.register_fake
def _nvfp4_grouped_quantize_cast_fake(x, offsets, row_amax, col_amax, seed_tensor, seed, rowwise, columnwise, block_2d,
                                      per_token, rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding):
    m, k = x.shape
    return tuple(x.new_empty(s, dtype=torch.uint8) for s in _cast_shapes(m, k, rowwise, columnwise))


def quantize_grouped(
    x2d: torch.Tensor,
    split_offsets: torch.Tensor,
    config: NVFP4QuantConfig,
    *,
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> GroupedNVFP4Tensor:
    """Quantize the splits [split_offsets[i], split_offsets[i+1]) of x2d (M, K) rows, each alone.

    split_offsets: int64 (n + 1,) on x2d's device, nondecreasing from 0 to M (not checked: no host
    sync). Each split must be a multiple of 16 rows when a columnwise or 16x16 output is asked.
    Compact scales. Stochastic rounding: ``seed`` (int) or an int64 seed drawn on the device from
    ``generator`` (read by the kernel).
    """
    if config.scale_layout != "compact":
        raise ValueError("grouped bulk buffers hold compact scales")
    m, k = x2d.shape
    x2d = x2d.contiguous()
    offsets = split_offsets.to(device=x2d.device, dtype=torch.int64).contiguous()
    row_mode = col_mode = G_NONE
    if config.rowwise:
        row_mode = G_PER_TOKEN if config.per_token else G_SPLIT
    if config.columnwise:
        col_mode = G_SPLIT_RHT if config.rht else (G_PER_TOKEN if config.per_token else G_SPLIT)
    rht_mask = config.rht_sign_mask if config.rht else 0
    row_amax, col_amax = nvfp4_grouped_amax(x2d, offsets, row_mode, col_mode, rht_mask)

    seed_tensor, seed_int = None, 0
    if config.stochastic_rounding:
        if seed is not None:
            seed_int = int(seed) % (1 << 63)
        else:
            seed_tensor = kq.draw_seed(x2d.device, generator)
    row_data, row_scale, col_data, col_scale = nvfp4_grouped_quantize_cast(
        x2d, offsets, row_amax if config.rowwise else None, col_amax if config.columnwise else None,
        seed_tensor, seed_int, config.rowwise, config.columnwise, config.block == "16x16", config.per_token,
        config.rht_sign_mask if config.rht else -1, kq._FOUR_OVER_SIX_CODES[config.four_over_six],
        config.e4m3_max, config.stochastic_rounding,
    )
    out = GroupedNVFP4Tensor(shape=x2d.shape, dtype=x2d.dtype, config=config, split_offsets=offsets)
    if config.rowwise:
        out.rowwise_data, out.rowwise_scale, out.rowwise_amax = row_data, row_scale, row_amax
    if config.columnwise:
        out.columnwise_data, out.columnwise_scale, out.columnwise_amax = col_data, col_scale, col_amax
    return out
