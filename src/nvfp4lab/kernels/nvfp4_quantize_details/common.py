"""Device helpers shared by the NVFP4 quantize kernels: fp32 arithmetic of the spec's global scales,
correctly rounded division, the normal-range test that picks a tile's division path, packing, scale
layouts, split search and tile loads.

Numerics (those of :mod:`nvfp4lab.ref.nvfp4`, op for op in fp32): divisions are correctly rounded
(``correct_div``). Tiles whose outer amaxes are all 0 or in [2^-100, 2^100] (``normal_range``) use
``div_rn`` (Triton's ``/`` is approximate): there no operand or quotient that matters is subnormal, so
it is exact even where Triton lowers it to the flushing ``div.rn.ftz.f32``. Other tiles take the
EXACT path: fp64 divisions rounded once.
"""
import numpy as np
import triton
import triton.language as tl

from ..formats import bf16_rne, e2m1_decode, e4m3_decode, to_f32
from ..swizzle import swizzle_offset

FLT_MAX = tl.constexpr(3.4028234663852886e38)
PR3045_AMAX_FLOOR = tl.constexpr(float(np.float32(1e-12)))  # fl(1e-12): PR 3045 floors amax in S_enc
ONE_SIXTH = tl.constexpr(float(np.float32(1.0 / 6.0)))  # fl(1/6), folded into S_enc first (spec 3.1)
E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def abs_bits(v):
    return v.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def abs_max16_bits(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15):
    """max |v| of 16 fp32 values as int32 bits: an integer max of their magnitude bits (NaN above inf, as
    torch.amax)."""
    a = tl.maximum(tl.maximum(abs_bits(v0), abs_bits(v1)), tl.maximum(abs_bits(v2), abs_bits(v3)))
    b = tl.maximum(tl.maximum(abs_bits(v4), abs_bits(v5)), tl.maximum(abs_bits(v6), abs_bits(v7)))
    c = tl.maximum(tl.maximum(abs_bits(v8), abs_bits(v9)), tl.maximum(abs_bits(v10), abs_bits(v11)))
    d = tl.maximum(tl.maximum(abs_bits(v12), abs_bits(v13)), tl.maximum(abs_bits(v14), abs_bits(v15)))
    return tl.maximum(tl.maximum(a, b), tl.maximum(c, d))


@triton.jit
def bf16_half(w, HI: tl.constexpr):
    """fp32 values of one bf16 of int32 words: the low half (column 2p) or, with HI, the high one (2p + 1)."""
    if HI:
        out = bf16_hi(w)
    else:
        out = bf16_lo(w)
    return out


@triton.jit
def bf16_rne_pairs(a, b, HW: tl.constexpr):
    """fp32 -> the fp32 values of their RNE bf16 for two tensors of one shape, without saturation: one
    ``cvt.rn.bf16x2.f32`` per pair of elements on the GPU (HW), else integer RNE. The same bits except for NaN
    payloads (the convert gives the canonical NaN)."""
    if HW:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $3, $2; shl.b32 $0, t, 16; and.b32 $1, t, 0xffff0000; }",
            "=r,=r,f,f", [a, b], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
        out = lo.to(tl.float32, bitcast=True), hi.to(tl.float32, bitcast=True)
    else:
        out = bf16_rne(a), bf16_rne(b)
    return out


