"""The columnwise-only NVFP4 cast of per-tensor 1x16 RHT recipes of bf16 input, stochastic rounding included:
``cast_col_kernel``, from the columnwise outer amax: without SR it divides each block's encode factor
itself; with SR (whose Philox words leave fewer registers for the divisions) it reads them from
``row_factor_table_kernel``'s 128-entry table (cast_row.py), launched before it.

``cast16_kernel`` splits each column's 16-row block between two threads (8 rows each, so that the same
tile gives the rowwise blocks too): its RHT needs one shuffle per element, and its tiles take 140-230
registers, i.e. 8-14 warps per SM, too few to hide the memory latency. A columnwise-only cast has no
rowwise blocks to serve, so here each thread owns whole columns: the block amax, the RHT butterflies,
the scale and the codes of a block stay in one thread, with no exchange and few live values.

Layout: x (M, K) bf16 contiguous, 16-byte aligned, read as (M, K / 2) int32 words (bf16 pairs: columns
2p and 2p + 1 in word p, the first in the low half). A program covers GROUPS 16-row groups x BLOCK_C
words. GROUPS (1, 2 or 4) divides M / 16, so there are no masks along M (they would split the vector
stores). With BLOCK_C = 32 * num_warps each thread holds one word column: each of a group's 16 row loads
is one coalesced 128-byte line per warp, and the thread holds two whole column blocks. Columnwise data
(K, M / 2) uint8, written as (K, M / 8) int32 words (M_WORDS = M / 8 per column, an argument so that
its divisibility is known): a program's GROUPS blocks of a column are one contiguous run of 8 * GROUPS
bytes, stored at once (16-byte stores; 4 groups fill a 32-byte sector) rather than 8-byte pieces one by
one. Scales E4M3 bits, compact / padded / swizzled (``scale_offsets``), likewise GROUPS per column at
once where the layout keeps them contiguous.

Numerics: ``cast16_kernel``'s columnwise side, with cast_row.py's per-tensor encoder: the block scale by
``_scale_code`` (Hopper's E4M3 convert; the integer encoder under the interpreter), the encode factor
1 / (s * S_dec) from the table (fp64 divisions there) or by one division per block (fp32 where the outer
amax is in the normal range, exact there; fp64 otherwise), codes by ``code_top`` (round to nearest even)
or ``sr_e2m1`` (SR), packed by ``push_code``. NaN blocks get code 0 without SR (the reference's
x * NaN), as there. RHT: bf16(v @ T) of each column's 16 rows in the butterfly order of ``rht16_cast16``
(index bit 0, 1, 2, 3), so the same bits. Programs whose outer amax is in the normal range sum with signs
+-1 only and finish with one bf16x2 convert per pair (GPU) as bf16(S / 4), which is exact while no result is
inf or NaN (rht.py); a program that finds one after all (a provided outer amax below its results) casts its
groups again the way other outer amaxes do: sums with T / 16, ``finish16``'s saturation. SR: the columnwise Philox
units of ``pair_bytes_cols`` (columns 2p, 2p + 1 x rows 8q..8q+7, counter p * (M / 8) + q, stream 1,
byte 8 (column % 2) + row % 8): a thread's word column is exactly one unit per 8 rows.

OPERAND: instead of codes and scales the kernel writes the BF16 GEMM operand of RHT(x^T), (K, M), the exact values
q * s of the same codes times the decoded block scale (``_value``), two rows per int32 word by one bf16x2 convert: a
group's 16 values of a column, 32 bytes (one sector), stored as soon as they are made.
"""
import triton
import triton.language as tl

from ...layout import cdiv
from ..formats import e2m1_decode, e4m3_decode, e4m3_encode_fast
from ..pdl import wait_prior_grid
from .cast_row import code_top, push_code
from .common import (
    ONE_SIXTH,
    abs_max16_bits,
    bf16_half,
    bf16_rne_pairs,
    bf16x2_word,
    e2m1_rn_value,
    encode_factor,
    global_scales,
    load_words16,
    normal_range,
    scale_offsets,
    word_column_program,
)
from .rht import finish16, rht16_sums
from .stochastic_rounding import philox_words, sr_e2m1, sr_seed


