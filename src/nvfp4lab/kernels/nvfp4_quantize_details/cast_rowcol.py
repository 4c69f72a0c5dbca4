"""The per-tensor 1x16 NVFP4 cast of bf16 input into both copies from one read, round to nearest:
``cast_rowcol_kernel``, fed by ``factor_tables_kernel``'s two 128-entry tables of encode factors (the
rowwise and the columnwise outer amax: cast_row.py's table each).

Layout: x (M, K) bf16 contiguous, 16-byte aligned, M % 16 == 0, K % 16 == 0, read as (M, K / 2) int32 words
(bf16 pairs: columns 2p and 2p + 1 in word p, the first in the low half). A program covers GROUPS 16-row groups
(GROUPS divides M / 16: no row masks) x BLOCK_K columns (QB = BLOCK_K / 16 row blocks wide). Each lane holds
two words, i.e. 4 columns, of each of a group's 16 rows ([4, QB, 2] per row load: 8 bytes per lane, a warp's
load one contiguous run), so that

* a column's 16-row block lies whole in one lane: its amax is a fold of the 16 words by
  ``max.NaN.xorsign.abs.bf16x2`` (two columns per instruction), its codes are packed in-thread;
* a row's 16-column block spans the four lanes of a quad: the block amax takes two shuffles per pair of
  rows (the two rows' maxima packed into one word), each lane computes its blocks' scales and factors
  (both rows of a pair by one ``cvt.rn.satfinite.e4m3x2.f32``) and packs its 4 codes of each row into
  16 bits.

Each element is unpacked from its word once (one shift or mask) and encoded twice, by ``cast_row``'s
``code_top`` (round to nearest even, code and sign in the top nibble by one multiply-add) and ``push_code``
(one funnel shift per code); Hopper has no E2M1 convert, so these are most of the kernel's instructions.

Outputs: rowwise data (M, K / 2) uint8 written as (M, K / 4) int16 (each lane's 4 codes of a row); rowwise
scales (E4M3 bits) compact / padded / swizzled (``scale_offsets``); columnwise data (K, M / 2) uint8 written as
(K, M / 8) int32 words, a program's GROUPS blocks of a column as one contiguous run of 8 * GROUPS bytes (4
groups: a whole 32-byte sector). Columnwise scales go to an (M / 16, K) staging buffer, group-major, the four
codes of a lane's columns as one int32 word (a warp's store one contiguous run); ``col_scales_kernel`` then
transposes them into their (K, M / 16) layout, compact, padded or swizzled. Written in place, a program's
columnwise scales would be one piece of GROUPS bytes per column, each a scale row (M / 16 bytes) apart: stores
that cost the cast more time than the second launch takes. Likewise swizzled rowwise scales (4-byte pieces 16
bytes apart in 512-byte tiles) are written compact, then swizzled (``kernels.swizzle``).

Program order (``common.banded_order``, ROW_BAND tile rows per band): the programs that run at the same time hold
neighbouring row groups of the same columns, so that the (K, M / 2) rows they write in 8 * GROUPS-byte pieces fill
whole lines in the L2 before those go to memory.

Why a kernel of its own: ``cast16_kernel``'s row+col cast divides once per block for the encode factor, and the
division's slow path (zero or subnormal scales, i.e. blocks far below the outer amax) makes its time depend on the
data; here every factor is a table read. Same bits as ``cast16_kernel`` (and the reference).

Numerics: those of ``cast_row_kernel`` on both sides: the block scale e4m3(min(bamax * fl(S_enc * fl(1/6)),
FLT_MAX)) (HW: Hopper's saturating convert; under the interpreter the integer encoder, same bits), the factor
read from the side's table by the scale code (fp64 divisions there: one code path for every outer amax), codes
of fl(x * enc); blocks whose factor is NaN (a NaN element, or a NaN outer amax) get code 0, as the reference.
"""
import torch
import triton
import triton.language as tl

from ...layout import cdiv
from ..pdl import wait_prior_grid
from .cast_col import word8
from .cast_row import TABLE_ENTRIES, absmax16x2, absmax16x2_hw, absmax16x2_sw, code_top, e4m3_code, factor_table, push_code
from .common import banded_order, scale_offsets
from .common import bf16_hi as _hi
from .common import bf16_lo as _lo

