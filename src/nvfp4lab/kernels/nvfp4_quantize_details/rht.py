"""Random Hadamard transform (RHT) of the columnwise NVFP4 output: bf16(v @ T) for every 16 consecutive
rows v of a column of x (the rows of x^T), T = diag(s) H16 / 4 with the sign mask s.

* ``rht_tile`` (the amax passes, for the post-RHT per-tensor amax): ``tl.dot`` of blockdiag(T^T)
  [BLOCK_M, BLOCK_M] (entries +-2^-6: T / 16) with the tile rounded to bf16, fp32 accumulation, result rounded
  to bf16 by integer RNE. (The interpreter truncates casts to bf16 and its bf16 ``tl.dot`` is wrong, so
  there the same exact values go through an fp32 dot: DOT_BF16=False.)
* ``rht16_cast16`` (the cast): butterflies in registers in ``cast16_kernel``'s layout, no dot.
* ``rht16_sums`` (``cast_col_kernel``, ``amax_rht_col_kernel``): the butterflies of one column's 16 rows held
  by one thread, no exchange.

Both sum with T / 16 (entries +-2^-6) and multiply by 16 at the end (``finish16``), as
:func:`nvfp4lab.rht.apply_rht`: the same bits as summing with T wherever that is finite (exact
power-of-two scaling of bf16 values and their partial sums), and no partial sum of finite values can
overflow; a result past bf16's range saturates to +-bf16 max. Non-bf16 inputs are rounded to bf16 with
the same saturation (``bf16_saturating``). ``rht16_sums`` can also sum with signs +-1 only (SCALED=False):
every product and partial sum is then exactly 2^6 times the T / 16 one (bf16 values times 2^-6 are exact,
subnormal partial sums are exact, and power-of-two scaling commutes with rounding elsewhere), so
bf16(S / 4) = bf16(16 s) for the finished value wherever S cannot overflow (|x| well inside fp32's range).

PR 3045's fp32 RHT (FP32=True in ``rht16_cast16``; ``rht_rows_fp32`` for the amax passes): the same
butterflies on sign-flipped fp32 values (signs +-1), kept in fp32, times 1/4 at the end: the stage order
(index bit 0, 1, 2, 3; pair (a, b) -> (a + b, a - b)) of :func:`nvfp4lab.rht.fwht16_fp32`, so every
backend gives the same bits.
"""
import triton
import triton.language as tl

from ..formats import bf16_rne
from .common import abs_bits, bf16_rne_pairs

BF16_MAX = tl.constexpr(3.3895313892515355e38)
SCALED_ENTRY = tl.constexpr(0.015625)  # |T / 16| = 2^-6


@triton.jit
def bf16_saturating(xf):
    """fp32 -> the fp32 value of its RNE bf16, finite values past bf16's range saturating to +-its max."""
    big = (tl.abs(xf) > BF16_MAX) & (tl.abs(xf) < float("inf"))
    return bf16_rne(tl.where(big, tl.where(xf > 0, BF16_MAX, -BF16_MAX), xf))


@triton.jit
def finish16(s):
    """bf16(16 s) of a sum s taken with T / 16; past bf16's range +-bf16 max (s finite). An inf or NaN
    input makes s non-finite, which passes as TE's."""
    big = (tl.abs(s) > BF16_MAX / 16) & (tl.abs(s) < float("inf"))
    return bf16_rne(tl.where(big, tl.where(s > 0, BF16_MAX, -BF16_MAX), s * 16.0))


@triton.jit
def finish16_bits(abs_sum_bits):
    """``finish16`` of a maximum |s| (int32 bits of a non-negative fp32 or NaN), as int32 bits: rounding
    and saturation are monotone, so the amax passes reduce the raw sums first and finish once."""
    return abs_bits(finish16(abs_sum_bits.to(tl.float32, bitcast=True)))