@triton.jit
def word_column_program(K, BLOCK_C: tl.constexpr, GROUPS: tl.constexpr):
    """This program's place in a word-column kernel over bf16 x (M, K) read as (M, K / 2) int32 words, BLOCK_C word
    columns x GROUPS 16-row groups per program, column tiles fastest: (its word columns wc (int64), their mask, its
    first 16-row group (int64), K / 2)."""
    pid = tl.program_id(0)
    kw = K // 2
    n_c = tl.cdiv(kw, BLOCK_C)
    wc = ((pid % n_c) * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
    return wc, wc < kw, (pid // n_c).to(tl.int64) * GROUPS, kw


@triton.jit
def load_words16(x_ptr, g, kw, wc, mask):
    """The 16 rows of 16-row group g of word columns wc of x read as (M, kw) int32 words (masked words: 0)."""
    p = x_ptr + g * 16 * kw + wc
    return (tl.load(p, mask=mask, other=0), tl.load(p + kw, mask=mask, other=0),
            tl.load(p + 2 * kw, mask=mask, other=0), tl.load(p + 3 * kw, mask=mask, other=0),
            tl.load(p + 4 * kw, mask=mask, other=0), tl.load(p + 5 * kw, mask=mask, other=0),
            tl.load(p + 6 * kw, mask=mask, other=0), tl.load(p + 7 * kw, mask=mask, other=0),
            tl.load(p + 8 * kw, mask=mask, other=0), tl.load(p + 9 * kw, mask=mask, other=0),
            tl.load(p + 10 * kw, mask=mask, other=0), tl.load(p + 11 * kw, mask=mask, other=0),
            tl.load(p + 12 * kw, mask=mask, other=0), tl.load(p + 13 * kw, mask=mask, other=0),
            tl.load(p + 14 * kw, mask=mask, other=0), tl.load(p + 15 * kw, mask=mask, other=0))


@triton.jit
def bf16_lo(w):
    """fp32 value of the low bf16 of int32 words (the even column of a bf16 pair; exact)."""
    return (w << 16).to(tl.float32, bitcast=True)


@triton.jit
def bf16_hi(w):
    """fp32 value of the high bf16 of int32 words (the odd column of a bf16 pair; exact)."""
    return (w & -65536).to(tl.float32, bitcast=True)


@triton.jit
def clamp_flt_max(v):
    # not tl.minimum: on the GPU it returns the non-NaN operand, torch.clamp keeps the NaN
    return tl.where(v > FLT_MAX, FLT_MAX, v)


@triton.jit
def correct_div(a, b, F64: tl.constexpr):
    """Correctly rounded fp32 a / b (a, b fp32 tensors of one shape).

    F64: divide in fp64 and round once to fp32 (exact: 53 >= 2*24 + 2 bits), for tiles where an
    operand or the quotient can be subnormal; ``div_rn`` flushes those on some Triton versions
    (div.rn.ftz.f32). In normal-range tiles (``normal_range``) ``div_rn`` is exact.
    """
    if F64:
        q = (a.to(tl.float64) / b.to(tl.float64)).to(tl.float32)
    else:
        q = tl.math.div_rn(a, b)
    return q


@triton.jit
def global_scales(amax, E6: tl.constexpr, F64: tl.constexpr):
    """S_enc = clamp(6E / amax) (1 for amax 0 or inf), S_dec = 1 / S_enc."""
    s_enc = clamp_flt_max(correct_div(tl.zeros_like(amax) + E6, amax, F64))
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    s_dec = correct_div(tl.zeros_like(s_enc) + 1.0, s_enc, F64)
    return s_enc, s_dec


@triton.jit
def pr3045_floor(amax):
    """PR 3045's max(amax, fl(1e-12)) (NaN stays NaN, as torch.maximum)."""
    return tl.where(amax < PR3045_AMAX_FLOOR, PR3045_AMAX_FLOOR, amax)


@triton.jit
def global_encode_pr3045(amax, F64: tl.constexpr):
    """PR 3045: S_enc = clamp(2688 / max(amax, 1e-12)), 1 where the quotient is 0."""
    floored = pr3045_floor(amax)
    s_enc = clamp_flt_max(correct_div(tl.zeros_like(floored) + 2688.0, floored, F64))
    return tl.where(s_enc == 0.0, 1.0, s_enc)


@triton.jit
def encode_factor_pr3045(scale_f, s_enc, F64: tl.constexpr):
    """PR 3045: min(S_enc / s, FLT_MAX), one correctly rounded division; 0 for a zero scale."""
    q = clamp_flt_max(correct_div(tl.zeros_like(scale_f) + s_enc, scale_f, F64))
    return tl.where(scale_f == 0.0, 0.0, q)


@triton.jit
def encode_factor(scale_f, s_dec, F64: tl.constexpr):
    """min(1 / (s * S_dec), FLT_MAX); a zero scale gives FLT_MAX."""
    prod = scale_f * s_dec
    return clamp_flt_max(correct_div(tl.zeros_like(prod) + 1.0, prod, F64))


@triton.jit
def e2m1_rn_value(v):
    """The E2M1 grid value (fp32, sign included) that round to nearest even gives v = fl(x * enc) (not NaN), without
    forming its code: a = min(|v|, 6) is rounded onto the grid in its binade 2^E (E = max(exponent(a), 0), spacing
    2^(E-1)) by one fp32 add of 2^(E+22), whose ulp is that spacing (ties to even: the grid's even codes are the
    even multiples), and the exact subtraction of it; then the sign bit of v + 0.0, i.e. the reference's ``v < 0``
    (-0.0 + 0.0 = +0.0, so -0.0 gives +0 as code 0, and a negative v rounding to 0 gives -0 as code 8; bits, not a
    negation: Triton negates a float by subtracting it from 0 on the GPU, which turns -0 into +0)."""
    a = tl.minimum(tl.abs(v), 6.0)
    big = (tl.maximum(a, 1.0).to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True) * 4194304.0
    sign = (v + 0.0).to(tl.int32, bitcast=True) & -2147483648
    return (((a + big) - big).to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def operand_values(codes, scale_codes):
    """The exact BF16 values q * s of E2M1 codes and their blocks' E4M3 scale codes (broadcast): the
    GEMM's expanded operand (every product has at most 6 significant bits and lies in [2^-10, 2688] or is 0;
    a NaN scale gives NaN, as the expansion)."""
    return (e2m1_decode(codes) * e4m3_decode(scale_codes.to(tl.int32))).to(tl.bfloat16)


@triton.jit
def operand_values_rn(x, enc, scale_codes):
    """``operand_values`` of the round-to-nearest codes of fl(x * enc) (normal-range tiles), without forming the
    codes (``e2m1_rn_value``). NaN products: unspecified, as the codes (their block's scale is NaN)."""
    q = e2m1_rn_value(x * enc)
    return (q * e4m3_decode(scale_codes.to(tl.int32))).to(tl.bfloat16)


@triton.jit
def bf16x2_word(lo, hi, HW: tl.constexpr):
    """The int32 word of two fp32 values that bf16 holds exactly (an operand's q * s; NaN stays NaN): lo in the low
    half. One ``cvt.rn.bf16x2.f32`` on the GPU (HW), else the top halves of the bits."""
    if HW:
        out = tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], dtype=tl.int32,
                                        is_pure=True, pack=1)
    else:
        out = (hi.to(tl.int32, bitcast=True) & -65536) | ((lo.to(tl.int32, bitcast=True) >> 16) & 0xFFFF)
    return out


@triton.jit
def pack_codes(codes, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 16] E2M1 codes -> [A, B, 2] int32 words, code i in bits 4(i%8).. of word i//8."""
    shift = ((tl.arange(0, 16) % 8) * 4)[None, None, :]
    return tl.sum(tl.reshape(codes << shift, [A, B, 2, 8]), axis=3)


@triton.jit
def normal_range(outer):
    """Scalar: every outer amax of the tile is 0 or in [2^-100, 2^100] (not NaN).

    Then every fp32 division meets normal operands and quotients (or only changes values that round
    to a zero scale anyway), so ``div_rn`` is exact even where it flushes subnormals, and
    dequant_4over6_fast is exact. Other tiles (tiny, huge or NaN amax) take the EXACT path: fp64
    divisions, per-element 4over6 dequantization.
    """
    return tl.min(in_normal_range(outer).to(tl.int32)) == 1


@triton.jit
def in_normal_range(outer):
    """Elementwise: outer amax 0 or in [2^-100, 2^100] (NaN fails), the test ``normal_range`` reduces."""
    return (outer == 0.0) | ((outer >= 7.888609052210118e-31) & (outer <= 1.2676506002282294e30))


@triton.jit
def split_of(r, offsets_ptr, num_splits, STEPS: tl.constexpr):
    """Split of global row r (int64 tensor): the largest s < num_splits with offsets[s] <= r (so a
    zero-row split never owns a row), by binary lifting over the device offsets (2^STEPS >= num_splits)."""
    pos = tl.zeros_like(r)
    for i in tl.static_range(STEPS):
        cand = pos + (1 << (STEPS - 1 - i))
        inside = cand < num_splits
        start = tl.load(offsets_ptr + cand, mask=inside, other=0)
        pos = tl.where(inside & (start <= r), cand, pos)
    return pos


@triton.jit
def group_split(group_split_ptr, g, M):
    """Split of the 16-row group g (scalar or tensor) as the amax pass recorded it; groups past the M rows
    (a multi-group program's tail, whose stores are masked) read the last group's entry."""
    return tl.load(group_split_ptr + tl.minimum(g, tl.cdiv(M, 16) - 1))


@triton.jit
def split_span(offsets_ptr, group_split_ptr, g, M):
    """(split, its first row, its 16-row blocks) of the 16-row group g (``group_split``)."""
    split = group_split(group_split_ptr, g, M)
    start = tl.load(offsets_ptr + split)
    return split, start, (tl.load(offsets_ptr + split + 1) - start) // 16


@triton.jit
def scale_offsets(i, j, ncols, LAYOUT: tl.constexpr):
    """Offset of scale (i, j) of an (R, ncols) matrix in the compact / padded / swizzled buffer."""
    if LAYOUT == 0:
        off = i * ncols + j
    else:
        cols_p = (ncols + 3) // 4 * 4
        if LAYOUT == 1:
            off = i * cols_p + j
        else:
            off = swizzle_offset(i, j, cols_p // 4)
    return off


@triton.jit
def banded_order(pid, n_m, n_k, BAND: tl.constexpr):
    """(pid_m, pid_k) of program pid over n_m x n_k tiles, visited in bands of BAND tile rows: within a band the
    tile rows fastest, then the tile columns (BAND = 1: tile columns fastest, row by row). Programs that run at the
    same time then write neighbouring pieces of each columnwise output row (x^T's rows, one per column of x), which
    the L2 can merge into whole lines before they go to memory."""
    if BAND == 1:
        pid_m = pid // n_k
        pid_k = pid % n_k
    else:
        per_band = BAND * n_k
        first_m = (pid // per_band) * BAND
        rows = tl.minimum(n_m - first_m, BAND)
        pid_m = first_m + (pid % per_band) % rows
        pid_k = (pid % per_band) // rows
    return pid_m, pid_k


@triton.jit
def program_columns(K, BLOCK_K: tl.constexpr):
    """(pid_m, pid_k, cols, col_ok) of this program over tiles ordered K-fastest (int64 columns)."""
    pid = tl.program_id(0)
    n_k = tl.cdiv(K, BLOCK_K)
    pid_m = pid // n_k
    pid_k = pid % n_k
    cols = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
    return pid_m, pid_k, cols, cols < K


@triton.jit
def load_rows(x_ptr, rows, cols, col_ok, M, K, SOFT_BF16: tl.constexpr):
    """(row_ok, fp32 tile) of x (M, K) at int64 rows x cols, zeros outside (SOFT_BF16: ``to_f32``)."""
    row_ok = rows < M
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    return row_ok, to_f32(x, SOFT_BF16)


@triton.jit
def load_tile(x_ptr, M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SOFT_BF16: tl.constexpr):
    """This program's [BLOCK_M, BLOCK_K] tile of x (M, K) as fp32 (zeros outside), programs ordered
    K-fastest; returns (rows, cols, row_ok, col_ok, pid_m, pid_k, xf) with int64 row/column indices."""
    pid_m, pid_k, cols, col_ok = program_columns(K, BLOCK_K)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok, xf = load_rows(x_ptr, rows, cols, col_ok, M, K, SOFT_BF16)
    return rows, cols, row_ok, col_ok, pid_m, pid_k, xf


@triton.jit
def split8(t, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr):
    """[A, B, C, D, 8] -> its 8 slices [A, B, C, D] along the last (in-thread) axis, in index order."""
    t6 = tl.reshape(t, [A, B, C, D, 2, 2, 2])  # last axes: bits 2, 1, 0 of the index
    ev, od = tl.split(t6)  # bit 0
    e0, e1 = tl.split(ev)  # bit 1
    o0, o1 = tl.split(od)
    i0, i4 = tl.split(e0)  # bit 2
    i2, i6 = tl.split(e1)
    i1, i5 = tl.split(o0)
    i3, i7 = tl.split(o1)
    return i0, i1, i2, i3, i4, i5, i6, i7