_COL_TABLE = tl.constexpr(TABLE_ENTRIES)  # the columnwise table's offset in factor_tables_kernel's output


@triton.jit
def factor_tables_kernel(row_amax_ptr, col_amax_ptr, table_ptr, E6: tl.constexpr, PDL: tl.constexpr = False):
    """``row_factor_table_kernel``'s table of the rowwise outer amax at table_ptr (program 0) and of the
    columnwise one at table_ptr + TABLE_ENTRIES (program 1)."""
    wait_prior_grid(PDL)
    pid = tl.program_id(0)
    lanes = tl.zeros([128], tl.int32)
    if pid == 0:
        outer = tl.load(row_amax_ptr + lanes)
    else:
        outer = tl.load(col_amax_ptr + lanes)
    factor_table(outer, table_ptr + pid * _COL_TABLE, E6)


@triton.jit
def _e4m3_pair(v_lo, v_hi, HW: tl.constexpr):
    """``e4m3_code`` of both (values >= 0 or NaN): HW, one ``cvt.rn.satfinite.e4m3x2.f32`` for the two."""
    if HW:
        t = tl.inline_asm_elementwise(
            "{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, $2, $1; cvt.u32.u16 $0, t; }",
            "=r,f,f", [v_lo, v_hi], dtype=tl.int32, is_pure=True, pack=1)
        lo = t & 0xFF
        hi = t >> 8
    else:
        lo = e4m3_code(v_lo, False)
        hi = e4m3_code(v_hi, False)
    return lo, hi