@triton.jit
def rht_tile(xf, BLOCK_M: tl.constexpr, RHT_MASK: tl.constexpr, IS_BF16: tl.constexpr, DOT_BF16: tl.constexpr,
             FINISH: tl.constexpr = True):
    """bf16(v @ T) for every 16-row group v of each column of the tile (the RHT of x^T's rows), fp32 out.
    FINISH=False: the sums s taken with T / 16 (``finish16`` not applied; see ``finish16_bits``).

    Done as D @ X with D = blockdiag(T^T): D[16g+j, 16g+i] = T[i, j] = s_i * H[i, j] / 4.
    """
    r = tl.arange(0, BLOCK_M)[:, None]
    c = tl.arange(0, BLOCK_M)[None, :]
    i = c % 16
    p = i & (r % 16)
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    negative = ((p ^ (RHT_MASK >> i)) & 1) != 0
    d = tl.where((r // 16) == (c // 16), tl.where(negative, -SCALED_ENTRY, SCALED_ENTRY), 0.0)
    if IS_BF16:
        xb = xf
    else:
        xb = bf16_saturating(xf)
    if DOT_BF16:
        y = tl.dot(d.to(tl.bfloat16), xb.to(tl.bfloat16), out_dtype=tl.float32)
    else:
        y = tl.dot(d, xb, out_dtype=tl.float32)
    if FINISH:
        y = finish16(y)
    return y


@triton.jit
def _butterfly_pairs(t):
    """[..., 2] -> (a + b, a - b) of each pair on the last axis: one stage of a Hadamard transform."""
    a, b = tl.split(t)
    return tl.join(a + b, a - b)


@triton.jit
def _stage_rows(t, H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """One butterfly stage over row-index bit H (a power of 2) of a [BLOCK_M, BLOCK_K] tile: rows r and
    r + H (r with bit H clear) become (a + b, a - b). (H = 1 without a size-1 axis.)"""
    if H == 1:
        t = tl.permute(tl.reshape(t, [BLOCK_M // 2, 2, BLOCK_K]), (0, 2, 1))
        a, b = tl.split(t)
        t = tl.permute(tl.join(a + b, a - b), (0, 2, 1))
    else:
        t = tl.permute(tl.reshape(t, [BLOCK_M // (2 * H), 2, H, BLOCK_K]), (0, 2, 3, 1))
        a, b = tl.split(t)
        t = tl.permute(tl.join(a + b, a - b), (0, 3, 1, 2))
    return tl.reshape(t, [BLOCK_M, BLOCK_K])


@triton.jit
def rht_rows_fp32(xf, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, RHT_MASK: tl.constexpr):
    """PR 3045's fp32 RHT of every 16-row group of each column of a [BLOCK_M, BLOCK_K] tile (rows in
    order): sign flips, the four butterfly stages of :func:`nvfp4lab.rht.fwht16_fp32`, times 1/4."""
    r = tl.arange(0, BLOCK_M) % 16
    t = xf * tl.where(((RHT_MASK >> r) & 1) != 0, -1.0, 1.0)[:, None]
    t = _stage_rows(t, 1, BLOCK_M, BLOCK_K)
    t = _stage_rows(t, 2, BLOCK_M, BLOCK_K)
    t = _stage_rows(t, 4, BLOCK_M, BLOCK_K)
    t = _stage_rows(t, 8, BLOCK_M, BLOCK_K)
    return t * 0.25


@triton.jit
def rht16_cast16(xb, RHT_MASK: tl.constexpr, BLOCK_K: tl.constexpr, FP32: tl.constexpr = False,
                 SATURATE: tl.constexpr = True, HW: tl.constexpr = False):
    """bf16(v @ T) for the 16 rows v of each column of a ``cast16_kernel`` tile (fp32 values of bf16
    x; tile row i holds row 8 (i % 2) + i // 2), fp32 out: the RHT of x^T's rows, as ``rht_tile``.

    Done in registers, no dot: with row r = 8 h + j, Sylvester's H16 = H2 x H8 and each thread holds
    the 8 rows j of one half h of a column, so T = diag(s) H16 / 4 is the sign flip and 1/4 (here 1/64, exact),
    H8 over j as three butterfly stages inside the thread, then H2 across the two threads of the
    column (one exchange). fp32 sums (with T / 16, then ``finish16``), rounded to bf16 once; the summation order differs from an MMA's,
    which only matters where a 16-term sum is inexact (spec: unspecified order).
    FP32 (PR 3045): signs +-1, no rounding to bf16, times 1/4 after the butterflies (module docstring).
    SATURATE=False: bf16(16 s) without the saturation of ``finish16``, for tiles whose outer amax (the
    post-RHT maximum) is in the normal range, where no result can pass bf16's range; HW: one bf16x2 convert
    per pair of neighbouring columns (``bf16_rne_pairs``).
    """
    i = tl.arange(0, 16)
    if FP32:
        sign = tl.where(((RHT_MASK >> ((i % 2) * 8 + i // 2)) & 1) != 0, -1.0, 1.0)
    else:
        sign = tl.where(((RHT_MASK >> ((i % 2) * 8 + i // 2)) & 1) != 0, -SCALED_ENTRY, SCALED_ENTRY)
    # [16, BK] -> [8 (j), 2 (h), BK] -> [2 (h), BK, 8 (j)]: a thread's 8 rows on the last axis
    t = tl.permute(tl.reshape(xb * sign[:, None], [8, 2, BLOCK_K]), (1, 2, 0))
    PAIRS: tl.constexpr = 2 * BLOCK_K * 4
    # one stage per bit of j: bit 0, bit 1, bit 2 (each pairs j with j ^ bit, the pair on the last axis)
    t = tl.reshape(_butterfly_pairs(tl.reshape(t, [PAIRS, 2])), [2, BLOCK_K, 2, 2, 2])       # (h, c, b2, b1, b0)
    t = tl.permute(t, (0, 1, 2, 4, 3))                                                      # (h, c, b2, b0, b1)
    t = tl.reshape(_butterfly_pairs(tl.reshape(t, [PAIRS, 2])), [2, BLOCK_K, 2, 2, 2])
    t = tl.permute(t, (0, 1, 3, 4, 2))                                                      # (h, c, b0, b1, b2)
    t = tl.reshape(_butterfly_pairs(tl.reshape(t, [PAIRS, 2])), [2, BLOCK_K, 2, 2, 2])
    t = tl.reshape(tl.permute(t, (0, 1, 4, 3, 2)), [2, BLOCK_K, 8])                          # (h, c, j')
    # H2 across h: y_h' = u_0 + (-1)^h' u_1
    first = (tl.arange(0, 2) == 0)[:, None, None]
    total = tl.sum(t, axis=0)
    diff = tl.sum(tl.where(first, t, -t), axis=0)
    y = tl.where(first, total[None, :, :], diff[None, :, :])
    y = tl.reshape(tl.permute(y, (2, 0, 1)), [16, BLOCK_K])
    if FP32:
        return y * 0.25
    if SATURATE:
        return finish16(y)
    even, odd = tl.split(tl.reshape(y * 16.0, [16, BLOCK_K // 2, 2]))
    even, odd = bf16_rne_pairs(even, odd, HW)
    return tl.reshape(tl.join(even, odd), [16, BLOCK_K])


@triton.jit
def _signed(v, RHT_MASK: tl.constexpr, R: tl.constexpr, SCALED: tl.constexpr):
    """Row R's term of the RHT sum: v times +-2^-6 (SCALED: T / 16) or +-1, negative where bit R of the sign mask
    is set (a negation is an operand modifier of the first butterfly's add)."""
    if SCALED:
        if (RHT_MASK >> R) & 1:
            out = v * -SCALED_ENTRY
        else:
            out = v * SCALED_ENTRY
    else:
        if (RHT_MASK >> R) & 1:
            out = -v
        else:
            out = v
    return out


@triton.jit
def _bfly(a, b):
    """One butterfly of a Hadamard stage: (a + b, a - b)."""
    return a + b, a - b


@triton.jit
def rht16_sums(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
               RHT_MASK: tl.constexpr, SCALED: tl.constexpr):
    """The 16 sums of v @ T of one column's 16 rows v0..v15 (fp32 values of bf16, each a tensor of one thread's
    columns): sign flips (times 2^-6 with SCALED, i.e. the sums s with T / 16 that ``finish16`` finishes; else the
    sums S = 2^6 s), then the four butterfly stages of Sylvester's H16 over row-index bits 0, 1, 2, 3."""
    v0, v1, v2, v3 = (_signed(v0, RHT_MASK, 0, SCALED), _signed(v1, RHT_MASK, 1, SCALED),
                      _signed(v2, RHT_MASK, 2, SCALED), _signed(v3, RHT_MASK, 3, SCALED))
    v4, v5, v6, v7 = (_signed(v4, RHT_MASK, 4, SCALED), _signed(v5, RHT_MASK, 5, SCALED),
                      _signed(v6, RHT_MASK, 6, SCALED), _signed(v7, RHT_MASK, 7, SCALED))
    v8, v9, v10, v11 = (_signed(v8, RHT_MASK, 8, SCALED), _signed(v9, RHT_MASK, 9, SCALED),
                        _signed(v10, RHT_MASK, 10, SCALED), _signed(v11, RHT_MASK, 11, SCALED))
    v12, v13, v14, v15 = (_signed(v12, RHT_MASK, 12, SCALED), _signed(v13, RHT_MASK, 13, SCALED),
                          _signed(v14, RHT_MASK, 14, SCALED), _signed(v15, RHT_MASK, 15, SCALED))
    # bit 0
    v0, v1 = _bfly(v0, v1)
    v2, v3 = _bfly(v2, v3)
    v4, v5 = _bfly(v4, v5)
    v6, v7 = _bfly(v6, v7)
    v8, v9 = _bfly(v8, v9)
    v10, v11 = _bfly(v10, v11)
    v12, v13 = _bfly(v12, v13)
    v14, v15 = _bfly(v14, v15)
    # bit 1
    v0, v2 = _bfly(v0, v2)
    v1, v3 = _bfly(v1, v3)
    v4, v6 = _bfly(v4, v6)
    v5, v7 = _bfly(v5, v7)
    v8, v10 = _bfly(v8, v10)
    v9, v11 = _bfly(v9, v11)
    v12, v14 = _bfly(v12, v14)
    v13, v15 = _bfly(v13, v15)
    # bit 2
    v0, v4 = _bfly(v0, v4)
    v1, v5 = _bfly(v1, v5)
    v2, v6 = _bfly(v2, v6)
    v3, v7 = _bfly(v3, v7)
    v8, v12 = _bfly(v8, v12)
    v9, v13 = _bfly(v9, v13)
    v10, v14 = _bfly(v10, v14)
    v11, v15 = _bfly(v11, v15)
    # bit 3
    v0, v8 = _bfly(v0, v8)
    v1, v9 = _bfly(v1, v9)
    v2, v10 = _bfly(v2, v10)
    v3, v11 = _bfly(v3, v11)
    v4, v12 = _bfly(v4, v12)
    v5, v13 = _bfly(v5, v13)
    v6, v14 = _bfly(v6, v14)
    v7, v15 = _bfly(v7, v15)
    return v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15
