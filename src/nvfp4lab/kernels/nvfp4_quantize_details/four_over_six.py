"""The 4over6 NVFP4 casts: each block's scale picked between map-to-6 and map-to-4 by the MAE or MSE of its
dequantized candidate. Recipes without 4over6 run ``cast16_kernel``; 4over6 takes neither RHT nor stochastic
rounding (:class:`~nvfp4lab.config.NVFP4QuantConfig` rejects both).

* ``four_over_six_1x16_kernel`` (1x16 blocks of bf16 input, per tensor or per token, not grouped; the end of this
  file): one output per launch, each block's 16 values in one thread, so its maximum, both candidates, their error
  sums and the pick need no exchange between threads and no per-block work is done twice; only the winner's codes
  are encoded. The kernel is bound by instructions (mostly sm_90's half-width integer pipe), not by the second read
  of x a row+col cast takes.
* ``four_over_six_kernel`` (16x16 blocks, grouped casts, other input dtypes) quantizes a 16-row group x BLOCK_K
  columns into its rowwise and columnwise blocks, as below.

Layout: ``cast16_kernel``'s (one warp per 16 x 128 tile, rows permuted so that each thread holds 8 rows
x 8 columns, i.e. half of a rowwise and half of a columnwise block). Both directions are views of the
tile as [A, B, 2, 8, 8]: 8 slices (last axis, in-thread: the thread's 8 rows for rowwise blocks, its 8
columns for columnwise ones) of blocks (A, B), each block's 16 elements as 2 halves (one per thread of
a pair) of 8 (in one thread), in index order. So a block maximum is an in-thread max and one shuffle,
an index-order error sum is 7 in-thread adds, one hand-off of the first half's sum, and 8 adds, and
the slices are quantized one after the other (few registers live at a time).

Numerics (``ref.nvfp4.quantize_rows``, op for op in fp32; launches pass ``enable_fp_fusion=False``):
normal-range tiles (``normal_range``) divide per block only: fl(bamax / 6) and the dequantization's
fl(y / 6E) by ``div_const_rn`` (exact for the divisors 6, 1536 and 2688), the encode factor by one
``div_rn``; an element's dequantized value is 2^e times one of two per-block values (``_candidate``).
EXACT tiles (tiny, huge or NaN outer amax) divide in fp64 per element.
"""
import triton
import triton.language as tl

from ..formats import e2m1_decode, e2m1_encode_fast, e4m3_decode, e4m3_encode, to_f32
from ..pdl import wait_prior_grid
from .cast_row import e4m3_code, push_code
from .common import (
    E4M3_MAX,
    FLT_MAX,
    abs_bits,
    bf16_hi,
    bf16_lo,
    correct_div,
    encode_factor,
    global_scales,
    group_split,
    in_normal_range,
    normal_range,
    scale_offsets,
    split8,
    split_of,
    split_span,
)


@triton.jit
def div_const_rn(y, C: tl.constexpr):
    """fl(y / C) for fp32 y >= 0 whose quotient is a normal number (or 0), C in (6, 1536, 2688) (6 and
    6E): with R = fl(1/C), q = fl(y * R) is within an ulp, the remainder y - q*C is exact in one fma,
    and fl(q + rem * R) is the correctly rounded quotient (Markstein's correction; checked over every
    fp32 significand for these C). 3 instructions instead of ``div_rn``'s ~10."""
    tl.static_assert((C == 6.0) or (C == 1536.0) or (C == 2688.0), "div_const_rn: divisor not checked")
    R: tl.constexpr = 1.0 / C  # the double 1/C rounds to fl(1/C) for these C
    q = y * R
    rem = tl.fma(-q, C, y)
    return tl.fma(rem, R, q)


@triton.jit
def dequant_pair(scale_f, outer, E6: tl.constexpr):
    """(fl(fl(s * amax) / 6E), fl(fl(fl(1.5 * s) * amax) / 6E)): the dequantized values of the codes
    +-1 and +-1.5 of a block with scale s, from which ``dequant_fast`` scales the others. All normal
    (or 0) for outer amaxes 0 or in [2^-100, 2^100]."""
    return div_const_rn(scale_f * outer, E6), div_const_rn((scale_f * 1.5) * outer, E6)


@triton.jit
def dequant_fast(q_mag, v_one, v_three_halves):
    """|fl(fl(fl(q * s) * amax) / 6E)| for the E2M1 magnitude q_mag = 2^e * m (m in {1, 1.5}; or 0)
    from ``dequant_pair``'s values: q*s is exact and scaling by 2^e commutes with the fp32 roundings
    while every value is normal, so it is 2^e times the value of m; 2^e and m are q_mag's exponent and
    mantissa bits (q_mag = 0 gives 2^e = 0)."""
    pow2, v_m = _dequant_parts(q_mag, v_one, v_three_halves)
    return pow2 * v_m


@triton.jit
def _dequant_parts(q_mag, v_one, v_three_halves):
    """(2^e, value of m) of ``dequant_fast``: their product is exact."""
    qb = q_mag.to(tl.int32, bitcast=True)
    pow2 = (qb & 0x7F800000).to(tl.float32, bitcast=True)
    return pow2, tl.where((qb & 0x400000) != 0, v_three_halves, v_one)


@triton.jit
def _slice(t, i: tl.constexpr, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr):
    """Slice i of [A, B, C, D, 8] along its last axis."""
    t0, t1, t2, t3, t4, t5, t6, t7 = split8(t, A, B, C, D)
    if i == 0:
        r = t0
    elif i == 1:
        r = t1
    elif i == 2:
        r = t2
    elif i == 3:
        r = t3
    elif i == 4:
        r = t4
    elif i == 5:
        r = t5
    elif i == 6:
        r = t6
    else:
        r = t7
    return r