@triton.jit
def _scale_code(v, HW: tl.constexpr):
    """``cast_row.e4m3_code`` in the form this kernel is faster with (same bits): the convert of (v, v) and the NaN
    mapped apart. With ``e4m3_code``'s one convert of (0, v), ptxas allocates this kernel differently and the RHT
    columnwise cast of 8192^2 bf16 takes 4% longer (benchmarks/RESULTS.md)."""
    if HW:
        code = tl.inline_asm_elementwise(
            "{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, $1, $1; cvt.u32.u16 $0, t; }",
            "=r,f", [v], dtype=tl.int32, is_pure=True, pack=1) & 0xFF
    else:
        code = e4m3_encode_fast(v, 448.0) & 0xFF
    return tl.where(v != v, 0x7F | ((v.to(tl.int32, bitcast=True) >> 24) & 0x80), code)


@triton.jit
def _quarter_bf16(a, b, HW: tl.constexpr):
    """bf16(a / 4), bf16(b / 4) as fp32 (``bf16_rne_pairs``: NaN payloads aside, which only programs that are
    cast again meet)."""
    return bf16_rne_pairs(a * 0.25, b * 0.25, HW)


@triton.jit
def _rht16(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
           RHT_MASK: tl.constexpr, SATURATE: tl.constexpr, HW: tl.constexpr):
    """bf16(v @ T) of one column's 16 rows v0..v15 (fp32 values of bf16). SATURATE: summed with T / 16 and
    finished by ``finish16`` (results past bf16's range saturate); else, for tiles whose outer amax is in the
    normal range, summed with signs +-1 and finished as bf16(S / 4): the same bits (rht.py) in fewer instructions
    wherever no result is inf or NaN (the kernel casts a program with such a result again, SATURATE)."""
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = rht16_sums(
        v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, RHT_MASK, SATURATE)
    if SATURATE:
        v0, v1, v2, v3 = finish16(v0), finish16(v1), finish16(v2), finish16(v3)
        v4, v5, v6, v7 = finish16(v4), finish16(v5), finish16(v6), finish16(v7)
        v8, v9, v10, v11 = finish16(v8), finish16(v9), finish16(v10), finish16(v11)
        v12, v13, v14, v15 = finish16(v12), finish16(v13), finish16(v14), finish16(v15)
    else:
        v0, v1 = _quarter_bf16(v0, v1, HW)
        v2, v3 = _quarter_bf16(v2, v3, HW)
        v4, v5 = _quarter_bf16(v4, v5, HW)
        v6, v7 = _quarter_bf16(v6, v7, HW)
        v8, v9 = _quarter_bf16(v8, v9, HW)
        v10, v11 = _quarter_bf16(v10, v11, HW)
        v12, v13 = _quarter_bf16(v12, v13, HW)
        v14, v15 = _quarter_bf16(v14, v15, HW)
    return v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15


@triton.jit
def _code(v, enc, rword, R: tl.constexpr, SR: tl.constexpr):
    """Row R's E2M1 code of fl(v * enc) in the top nibble (below it: whatever ``push_code`` ignores):
    round to nearest even, or SR with byte R % 4 of the random word ``rword``."""
    if SR:
        out = sr_e2m1(v * enc, (rword >> ((R % 4) * 8)) & 0xFF) << 28
    else:
        out = code_top(v, enc)
    return out


