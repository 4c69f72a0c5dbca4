"""The 4over6 NVFP4 cast: ``four_over_six_kernel`` quantizes a [BLOCK_M, BLOCK_K] tile of x into its rowwise
blocks (view [BLOCK_M, BLOCK_K/16, 16]) and its columnwise blocks (view [BLOCK_M/16, BLOCK_K, 16] permuted
from [BLOCK_M/16, 16, BLOCK_K]), each block's scale picked between map-to-6 and map-to-4 by the MAE or
MSE of its dequantized candidate. Recipes without 4over6 run ``cast16_kernel``; 4over6 takes neither
RHT nor stochastic rounding (:class:`~nvfp4lab.config.NVFP4QuantConfig` rejects both).

Numerics: no per-element division in normal-range tiles: a candidate is dequantized with three
divisions per block (``dequant_4over6_fast``); EXACT tiles divide per element. Error sums run in index
order (``seq_sum16``), 2D errors as TE's shuffle tree (``tree_sum16``). Launches pass
``enable_fp_fusion=False`` (an FMA would merge ``err + d*d``).
"""
import triton
import triton.language as tl

from ..formats import e2m1_decode, e2m1_encode_fast, e4m3_decode, e4m3_encode
from .common import (
    E4M3_MAX,
    abs_bits,
    correct_div,
    encode_factor,
    global_scales,
    load_tile,
    normal_range,
    pack_codes,
    scale_offsets,
    split_of,
)


@triton.jit
def _block_amax(v3):
    """[A, B, 16] -> [A, B]: max |v| by integer max of the magnitude bits (NaN propagates)."""
    return tl.max(abs_bits(v3), axis=2).to(tl.float32, bitcast=True)