@triton.jit
def _slice3(t, i: tl.constexpr, N: tl.constexpr):
    """Slice i of [P, Q, N] (N = 8) along its last axis -> [P, Q]; N = 1 (the same for every slice): t."""
    P: tl.constexpr = t.shape[0]
    Q: tl.constexpr = t.shape[1]
    if N == 1:
        r = tl.reshape(t, [P, Q])
    else:
        r = tl.reshape(_slice(tl.reshape(t, [P, Q, 1, 1, 8]), i, P, Q, 1, 1), [P, Q])
    return r


@triton.jit
def seq_sum_pair(t, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 2, 8] -> [A, B, 2]: the fp32 sum of each block's 16 terms (half, element) in index order
    (((t0 + t1) + t2) + ...) in the half-1 entry (the half-0 entry holds garbage): half 0 sums its 8
    in-thread terms, hands the sum over (one shuffle; + 0.0 is exact), and half 1 continues it."""
    t0, t1, t2, t3, t4, t5, t6, t7 = split8(tl.reshape(t, [A, B, 1, 2, 8]), A, B, 1, 2)
    s = t0 + t1
    s = s + t2
    s = s + t3
    s = s + t4
    s = s + t5
    s = s + t6
    s = s + t7
    half = tl.arange(0, 2)[None, None, None, :]
    s = tl.sum(tl.where(half == 0, s, 0.0), axis=3)[:, :, :, None] + t0
    s = s + t1
    s = s + t2
    s = s + t3
    s = s + t4
    s = s + t5
    s = s + t6
    s = s + t7
    return tl.reshape(s, [A, B, 2])


@triton.jit
def seq_sum16(t, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 2, 8] -> [A, B]: the fp32 sum of each block's 16 terms (half, element) in index order, the block
    in one thread."""
    a0, a1, a2, a3, a4, a5, a6, a7 = split8(tl.reshape(t, [A, B, 2, 1, 8]), A, B, 2, 1)
    l0, h0 = tl.split(tl.reshape(a0, [A, B, 2]))
    l1, h1 = tl.split(tl.reshape(a1, [A, B, 2]))
    l2, h2 = tl.split(tl.reshape(a2, [A, B, 2]))
    l3, h3 = tl.split(tl.reshape(a3, [A, B, 2]))
    l4, h4 = tl.split(tl.reshape(a4, [A, B, 2]))
    l5, h5 = tl.split(tl.reshape(a5, [A, B, 2]))
    l6, h6 = tl.split(tl.reshape(a6, [A, B, 2]))
    l7, h7 = tl.split(tl.reshape(a7, [A, B, 2]))
    s = l0 + l1
    s = s + l2
    s = s + l3
    s = s + l4
    s = s + l5
    s = s + l6
    s = s + l7
    s = s + h0
    s = s + h1
    s = s + h2
    s = s + h3
    s = s + h4
    s = s + h5
    s = s + h6
    s = s + h7
    return s


@triton.jit
def tree_sum8(t, KB: tl.constexpr):
    """[KB, 8] -> [KB]: levels 4, 2, 1 of the shuffle-down tree, t[j] + t[j + 4], ... (in-thread)."""
    lo, hi = tl.split(tl.permute(tl.reshape(t, [KB, 2, 4]), (0, 2, 1)))
    t = lo + hi
    lo, hi = tl.split(tl.permute(tl.reshape(t, [KB, 2, 2]), (0, 2, 1)))
    t = lo + hi
    lo, hi = tl.split(t)
    return lo + hi


@triton.jit
def tree_sum8_pair(r, KB: tl.constexpr):
    """[KB, 2, 8] -> [KB]: the shuffle-down tree (offsets 8, 4, 2, 1) over the 16 values of each 16x16
    block (value 8 * h + j at [kb, h, j]) as TE reduces 2D 4over6 errors."""
    return tree_sum8(tl.sum(r, axis=1), KB)  # r[j] + r[j + 8] first