@triton.jit
def word8(v0, v1, v2, v3, v4, v5, v6, v7, enc, ra, rb, HW: tl.constexpr, SR: tl.constexpr):
    """The int32 word of the codes of 8 values (rows here, row 0 in the low nibble; pushed from the last one
    down); SR: values 0-3 take the bytes of random word ``ra``, 4-7 those of ``rb``. ``ra`` gives the word's
    shape (int32; without SR any int32 tensor of that shape)."""
    acc = push_code(tl.zeros_like(ra), _code(v7, enc, rb, 7, SR), HW)
    acc = push_code(acc, _code(v6, enc, rb, 6, SR), HW)
    acc = push_code(acc, _code(v5, enc, rb, 5, SR), HW)
    acc = push_code(acc, _code(v4, enc, rb, 4, SR), HW)
    acc = push_code(acc, _code(v3, enc, ra, 3, SR), HW)
    acc = push_code(acc, _code(v2, enc, ra, 2, SR), HW)
    acc = push_code(acc, _code(v1, enc, ra, 1, SR), HW)
    return push_code(acc, _code(v0, enc, ra, 0, SR), HW)


@triton.jit
def _value(v, enc, scale_f, rword, R: tl.constexpr, SR: tl.constexpr):
    """Row R's operand value q * s: the E2M1 value of ``_code``'s rounding of fl(v * enc) times the decoded scale."""
    if SR:
        q = e2m1_decode(sr_e2m1(v * enc, (rword >> ((R % 4) * 8)) & 0xFF))
    else:
        q = e2m1_rn_value(v * enc)
    return q * scale_f


@triton.jit
def _value_words8(v0, v1, v2, v3, v4, v5, v6, v7, enc, scale_f, ra, rb, R0: tl.constexpr, HW: tl.constexpr,
                  SR: tl.constexpr):
    """[N, 4] int32 words of the operand values of 8 rows R0.. (two bf16 per word, the first row low), in order along
    the last axis; SR: rows 0-3 of the 8 take the bytes of ``ra``, 4-7 those of ``rb`` (as ``word8``)."""
    w0 = bf16x2_word(_value(v0, enc, scale_f, ra, R0, SR), _value(v1, enc, scale_f, ra, R0 + 1, SR), HW)
    w1 = bf16x2_word(_value(v2, enc, scale_f, ra, R0 + 2, SR), _value(v3, enc, scale_f, ra, R0 + 3, SR), HW)
    w2 = bf16x2_word(_value(v4, enc, scale_f, rb, R0 + 4, SR), _value(v5, enc, scale_f, rb, R0 + 5, SR), HW)
    w3 = bf16x2_word(_value(v6, enc, scale_f, rb, R0 + 6, SR), _value(v7, enc, scale_f, rb, R0 + 7, SR), HW)
    return _in_order4(w0, w1, w2, w3)


@triton.jit
def _encode16(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15, bamax, s_enc_sixth, s_dec, table_ptr,
              r0, r1, r2, r3, HW: tl.constexpr, EXACT: tl.constexpr, TABLE: tl.constexpr,
              SR: tl.constexpr, OPERAND: tl.constexpr):
    """(word of rows 0-7, word of rows 8-15, E4M3 scale code) of one column block of 16 fp32 values with
    block amax ``bamax``; SR: random words r0..r3 for rows 0-3, 4-7, 8-11, 12-15. The encode factor read from
    the table (TABLE), else by one division: fp32 (exact for a normal-range outer amax), or (EXACT) fp64.
    OPERAND: instead of the two code words, the [N, 4] words of the operand values of rows 0-7 and of rows 8-15
    (a NaN factor's scale is NaN: NaN values, as the expansion of code 0)."""
    scale = _scale_code(bamax * s_enc_sixth, HW)
    if TABLE:
        enc = tl.load(table_ptr + (scale & 0x7F))
    else:
        enc = encode_factor(e4m3_decode(scale & 0x7F), s_dec, EXACT)
    if OPERAND:
        scale_f = e4m3_decode(scale)
        lo = _value_words8(v0, v1, v2, v3, v4, v5, v6, v7, enc, scale_f, r0, r1, 0, HW, SR)
        hi = _value_words8(v8, v9, v10, v11, v12, v13, v14, v15, enc, scale_f, r2, r3, 8, HW, SR)
    else:
        lo = word8(v0, v1, v2, v3, v4, v5, v6, v7, enc, r0, r1, HW, SR)
        hi = word8(v8, v9, v10, v11, v12, v13, v14, v15, enc, r2, r3, HW, SR)
        if not SR:  # a NaN factor (NaN element or outer amax): code 0, as the reference
            lo = tl.where(enc != enc, 0, lo)
            hi = tl.where(enc != enc, 0, hi)
    return lo, hi, scale