@triton.jit
def _halves_max(p):
    """fp32 block amaxes (low half, high half) of words of two 16-bit magnitudes (bits 15 and 31: garbage)."""
    return ((p & 0x7FFF) << 16).to(tl.float32, bitcast=True), (p & 0x7FFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _factors(bamax_lo, bamax_hi, table_ptr, s_enc_sixth, HW: tl.constexpr):
    """(scale code, encode factor) of two blocks from their amaxes, the factor read from the table."""
    scale_lo, scale_hi = _e4m3_pair(bamax_lo * s_enc_sixth, bamax_hi * s_enc_sixth, HW)
    if HW:  # the GPU's NaNs are positive: codes <= 0x7F
        enc_lo = tl.load(table_ptr + scale_lo)
        enc_hi = tl.load(table_ptr + scale_hi)
    else:
        enc_lo = tl.load(table_ptr + (scale_lo & 0x7F))
        enc_hi = tl.load(table_ptr + (scale_hi & 0x7F))
    return scale_lo, enc_lo, scale_hi, enc_hi


@triton.jit
def _row_code16(a, b, enc, HW: tl.constexpr):
    """The 16 bits of one lane's 4 codes of one row (words a: columns 0, 1; b: 2, 3; column 0 in the low nibble);
    0 where the block's factor is NaN."""
    acc = push_code(tl.zeros_like(a), code_top(_hi(b), enc), HW)
    acc = push_code(acc, code_top(_lo(b), enc), HW)
    acc = push_code(acc, code_top(_hi(a), enc), HW)
    acc = push_code(acc, code_top(_lo(a), enc), HW)
    return tl.where(enc != enc, 0, acc)


@triton.jit
def _row_pair(row_data_ptr, row_scale_ptr, table_ptr, s_enc_sixth, r, a0, b0, a1, b1, d_at, s_blk, s_ok, d_ok, K,
              k_blocks, LAYOUT: tl.constexpr, HW: tl.constexpr):
    """Rowwise blocks of rows r and r + 1 (int64 [1]) from their words (a0, b0: row r; [4, QB] each): amax over
    the quad, scales, codes; stored."""
    m0 = absmax16x2(a0, b0, HW)  # per half: max over the lane's two words
    m1 = absmax16x2(a1, b1, HW)
    # the two rows' maxima in one word (row r low, row r + 1 high), then over the quad: two shuffles
    p = absmax16x2((m0 & 0xFFFF) | (m1 << 16), ((m0 >> 16) & 0xFFFF) | (m1 & -65536), HW)
    if HW:
        p = tl.reduce(p, 0, absmax16x2_hw)
    else:
        p = tl.reduce(p, 0, absmax16x2_sw)
    bamax0, bamax1 = _halves_max(p)  # [QB]
    scale0, enc0, scale1, enc1 = _factors(bamax0, bamax1, table_ptr, s_enc_sixth, HW)
    codes0 = _row_code16(a0, b0, enc0[None, :], HW)
    codes1 = _row_code16(a1, b1, enc1[None, :], HW)
    tl.store(row_data_ptr + (r * (K // 4) + d_at), codes0.to(tl.int16), mask=d_ok)
    tl.store(row_data_ptr + ((r + 1) * (K // 4) + d_at), codes1.to(tl.int16), mask=d_ok)
    tl.store(row_scale_ptr + scale_offsets(r, s_blk, k_blocks, LAYOUT), scale0.to(tl.uint8)[None, :], mask=s_ok)
    tl.store(row_scale_ptr + scale_offsets(r + 1, s_blk, k_blocks, LAYOUT), scale1.to(tl.uint8)[None, :], mask=s_ok)


@triton.jit
def _fold16(w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, HW: tl.constexpr):
    """Per 16-bit half, the largest bf16 magnitude of 16 words (a tree of ``absmax16x2``)."""
    a = absmax16x2(absmax16x2(w0, w1, HW), absmax16x2(w2, w3, HW), HW)
    b = absmax16x2(absmax16x2(w4, w5, HW), absmax16x2(w6, w7, HW), HW)
    c = absmax16x2(absmax16x2(w8, w9, HW), absmax16x2(w10, w11, HW), HW)
    d = absmax16x2(absmax16x2(w12, w13, HW), absmax16x2(w14, w15, HW), HW)
    return absmax16x2(absmax16x2(a, b, HW), absmax16x2(c, d, HW), HW)


@triton.jit
def _col_words(w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, table_ptr, s_enc_sixth,
               HW: tl.constexpr):
    """Columnwise blocks of the two columns of words w0..w15 (rows 0..15): (low column's word of rows 0-7, its
    word of rows 8-15, its scale code, the high column's two words, its scale code); codes 0 where the
    factor is NaN."""
    bamax_lo, bamax_hi = _halves_max(_fold16(w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, HW))
    scale_lo, enc_lo, scale_hi, enc_hi = _factors(bamax_lo, bamax_hi, table_ptr, s_enc_sixth, HW)
    z = w0  # (the word shape; no random bits)
    lo0 = word8(_lo(w0), _lo(w1), _lo(w2), _lo(w3), _lo(w4), _lo(w5), _lo(w6), _lo(w7), enc_lo, z, z, HW, False)
    lo1 = word8(_lo(w8), _lo(w9), _lo(w10), _lo(w11), _lo(w12), _lo(w13), _lo(w14), _lo(w15), enc_lo, z, z, HW, False)
    hi0 = word8(_hi(w0), _hi(w1), _hi(w2), _hi(w3), _hi(w4), _hi(w5), _hi(w6), _hi(w7), enc_hi, z, z, HW, False)
    hi1 = word8(_hi(w8), _hi(w9), _hi(w10), _hi(w11), _hi(w12), _hi(w13), _hi(w14), _hi(w15), enc_hi, z, z, HW, False)
    lo_nan = enc_lo != enc_lo
    hi_nan = enc_hi != enc_hi
    return (tl.where(lo_nan, 0, lo0), tl.where(lo_nan, 0, lo1), scale_lo,
            tl.where(hi_nan, 0, hi0), tl.where(hi_nan, 0, hi1), scale_hi)


@triton.jit
def _load_row(x_ptr, row, kw, w_at, w_ok, EVEN: tl.constexpr):
    """Row ``row``'s two words per lane ([4, QB] each: words 2 l, 2 l + 1 of the lane's quad position l)."""
    p = x_ptr + row * kw + w_at
    t = tl.load(p) if EVEN else tl.load(p, mask=w_ok, other=0)
    return tl.split(t)


@triton.jit
def _cast_group(x_ptr, row_data_ptr, row_scale_ptr, table_ptr, row_s6, col_s6, g, kw, K, k_blocks, w_at, w_ok, d_at,
                d_ok, s_blk, s_ok, LAYOUT: tl.constexpr, HW: tl.constexpr, EVEN: tl.constexpr):
    """16-row group g: its rowwise blocks stored; returns its columnwise words and scale codes, per lane column
    c = 0..3 (word a low, a high, b low, b high): (word of rows 0-7, word of rows 8-15) x 4, then the 4 scales."""
    r0 = g * 16
    a0, b0 = _load_row(x_ptr, r0, kw, w_at, w_ok, EVEN)
    a1, b1 = _load_row(x_ptr, r0 + 1, kw, w_at, w_ok, EVEN)
    a2, b2 = _load_row(x_ptr, r0 + 2, kw, w_at, w_ok, EVEN)
    a3, b3 = _load_row(x_ptr, r0 + 3, kw, w_at, w_ok, EVEN)
    a4, b4 = _load_row(x_ptr, r0 + 4, kw, w_at, w_ok, EVEN)
    a5, b5 = _load_row(x_ptr, r0 + 5, kw, w_at, w_ok, EVEN)
    a6, b6 = _load_row(x_ptr, r0 + 6, kw, w_at, w_ok, EVEN)
    a7, b7 = _load_row(x_ptr, r0 + 7, kw, w_at, w_ok, EVEN)
    a8, b8 = _load_row(x_ptr, r0 + 8, kw, w_at, w_ok, EVEN)
    a9, b9 = _load_row(x_ptr, r0 + 9, kw, w_at, w_ok, EVEN)
    a10, b10 = _load_row(x_ptr, r0 + 10, kw, w_at, w_ok, EVEN)
    a11, b11 = _load_row(x_ptr, r0 + 11, kw, w_at, w_ok, EVEN)
    a12, b12 = _load_row(x_ptr, r0 + 12, kw, w_at, w_ok, EVEN)
    a13, b13 = _load_row(x_ptr, r0 + 13, kw, w_at, w_ok, EVEN)
    a14, b14 = _load_row(x_ptr, r0 + 14, kw, w_at, w_ok, EVEN)
    a15, b15 = _load_row(x_ptr, r0 + 15, kw, w_at, w_ok, EVEN)
    _row_pair(row_data_ptr, row_scale_ptr, table_ptr, row_s6, r0, a0, b0, a1, b1, d_at, s_blk, s_ok, d_ok, K, k_blocks,
              LAYOUT, HW)
    _row_pair(row_data_ptr, row_scale_ptr, table_ptr, row_s6, r0 + 2, a2, b2, a3, b3, d_at, s_blk, s_ok, d_ok, K,
              k_blocks, LAYOUT, HW)
    _row_pair(row_data_ptr, row_scale_ptr, table_ptr, row_s6, r0 + 4, a4, b4, a5, b5, d_at, s_blk, s_ok, d_ok, K,
              k_blocks, LAYOUT, HW)
    _row_pair(row_data_ptr, row_scale_ptr, table_ptr, row_s6, r0 + 6, a6, b6, a7, b7, d_at, s_blk, s_ok, d_ok, K,
              k_blocks, LAYOUT, HW)
    _row_pair(row_data_ptr, row_scale_ptr, table_ptr, row_s6, r0 + 8, a8, b8, a9, b9, d_at, s_blk, s_ok, d_ok, K,
              k_blocks, LAYOUT, HW)
    _row_pair(row_data_ptr, row_scale_ptr, table_ptr, row_s6, r0 + 10, a10, b10, a11, b11, d_at, s_blk, s_ok, d_ok, K,
              k_blocks, LAYOUT, HW)
    _row_pair(row_data_ptr, row_scale_ptr, table_ptr, row_s6, r0 + 12, a12, b12, a13, b13, d_at, s_blk, s_ok, d_ok, K,
              k_blocks, LAYOUT, HW)
    _row_pair(row_data_ptr, row_scale_ptr, table_ptr, row_s6, r0 + 14, a14, b14, a15, b15, d_at, s_blk, s_ok, d_ok, K,
              k_blocks, LAYOUT, HW)
    col_table = table_ptr + _COL_TABLE
    c0w0, c0w1, c0s, c1w0, c1w1, c1s = _col_words(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,
                                                  col_table, col_s6, HW)
    c2w0, c2w1, c2s, c3w0, c3w1, c3s = _col_words(b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15,
                                                  col_table, col_s6, HW)
    return c0w0, c0w1, c1w0, c1w1, c2w0, c2w1, c3w0, c3w1, c0s, c1s, c2s, c3s


@triton.jit
def _in_order2(a, b):
    """[4, QB, 2] of a, b ([4, QB] each), b next to a in registers and in memory."""
    return tl.join(a, b)


@triton.jit
def _in_order4(a, b, c, d):
    """[4, QB, 4] of a, b, c, d in this order, in registers as in memory (the last join is the fastest axis)."""
    return tl.reshape(tl.join(tl.join(a, c), tl.join(b, d)), [a.shape[0], a.shape[1], 4])


@triton.jit
def _store_column(col_data_ptr, col, c_ok, g0, M_WORDS, w0, w1, w2, w3, w4, w5, w6, w7, GROUPS: tl.constexpr):
    """Column ``col``'s ([4, QB]) words of the program's GROUPS groups (w0, w1: group g0; w2, w3: g0 + 1; ...) as
    one run from word 2 g0 of its row of the (K, M / 8) data."""
    at = col * M_WORDS + g0 * 2
    if GROUPS == 1:
        tl.store(col_data_ptr + at[:, :, None] + tl.arange(0, 2)[None, None, :], _in_order2(w0, w1),
                 mask=c_ok[:, :, None])
    else:
        tl.store(col_data_ptr + at[:, :, None] + tl.arange(0, 4)[None, None, :], _in_order4(w0, w1, w2, w3),
                 mask=c_ok[:, :, None])
        if GROUPS == 4:  # the run's second 16 bytes, right after its first (the same sector)
            tl.store(col_data_ptr + (at + 4)[:, :, None] + tl.arange(0, 4)[None, None, :], _in_order4(w4, w5, w6, w7),
                     mask=c_ok[:, :, None])


@triton.jit
def _stage_scales(stage_ptr, g, stage_at, c_ok, K, s0, s1, s2, s3):
    """Group g's columnwise scale codes of the lane's four columns (s0: its first column; int32 0..255 each) as one
    int32 word of row g of the (M / 16, K) staging buffer: a warp's store is one contiguous run."""
    word = s0 | (s1 << 8) | (s2 << 16) | (s3 << 24)
    tl.store(stage_ptr + (g * (K // 4) + stage_at), word, mask=c_ok)


@triton.jit
def cast_rowcol_kernel(x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, stage_ptr, table_ptr, M, K, M_WORDS,
                       LAYOUT: tl.constexpr, QB: tl.constexpr, GROUPS: tl.constexpr, HW: tl.constexpr,
                       EVEN: tl.constexpr = False, ROW_BAND: tl.constexpr = 1, PDL: tl.constexpr = False):
    """Rowwise and columnwise codes and scales of GROUPS 16-row groups x 16 QB columns (module docstring).
    x_ptr: x as int32 words; row_data_ptr: the rowwise data as int16; col_data_ptr: the columnwise data as int32
    words; stage_ptr: the columnwise scales' (M / 16, K / 4) int32 staging buffer; table_ptr:
    ``factor_tables_kernel``'s two tables; M_WORDS = M / 8 (an argument, so that its divisibility is known); HW:
    inline PTX (GPU) instead of the integer formulas; EVEN: (K / 16) % QB == 0 (no masks); ROW_BAND: the program
    order (``banded_order``)."""
    wait_prior_grid(PDL)
    k_blocks = K // 16
    kw = K // 2
    n_q = tl.cdiv(k_blocks, QB)
    m_blocks = M // 16
    pid_m, pid_q = banded_order(tl.program_id(0), m_blocks // GROUPS, n_q, ROW_BAND)
    g0 = pid_m.to(tl.int64) * GROUPS
    # [4, QB] tensors, the quad position first: Triton 3.6 gives dimensions of equal contiguity lanes along dim 0
    # first, so that a quad's four lanes are neighbours and the rowwise data store (contiguous along dim 0) keeps
    # the computed layout
    q = (pid_q * QB + tl.arange(0, QB))[None, :]  # row block of the quad, [1, QB]
    lane = tl.arange(0, 4)[:, None]  # position in the quad, [4, 1]
    q_ok = q < k_blocks
    w_at = (q * 8 + lane * 2)[:, :, None] + tl.arange(0, 2)[None, None, :]  # [4, QB, 2] word columns
    w_ok = None if EVEN else (q_ok & (lane >= 0))[:, :, None] & (w_at >= 0)
    # the lane's int16 of a row's rowwise data; unit alignment keeps the store in the computed layout (a vector of
    # the quad's four would take a layout conversion)
    d_at = tl.multiple_of(q * 4 + lane, [1, 1])
    d_ok = None if EVEN else q_ok & (lane >= 0)
    # [4, QB]: the quad's row block in each lane; times a one the compiler cannot see through, so that the scale
    # store, contiguous along no dimension, keeps the computed layout (lanes along the quad first)
    one = (k_blocks + 1) // (k_blocks + 1)
    s_blk = (q * one + 0 * lane).to(tl.int64)
    s_ok = (lane == 0) if EVEN else q_ok & (lane == 0)
    col = (q * 16 + lane * 4).to(tl.int64)  # the lane's first column
    c_ok = (lane >= 0) if EVEN else q_ok & (lane >= 0)
    stage_at = q * 4 + lane  # the lane's word of a staging row
    row_s6 = tl.load(table_ptr + 128)
    col_s6 = tl.load(table_ptr + _COL_TABLE + 128)
    c0w0, c0w1, c1w0, c1w1, c2w0, c2w1, c3w0, c3w1, c0s, c1s, c2s, c3s = _cast_group(
        x_ptr, row_data_ptr, row_scale_ptr, table_ptr, row_s6, col_s6, g0, kw, K, k_blocks, w_at, w_ok, d_at, d_ok,
        s_blk, s_ok, LAYOUT, HW, EVEN)
    _stage_scales(stage_ptr, g0, stage_at, c_ok, K, c0s, c1s, c2s, c3s)
    if GROUPS == 1:
        _store_column(col_data_ptr, col, c_ok, g0, M_WORDS, c0w0, c0w1, c0w0, c0w0, c0w0, c0w0, c0w0, c0w0, GROUPS)
        _store_column(col_data_ptr, col + 1, c_ok, g0, M_WORDS, c1w0, c1w1, c1w0, c1w0, c1w0, c1w0, c1w0, c1w0, GROUPS)
        _store_column(col_data_ptr, col + 2, c_ok, g0, M_WORDS, c2w0, c2w1, c2w0, c2w0, c2w0, c2w0, c2w0, c2w0, GROUPS)
        _store_column(col_data_ptr, col + 3, c_ok, g0, M_WORDS, c3w0, c3w1, c3w0, c3w0, c3w0, c3w0, c3w0, c3w0, GROUPS)
    else:
        d0w0, d0w1, d1w0, d1w1, d2w0, d2w1, d3w0, d3w1, d0s, d1s, d2s, d3s = _cast_group(
            x_ptr, row_data_ptr, row_scale_ptr, table_ptr, row_s6, col_s6, g0 + 1, kw, K, k_blocks, w_at, w_ok, d_at,
            d_ok, s_blk, s_ok, LAYOUT, HW, EVEN)
        _stage_scales(stage_ptr, g0 + 1, stage_at, c_ok, K, d0s, d1s, d2s, d3s)
        if GROUPS == 2:
            _store_column(col_data_ptr, col, c_ok, g0, M_WORDS, c0w0, c0w1, d0w0, d0w1, c0w0, c0w0, c0w0, c0w0, GROUPS)
            _store_column(col_data_ptr, col + 1, c_ok, g0, M_WORDS, c1w0, c1w1, d1w0, d1w1, c1w0, c1w0, c1w0, c1w0,
                          GROUPS)
            _store_column(col_data_ptr, col + 2, c_ok, g0, M_WORDS, c2w0, c2w1, d2w0, d2w1, c2w0, c2w0, c2w0, c2w0,
                          GROUPS)
            _store_column(col_data_ptr, col + 3, c_ok, g0, M_WORDS, c3w0, c3w1, d3w0, d3w1, c3w0, c3w0, c3w0, c3w0,
                          GROUPS)
        else:
            e0w0, e0w1, e1w0, e1w1, e2w0, e2w1, e3w0, e3w1, e0s, e1s, e2s, e3s = _cast_group(
                x_ptr, row_data_ptr, row_scale_ptr, table_ptr, row_s6, col_s6, g0 + 2, kw, K, k_blocks, w_at, w_ok,
                d_at, d_ok, s_blk, s_ok, LAYOUT, HW, EVEN)
            _stage_scales(stage_ptr, g0 + 2, stage_at, c_ok, K, e0s, e1s, e2s, e3s)
            f0w0, f0w1, f1w0, f1w1, f2w0, f2w1, f3w0, f3w1, f0s, f1s, f2s, f3s = _cast_group(
                x_ptr, row_data_ptr, row_scale_ptr, table_ptr, row_s6, col_s6, g0 + 3, kw, K, k_blocks, w_at, w_ok,
                d_at, d_ok, s_blk, s_ok, LAYOUT, HW, EVEN)
            _stage_scales(stage_ptr, g0 + 3, stage_at, c_ok, K, f0s, f1s, f2s, f3s)
            _store_column(col_data_ptr, col, c_ok, g0, M_WORDS, c0w0, c0w1, d0w0, d0w1, e0w0, e0w1, f0w0, f0w1, GROUPS)
            _store_column(col_data_ptr, col + 1, c_ok, g0, M_WORDS, c1w0, c1w1, d1w0, d1w1, e1w0, e1w1, f1w0, f1w1,
                          GROUPS)
            _store_column(col_data_ptr, col + 2, c_ok, g0, M_WORDS, c2w0, c2w1, d2w0, d2w1, e2w0, e2w1, f2w0, f2w1,
                          GROUPS)
            _store_column(col_data_ptr, col + 3, c_ok, g0, M_WORDS, c3w0, c3w1, d3w0, d3w1, e3w0, e3w1, f3w0, f3w1,
                          GROUPS)


@triton.jit
def col_scales_kernel(stage_ptr, col_scale_ptr, m_blocks, K, LAYOUT: tl.constexpr, BLOCK_G: tl.constexpr,
                      BLOCK_C: tl.constexpr, PDL: tl.constexpr = False):
    """The columnwise scales (K, M / 16) in their layout (compact / padded / swizzled: ``scale_offsets``) from
    ``cast_rowcol_kernel``'s (M / 16, K) staging buffer: a [BLOCK_G, BLOCK_C] tile read along the columns,
    transposed in the program, written along the groups."""
    wait_prior_grid(PDL)
    g = (tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)).to(tl.int64)
    c = (tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
    codes = tl.load(stage_ptr + g[:, None] * K + c[None, :], mask=(g[:, None] < m_blocks) & (c[None, :] < K))
    tl.store(col_scale_ptr + scale_offsets(c[:, None], g[None, :], m_blocks, LAYOUT), tl.trans(codes),
             mask=(c[:, None] < K) & (g[None, :] < m_blocks))


def factor_tables(tables_launch, row_amax, col_amax):
    """The fp32 (2 * TABLE_ENTRIES,) tables of ``factor_tables_kernel`` for the (1,) amaxes, in one launch of
    ``tables_launch`` (a :class:`~nvfp4lab.kernels.launch.Launch` of it; no host sync)."""
    tables = torch.empty(2 * TABLE_ENTRIES, dtype=torch.float32, device=row_amax.device)
    tables_launch(row_amax, col_amax, tables)
    return tables


def cast_rowcol_grid(m: int, k: int, meta: dict) -> tuple[int]:
    return (cdiv(m // 16, meta["GROUPS"]) * cdiv(k // 16, meta["QB"]),)


def col_scales_grid(m: int, k: int, meta: dict) -> tuple[int, int]:
    return (cdiv(m // 16, meta["BLOCK_G"]), cdiv(k, meta["BLOCK_C"]))


def launch_rowcol(cast_launch, col_scales_launch, row_swizzle_launch, x_words, row_data, row_scale, col_data,
                  col_scale, tables, m, k):
    """``cast_rowcol_kernel`` (``cast_launch``) into the four outputs: its columnwise scales through an (m / 16, k)
    staging buffer that ``col_scales_kernel`` (``col_scales_launch``) writes into ``col_scale``; with a
    ``row_swizzle_launch`` (swizzled layout) its rowwise scales too, compact, then swizzled into ``row_scale``."""
    stage = torch.empty((m // 16, k // 4), dtype=torch.int32, device=x_words.device)
    row_out = row_scale
    if row_swizzle_launch is not None:
        row_out = torch.empty((m, k // 16), dtype=torch.uint8, device=x_words.device)
    cast_launch(x_words, row_data, row_out, col_data, stage, tables, m, k, m // 8)
    col_scales_launch(stage.view(torch.uint8), col_scale, m // 16, k)
    if row_swizzle_launch is not None:
        row_swizzle_launch(row_out, row_scale, m, k // 16, (k // 16 + 3) // 4)