@triton.jit
def _candidate(xs, scale, outer, s_dec, E6: tl.constexpr, MSE: tl.constexpr, EXACT: tl.constexpr,
               X_SIGN: tl.constexpr = False):
    """One 4over6 candidate of blocks [A, B] (xs [A, B, 2, 8]) with E4M3 scale bits ``scale`` [A, B]:
    (packed words [A, B, 2] (one per half: code i of a half in bits 4i..4i+3), per-element error terms
    [A, B, 2, 8]). ``outer``, ``s_dec``: broadcastable to [A, B].

    Normal-range tiles: the encode factor by one ``div_rn``; the codes by ``e2m1_scale_encode``'s
    rounding, which also gives |q| exactly, their sign bit from fl(x * enc) < 0 (X_SIGN, normal range only: the
    int32 bits sb of each rounded value instead of the words, from which the caller encodes the winning candidate's
    codes with x's signs, see ``_blocks16``); the dequantized magnitude by
    ``dequant_fast``, its exact product folded into d's one rounding. The sign of the code only flips the
    sign of d, so d = |val| - |x|.
    """
    if EXACT:
        scale_f = e4m3_decode(scale)
        enc = encode_factor(scale_f, s_dec, True)
        codes = e2m1_encode_fast(xs * enc[:, :, None, None])
        val = correct_div((e2m1_decode(codes) * scale_f[:, :, None, None]) * outer[:, :, None, None],
                          tl.zeros_like(xs) + E6, True)
        d = val - xs
    else:
        scale_f = (scale << 20).to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^120: exact decode
        enc = tl.minimum(tl.math.div_rn(tl.full(scale_f.shape, 1.0, tl.float32), scale_f * s_dec), FLT_MAX)
        v_one, v_three_halves = dequant_pair(scale_f, outer, E6)
        v = xs * enc[:, :, None, None]
        a = tl.minimum(tl.abs(v), 6.0)
        binade = (tl.maximum(a, 1.0).to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
        s = tl.fma(binade, 5242883.0, a)  # a rounded onto the E2M1 grid of its binade (e2m1_scale_encode)
        sb = s.to(tl.int32, bitcast=True)
        codes = ((sb + (sb >> 22)) & 7) | tl.where(v < 0, 8, 0)
        q_mag = tl.fma(binade, -5242883.0, s)  # |q|, exactly
        pow2, v_m = _dequant_parts(q_mag, v_one[:, :, None, None], v_three_halves[:, :, None, None])
        d = tl.fma(pow2, v_m, -tl.abs(xs))  # fl(|val| - |x|): the product is exact
    if MSE:
        term = d * d
    else:
        term = tl.abs(d)
    if X_SIGN:
        words = sb  # the caller encodes the winner's only
    else:
        shift = (tl.arange(0, 8) * 4)[None, None, None, :]
        words = tl.sum(codes << shift, axis=3)
    return words, term


@triton.jit
def _slice_candidates(xs, bamax, outer, s_enc, s_dec, FOUR_OVER_SIX: tl.constexpr, E6: tl.constexpr,
                      EXACT: tl.constexpr, A: tl.constexpr, B: tl.constexpr, IN_THREAD: tl.constexpr = False,
                      HW: tl.constexpr = False, X_SIGN: tl.constexpr = False):
    """Both candidates of blocks [A, B] (xs [A, B, 2, 8] fp32, block maxima [A, B]; outer amax and its
    S_enc, S_dec broadcastable to [A, B]): (words6, words4 [A, B, 2], err6, err4 [A, B] (the index-order
    error sums), scale6, scale4 [A, B]). IN_THREAD: each block's 16 values lie in one thread (``seq_sum16``),
    else its halves in a thread pair (``seq_sum_pair``). HW: the normal-range tiles' block scales by Hopper's E4M3
    convert (``cast_row.e4m3_code``, same bits; a NaN block's scale is set by ``_pick``). X_SIGN (normal-range
    tiles only): words6, words4 are ``_candidate``'s raw bits sb [A, B, 2, 8]."""
    if EXACT:
        base = correct_div(bamax, tl.zeros_like(bamax) + 6.0, True) * s_enc
        scale6 = e4m3_encode(tl.where(base > E4M3_MAX, E4M3_MAX, base))
        base4 = base * 1.5
        scale4 = e4m3_encode(tl.where(base4 > E4M3_MAX, E4M3_MAX, base4))
    else:
        # a subnormal bamax / 6 may be off by an ulp, but its base rounds to a zero scale anyway
        base = div_const_rn(bamax, 6.0) * s_enc
        scale6 = e4m3_code(base, HW)
        scale4 = e4m3_code(base * 1.5, HW)
    MSE: tl.constexpr = FOUR_OVER_SIX == 2
    words6, term6 = _candidate(xs, scale6, outer, s_dec, E6, MSE, EXACT, X_SIGN)
    words4, term4 = _candidate(xs, scale4, outer, s_dec, E6, MSE, EXACT, X_SIGN)
    if IN_THREAD:
        err6 = seq_sum16(term6, A, B)
        err4 = seq_sum16(term4, A, B)
    else:
        half = tl.arange(0, 2)[None, None, :]
        err6 = tl.sum(tl.where(half == 1, seq_sum_pair(term6, A, B), 0.0), axis=2)
        err4 = tl.sum(tl.where(half == 1, seq_sum_pair(term4, A, B), 0.0), axis=2)
    return words6, words4, err6, err4, scale6, scale4


@triton.jit
def _pick(w6, w4, e6, e4, sc6, sc4, bamax, EXACT: tl.constexpr):
    """The words [A, B, 2] and scales [A, B] of each block's candidate with the smaller error (map-to-4 only when
    strictly smaller). Normal-range tiles: NaN blocks (only where the outer amax does not bound the data) get zero
    codes and scale 0x7F, as the reference's NaN scale and encode factor give (EXACT tiles get them from the
    candidates' own arithmetic)."""
    pick4 = e4 < e6
    w = tl.where(pick4[:, :, None], w4, w6)
    sc = tl.where(pick4, sc4, sc6)
    if not EXACT:
        nan = bamax != bamax
        sc = tl.where(nan, 0x7F, sc)
        w = tl.where(nan[:, :, None], 0, w)
    return w, sc


@triton.jit
def _quantize_direction(xt, bamax3, outer3, FOUR_OVER_SIX: tl.constexpr, E6: tl.constexpr, EXACT: tl.constexpr,
                        BLOCK_2D: tl.constexpr, ROW: tl.constexpr, A: tl.constexpr, B: tl.constexpr,
                        N_OUTER: tl.constexpr):
    """4over6-quantize the 8 slices of blocks [A, B] of xt [A, B, 2, 8, 8] (fp32; block maxima bamax3
    [A, B, 8], outer amaxes outer3 [A, B, 8] (N_OUTER = 8) or [1, 1, 1] (N_OUTER = 1)) -> (words
    [A, B, 2, 8], scale bits [A, B, 8]). FOUR_OVER_SIX: 1 MAE, 2 MSE.

    BLOCK_2D: the 16 errors of each 16x16 block are tree-summed: (A, B) = (h, kb) with slices j (ROW:
    block rows 8h + j) or (kb, half) with slices cc (columnwise: block columns 8 half + cc).
    """
    s_enc3, s_dec3 = global_scales(outer3, E6, EXACT)
    sl = tl.arange(0, 8)
    words = tl.zeros([A, B, 2, 8], tl.int32)
    words4 = tl.zeros([A, B, 2, 8], tl.int32)
    scale = tl.zeros([A, B, 8], tl.int32)
    scale4 = tl.zeros([A, B, 8], tl.int32)
    if ROW:
        KB: tl.constexpr = B
    else:
        KB: tl.constexpr = A
    t8_6 = tl.zeros([KB, 8], tl.float32)
    t8_4 = tl.zeros([KB, 8], tl.float32)
    for i in tl.static_range(8):
        xs = _slice(xt, i, A, B, 2, 8)
        bamax = _slice3(bamax3, i, 8)
        outer = _slice3(outer3, i, N_OUTER)
        s_enc = _slice3(s_enc3, i, N_OUTER)
        s_dec = _slice3(s_dec3, i, N_OUTER)
        w6, w4, e6, e4, sc6, sc4 = _slice_candidates(xs, bamax, outer, s_enc, s_dec, FOUR_OVER_SIX, E6, EXACT, A, B)
        at_i = (sl == i)[None, None, :]
        if BLOCK_2D:
            # this slice's row (column) errors of every 16x16 block, paired h (half): r[j] + r[j + 8]
            if ROW:
                r6 = tl.sum(e6, axis=0)
                r4 = tl.sum(e4, axis=0)
            else:
                r6 = tl.sum(e6, axis=1)
                r4 = tl.sum(e4, axis=1)
            t8_6 = tl.where((sl == i)[None, :], r6[:, None], t8_6)
            t8_4 = tl.where((sl == i)[None, :], r4[:, None], t8_4)
            words = tl.where(at_i[:, :, None, :], w6[:, :, :, None], words)
            words4 = tl.where(at_i[:, :, None, :], w4[:, :, :, None], words4)
            scale = tl.where(at_i, sc6[:, :, None], scale)
            scale4 = tl.where(at_i, sc4[:, :, None], scale4)
        else:
            w, sc = _pick(w6, w4, e6, e4, sc6, sc4, bamax, EXACT)
            words = tl.where(at_i[:, :, None, :], w[:, :, :, None], words)
            scale = tl.where(at_i, sc[:, :, None], scale)
    if BLOCK_2D:
        pick4 = tree_sum8(t8_4, KB) < tree_sum8(t8_6, KB)  # [KB]
        if ROW:
            p3 = pick4[None, :, None]
        else:
            p3 = pick4[:, None, None]
        words = tl.where(p3[:, :, None, :], words4, words)
        scale = tl.where(p3, scale4, scale)
        if not EXACT:
            nan = bamax3 != bamax3
            scale = tl.where(nan, 0x7F, scale)
            words = tl.where(nan[:, :, None, :], 0, words)
    return words, scale


@triton.jit
def four_over_six_kernel(
    x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr,
    row_amax_ptr, col_amax_ptr, M, K, offsets_ptr, group_split_ptr, num_splits,
    ROWWISE: tl.constexpr, COLWISE: tl.constexpr, BLOCK_2D: tl.constexpr, PER_TOKEN: tl.constexpr,
    FOUR_OVER_SIX: tl.constexpr, E6: tl.constexpr, LAYOUT: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUPED: tl.constexpr = False, SPLIT_STEPS: tl.constexpr = 0, SOFT_BF16: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """One 16-row group x BLOCK_K columns -> its rowwise and columnwise 4over6 blocks (FOUR_OVER_SIX:
    1 MAE, 2 MSE).

    GROUPED (kernels/grouped_quantize.py): x is the concatenation of splits of rows, int64 offsets
    (num_splits + 1,) at offsets_ptr (2^SPLIT_STEPS >= num_splits), each split quantized alone: outer
    amaxes per split (row_amax (num_splits,) or per row; col_amax (num_splits,) or (num_splits, K)),
    columnwise blocks in the bulk layout (split s at K * off_s / 16 blocks, viewed (K, m_s / 16)).
    Compact scales only. Splits are multiples of 16 rows
    when columnwise or 16x16 output is asked, so no 16-row group straddles two splits, and the split
    of a row is read from group_split (int32, split of each 16-row group, from the amax pass);
    rowwise-only splits have any size and each row searches the offsets (``split_of``).

    Tile views: tile row i = 2j + h holds row 8h + j of the group (``cast16_kernel``'s r16), tile
    column c = 16 kb + 8 half + cc, x5 = [j, h, kb, half, cc]; rowwise blocks are its permutation
    [h, kb, half, cc, j] (slices j), columnwise blocks [kb, half, h, j, cc] (slices cc).
    """
    wait_prior_grid(PDL)
    KB: tl.constexpr = BLOCK_K // 16
    pid = tl.program_id(0)
    n_k = tl.cdiv(K, BLOCK_K)
    g = (pid // n_k).to(tl.int64)  # 16-row group = columnwise block index along M
    pid_k = pid % n_k
    r16 = (tl.arange(0, 16) % 2) * 8 + tl.arange(0, 16) // 2
    rows = g * 16 + r16.to(tl.int64)
    cols = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
    x_ptrs = x_ptr + rows[:, None] * K + cols[None, :]
    x_ok = (rows < M)[:, None] & (cols < K)[None, :]
    x5 = tl.reshape(to_f32(tl.load(x_ptrs, mask=x_ok, other=0.0), SOFT_BF16), [8, 2, KB, 2, 8])
    k_blocks = K // 16
    m_blocks = M // 16
    if BLOCK_2D:
        bamax_2d = tl.max(tl.max(tl.max(tl.max(abs_bits(x5), axis=4), axis=3), axis=1), axis=0).to(tl.float32, bitcast=True)  # [KB]

    # ---------------------------------------------------------------- rowwise: [h, kb, half, cc, j]
    if ROWWISE:
        xr = tl.permute(x5, (1, 2, 3, 4, 0))
        h3 = tl.arange(0, 2)[:, None, None]
        j3 = tl.arange(0, 8)[None, None, :]
        row3 = g * 16 + (h3 * 8 + j3).to(tl.int64)  # [2, 1, 8]
        blk3 = pid_k * KB + tl.arange(0, KB)[None, :, None].to(tl.int64)  # [1, KB, 1]
        row_ok3 = row3 < M
        if BLOCK_2D:
            bamax = tl.broadcast_to(bamax_2d[None, :, None], [2, KB, 8])
        else:
            bamax = tl.max(tl.max(abs_bits(xr), axis=3), axis=2).to(tl.float32, bitcast=True)
        if PER_TOKEN:
            outer = tl.load(row_amax_ptr + row3, mask=row_ok3, other=0.0)  # [2, 1, 8]
            N_ROW: tl.constexpr = 8
        elif GROUPED:
            if COLWISE or BLOCK_2D:  # splits of whole 16-row groups: one split for the tile
                outer = tl.zeros([1, 1, 1], tl.float32) + tl.load(row_amax_ptr + group_split(group_split_ptr, g, M))
                N_ROW: tl.constexpr = 1
            else:
                outer = tl.load(row_amax_ptr + split_of(row3, offsets_ptr, num_splits, SPLIT_STEPS))
                N_ROW: tl.constexpr = 8
        else:
            outer = tl.zeros([1, 1, 1], tl.float32) + tl.load(row_amax_ptr)
            N_ROW: tl.constexpr = 1
        # Triton 3.6 rejects a runtime `if` that rebinds a name already bound to another shape, so the
        # two directions' results have distinct names (row_*, col_*)
        if normal_range(outer):
            row_words, row_scale = _quantize_direction(xr, bamax, outer, FOUR_OVER_SIX, E6, False, BLOCK_2D, True,
                                                       2, KB, N_ROW)
        else:
            row_words, row_scale = _quantize_direction(xr, bamax, outer, FOUR_OVER_SIX, E6, True, BLOCK_2D, True,
                                                       2, KB, N_ROW)
        ok = row_ok3 & (blk3 < k_blocks)  # [2, KB, 8]
        word = (row3 * k_blocks + blk3) * 2
        tl.store(row_data_ptr + word[:, :, None, :] + tl.arange(0, 2)[None, None, :, None], row_words,
                 mask=ok[:, :, None, :])
        tl.store(row_scale_ptr + scale_offsets(row3, blk3, k_blocks, LAYOUT), row_scale.to(tl.uint8), mask=ok)

    # ---------------------------------------------------------- columnwise: [kb, half, h, j, cc]
    if COLWISE:
        if ROWWISE:  # read the tile again (from L1): keeping it live through the rowwise side spills
            x5 = tl.reshape(to_f32(tl.load(x_ptrs, mask=x_ok, other=0.0), SOFT_BF16), [8, 2, KB, 2, 8])
        xc = tl.permute(x5, (2, 3, 1, 0, 4))
        col3 = pid_k * BLOCK_K + (tl.arange(0, KB)[:, None, None] * 16 + tl.arange(0, 2)[None, :, None] * 8
                                  + tl.arange(0, 8)[None, None, :]).to(tl.int64)  # [KB, 2, 8]
        col_ok3 = col3 < K
        if BLOCK_2D:
            cbamax = tl.broadcast_to(bamax_2d[:, None, None], [KB, 2, 8])
        else:
            cbamax = tl.max(tl.max(abs_bits(xc), axis=3), axis=2).to(tl.float32, bitcast=True)
        if GROUPED:
            split, start, split_blocks = split_span(offsets_ptr, group_split_ptr, g, M)
            blk2 = start // 16 * K + col3 * split_blocks + (g - start // 16)  # bulk layout
            if PER_TOKEN:
                couter = tl.load(col_amax_ptr + split * K + col3, mask=col_ok3, other=0.0)
            else:
                couter = tl.zeros([1, 1, 1], tl.float32) + tl.load(col_amax_ptr + split)
        else:
            blk2 = col3 * m_blocks + g
            if PER_TOKEN:
                couter = tl.load(col_amax_ptr + col3, mask=col_ok3, other=0.0)
            else:
                couter = tl.zeros([1, 1, 1], tl.float32) + tl.load(col_amax_ptr)
        N_COL: tl.constexpr = 8 if PER_TOKEN else 1
        if normal_range(couter):
            col_words, col_scale = _quantize_direction(xc, cbamax, couter, FOUR_OVER_SIX, E6, False, BLOCK_2D, False,
                                                       KB, 2, N_COL)
        else:
            col_words, col_scale = _quantize_direction(xc, cbamax, couter, FOUR_OVER_SIX, E6, True, BLOCK_2D, False,
                                                       KB, 2, N_COL)
        cok = col_ok3 & ((tl.zeros_like(col3) + g) < m_blocks)
        if GROUPED:  # device offsets are not checked: whatever they hold, write inside the bulk buffers only
            cok = cok & (blk2 >= 0) & (blk2 < m_blocks * K)
        tl.store(col_data_ptr + blk2[:, :, None, :] * 2 + tl.arange(0, 2)[None, None, :, None], col_words,
                 mask=cok[:, :, None, :])
        if GROUPED:
            csoff = blk2  # compact
        else:
            csoff = scale_offsets(col3, g, m_blocks, LAYOUT)
        tl.store(col_scale_ptr + csoff, col_scale.to(tl.uint8), mask=cok)


# ------------------------------------------------------------------------------------------------------------------
# four_over_six_1x16_kernel: one output per launch, every block's 16 values in one thread


@triton.jit
def _stack8(e0, e1, e2, e3, e4, e5, e6, e7, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 8] of eight [A, B] tensors in index order, the new axis in-thread (joins: no data movement)."""
    t = tl.join(tl.join(tl.join(e0, e4), tl.join(e2, e6)), tl.join(tl.join(e1, e5), tl.join(e3, e7)))
    return tl.reshape(t, [A, B, 8])


@triton.jit
def _stack16(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 2, 8] of sixteen [A, B] tensors: value i at (i // 8, i % 8), in-thread."""
    lo = _stack8(v0, v1, v2, v3, v4, v5, v6, v7, A, B)
    hi = _stack8(v8, v9, v10, v11, v12, v13, v14, v15, A, B)
    return tl.permute(tl.join(lo, hi), (0, 1, 3, 2))


@triton.jit
def _bf16_pair(w):
    """[N] int32 words -> [N, 2] fp32: (low bf16, high bf16) of each word, in-thread."""
    return tl.join(bf16_lo(w), bf16_hi(w))


@triton.jit
def x_sign_safe(outer, E6: tl.constexpr):
    """Elementwise: an outer amax (per tensor or per token) under which no product x * enc of a nonzero bf16 x
    (|x| >= 2^-133) underflows, so a code's sign is x's own. Every block's encode factor is
    enc = fl(1 / fl(s * S_dec)) >= ~(6E / outer) / 448 (s <= 448, S_dec ~ outer / 6E), which exceeds 2^-17
    (|x| enc > 2^-150) for outer <= 6E / 448 * 2^17: the bound here keeps a factor 2 to spare."""
    return outer <= E6 * (65536.0 / 448.0)


@triton.jit
def tile_path(outer, E6: tl.constexpr):
    """Scalar path of a tile of bf16 input from its outer amaxes: 2 every one normal-range (``in_normal_range``) and
    ``x_sign_safe``, 1 normal-range, 0 EXACT."""
    return tl.min(tl.where(in_normal_range(outer), tl.where(x_sign_safe(outer, E6), 2, 1), 0))


@triton.jit
def _blocks16(xs, outer, FOUR_OVER_SIX: tl.constexpr, E6: tl.constexpr, EXACT: tl.constexpr, A: tl.constexpr,
              B: tl.constexpr, HW: tl.constexpr, X_SIGN: tl.constexpr):
    """4over6 blocks [A, B] of xs [A, B, 2, 8] (each block's 16 values in one thread, index order) with outer amaxes
    ``outer`` (broadcastable to [A, B]) -> (words [A, B, 2], E4M3 scale bits [A, B])."""
    s_enc, s_dec = global_scales(outer, E6, EXACT)
    bamax = tl.max(tl.max(abs_bits(xs), axis=3), axis=2).to(tl.float32, bitcast=True)
    w6, w4, e6, e4, sc6, sc4 = _slice_candidates(xs, bamax, outer, s_enc, s_dec, FOUR_OVER_SIX, E6, EXACT, A, B, True,
                                                 HW, X_SIGN)
    if X_SIGN:  # the winner's codes only: code and sign in the top nibble by one multiply-add (``cast_row.code_top``)
        sb = tl.where((e4 < e6)[:, :, None, None], w4, w6)
        sign_top = (xs + 0.0).to(tl.int32, bitcast=True) & -2147483648  # -0.0 -> +0.0: code 0, as fl(-0.0 * enc) < 0
        w6 = _pack_top(sb * 268435520 + sign_top, A, B, HW)  # 2^28 + 2^6
        w4 = w6
    return _pick(w6, w4, e6, e4, sc6, sc4, bamax, EXACT)


@triton.jit
def _pack_top(top, A: tl.constexpr, B: tl.constexpr, HW: tl.constexpr):
    """[A, B, 2, 8] codes in the top nibbles -> [A, B, 2] words (code i in bits 4i..4i+3), by ``push_code``."""
    t0, t1, t2, t3, t4, t5, t6, t7 = split8(tl.reshape(top, [A, B, 2, 1, 8]), A, B, 2, 1)
    acc = push_code(tl.zeros([A, B, 2], tl.int32), tl.reshape(t7, [A, B, 2]), HW)
    acc = push_code(acc, tl.reshape(t6, [A, B, 2]), HW)
    acc = push_code(acc, tl.reshape(t5, [A, B, 2]), HW)
    acc = push_code(acc, tl.reshape(t4, [A, B, 2]), HW)
    acc = push_code(acc, tl.reshape(t3, [A, B, 2]), HW)
    acc = push_code(acc, tl.reshape(t2, [A, B, 2]), HW)
    acc = push_code(acc, tl.reshape(t1, [A, B, 2]), HW)
    return push_code(acc, tl.reshape(t0, [A, B, 2]), HW)


@triton.jit
def _row_tile(x_ptr, rows, kb, ok, kw):
    """[BLOCK_M, KB, 2, 8] fp32: the 16 values of rowwise blocks (rows, kb) of bf16 x read as int32 words (8 words per
    block, one load per word slot: the whole block in one thread)."""
    p = x_ptr + rows[:, None] * kw + kb[None, :] * 8
    w0 = tl.load(p, mask=ok, other=0)
    w1 = tl.load(p + 1, mask=ok, other=0)
    w2 = tl.load(p + 2, mask=ok, other=0)
    w3 = tl.load(p + 3, mask=ok, other=0)
    w4 = tl.load(p + 4, mask=ok, other=0)
    w5 = tl.load(p + 5, mask=ok, other=0)
    w6 = tl.load(p + 6, mask=ok, other=0)
    w7 = tl.load(p + 7, mask=ok, other=0)
    return _stack16(bf16_lo(w0), bf16_hi(w0), bf16_lo(w1), bf16_hi(w1), bf16_lo(w2), bf16_hi(w2),
                    bf16_lo(w3), bf16_hi(w3), bf16_lo(w4), bf16_hi(w4), bf16_lo(w5), bf16_hi(w5),
                    bf16_lo(w6), bf16_hi(w6), bf16_lo(w7), bf16_hi(w7), rows.shape[0], kb.shape[0])


@triton.jit
def _col_tile(x_ptr, g, wc, c_ok, kw):
    """[BLOCK_W, 2, 2, 8] fp32: the columnwise blocks of 16-row group g for word columns wc (columns 2 wc and
    2 wc + 1): one coalesced load per row, a column's 16 rows in one thread."""
    p = x_ptr + g * 16 * kw + wc
    BW: tl.constexpr = wc.shape[0]
    return _stack16(
        _bf16_pair(tl.load(p, mask=c_ok, other=0)), _bf16_pair(tl.load(p + kw, mask=c_ok, other=0)),
        _bf16_pair(tl.load(p + 2 * kw, mask=c_ok, other=0)), _bf16_pair(tl.load(p + 3 * kw, mask=c_ok, other=0)),
        _bf16_pair(tl.load(p + 4 * kw, mask=c_ok, other=0)), _bf16_pair(tl.load(p + 5 * kw, mask=c_ok, other=0)),
        _bf16_pair(tl.load(p + 6 * kw, mask=c_ok, other=0)), _bf16_pair(tl.load(p + 7 * kw, mask=c_ok, other=0)),
        _bf16_pair(tl.load(p + 8 * kw, mask=c_ok, other=0)), _bf16_pair(tl.load(p + 9 * kw, mask=c_ok, other=0)),
        _bf16_pair(tl.load(p + 10 * kw, mask=c_ok, other=0)), _bf16_pair(tl.load(p + 11 * kw, mask=c_ok, other=0)),
        _bf16_pair(tl.load(p + 12 * kw, mask=c_ok, other=0)), _bf16_pair(tl.load(p + 13 * kw, mask=c_ok, other=0)),
        _bf16_pair(tl.load(p + 14 * kw, mask=c_ok, other=0)), _bf16_pair(tl.load(p + 15 * kw, mask=c_ok, other=0)),
        BW, 2)


@triton.jit
def _col_group(x_ptr, g, wc, c_ok, kw, m_blocks, outer, FOUR_OVER_SIX: tl.constexpr, E6: tl.constexpr,
               EXACT: tl.constexpr, HW: tl.constexpr, X_SIGN: tl.constexpr):
    """``_blocks16`` of the columnwise blocks of 16-row group g (read as zeros past m_blocks) for word columns wc:
    (words [BLOCK_W, 2, 2], scale bits [BLOCK_W, 2])."""
    xs = _col_tile(x_ptr, g, wc, c_ok & (wc * 0 + g < m_blocks), kw)
    return _blocks16(xs, outer, FOUR_OVER_SIX, E6, EXACT, wc.shape[0], 2, HW, X_SIGN)


@triton.jit
def _col_groups(x_ptr, g0, wc, c_ok, kw, m_blocks, outer, FOUR_OVER_SIX: tl.constexpr, E6: tl.constexpr,
                EXACT: tl.constexpr, HW: tl.constexpr, X_SIGN: tl.constexpr, GROUPS: tl.constexpr):
    """The columnwise blocks of 16-row groups g0.. g0 + GROUPS - 1 (1, 2 or 4) for word columns wc: (words
    [BLOCK_W, 2, 2 GROUPS], each column's run of GROUPS blocks in memory order, scale bits [BLOCK_W, 2, GROUPS])."""
    BW: tl.constexpr = wc.shape[0]
    w0, s0 = _col_group(x_ptr, g0, wc, c_ok, kw, m_blocks, outer, FOUR_OVER_SIX, E6, EXACT, HW, X_SIGN)
    if GROUPS == 1:
        words = w0
        scales = tl.reshape(s0, [BW, 2, 1])
    else:
        w1, s1 = _col_group(x_ptr, g0 + 1, wc, c_ok, kw, m_blocks, outer, FOUR_OVER_SIX, E6, EXACT, HW, X_SIGN)
        if GROUPS == 2:
            words = tl.reshape(tl.permute(tl.join(w0, w1), (0, 1, 3, 2)), [BW, 2, 4])
            scales = tl.join(s0, s1)
        else:
            w2, s2 = _col_group(x_ptr, g0 + 2, wc, c_ok, kw, m_blocks, outer, FOUR_OVER_SIX, E6, EXACT, HW, X_SIGN)
            w3, s3 = _col_group(x_ptr, g0 + 3, wc, c_ok, kw, m_blocks, outer, FOUR_OVER_SIX, E6, EXACT, HW, X_SIGN)
            # join(join(a, c), join(b, d)): the last two axes (i, o) hold group 2 i + o
            w4 = tl.reshape(tl.join(tl.join(w0, w2), tl.join(w1, w3)), [BW, 2, 2, 4])
            words = tl.reshape(tl.permute(w4, (0, 1, 3, 2)), [BW, 2, 8])
            scales = tl.reshape(tl.join(tl.join(s0, s2), tl.join(s1, s3)), [BW, 2, 4])
    return words, scales


@triton.jit
def four_over_six_1x16_kernel(x_ptr, data_ptr, scale_ptr, amax_ptr, M, K, M_WORDS,
                              COLUMNWISE: tl.constexpr, PER_TOKEN: tl.constexpr, FOUR_OVER_SIX: tl.constexpr,
                              E6: tl.constexpr, LAYOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr,
                              HW: tl.constexpr, GROUPS: tl.constexpr = 1, PDL: tl.constexpr = False):
    """One output (rowwise, or with COLUMNWISE columnwise) of a 1x16 4over6 cast of bf16 x, each block's 16 values
    in one thread: its maximum, both candidates, their index-order error sums and the pick stay in the thread (no
    exchange between threads, no per-block work done twice), unlike ``four_over_six_kernel`` whose blocks span a
    thread pair. A row+col cast is two launches, each reading x.

    Layout: x (M, K) bf16 contiguous, 16-byte aligned, K % 16 == 0, read as (M, K / 2) int32 words (columns 2p and
    2p + 1 in word p, the first in the low half); data written as int32 words (8 codes each, the first in the low
    nibble), scales (E4M3 bits) compact / padded / swizzled (``scale_offsets``).

    * Rowwise: a program covers BLOCK_M rows x BLOCK_W blocks, each thread whole blocks (eight 4-byte loads per block,
      32 bytes apart: more L1 requests than a coalesced load, which this instruction-bound kernel absorbs). Data
      (M, K / 2) uint8 as (M, K / 8) words.
    * Columnwise (M % 16 == 0): a program covers GROUPS 16-row groups x BLOCK_W word columns (2 BLOCK_W columns),
      each thread a word column: 16 coalesced row loads per group, two column blocks. Data (K, M / 2) uint8 as
      (K, M / 8) words, a column's GROUPS blocks stored as one run of 8 GROUPS bytes (4 groups: a whole 32-byte
      sector) and its scales likewise (one run where the layout keeps them contiguous).

    M_WORDS = M / 8 (an argument, so that its divisibility is known to the columnwise stores).
    amax_ptr: the outer amax (per tensor: (1,); PER_TOKEN: one per row, or per column with COLUMNWISE). HW: inline
    PTX (the GPU) for the block scales' E4M3 convert.
    Numerics: ``four_over_six_kernel``'s, op for op (the same helpers; normal-range tiles and EXACT ones), the codes'
    sign from x on normal-range tiles whose outer amaxes are ``x_sign_safe`` (``tile_path``; the same bits).
    """
    wait_prior_grid(PDL)
    pid = tl.program_id(0)
    kw = K // 2
    if COLUMNWISE:
        n_c = tl.cdiv(kw, BLOCK_W)
        m_blocks = M_WORDS // 2
        g0 = (pid // n_c).to(tl.int64) * GROUPS
        wc = ((pid % n_c) * BLOCK_W + tl.arange(0, BLOCK_W)).to(tl.int64)
        c_ok = wc < kw
        cols = wc[:, None] * 2 + tl.arange(0, 2)[None, :]  # [BLOCK_W, 2]
        ok = c_ok[:, None] & (cols < K)
        if PER_TOKEN:
            outer = tl.load(amax_ptr + cols, mask=ok, other=0.0)
        else:
            outer = tl.zeros([1, 1], tl.float32) + tl.load(amax_ptr)
        path = tile_path(outer, E6)
        if path == 2:
            words, scale = _col_groups(x_ptr, g0, wc, c_ok, kw, m_blocks, outer, FOUR_OVER_SIX, E6, False, HW, True, GROUPS)
        elif path == 1:
            words, scale = _col_groups(x_ptr, g0, wc, c_ok, kw, m_blocks, outer, FOUR_OVER_SIX, E6, False, HW, False,
                                       GROUPS)
        else:
            words, scale = _col_groups(x_ptr, g0, wc, c_ok, kw, m_blocks, outer, FOUR_OVER_SIX, E6, True, HW, False,
                                       GROUPS)
        slot = tl.arange(0, 2 * GROUPS)[None, None, :]
        tl.store(data_ptr + (cols * M_WORDS + g0 * 2)[:, :, None] + slot, words,
                 mask=ok[:, :, None] & (g0 * 2 + slot < m_blocks * 2))
        groups = g0 + tl.arange(0, GROUPS)[None, None, :]
        tl.store(scale_ptr + scale_offsets(cols[:, :, None], groups, m_blocks, LAYOUT), scale.to(tl.uint8),
                 mask=ok[:, :, None] & (groups < m_blocks))
    else:
        k_blocks = K // 16
        n_k = tl.cdiv(k_blocks, BLOCK_W)
        rows = ((pid // n_k) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        kb = ((pid % n_k) * BLOCK_W + tl.arange(0, BLOCK_W)).to(tl.int64)
        ok = (rows < M)[:, None] & (kb < k_blocks)[None, :]
        xs = _row_tile(x_ptr, rows, kb, ok, kw)
        if PER_TOKEN:
            outer = tl.load(amax_ptr + rows, mask=rows < M, other=0.0)[:, None]
        else:
            outer = tl.zeros([1, 1], tl.float32) + tl.load(amax_ptr)
        path = tile_path(outer, E6)
        if path == 2:
            words, scale = _blocks16(xs, outer, FOUR_OVER_SIX, E6, False, BLOCK_M, BLOCK_W, HW, True)
        elif path == 1:
            words, scale = _blocks16(xs, outer, FOUR_OVER_SIX, E6, False, BLOCK_M, BLOCK_W, HW, False)
        else:
            words, scale = _blocks16(xs, outer, FOUR_OVER_SIX, E6, True, BLOCK_M, BLOCK_W, HW, False)
        word = (rows[:, None] * k_blocks + kb[None, :]) * 2
        tl.store(data_ptr + word[:, :, None] + tl.arange(0, 2)[None, None, :], words, mask=ok[:, :, None])
        tl.store(scale_ptr + scale_offsets(rows[:, None], kb[None, :], k_blocks, LAYOUT), scale.to(tl.uint8), mask=ok)