@triton.jit
def _split_last(t, A: tl.constexpr, B: tl.constexpr, L: tl.constexpr):
    """[A, B, L] -> (even, odd) elements of the last axis, each [A, B, L/2] ([A, B] when L == 2)."""
    if L == 2:
        pair = t
    else:
        pair = tl.reshape(t, [A, B, L // 2, 2])
    return tl.split(pair)


@triton.jit
def _halves_last(t, A: tl.constexpr, B: tl.constexpr, L: tl.constexpr):
    """[A, B, L] -> (first half, second half) of the last axis, each [A, B, L/2]."""
    return tl.split(tl.permute(tl.reshape(t, [A, B, 2, L // 2]), (0, 1, 3, 2)))


@triton.jit
def seq_sum16(t, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 16] -> [A, B]: fp32 sum of the last axis in index order, (((t0 + t1) + t2) + ...)."""
    ev, od = _split_last(t, A, B, 16)  # 0,2,..,14 | 1,3,..,15
    e0, e2 = _split_last(ev, A, B, 8)  # 0,4,8,12 | 2,6,10,14
    o1, o3 = _split_last(od, A, B, 8)  # 1,5,9,13 | 3,7,11,15
    a0, a4 = _split_last(e0, A, B, 4)  # 0,8 | 4,12
    a2, a6 = _split_last(e2, A, B, 4)  # 2,10 | 6,14
    a1, a5 = _split_last(o1, A, B, 4)  # 1,9 | 5,13
    a3, a7 = _split_last(o3, A, B, 4)  # 3,11 | 7,15
    t0, t8 = _split_last(a0, A, B, 2)
    t4, t12 = _split_last(a4, A, B, 2)
    t2, t10 = _split_last(a2, A, B, 2)
    t6, t14 = _split_last(a6, A, B, 2)
    t1, t9 = _split_last(a1, A, B, 2)
    t5, t13 = _split_last(a5, A, B, 2)
    t3, t11 = _split_last(a3, A, B, 2)
    t7, t15 = _split_last(a7, A, B, 2)
    s = t0 + t1
    s = s + t2
    s = s + t3
    s = s + t4
    s = s + t5
    s = s + t6
    s = s + t7
    s = s + t8
    s = s + t9
    s = s + t10
    s = s + t11
    s = s + t12
    s = s + t13
    s = s + t14
    s = s + t15
    return s


@triton.jit
def tree_sum16(t, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 16] -> [A, B]: shuffle-down tree (offsets 8, 4, 2, 1) as TE reduces 2D 4over6 errors."""
    lo, hi = _halves_last(t, A, B, 16)
    t8 = lo + hi
    lo, hi = _halves_last(t8, A, B, 8)
    t4 = lo + hi
    lo, hi = _halves_last(t4, A, B, 4)
    t2 = lo + hi
    lo, hi = _split_last(t2, A, B, 2)
    return lo + hi


@triton.jit
def dequant_4over6_fast(codes, scale_f, outer, E6: tl.constexpr):
    """fl(fl(fl(q * s) * amax) / 6E) for every code, with three divisions per block instead of one per
    element (the division dominates the 4over6 cost).

    q = +-2^e * m with m in {1, 1.5} and e in {-1, 0, 1, 2}; q * s and m * s are exact (at most 5
    significant bits), and scaling by 2^e commutes with fp32 rounding while every intermediate is a
    normal number, so the value is +-2^e * fl(fl(fl(m * s) * amax) / 6E). The caller guarantees that
    range (outer amax 0 or in [2^-100, 2^100]); zero codes take fl(fl(0 * s) * amax) / 6E.
    """
    e6 = tl.zeros_like(scale_f) + E6
    v_one = tl.math.div_rn(scale_f * outer, e6)  # all normal in the caller's range: no FTZ exposure
    v_three_halves = tl.math.div_rn((scale_f * 1.5) * outer, e6)
    v_zero = tl.math.div_rn((scale_f * 0.0) * outer, e6)
    idx = codes & 7  # magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6
    pow2 = ((((idx - 2) >> 1) + 127) << 23).to(tl.float32, bitcast=True)  # 2^e for idx 1..7
    three_halves = ((idx & 1) == 1) & (idx >= 3)
    mag = tl.where(three_halves, v_three_halves[:, :, None], v_one[:, :, None]) * pow2
    mag = tl.where(idx == 0, v_zero[:, :, None], mag)
    return tl.where((codes & 8) != 0, -mag, mag)


@triton.jit
def _candidate_4over6(y3, base, s_dec, outer, EXPAND: tl.constexpr, E6: tl.constexpr, MSE: tl.constexpr,
                      EXACT: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    """One 4over6 candidate: codes [A, B, 16], scale bits [A, B], per-block-row error [A, B].

    outer: the outer amax, broadcastable to [A, B]. EXACT: per-element fp64 division (any range);
    otherwise dequant_4over6_fast (normal-range tiles).
    """
    if EXPAND:
        cand = base * 1.5
    else:
        cand = base
    scale = e4m3_encode(tl.where(cand > E4M3_MAX, E4M3_MAX, cand))
    scale_f = e4m3_decode(scale)
    enc = encode_factor(scale_f, s_dec, EXACT)
    codes = e2m1_encode_fast(y3 * enc[:, :, None])
    if EXACT:
        val = correct_div((e2m1_decode(codes) * scale_f[:, :, None]) * outer[:, :, None], tl.zeros_like(y3) + E6, True)
    else:
        val = dequant_4over6_fast(codes, scale_f, outer, E6)
    d = val - y3
    if MSE:
        term = d * d
    else:
        term = tl.abs(d)
    return codes, scale, seq_sum16(term, A, B)


@triton.jit
def _quantize_blocks(
    v3, bamax, outer, FOUR_OVER_SIX: tl.constexpr, E6: tl.constexpr, EXACT: tl.constexpr,
    TREE_2D: tl.constexpr, A: tl.constexpr, B: tl.constexpr, G: tl.constexpr, KB: tl.constexpr,
):
    """4over6-quantize [A, B] blocks of 16 (v3: [A, B, 16] fp32, block amax [A, B], outer amax
    broadcastable to [A, B]); returns (codes [A, B, 16], scale bits [A, B]). FOUR_OVER_SIX: 1 MAE, 2 MSE.

    EXACT: fp64 divisions and per-element 4over6 dequantization (see normal_range).
    TREE_2D: 0 for 1x16 blocks; 1 when the [A, B] = [BLOCK_M, BLOCK_K/16] rows of 16x16 blocks are
    rowwise (error rows [G, 16, KB]); 2 when [A, B] = [BLOCK_M/16, BLOCK_K] are columnwise ([G, KB, 16]).
    """
    s_enc, s_dec = global_scales(outer, E6, EXACT)
    base = correct_div(bamax, tl.zeros_like(bamax) + 6.0, EXACT) * s_enc
    MSE: tl.constexpr = FOUR_OVER_SIX == 2
    codes6, scale6, err6 = _candidate_4over6(v3, base, s_dec, outer, False, E6, MSE, EXACT, A, B)
    codes4, scale4, err4 = _candidate_4over6(v3, base, s_dec, outer, True, E6, MSE, EXACT, A, B)
    if TREE_2D == 1:
        # the 16 row errors of a 16x16 block, [G, 16, KB] -> tree over the 16 rows
        e6 = tree_sum16(tl.permute(tl.reshape(err6, [G, 16, KB]), (0, 2, 1)), G, KB)
        e4 = tree_sum16(tl.permute(tl.reshape(err4, [G, 16, KB]), (0, 2, 1)), G, KB)
        pick4 = tl.reshape(tl.broadcast_to((e4 < e6)[:, None, :], [G, 16, KB]), [A, B])
    elif TREE_2D == 2:
        # the 16 column errors of a 16x16 block, [G, KB, 16] -> tree over the 16 columns
        e6 = tree_sum16(tl.reshape(err6, [G, KB, 16]), G, KB)
        e4 = tree_sum16(tl.reshape(err4, [G, KB, 16]), G, KB)
        pick4 = tl.reshape(tl.broadcast_to((e4 < e6)[:, :, None], [G, KB, 16]), [A, B])
    else:
        pick4 = err4 < err6
    scale = tl.where(pick4, scale4, scale6)
    codes = tl.where(pick4[:, :, None], codes4, codes6)
    return codes, scale


@triton.jit
def four_over_six_kernel(
    x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr,
    row_amax_ptr, col_amax_ptr, M, K, offsets_ptr, group_split_ptr, num_splits,
    ROWWISE: tl.constexpr, COLWISE: tl.constexpr, BLOCK_2D: tl.constexpr, PER_TOKEN: tl.constexpr,
    FOUR_OVER_SIX: tl.constexpr, E6: tl.constexpr, LAYOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUPED: tl.constexpr = False, SPLIT_STEPS: tl.constexpr = 0, SOFT_BF16: tl.constexpr = False,
):
    """One [BLOCK_M, BLOCK_K] tile -> its rowwise and columnwise 4over6 blocks (FOUR_OVER_SIX: 1 MAE, 2 MSE).

    GROUPED (kernels/grouped_quantize.py): x is the concatenation of splits of rows, int64 offsets
    (num_splits + 1,) at offsets_ptr (2^SPLIT_STEPS >= num_splits), each split quantized alone: outer
    amaxes per split (row_amax (num_splits,) or per row; col_amax (num_splits,) or (num_splits, K)),
    columnwise blocks in the bulk layout (split s at K * off_s / 16 blocks, viewed (K, m_s / 16)).
    Compact scales only. Splits are multiples of 16 rows
    when columnwise or 16x16 output is asked, so no 16-row group straddles two splits, and the split
    of a row is read from group_split (int32, split of each 16-row group, from the amax pass);
    rowwise-only splits have any size and each row searches the offsets (``split_of``).
    """
    G: tl.constexpr = BLOCK_M // 16  # 16-row groups (columnwise blocks) per tile
    KB: tl.constexpr = BLOCK_K // 16  # 16-column groups (rowwise blocks) per tile
    rows, cols, row_ok, col_ok, pid_m, pid_k, xf = load_tile(x_ptr, M, K, BLOCK_M, BLOCK_K, SOFT_BF16)
    k_blocks = K // 16
    blks = pid_k * KB + tl.arange(0, KB).to(tl.int64)  # rowwise block index along K
    blk_ok = blks < k_blocks
    groups = pid_m * G + tl.arange(0, G).to(tl.int64)  # columnwise block index along M
    m_blocks = M // 16
    group_ok = groups < m_blocks
    if BLOCK_2D:
        x4 = tl.reshape(xf, [G, 16, KB, 16])
        bamax_2d = tl.max(tl.max(abs_bits(x4), axis=3), axis=1).to(tl.float32, bitcast=True)  # [G, KB]

    # ---------------------------------------------------------------- rowwise: blocks along K
    if ROWWISE:
        x3 = tl.reshape(xf, [BLOCK_M, KB, 16])
        if BLOCK_2D:
            bamax = tl.reshape(tl.broadcast_to(bamax_2d[:, None, :], [G, 16, KB]), [BLOCK_M, KB])
        else:
            bamax = _block_amax(x3)
        if PER_TOKEN:
            outer = tl.load(row_amax_ptr + rows, mask=row_ok, other=0.0)[:, None]  # [BLOCK_M, 1]
        elif GROUPED:
            if COLWISE or BLOCK_2D:
                row_split = tl.load(group_split_ptr + rows // 16, mask=row_ok, other=0)
            else:
                row_split = split_of(rows, offsets_ptr, num_splits, SPLIT_STEPS)
            outer = tl.load(row_amax_ptr + row_split)[:, None]
        else:
            outer = tl.zeros([1, 1], tl.float32) + tl.load(row_amax_ptr)
        TREE_R: tl.constexpr = BLOCK_2D * 1  # 1: 16x16 row errors are tree-summed
        # Triton 3.6 rejects a runtime `if` that rebinds a name already bound to another shape, so the
        # two directions' results have distinct names (row_*, col_*)
        if normal_range(outer):
            row_codes, row_scale = _quantize_blocks(x3, bamax, outer, FOUR_OVER_SIX, E6, False, TREE_R, BLOCK_M, KB, G, KB)
        else:
            row_codes, row_scale = _quantize_blocks(x3, bamax, outer, FOUR_OVER_SIX, E6, True, TREE_R, BLOCK_M, KB, G, KB)
        ok = row_ok[:, None] & blk_ok[None, :]
        half = tl.arange(0, 2)[None, None, :]
        word = (rows[:, None] * k_blocks + blks[None, :]) * 2
        tl.store(row_data_ptr + word[:, :, None] + half, pack_codes(row_codes, BLOCK_M, KB), mask=ok[:, :, None])
        soff = scale_offsets(rows[:, None], blks[None, :], k_blocks, LAYOUT)
        tl.store(row_scale_ptr + soff, row_scale.to(tl.uint8), mask=ok)

    # ---------------------------------------------------------- columnwise: blocks along M (x^T rows)
    if COLWISE:
        y3 = tl.permute(tl.reshape(xf, [G, 16, BLOCK_K]), (0, 2, 1))  # [G, BLOCK_K, 16]
        if BLOCK_2D:
            bamax = tl.reshape(tl.broadcast_to(bamax_2d[:, :, None], [G, KB, 16]), [G, BLOCK_K])
        else:
            bamax = _block_amax(y3)
        if GROUPED:
            split = tl.load(group_split_ptr + groups, mask=group_ok, other=0)  # [G]
            start = tl.load(offsets_ptr + split)
            split_blocks = (tl.load(offsets_ptr + split + 1) - start) // 16
            # bulk block index: split base K * start / 16, then (column, 16-row group within the split)
            blk2 = (start // 16 * K)[:, None] + cols[None, :] * split_blocks[:, None] + (groups - start // 16)[:, None]
            if PER_TOKEN:
                outer = tl.load(col_amax_ptr + split[:, None] * K + cols[None, :], mask=col_ok[None, :], other=0.0)
            else:
                outer = tl.load(col_amax_ptr + split)[:, None]  # [G, 1]
        else:
            blk2 = cols[None, :] * m_blocks + groups[:, None]
            if PER_TOKEN:
                outer = tl.load(col_amax_ptr + cols, mask=col_ok, other=0.0)[None, :]  # [1, BLOCK_K]
            else:
                outer = tl.zeros([1, 1], tl.float32) + tl.load(col_amax_ptr)
        TREE_C: tl.constexpr = BLOCK_2D * 2
        if normal_range(outer):
            col_codes, col_scale = _quantize_blocks(y3, bamax, outer, FOUR_OVER_SIX, E6, False, TREE_C, G, BLOCK_K, G, KB)
        else:
            col_codes, col_scale = _quantize_blocks(y3, bamax, outer, FOUR_OVER_SIX, E6, True, TREE_C, G, BLOCK_K, G, KB)
        ok = group_ok[:, None] & col_ok[None, :]
        if GROUPED:  # device offsets are not checked: whatever they hold, write inside the bulk buffers only
            ok = ok & (blk2 >= 0) & (blk2 < (M // 16) * K)
        half = tl.arange(0, 2)[None, None, :]
        word = blk2 * 2
        tl.store(col_data_ptr + word[:, :, None] + half, pack_codes(col_codes, G, BLOCK_K), mask=ok[:, :, None])
        if GROUPED:
            soff = blk2  # compact
        else:
            soff = scale_offsets(cols[None, :], groups[:, None], m_blocks, LAYOUT)
        tl.store(col_scale_ptr + soff, col_scale.to(tl.uint8), mask=ok)