@triton.jit
def _column_block(w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, s_enc_sixth, s_dec, table_ptr,
                  r0, r1, r2, r3, HI: tl.constexpr, HW: tl.constexpr, RHT_MASK: tl.constexpr, SATURATE: tl.constexpr,
                  TABLE: tl.constexpr, SR: tl.constexpr, OPERAND: tl.constexpr):
    """(word of rows 0-7, word of rows 8-15, scale code, block amax bits) of the RHT block of one column of 16 rows of
    words w0..w15 (the low bf16 of each, or with HI the high one); SR: random words r0..r3 as ``_encode16``'s;
    OPERAND: ``_encode16``'s value words."""
    v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15 = _rht16(
        bf16_half(w0, HI), bf16_half(w1, HI), bf16_half(w2, HI), bf16_half(w3, HI), bf16_half(w4, HI),
        bf16_half(w5, HI), bf16_half(w6, HI), bf16_half(w7, HI), bf16_half(w8, HI), bf16_half(w9, HI),
        bf16_half(w10, HI), bf16_half(w11, HI), bf16_half(w12, HI), bf16_half(w13, HI), bf16_half(w14, HI),
        bf16_half(w15, HI), RHT_MASK, SATURATE, HW)
    bamax_bits = abs_max16_bits(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15)
    lo, hi, scale = _encode16(v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11, v12, v13, v14, v15,
                              bamax_bits.to(tl.float32, bitcast=True), s_enc_sixth, s_dec, table_ptr, r0, r1, r2, r3, HW,
                              SATURATE, TABLE, SR, OPERAND)
    return lo, hi, scale, bamax_bits


@triton.jit
def _store_words(data_ptr, col, start, words, row_words, c_ok):
    """Words [BLOCK_C, W] (W = 2 or 4: at most 16 bytes, so that the store keeps one thread per column and
    needs no layout conversion) at word slots start.. of column ``col``'s row of ``row_words`` words."""
    slot = start + tl.arange(0, words.shape[1])
    tl.store(data_ptr + (col * row_words)[:, None] + slot[None, :], words, mask=c_ok[:, None])


