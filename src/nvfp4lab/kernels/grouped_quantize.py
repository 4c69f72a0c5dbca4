"""Grouped (MoE) NVFP4 quantize: x (M, K) split along M into experts, each split quantized alone, in
two launches whatever the number of splits (an amax pass, then one cast pass).

The amax pass tiles x as the single-tensor one does (:mod:`.nvfp4_quantize`), the cast pass runs the
single op's cast kernel, so the grids depend only on (M, K), never on the split sizes: the offsets (int64
(n + 1,), on the device) are read by the kernels (no host sync, CUDA-graph capturable).

* ``_grouped_amax_kernel``: per-split amaxes. A program finds the splits of its first and last row
  (binary lifting over the offsets, ``split_of``); within one split it carries maxima across its
  tiles and folds them once, as the single pass does; a program straddling splits folds each tile's
  row maxima per split by a segmented scan and one ``atomic_max`` per split on the int32 view of
  zeroed fp32 buffers (same NaN handling as the single pass). Per-token row amaxes are per row, as in
  the single pass; per-token column amaxes are (n, K) (of PR 3045's fp32 RHT output with its RHT). It
  also writes the split of every 16-row group (int32 (cdiv(M, 16),)) for the cast.
* ``_grouped_amax_rht_col_kernel``: the same pass for per-split post-RHT amaxes of bf16 x (alone or with
  per-split row amaxes), in the layout of the single pass's ``amax_rht_col_kernel``: a word column per
  thread, each column block's RHT by butterflies in the thread, no ``tl.dot``.
* the cast is the single op's cast (``nvfp4_quantize_details.cast.launch_cast``) with GROUPED=True:
  outer amaxes gathered per 16-row group through that split table (rowwise-only splits, of any size,
  search the offsets per row), columnwise blocks written into the bulk layout of
  :class:`~nvfp4lab.tensors.GroupedNVFP4Tensor`. Same device functions as the single op, so every split
  gets the bits of quantizing it alone; SR block counters are bulk block indices (split 0 and a single
  split reproduce the single op's random bits for the same seed; the others differ, statistically alike).

:func:`quantize_grouped_operand` runs the same passes with the cast writing each split's rowwise copy as the exact
BF16 GEMM operand (``cast16_kernel``'s ROW_OPERAND): the tokens or the stacked experts' weights as the Hopper grouped
GEMM takes them.

Eager calls run both passes from a plan cached per config, shape, split count and alignments
(:class:`_GroupedPlan`), so that they only allocate and launch; traced calls run the same plan through the one
custom op ``nvfp4lab::nvfp4_grouped_quantize``. :func:`grouped_amax` and :func:`grouped_cast` run one pass alone
(benchmarks, tests).
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..config import NVFP4QuantConfig, operand_config, with_copies
from ..layout import cdiv
from ..tensors import GroupedNVFP4Tensor, NVFP4Operand
from .formats import soft_bf16_loads
from .launch import Launch, aligned, arg_key, custom_op, tracing
from .nvfp4_quantize import config_of_fields
from .nvfp4_quantize_details import opt_flags
from .nvfp4_quantize_details.amax import AMAX_NONE, AMAX_TENSOR, AMAX_TENSOR_RHT, halves_max_bits, rht_group_max
from .nvfp4_quantize_details.cast import (
    FOUR_OVER_SIX_CODES,
    cast_steps,
    launch_cast,
    run_cast,
    seed_args,
    uninitialized,
)
from .nvfp4_quantize_details.common import (
    abs_bits,
    load_rows,
    load_words16,
    program_columns,
    split_of,
    word_column_program,
)
from .nvfp4_quantize_details.rht import finish16_bits, rht_rows_fp32, rht_tile
from .pdl import wait_prior_grid

# amax modes: 0 none, 1 per split, 2 per row / per (split, column), 3 per split of the bf16 RHT output,
# 4 per (split, column) of PR 3045's fp32 RHT output
G_NONE, G_SPLIT, G_PER_TOKEN, G_SPLIT_RHT, G_PER_TOKEN_RHT = 0, 1, 2, 3, 4


@triton.jit
def _segment_max(split_a, max_a, split_b, max_b):
    """Combine of a segmented running max over rows sorted by split."""
    return split_b, tl.where(split_a == split_b, tl.maximum(max_a, max_b), max_b)


@triton.jit
def _fold_rows_per_split(row_ptr, col_ptr, r, rows, split, row_ok, offsets_ptr, s_lo, s_hi,
                         TO_ROW: tl.constexpr, TO_COL: tl.constexpr):
    """atomic_max(ptr[s], max of r over this tile's rows of split s) for every split s the tile covers,
    into row_ptr and/or col_ptr: one segmented scan over the rows (sorted by split), then one atomic
    per split, from the split's last row in the tile."""
    _, run_max = tl.associative_scan((split, tl.where(row_ok, r, 0)), 0, _segment_max)
    next_split = _split_in_range(rows + 1, offsets_ptr, s_lo, s_hi)
    last = row_ok & ((next_split != split) | (rows + 1 == tl.max(tl.where(row_ok, rows + 1, 0), axis=0)))
    if TO_ROW:
        tl.atomic_max(row_ptr + split, run_max, mask=last, sem="relaxed")
    if TO_COL:
        tl.atomic_max(col_ptr + split, run_max, mask=last, sem="relaxed")


@triton.jit
def _canonical_nan(bits):
    """Any NaN's |x| bits -> the canonical NaN's, which compares above +inf as int32."""
    return tl.where(bits > 0x7F800000, 0x7FC00000, bits)


@triton.jit
def _split_in_range(rows, offsets_ptr, s_lo, s_hi):
    """Split of each row known to lie in splits [s_lo, s_hi]: s_lo + #{s in (s_lo, s_hi]: offsets[s] <= row}
    (offsets nondecreasing, so the counted s are a prefix and a zero-row split never owns a row)."""
    split = tl.zeros_like(rows) + s_lo
    for s in range(s_lo + 1, s_hi + 1):
        split += (tl.load(offsets_ptr + s) <= rows).to(split.dtype)
    return split


@triton.jit
def _grouped_amax_kernel(
    x_ptr, row_amax_ptr, col_amax_ptr, offsets_ptr, group_split_ptr, num_splits, M, K,
    ROW_MODE: tl.constexpr, COL_MODE: tl.constexpr, RHT_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT_BF16: tl.constexpr, SPLIT_STEPS: tl.constexpr,
    STEPS_M: tl.constexpr, SOFT_BF16: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Folds the maxima of STEPS_M tiles (consecutive along M) into the amax buffers, and (programs of
    the first column tile) writes group_split[g] = split of row 16 g, which the cast pass reads instead
    of searching the offsets.

    The splits a program covers are found from its first and last row (two scalar searches). When
    they are one split (the usual case: splits of hundreds of rows), maxima are carried elementwise
    across the tiles and folded once, as in the single pass; otherwise each tile takes the row maxima's
    running max per split (a segmented scan) and issues one atomic per split it covers.
    """
    wait_prior_grid(PDL)
    pid_m, pid_k, cols, col_ok = program_columns(K, BLOCK_K)
    first_row = (pid_m * STEPS_M * BLOCK_M).to(tl.int64)
    last_row = tl.minimum(first_row + STEPS_M * BLOCK_M, M) - 1
    s_lo = split_of(first_row, offsets_ptr, num_splits, SPLIT_STEPS)
    s_hi = split_of(last_row, offsets_ptr, num_splits, SPLIT_STEPS)
    PER_SPLIT: tl.constexpr = (ROW_MODE == 1) or (COL_MODE == 1)
    if s_lo == s_hi:
        t = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
        t_rht = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
        t_col = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
        for step in tl.static_range(STEPS_M):
            rows = first_row + step * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok, xf = load_rows(x_ptr, rows, cols, col_ok, M, K, SOFT_BF16)
            mag = abs_bits(xf)  # |x| bits
            if PER_SPLIT or COL_MODE == 2:
                t = tl.maximum(t, mag)
            if ROW_MODE == 2:
                tl.atomic_max(row_amax_ptr + rows, _canonical_nan(tl.max(mag, axis=1)), mask=row_ok, sem="relaxed")
            if COL_MODE == 3:  # the raw sums, finished once after the reduction (finish16_bits)
                y = rht_tile(xf, BLOCK_M, RHT_MASK, x_ptr.dtype.element_ty == tl.bfloat16, DOT_BF16, False)
                t_rht = tl.maximum(t_rht, abs_bits(y))
            if COL_MODE == 4:
                t_col = tl.maximum(t_col, abs_bits(rht_rows_fp32(xf, BLOCK_M, BLOCK_K, RHT_MASK)))
            if pid_k == 0:
                tl.store(group_split_ptr + rows // 16, (tl.zeros_like(rows) + s_lo).to(tl.int32), mask=row_ok & (rows % 16 == 0))
        if PER_SPLIT:
            v = _canonical_nan(tl.max(tl.max(t, axis=1), axis=0))
            if ROW_MODE == 1:
                tl.atomic_max(row_amax_ptr + s_lo, v, sem="relaxed")
            if COL_MODE == 1:
                tl.atomic_max(col_amax_ptr + s_lo, v, sem="relaxed")
        if COL_MODE == 2:
            tl.atomic_max(col_amax_ptr + s_lo * K + cols, _canonical_nan(tl.max(t, axis=0)), mask=col_ok, sem="relaxed")
        if COL_MODE == 3:
            tl.atomic_max(col_amax_ptr + s_lo, _canonical_nan(finish16_bits(tl.max(tl.max(t_rht, axis=1), axis=0))),
                          sem="relaxed")
        if COL_MODE == 4:
            tl.atomic_max(col_amax_ptr + s_lo * K + cols, _canonical_nan(tl.max(t_col, axis=0)), mask=col_ok, sem="relaxed")
    else:
        for step in tl.static_range(STEPS_M):
            rows = first_row + step * BLOCK_M + tl.arange(0, BLOCK_M)
            row_ok, xf = load_rows(x_ptr, rows, cols, col_ok, M, K, SOFT_BF16)
            mag = abs_bits(xf)  # |x| bits
            split = _split_in_range(rows, offsets_ptr, s_lo, s_hi)
            if PER_SPLIT:
                _fold_rows_per_split(row_amax_ptr, col_amax_ptr, _canonical_nan(tl.max(mag, axis=1)), rows, split,
                                     row_ok, offsets_ptr, s_lo, s_hi, ROW_MODE == 1, COL_MODE == 1)
            if ROW_MODE == 2:
                tl.atomic_max(row_amax_ptr + rows, _canonical_nan(tl.max(mag, axis=1)), mask=row_ok, sem="relaxed")
            if COL_MODE == 2 or COL_MODE == 4:
                if COL_MODE == 4:  # 16-row groups never straddle splits (columnwise splits are multiples of 16)
                    cmag = abs_bits(rht_rows_fp32(xf, BLOCK_M, BLOCK_K, RHT_MASK))
                else:
                    cmag = mag
                tile_lo = tl.min(tl.where(row_ok, split, num_splits), axis=0)
                tile_hi = tl.max(tl.where(row_ok, split, 0), axis=0)
                for s in range(tile_lo, tile_hi + 1):
                    c = tl.max(tl.where((row_ok & (split == s))[:, None], cmag, 0), axis=0)
                    tl.atomic_max(col_amax_ptr + s * K + cols, _canonical_nan(c), mask=col_ok, sem="relaxed")
            if COL_MODE == 3:
                # 16-row groups never straddle splits here (splits are multiples of 16 for columnwise output)
                y = rht_tile(xf, BLOCK_M, RHT_MASK, x_ptr.dtype.element_ty == tl.bfloat16, DOT_BF16, False)
                _fold_rows_per_split(col_amax_ptr, col_amax_ptr, _canonical_nan(finish16_bits(tl.max(abs_bits(y), axis=1))), rows, split,
                                     row_ok, offsets_ptr, s_lo, s_hi, False, True)
            if pid_k == 0:
                tl.store(group_split_ptr + rows // 16, split.to(tl.int32), mask=row_ok & (rows % 16 == 0))


@triton.jit
def _grouped_amax_rht_col_kernel(
    x_ptr, row_amax_ptr, col_amax_ptr, offsets_ptr, group_split_ptr, num_splits, M, K,
    ROW_MODE: tl.constexpr, RHT_MASK: tl.constexpr, BLOCK_C: tl.constexpr, STEPS: tl.constexpr,
    SPLIT_STEPS: tl.constexpr, HW: tl.constexpr, PDL: tl.constexpr = False,
):
    """``amax_rht_col_kernel`` per split (``G_SPLIT_RHT``, with ``G_SPLIT`` row amaxes or none): bf16 x (M, K) read
    as (M, K / 2) int32 words, BLOCK_C word columns x STEPS 16-row groups per program, M % 16 == 0 (columnwise
    splits are multiples of 16 rows, so each group lies in one split: the split of its first row). A program whose
    groups share one split carries its maxima across them and issues one atomic per output; one whose groups
    straddle splits issues them per group. Writes group_split as ``_grouped_amax_kernel`` does."""
    wait_prior_grid(PDL)
    wc, c_ok, g0, kw = word_column_program(K, BLOCK_C, STEPS)
    n_groups = M // 16
    s_lo = split_of(g0 * 16, offsets_ptr, num_splits, SPLIT_STEPS)
    s_hi = split_of((tl.minimum(g0 + STEPS, n_groups) - 1) * 16, offsets_ptr, num_splits, SPLIT_STEPS)
    zero = tl.zeros([BLOCK_C], tl.int32)
    if s_lo == s_hi:
        t_rht = zero
        t_row = zero
        for step in range(STEPS):
            g = wc * 0 + (g0 + step)  # broadcast first: the interpreter takes no scalar comparison into a mask
            ok = c_ok & (g < n_groups)
            w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15 = load_words16(x_ptr, g, kw, wc, ok)
            t_rht, t_row = rht_group_max(t_rht, t_row, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14,
                                         w15, ROW_MODE == 1, RHT_MASK, HW)
            tl.store(group_split_ptr + g, (g * 0 + s_lo).to(tl.int32), mask=ok & (wc == 0))
        if ROW_MODE == 1:
            tl.atomic_max(row_amax_ptr + s_lo, _canonical_nan(halves_max_bits(t_row)), sem="relaxed")
        tl.atomic_max(col_amax_ptr + s_lo, _canonical_nan(finish16_bits(tl.max(t_rht, axis=0))), sem="relaxed")
    else:
        for step in range(STEPS):
            g = wc * 0 + (g0 + step)
            ok = c_ok & (g < n_groups)
            split = split_of((g0 + step) * 16, offsets_ptr, num_splits, SPLIT_STEPS)
            w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15 = load_words16(x_ptr, g, kw, wc, ok)
            t_rht, t_row = rht_group_max(zero, zero, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14,
                                         w15, ROW_MODE == 1, RHT_MASK, HW)
            tl.store(group_split_ptr + g, (g * 0 + split).to(tl.int32), mask=ok & (wc == 0))
            if g0 + step < n_groups:
                if ROW_MODE == 1:
                    tl.atomic_max(row_amax_ptr + split, _canonical_nan(halves_max_bits(t_row)), sem="relaxed")
                tl.atomic_max(col_amax_ptr + split, _canonical_nan(finish16_bits(tl.max(t_rht, axis=0))),
                              sem="relaxed")


def split_steps_of(num_splits: int) -> int:
    return max(0, (num_splits - 1).bit_length())


def _amax_shapes(m, k, n, row_mode, col_mode):
    row = {G_NONE: (0,), G_SPLIT: (n,), G_PER_TOKEN: (m,)}[row_mode]
    col = {G_NONE: (0,), G_SPLIT: (n,), G_SPLIT_RHT: (n,), G_PER_TOKEN: (n, k), G_PER_TOKEN_RHT: (n, k)}[col_mode]
    return row, col


def grouped_amax(x: torch.Tensor, offsets: torch.Tensor, row_mode: int, col_mode: int, rht_sign_mask: int,
                 block_m: int = 0, block_k: int = 0, num_warps: int = 0,
                 poison: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The amax pass alone (benchmarks, tests; :func:`quantize_grouped` runs it through its plan): per-split
    outer amaxes of x (M, K) split at the device int64 offsets (n + 1,), and the int32 split of each 16-row
    group's first row (cdiv(M, 16),), which the cast pass takes. block_m, block_k, num_warps: an explicit tile
    (0: opt_flags' choice); poison: the group splits start as -1."""
    x = x.contiguous()
    m, k = x.shape
    n = offsets.numel() - 1
    row_shape, col_shape = _amax_shapes(m, k, n, row_mode, col_mode)
    row_amax = torch.zeros(row_shape, dtype=torch.float32, device=x.device)
    col_amax = torch.zeros(col_shape, dtype=torch.float32, device=x.device)
    group_split = torch.empty(cdiv(m, 16), dtype=torch.int32, device=x.device)
    if poison:
        group_split.fill_(-1)
    if x.numel() == 0:
        return row_amax, col_amax, group_split
    amax_launch = _amax_launch(m, k, n, row_mode, col_mode, rht_sign_mask, (block_m, block_k, num_warps), x.dtype,
                               x.device, aligned(x))
    row_view = row_amax.view(torch.int32) if row_mode else col_amax.view(torch.int32)
    col_view = col_amax.view(torch.int32) if col_mode else row_amax.view(torch.int32)
    launch_grouped_amax(amax_launch, x, row_view, col_view, offsets, group_split)
    return row_amax, col_amax, group_split


def _amax_launch(m: int, k: int, n: int, row_mode: int, col_mode: int, rht_sign_mask: int, tile: tuple, dtype,
                 device, x_aligned: bool) -> Launch:
    """The amax pass's launch for x (M, K) of ``dtype`` in ``n`` splits: ``_grouped_amax_rht_col_kernel`` for per-split
    post-RHT amaxes of bf16 x (16-byte aligned, M % 16 == 0, K even; row amaxes per split or none), else
    ``_grouped_amax_kernel``. tile: (block_m, block_k, num_warps), 0 for opt_flags' choice."""
    block_m, block_k, num_warps = tile
    if (col_mode == G_SPLIT_RHT and row_mode in (G_NONE, G_SPLIT)
            and opt_flags.use_amax_rht_col(m, k, AMAX_TENSOR if row_mode == G_SPLIT else AMAX_NONE, AMAX_TENSOR_RHT,
                                           dtype == torch.bfloat16, x_aligned)):
        meta = opt_flags.amax_rht_col_meta(m, k, 1 if row_mode == G_SPLIT else 0, rht_sign_mask, block_m=block_m,
                                           block_k=block_k, num_warps=num_warps)
        del meta["DIRECT"]  # its per-split accumulators are the outputs, always zeroed by the caller
        meta["SPLIT_STEPS"] = split_steps_of(n)
        return Launch(_grouped_amax_rht_col_kernel, opt_flags.amax_rht_col_grid(m, k, meta), meta)
    meta = _amax_meta(m, k, n, row_mode, col_mode, rht_sign_mask, block_m, block_k, num_warps, device)
    return Launch(_grouped_amax_kernel, opt_flags.amax_grid(m, k, meta), meta)


def _amax_meta(m: int, k: int, n: int, row_mode: int, col_mode: int, rht_sign_mask: int, block_m: int, block_k: int,
               num_warps: int, device) -> dict:
    """Constexprs and launch options of ``_grouped_amax_kernel`` for x (M, K) in ``n`` splits."""
    per_token = G_PER_TOKEN in (row_mode, col_mode) or col_mode == G_PER_TOKEN_RHT
    bm, bk, warps = opt_flags.amax_tile(m, k, rht=col_mode == G_SPLIT_RHT, per_token=per_token, block_m=block_m,
                                        block_k=block_k, num_warps=num_warps)
    return dict(ROW_MODE=row_mode, COL_MODE=col_mode, RHT_MASK=rht_sign_mask, BLOCK_M=bm, BLOCK_K=bk,
                DOT_BF16=not opt_flags.interpreting(), SPLIT_STEPS=split_steps_of(n),
                STEPS_M=opt_flags.amax_steps(m, bm, per_token=per_token), num_warps=warps,
                SOFT_BF16=soft_bf16_loads(device), enable_fp_fusion=False)


def launch_grouped_amax(amax_launch: Launch, x, row_view, col_view, offsets, group_split) -> None:
    """One launch of the amax pass (``amax_launch``, of :func:`_amax_launch`): x (M, K), the int32 views of the
    zeroed amax buffers (an absent one gets the other's view, never touched), the device offsets, the group-split
    output."""
    m, k = x.shape
    if amax_launch.kernel is _grouped_amax_rht_col_kernel:  # bf16 pairs as int32 words
        x = x.view(torch.int32)
    amax_launch(x, row_view, col_view, offsets, group_split, offsets.numel() - 1, m, k)


def _cast_shapes(m, k, rowwise, columnwise, row_operand=False):
    """Shapes of the bulk buffers (row_data, row_scale, col_data, col_scale), absent ones (0,); ``row_operand``:
    the rowwise side as the BF16 GEMM operand (M, K), no scales."""
    return [((m, k) if row_operand else (m, k // 2)) if rowwise else (0,),
            (m, k // 16) if rowwise and not row_operand else (0,),
            (k * m // 2,) if columnwise else (0,), (k * m // 16,) if columnwise else (0,)]


def _cast_outputs(shapes, device, poison: bool, row_operand: bool) -> tuple:
    """The bulk buffers of :func:`_cast_shapes` (a BF16 operand poisoned with NaN)."""
    outputs = [uninitialized(s, device, poison) for s in shapes]
    if row_operand:
        outputs[0] = torch.empty(shapes[0], dtype=torch.bfloat16, device=device)
        if poison:
            outputs[0].fill_(float("nan"))
    return tuple(outputs)


def grouped_cast(
    x: torch.Tensor, offsets: torch.Tensor, group_split: torch.Tensor, row_amax: Optional[torch.Tensor], col_amax: Optional[torch.Tensor],
    seed_tensor: Optional[torch.Tensor], seed: int, rowwise: bool, columnwise: bool, block_2d: bool, per_token: bool,
    rht_sign_mask: int, four_over_six: int, e4m3_max: float, stochastic_rounding: bool,
    block_m: int = 0, block_k: int = 0, num_warps: int = 0, poison: bool = False, pr3045: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cast pass alone (benchmarks, tests; :func:`quantize_grouped` runs it through its plan): the grouped
    quantize into the bulk buffers (compact scales); absent outputs are (0,). group_split: the amax pass's split of
    each 16-row group. block_m, block_k, num_warps: an explicit tile (0: opt_flags' choice); poison: fill the
    outputs with 0xFF before the kernels write them. pr3045: PR 3045's numerics (per-token casts)."""
    m, k = x.shape
    n = offsets.numel() - 1
    shapes = _cast_shapes(m, k, rowwise, columnwise)
    # every byte of a present buffer belongs to a row of some split, and every row is written
    row_data, row_scale, col_data, col_scale = (uninitialized(s, x.device, poison) for s in shapes)
    if x.numel() == 0:
        return row_data, row_scale, col_data, col_scale
    launch_cast(x, (row_data, row_scale, col_data, col_scale), row_amax, col_amax, seed_tensor, seed, rowwise,
                columnwise, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding,
                "compact", offsets=offsets, num_splits=n, split_steps=split_steps_of(n), group_split=group_split,
                block_m=block_m, block_k=block_k, num_warps=num_warps, pr3045=pr3045)
    return row_data, row_scale, col_data, col_scale


def _amax_modes(config: NVFP4QuantConfig) -> tuple[int, int]:
    """The grouped amax pass's (row, column) modes for a config (module docstring)."""
    row_mode = col_mode = G_NONE
    if config.rowwise:
        row_mode = G_PER_TOKEN if config.per_token else G_SPLIT
    if config.columnwise:
        if config.rht:
            col_mode = G_PER_TOKEN_RHT if config.per_token else G_SPLIT_RHT
        else:
            col_mode = G_PER_TOKEN if config.per_token else G_SPLIT
    return row_mode, col_mode


def _cast_args(config: NVFP4QuantConfig) -> tuple:
    """The recipe arguments of the grouped cast (``nvfp4_grouped_quantize_cast``'s, rowwise .. stochastic_rounding)."""
    return (config.rowwise, config.columnwise, config.block == "16x16", config.per_token,
            config.rht_sign_mask if config.rht else -1, FOUR_OVER_SIX_CODES[config.four_over_six], config.e4m3_max,
            config.stochastic_rounding)


class _GroupedPlan:
    """What the config, shape, split count, dtype, device and alignments of an eager (untraced) grouped quantize fix
    (:func:`_grouped_plan`'s key): the amax pass's launch and buffer shapes, the outputs' shapes, and the cast's
    launches (per SR seed kind), so that a call only allocates and launches: the launches and arguments of
    :func:`grouped_amax` and :func:`grouped_cast`. Traced calls run it through :func:`nvfp4_grouped_quantize`."""

    __slots__ = ("config", "n", "row_shape", "col_shape", "group_shape", "amax_launch", "row_mode", "col_mode",
                 "out_shapes", "cast_args", "pr3045", "steps", "tile", "poison", "row_operand")

    def __init__(self, config: NVFP4QuantConfig, m: int, k: int, n: int, dtype, device, x_aligned: bool, tile: tuple,
                 poison: bool, row_operand: bool = False):
        self.config, self.n, self.tile, self.poison = config, n, tile, poison
        self.row_operand = row_operand and config.rowwise
        self.row_mode, self.col_mode = _amax_modes(config)
        self.row_shape, self.col_shape = _amax_shapes(m, k, n, self.row_mode, self.col_mode)
        self.group_shape = (cdiv(m, 16),)
        self.amax_launch = None
        if m * k:
            self.amax_launch = _amax_launch(m, k, n, self.row_mode, self.col_mode,
                                            config.rht_sign_mask if config.rht else 0, tile, dtype, device, x_aligned)
        self.out_shapes = _cast_shapes(m, k, config.rowwise, config.columnwise, self.row_operand)
        self.cast_args = _cast_args(config)
        self.pr3045 = config.numerics == "te_pr3045"
        self.steps = {}

    def __call__(self, x2d, offsets, seed_tensor, seed_int: int) -> tuple:
        dev = x2d.device
        m, k = x2d.shape
        row_amax = torch.zeros(self.row_shape, dtype=torch.float32, device=dev)
        col_amax = torch.zeros(self.col_shape, dtype=torch.float32, device=dev)
        group_split = torch.empty(self.group_shape, dtype=torch.int32, device=dev)
        if self.poison:
            group_split.fill_(-1)
        outputs = _cast_outputs(self.out_shapes, dev, self.poison, self.row_operand)
        if self.amax_launch is None:
            return row_amax, col_amax, outputs
        row_view = row_amax.view(torch.int32) if self.row_mode else col_amax.view(torch.int32)
        col_view = col_amax.view(torch.int32) if self.col_mode else row_amax.view(torch.int32)
        launch_grouped_amax(self.amax_launch, x2d, row_view, col_view, offsets, group_split)
        row_in = row_amax if self.config.rowwise else None
        col_in = col_amax if self.config.columnwise else None
        key = (seed_tensor is not None, arg_key(seed_int))
        steps = self.steps.get(key)
        if steps is None:  # (the amax buffers are new allocations: 16-byte aligned)
            steps = self.steps[key] = cast_steps(
                x2d, seed_tensor, seed_int, *self.cast_args, "compact", offsets, self.n, split_steps_of(self.n),
                group_split, *self.tile, self.pr3045, (row_in is not None, col_in is not None), (self.row_operand, False))
        run_cast(steps, x2d, outputs, row_in, col_in, seed_tensor, seed_int, offsets, self.n, group_split)
        return row_amax, col_amax, outputs


_GROUPED_PLANS: dict = {}


def _grouped_plan(config, x2d, offsets, tile: tuple, poison: bool, row_operand: bool = False) -> _GroupedPlan:
    """The cached plan of an eager grouped quantize (the Launch specializations it keeps are those of x's and the
    offsets' alignment, in the key)."""
    n = offsets.numel() - 1
    m, k = x2d.shape
    key = (config, m, k, n, x2d.dtype, x2d.device, aligned(x2d), aligned(offsets), tile, poison, row_operand)
    plan = _GROUPED_PLANS.get(key)
    if plan is None:
        if len(_GROUPED_PLANS) >= 4096:
            _GROUPED_PLANS.clear()
        plan = _GROUPED_PLANS[key] = _GroupedPlan(config, m, k, n, x2d.dtype, x2d.device, aligned(x2d), tile, poison,
                                                  row_operand)
    return plan


@custom_op("nvfp4lab::nvfp4_grouped_quantize", mutates_args=())
def nvfp4_grouped_quantize(
    x: torch.Tensor, offsets: torch.Tensor, seed_tensor: Optional[torch.Tensor], seed: int, block: str, rowwise: bool,
    columnwise: bool, per_token: bool, rht: bool, rht_sign_mask: int, four_over_six: Optional[str], e4m3_max: float,
    stochastic_rounding: bool, numerics: str, block_m: int = 0, block_k: int = 0, num_warps: int = 0,
    poison: bool = False, row_operand: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize_grouped` of x (M, K) split at the device int64 offsets (n + 1,) as one op (traced calls): the
    config as its fields (compact scales), the SR seed as ``seed_args`` gives it. Returns (row_amax, col_amax,
    row_data, row_scale, col_data, col_scale), absent ones (0,); ``row_operand``: row_data is the BF16 operand
    (M, K) and row_scale (0,). Runs the cached plan of eager calls (:class:`_GroupedPlan`)."""
    config = config_of_fields(block, rowwise, columnwise, per_token, rht, rht_sign_mask, four_over_six, e4m3_max,
                              stochastic_rounding, "compact", numerics)
    plan = _grouped_plan(config, x, offsets, (block_m, block_k, num_warps), poison, row_operand)
    row_amax, col_amax, outputs = plan(x, offsets, seed_tensor, seed)
    return (row_amax, col_amax, *outputs)


@nvfp4_grouped_quantize.register_fake
def _nvfp4_grouped_quantize_fake(x, offsets, seed_tensor, seed, block, rowwise, columnwise, per_token, rht,
                                 rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding, numerics, block_m=0,
                                 block_k=0, num_warps=0, poison=False, row_operand=False):
    m, k = x.shape
    config = config_of_fields(block, rowwise, columnwise, per_token, rht, rht_sign_mask, four_over_six, e4m3_max,
                              stochastic_rounding, "compact", numerics)
    row_shape, col_shape = _amax_shapes(m, k, offsets.shape[0] - 1, *_amax_modes(config))
    row_operand = row_operand and rowwise
    dtypes = (torch.bfloat16 if row_operand else torch.uint8,) + (torch.uint8,) * 3
    return (x.new_empty(row_shape, dtype=torch.float32), x.new_empty(col_shape, dtype=torch.float32),
            *(x.new_empty(s, dtype=d) for s, d in zip(_cast_shapes(m, k, rowwise, columnwise, row_operand), dtypes)))


def quantize_grouped(
    x2d: torch.Tensor,
    split_offsets: torch.Tensor,
    config: NVFP4QuantConfig,
    *,
    seed=None,
    generator: Optional[torch.Generator] = None,
    block_m: int = 0,
    block_k: int = 0,
    num_warps: int = 0,
    poison: bool = False,
) -> GroupedNVFP4Tensor:
    """Quantize the splits [split_offsets[i], split_offsets[i+1]) of x2d (M, K) rows, each alone.

    split_offsets: int64 (n + 1,) on x2d's device, nondecreasing from 0 to M (not checked: no host
    sync). Each split must be a multiple of 16 rows when a columnwise or 16x16 output is asked.
    Compact scales. Stochastic rounding: ``seed`` (an int or an int64 one-element tensor on x2d's device) or a seed
    drawn from ``generator``
    (``nvfp4_quantize_details.cast.seed_args``). block_m, block_k, num_warps: the tile of every kernel of this
    call (0: opt_flags' choice); poison: fill the outputs with 0xFF before the kernels write them (tests).
    """
    x2d, offsets, parts = _grouped_parts(x2d, split_offsets, config, seed, generator, (block_m, block_k, num_warps),
                                         poison, False)
    row_amax, col_amax, row_data, row_scale, col_data, col_scale = parts
    out = GroupedNVFP4Tensor(shape=x2d.shape, dtype=x2d.dtype, config=config, split_offsets=offsets)
    if config.rowwise:
        out.rowwise_data, out.rowwise_scale, out.rowwise_amax = row_data, row_scale, row_amax
    if config.columnwise:
        out.columnwise_data, out.columnwise_scale, out.columnwise_amax = col_data, col_scale, col_amax
    return out


def quantize_grouped_operand(
    x2d: torch.Tensor,
    split_offsets: torch.Tensor,
    config: NVFP4QuantConfig,
    *,
    seed=None,
    generator: Optional[torch.Generator] = None,
    poison: bool = False,
) -> tuple:
    """:func:`quantize_grouped` whose cast writes each split's rowwise copy as the exact BF16 GEMM operand q * s
    (M, K) instead of codes and scales (``cast16_kernel``'s ROW_OPERAND). Returns (packed, row): a
    :class:`~nvfp4lab.tensors.GroupedNVFP4Tensor` holding the columnwise copy where the config asks one (else None),
    and the :class:`~nvfp4lab.NVFP4Operand` with the rowwise amaxes (per split (n,), per row (M,) per token): the
    tokens' operand of a Hopper grouped GEMM, or a stack of experts' weights. Same amax pass, same codes, same bits
    as :func:`quantize_grouped` followed by the expansion of its rowwise copy."""
    if not config.rowwise:
        raise ValueError("quantize_grouped_operand: a config with the rowwise copy (the operand)")
    if config.four_over_six:
        raise ValueError("quantize_grouped_operand: configs without four_over_six (its cast has no operand output)")
    x2d, offsets, parts = _grouped_parts(x2d, split_offsets, config, seed, generator, (0, 0, 0), poison, True)
    row_amax, col_amax, row_values, _, col_data, col_scale = parts
    packed = None
    if config.columnwise:
        packed = GroupedNVFP4Tensor.from_parts(x2d.shape, x2d.dtype, with_copies(config, False, True), offsets,
                                               columnwise=(col_data, col_scale, col_amax))
    return packed, NVFP4Operand(row_values, row_amax, operand_config(config, False))


def _grouped_parts(x2d, split_offsets, config, seed, generator, tile: tuple, poison: bool, row_operand: bool) -> tuple:
    """(x2d, offsets, (row_amax, col_amax, row_data, row_scale, col_data, col_scale)) of a grouped quantize, eager
    (the cached plan) or traced (the custom op)."""
    if config.scale_layout != "compact":
        raise ValueError("grouped bulk buffers hold compact scales")
    if config.broadcast_2d:
        raise ValueError("PR 3045's 2D weight (numerics='te_pr3045', block='16x16') is a per-tensor cast: quantize "
                         "each weight alone (TE's split_quantize rejects it too)")
    x2d = x2d.contiguous()
    offsets = split_offsets.to(device=x2d.device, dtype=torch.int64).contiguous()
    traced = tracing(x2d)
    seed_tensor, seed_int = seed_args(config, x2d, seed, generator, traced)
    if not traced:
        row_amax, col_amax, outputs = _grouped_plan(config, x2d, offsets, tile, poison, row_operand)(
            x2d, offsets, seed_tensor, seed_int)
        return x2d, offsets, (row_amax, col_amax, *outputs)
    return x2d, offsets, nvfp4_grouped_quantize(
        x2d, offsets, seed_tensor, seed_int, config.block, config.rowwise, config.columnwise, config.per_token,
        config.rht, config.rht_sign_mask, config.four_over_six, config.e4m3_max, config.stochastic_rounding,
        config.numerics, *tile, poison, row_operand)