@triton.jit
def _store_scales(scale_ptr, col, g0, m_blocks, m_words, s0, s1, s2, s3, c_ok, GROUPS: tl.constexpr,
                  LAYOUT: tl.constexpr):
    """Column ``col``'s scale codes of groups g0..g0+GROUPS-1 (s0..s3, the unused ones ignored): one run per
    column in the compact and padded layouts (row length m_blocks, or rounded up to 4: divisible by 4, so
    the run is one store), one byte per group in the swizzled one."""
    if LAYOUT == 2 or GROUPS == 1:
        tl.store(scale_ptr + scale_offsets(col, g0, m_blocks, LAYOUT), s0.to(tl.uint8), mask=c_ok)
        if GROUPS > 1:
            tl.store(scale_ptr + scale_offsets(col, g0 + 1, m_blocks, LAYOUT), s1.to(tl.uint8), mask=c_ok)
        if GROUPS > 2:
            tl.store(scale_ptr + scale_offsets(col, g0 + 2, m_blocks, LAYOUT), s2.to(tl.uint8), mask=c_ok)
            tl.store(scale_ptr + scale_offsets(col, g0 + 3, m_blocks, LAYOUT), s3.to(tl.uint8), mask=c_ok)
    else:
        if LAYOUT == 0:
            row = m_words // 2
        else:
            row = (m_words // 2 + 3) // 4 * 4
        if GROUPS == 2:
            scales = _in_order2(s0, s1)
        else:
            scales = _in_order4(s0, s1, s2, s3)
        groups = g0 + tl.arange(0, GROUPS)
        tl.store(scale_ptr + (col * row)[:, None] + groups[None, :], scales.to(tl.uint8), mask=c_ok[:, None])


@triton.jit
def _in_order2(a, b):
    """[N, 2] of a, b (b next to a in registers and in memory)."""
    return tl.join(a, b)


@triton.jit
def _in_order4(a, b, c, d):
    """[N, 4] of a, b, c, d in this order, in registers as in memory (the last join is the fastest axis)."""
    return tl.reshape(tl.join(tl.join(a, c), tl.join(b, d)), [a.shape[0], 4])


@triton.jit
def _cast_group(x_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g, kw, m_blocks, HW: tl.constexpr, RHT_MASK: tl.constexpr,
                SATURATE: tl.constexpr, TABLE: tl.constexpr, SR: tl.constexpr, OPERAND: tl.constexpr):
    """The columnwise blocks of 16-row group g (int64 scalar) for word columns wc, both columns of each word:
    (column 2p's two words, column 2p + 1's two words, their two scale codes, the larger block amax bits); OPERAND:
    each column's two [BLOCK_C, 4] value words (rows 0-7, rows 8-15) instead of its code words."""
    w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15 = load_words16(x_ptr, g, kw, wc, c_ok)
    if SR:  # one Philox block per 8 rows of the word column: words 0, 1 -> column 2p, words 2, 3 -> 2p + 1
        counter = wc * (m_blocks * 2) + g * 2
        a0, a1, a2, a3 = philox_words(seed, counter, 1)
        b0, b1, b2, b3 = philox_words(seed, counter + 1, 1)
        a0, a1, a2, a3 = (a0.to(tl.int32, bitcast=True), a1.to(tl.int32, bitcast=True), a2.to(tl.int32, bitcast=True),
                          a3.to(tl.int32, bitcast=True))
        b0, b1, b2, b3 = (b0.to(tl.int32, bitcast=True), b1.to(tl.int32, bitcast=True), b2.to(tl.int32, bitcast=True),
                          b3.to(tl.int32, bitcast=True))
    else:
        a0, a1, a2, a3, b0, b1, b2, b3 = w0, w0, w0, w0, w0, w0, w0, w0  # unused without SR
    lo0, lo1, scale_lo, max_lo = _column_block(w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15,
                                               s_enc_sixth, s_dec, table_ptr, a0, a1, b0, b1, False, HW, RHT_MASK,
                                               SATURATE, TABLE, SR, OPERAND)
    hi0, hi1, scale_hi, max_hi = _column_block(w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15,
                                               s_enc_sixth, s_dec, table_ptr, a2, a3, b2, b3, True, HW, RHT_MASK,
                                               SATURATE, TABLE, SR, OPERAND)
    return lo0, lo1, hi0, hi1, scale_lo, scale_hi, tl.maximum(max_lo, max_hi)


@triton.jit
def _cast_groups(x_ptr, data_ptr, scale_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g0, kw, m_blocks, m_words,
                 LAYOUT: tl.constexpr, GROUPS: tl.constexpr, HW: tl.constexpr, RHT_MASK: tl.constexpr,
                 SATURATE: tl.constexpr, TABLE: tl.constexpr, SR: tl.constexpr, OPERAND: tl.constexpr):
    """GROUPS (1, 2 or 4) consecutive 16-row groups from g0, unrolled; each column's words and scales of them
    stored together (OPERAND: each group's 16 values of a column, 32 bytes, as soon as they are made). Returns whether
    a block amax of the program is inf or NaN."""
    lo_col = wc * 2
    hi_col = lo_col + 1
    if OPERAND:  # a column's row of the (K, M) operand holds M / 2 words, 8 per group
        worst = tl.zeros_like(wc).to(tl.int32)
        for j in tl.static_range(GROUPS):
            l0, l1, h0, h1, _, _, w = _cast_group(x_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g0 + j, kw,
                                                  m_blocks, HW, RHT_MASK, SATURATE, TABLE, SR, True)
            worst = tl.maximum(worst, w)
            start = (g0 + j) * 8
            _store_words(data_ptr, lo_col, start, l0, m_words * 4, c_ok)
            _store_words(data_ptr, lo_col, start + 4, l1, m_words * 4, c_ok)
            _store_words(data_ptr, hi_col, start, h0, m_words * 4, c_ok)
            _store_words(data_ptr, hi_col, start + 4, h1, m_words * 4, c_ok)
    else:
        l0, l1, h0, h1, sl0, sh0, worst = _cast_group(x_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g0, kw, m_blocks, HW,
                                                      RHT_MASK, SATURATE, TABLE, SR, False)
        if GROUPS == 1:
            _store_words(data_ptr, lo_col, g0 * 2, _in_order2(l0, l1), m_words, c_ok)
            _store_words(data_ptr, hi_col, g0 * 2, _in_order2(h0, h1), m_words, c_ok)
            _store_scales(scale_ptr, lo_col, g0, m_blocks, m_words, sl0, sl0, sl0, sl0, c_ok, 1, LAYOUT)
            _store_scales(scale_ptr, hi_col, g0, m_blocks, m_words, sh0, sh0, sh0, sh0, c_ok, 1, LAYOUT)
        else:
            l2, l3, h2, h3, sl1, sh1, worst1 = _cast_group(x_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g0 + 1, kw,
                                                           m_blocks, HW, RHT_MASK, SATURATE, TABLE, SR, False)
            worst = tl.maximum(worst, worst1)
            _store_words(data_ptr, lo_col, g0 * 2, _in_order4(l0, l1, l2, l3), m_words, c_ok)
            _store_words(data_ptr, hi_col, g0 * 2, _in_order4(h0, h1, h2, h3), m_words, c_ok)
            if GROUPS == 2:
                _store_scales(scale_ptr, lo_col, g0, m_blocks, m_words, sl0, sl1, sl1, sl1, c_ok, 2, LAYOUT)
                _store_scales(scale_ptr, hi_col, g0, m_blocks, m_words, sh0, sh1, sh1, sh1, c_ok, 2, LAYOUT)
            else:
                l4, l5, h4, h5, sl2, sh2, worst2 = _cast_group(x_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g0 + 2,
                                                               kw, m_blocks, HW, RHT_MASK, SATURATE, TABLE, SR, False)
                l6, l7, h6, h7, sl3, sh3, worst3 = _cast_group(x_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g0 + 3,
                                                               kw, m_blocks, HW, RHT_MASK, SATURATE, TABLE, SR, False)
                worst = tl.maximum(worst, tl.maximum(worst2, worst3))
                # the run's second 16 bytes right after its first (the same sector)
                _store_words(data_ptr, lo_col, g0 * 2 + 4, _in_order4(l4, l5, l6, l7), m_words, c_ok)
                _store_words(data_ptr, hi_col, g0 * 2 + 4, _in_order4(h4, h5, h6, h7), m_words, c_ok)
                _store_scales(scale_ptr, lo_col, g0, m_blocks, m_words, sl0, sl1, sl2, sl3, c_ok, 4, LAYOUT)
                _store_scales(scale_ptr, hi_col, g0, m_blocks, m_words, sh0, sh1, sh2, sh3, c_ok, 4, LAYOUT)
    return tl.max(tl.where(c_ok, worst, 0), axis=0) >= 0x7F800000


@triton.jit(do_not_specialize=["seed_value"])  # a fresh seed per call must not select another compiled kernel
def cast_col_kernel(x_ptr, data_ptr, scale_ptr, table_ptr, amax_ptr, seed_ptr, seed_value, M, K, M_WORDS,
                    LAYOUT: tl.constexpr, BLOCK_C: tl.constexpr, GROUPS: tl.constexpr, HW: tl.constexpr,
                    RHT_MASK: tl.constexpr, E6: tl.constexpr, TABLE: tl.constexpr, SR: tl.constexpr = False,
                    SEED_FROM_PTR: tl.constexpr = False, OPERAND: tl.constexpr = False, PDL: tl.constexpr = False):
    """Columnwise codes and scales of GROUPS 16-row groups x BLOCK_C word columns (module docstring).
    x_ptr: x as int32 words; data_ptr: the columnwise data as int32 words; amax_ptr: the (1,) columnwise
    outer amax (post-RHT); TABLE: encode factors from table_ptr, ``row_factor_table_kernel``'s table of
    that amax, else divided here (E6: 6 * the E4M3 maximum); HW: inline PTX (GPU) instead of the integer
    formulas. Blocks of bf16(RHT(x^T)) with the sign mask RHT_MASK; SR with the seed (SEED_FROM_PTR: read
    from seed_ptr). OPERAND: data_ptr is the BF16 GEMM operand (K, M) of RHT(x^T) as int32 words (M / 2 per row), written
    with the exact values q * s of the codes above times their decoded block scales; no codes, no scales (scale_ptr
    is not written)."""
    wait_prior_grid(PDL)
    wc, c_ok, g0, kw = word_column_program(K, BLOCK_C, GROUPS)
    m_blocks = M // 16
    outer = tl.load(amax_ptr + tl.zeros([1], tl.int32))
    if TABLE:
        s_enc_sixth = tl.load(table_ptr + 128)
        s_dec = s_enc_sixth  # unused
    else:
        s_enc, s_dec = global_scales(outer, E6, True)  # once per program, fp64 divisions (spec 3.1)
        s_enc_sixth = s_enc * ONE_SIXTH
    seed = sr_seed(seed_ptr, seed_value, SR, SEED_FROM_PTR)
    # a normal-range outer amax (the post-RHT maximum the amax pass found) bounds every result: no saturation, no
    # inf or NaN, and the fp32 division of a block's encode factor is exact. Other amaxes (0 included: S_enc = 1)
    # take fp64 and finish16, and so does a program whose results were not all finite after all (a provided outer
    # amax below the tensor's): its stores are written again
    exact = not normal_range(outer)
    if normal_range(outer):
        exact = _cast_groups(x_ptr, data_ptr, scale_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g0, kw, m_blocks,
                             M_WORDS, LAYOUT, GROUPS, HW, RHT_MASK, False, TABLE, SR, OPERAND)
    if exact:
        if HW:  # the same columns, in values the compiler cannot identify with wc: no loaded word of the pass above
            # stays live into this one
            wc = wc + tl.inline_asm_elementwise("mov.b32 $0, 0;", "=r,r", [tl.program_id(0) + 0 * wc.to(tl.int32)],
                                                dtype=tl.int32, is_pure=False, pack=1).to(tl.int64)
        _cast_groups(x_ptr, data_ptr, scale_ptr, s_enc_sixth, s_dec, table_ptr, seed, wc, c_ok, g0, kw, m_blocks, M_WORDS,
                     LAYOUT, GROUPS, HW, RHT_MASK, True, TABLE, SR, OPERAND)


def cast_col_grid(m: int, k: int, meta: dict) -> tuple[int]:
    return (cdiv(cdiv(m, 16), meta["GROUPS"]) * cdiv(k // 2, meta["BLOCK_C"]),)
