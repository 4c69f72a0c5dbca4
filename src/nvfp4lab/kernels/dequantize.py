"""NVFP4 dequantize kernel: packed E2M1 codes + E4M3 block scales + fp32 amax -> bf16 / fp16 / fp32.

Numerics (spec section 11, :func:`nvfp4lab.ref.nvfp4.dequantize_rows`), per 16-element block:

    factor = fl(fl(float(s) * amax) * fl(1/(6E)))        E = the tensor's own e4m3_max (448 or 256)
    out    = out_dtype(fl(q * factor))

Input layout of the quantized matrix Q (R, C) (rowwise copy: Q = x, R = M, C = K; columnwise copy:
Q = x^T, R = K, C = M):

    data   uint8 (R, C/2), element 2j in the low nibble
    scale  uint8 E4M3 bits, entry [r, b] scales Q[r, 16b:16b+16]:
           compact (R, C/16); padded (roundup(R,128), roundup(C/16,4)); swizzled: the padded shape in
           cuBLAS' 128x4 order, read through :func:`.swizzle.swizzle_offset` (no unswizzle pass)
    amax   fp32 (1,) per tensor, or (R,) per row (per token)

Output: Q itself (R, C), or with ``transpose`` its transpose (C, R) = x's orientation for the
columnwise copy. Default ``_nvfp4_dequantize_t_rows_kernel``: each thread decodes one 16-code block
of 8 (fp32 output: 4) consecutive Q rows and stores it one output row at a time, in the layout the
values are decoded in: no shared memory, 48 / 40 registers at sm_90, see :data:`T_VARIANT`.
``NVFP4LAB_DQ_T_VARIANT=join`` selects ``_nvfp4_dequantize_t_kernel`` (the previous default), which
joins a slot's 16 x 8 values into one [slots, 16, 8] store; Triton's coalescing pass gives that store a
different layout (threads spread over the 16 output rows), so it goes through shared memory: 4 rounds
of STS / barrier / LDSM, 88 registers for bf16 and 158 for fp32.) With RHT the columnwise copy is dequantized by the row kernel in fp32 and
the inverse RHT is then the reference's own ``inverse_rht`` (a torch matmul): the fp32 sum of 16
products depends on summation order, so reusing the reference's matmul is what keeps the result
identical to it on each device.

Row kernel tiling: one program per BLOCK_ROWS x BLOCK_COLS output tile (1-D grid, row-major over
tiles). The packed data is read as int32 words, [BLOCK_ROWS, BLOCK_COLS/16, 2] (8 codes per word, 2 words per
block), so one block factor broadcasts over 16 codes held by the same thread and the codes come out of
each word by shifts, already in element order for 16-byte vector stores. The E2M1 and E4M3 decodes
are bit placements plus one exact power-of-two multiply (no conversion instructions). bf16 output
uses the hardware cast on the GPU and an integer round-to-nearest-even under the interpreter (whose own
fp32 -> bf16 cast truncates). Constraints: C % 16 == 0 (whole blocks). Tile bases are 64-bit; offsets
inside a tile are 32-bit unless a tile spans 2^31 elements (``LOCAL_I64``).

The public launcher is the ``torch.library`` custom op ``nvfp4lab::dequantize_nvfp4`` with a fake
implementation (torch.compile, CUDA graphs: no host sync); empty inputs return without a launch.
"""
from __future__ import annotations

import os
import struct

import torch
import triton
import triton.language as tl

from . import _codecs
from .swizzle import swizzle_offset

_INT32_LIMIT = 2**31
# Transposing kernel: each thread decodes 2 words (one 16-code scale block, one 8-byte load) per Q row
# instead of 1. H200, Triton 3.6, 8192 x 8192 columnwise -> bf16, swizzled scales (benchmarks/dequantize.py
# --tune): 8 groups x 32 words, 4 warps, with pairs 54.3 us = 89.7% of a copy, against 56.0 us (87.0%)
# for 8 x 16 w4 and 58.5 us (83.3%) for 4 x 32 w4 without pairs. False: one word per thread (the
# launcher also falls back to it for a tile of 1 word).
T_PAIRS = True
# Columnwise (transposing) kernel variant, NVFP4LAB_DQ_T_VARIANT overrides (read at each launch):
#   "join":  _nvfp4_dequantize_t_kernel (all 16 x 8 decoded values of a slot joined into one store)
#   "rows":  _nvfp4_dequantize_t_rows_kernel, 8-row groups, one store per output row (two 16-byte
#            halves for fp32), per-token amax as two 16-byte loads per slot
#   "rows4": as "rows", but 4-row groups for fp32 output (one 16-byte store per output row)
# H200, 8192 x 8192, swizzled scales, same run (benchmarks/dequantize.py --tune, fifth session), us and % of
# a copy: bf16 join 54.2 (89.2%), rows 16 x 32 w8 51.1 (94.6%); per-token bf16 join 55.3 (81.4%), rows
# 16 x 32 w8 51.7 (87.0%); fp32 join 94.4 (84.5%), rows 179.3 (44.5%: two half stores per row), rows4
# 16 x 32 w8 89.8 (88.8%). Default "rows4" (= "rows" for 2-byte outputs) with 16 x 32 tiles.
T_VARIANTS = ("join", "rows", "rows4")
T_VARIANT = "rows4"


def t_variant() -> str:
    v = os.environ.get("NVFP4LAB_DQ_T_VARIANT", "") or T_VARIANT
    if v not in T_VARIANTS:
        raise ValueError(f"NVFP4LAB_DQ_T_VARIANT must be one of {T_VARIANTS}, got {v!r}")
    return v


def roundup(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def rcp_f32(v: float) -> float:
    """fl32(1/v) as a Python float that is exactly an fp32 value (no later conversion rounds it)."""
    return struct.unpack("f", struct.pack("f", 1.0 / v))[0]


@triton.jit
def e2m1_decode_exact(code):
    """E2M1 code (int32) -> fp32 from bits: the magnitude bits placed at fp32 bits 24..22 read as
    exactly value * 2^-126 for all 8 magnitudes (0.5 lands on the fp32 subnormal 2^-127), so one exact
    multiply by 2^126 finishes it. 4 integer ops + 1 multiply, no conversion instruction."""
    bits = ((code & 7) << 22) | ((code & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37


@triton.jit
def e4m3_decode_exact(code):
    """E4M3 bits (int32) -> fp32 the same way: bits 26..20 hold value * 2^-120 (subnormals included),
    times 2^120 exactly; 0x7F / 0xFF are NaN. Same values as ``_codecs.e4m3_decode``, fewer ops."""
    bits = ((code & 0x7F) << 20) | ((code & 0x80) << 24)
    val = bits.to(tl.float32, bitcast=True) * 1.329227995784916e36
    return tl.where((code & 0x7F) == 0x7F, float("nan"), val)


@triton.jit
def cast_to_out(v, out_ptr, SOFT_BF16: tl.constexpr):
    """fp32 -> the output pointer's dtype, rounding to nearest even (see :func:`soft_bf16_cast`)."""
    if SOFT_BF16:
        return _codecs.f32_to_bf16_rne(v)
    else:
        return v.to(out_ptr.dtype.element_ty)


@triton.jit
def _nvfp4_dequantize_kernel(
    words_ptr, scale_ptr, amax_ptr, out_ptr,
    rows, cols,  # Q is (rows, cols); words_ptr is its packed data read as int32, cols // 8 per row
    scale_stride,  # row stride of a compact or padded scale matrix
    scale_col_tiles,  # roundup(cols // 16, 4) // 4, for the swizzled layout
    dequant_rcp,  # fl(1/(6E))
    SWIZZLED: tl.constexpr,
    PER_ROW_AMAX: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    LOCAL_I64: tl.constexpr,
    SOFT_BF16: tl.constexpr,
    EVEN: tl.constexpr,
):
    BLOCKS: tl.constexpr = BLOCK_COLS // 16
    pid = tl.program_id(0)
    col_tiles = tl.cdiv(cols, BLOCK_COLS)
    row0 = (pid // col_tiles).to(tl.int64) * BLOCK_ROWS
    col0 = (pid % col_tiles) * BLOCK_COLS

    lr = tl.arange(0, BLOCK_ROWS)
    if LOCAL_I64:
        lr = lr.to(tl.int64)
    blk = col0 // 16 + tl.arange(0, BLOCKS)
    if EVEN:  # the tile lies inside Q: all-true masks, so loads and stores stay vectorised
        row_ok = lr < BLOCK_ROWS
        blk_ok = blk >= 0
    else:
        row_ok = lr < rows - row0
        blk_ok = blk < cols // 16
    tile_ok = row_ok[:, None] & blk_ok[None, :]  # [R, BLOCKS]

    # [R, BLOCKS, 2] int32 words, 8 codes each; code i of a word sits at bits 4i..4i+3
    row_words = cols // 8
    lw = tl.arange(0, 2)
    w_off = lr[:, None, None] * row_words + (blk * 2)[None, :, None] + lw[None, None, :]
    words = tl.load(words_ptr + row0 * row_words + w_off, mask=tile_ok[:, :, None], other=0)

    if SWIZZLED:
        # BLOCK_ROWS divides 128, so the tile sits inside one 128-row band of the swizzled buffer
        s_ptr = scale_ptr + (row0 // 128) * scale_col_tiles * 512
        s_off = swizzle_offset((row0 % 128).to(tl.int32) + lr[:, None], blk[None, :], scale_col_tiles)
    else:
        s_ptr = scale_ptr + row0 * scale_stride
        s_off = lr[:, None] * scale_stride + blk[None, :]
    scale_code = tl.load(s_ptr + s_off, mask=tile_ok, other=0).to(tl.int32)
    if PER_ROW_AMAX:
        amax = tl.load(amax_ptr + row0 + lr, mask=row_ok, other=0.0)[:, None]
    else:
        amax = tl.load(amax_ptr)
    factor = (e4m3_decode_exact(scale_code) * amax) * dequant_rcp  # [R, BLOCKS]

    shifts = tl.arange(0, 8) * 4
    codes = (words[:, :, :, None] >> shifts[None, None, None, :]) & 0xF  # [R, BLOCKS, 2, 8]
    vals = e2m1_decode_exact(codes) * factor[:, :, None, None]
    vals = tl.reshape(cast_to_out(vals, out_ptr, SOFT_BF16), (BLOCK_ROWS, BLOCK_COLS))

    lc = tl.arange(0, BLOCK_COLS)
    if LOCAL_I64:
        lc = lc.to(tl.int64)
    if EVEN:
        col_ok = lc < BLOCK_COLS
    else:
        col_ok = lc < cols - col0
    out_base = out_ptr + row0 * cols + col0
    tl.store(out_base + lr[:, None] * cols + lc[None, :], vals, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _join8(v0, v1, v2, v3, v4, v5, v6, v7):
    """[..., 2, 2, 2] whose flat index over the three new dimensions (each held by one thread) reads
    v0..v7 in order after a reshape: nested joins index their new dimensions innermost-first, so the
    leaves go in bit-reversed order."""
    return tl.join(tl.join(tl.join(v0, v4), tl.join(v2, v6)), tl.join(tl.join(v1, v5), tl.join(v3, v7)))


@triton.jit
def _e2m1_nibble_bits(words, NIBBLE: tl.constexpr):
    """fp32 bits of (E2M1 code NIBBLE of each int32 word) * 2^-126: the 3 magnitude bits at bits
    24..22 (exact for all 8 magnitudes, 0.5 landing on the subnormal 2^-127) and the sign at bit 31."""
    MAG_SHIFT: tl.constexpr = 22 - 4 * NIBBLE
    if MAG_SHIFT >= 0:
        mag = (words << MAG_SHIFT) & 0x01C00000
    else:
        mag = (words >> -MAG_SHIFT) & 0x01C00000
    return mag | ((words << (28 - 4 * NIBBLE)) & -(2**31))


@triton.jit
def _decode_word(words, factor, SLOTS: tl.constexpr):
    """Words [SLOTS] (8 E2M1 codes each) times their block factor, as fp32 [SLOTS, 8] (code n at n)."""
    v0 = _e2m1_nibble_bits(words, 0).to(tl.float32, bitcast=True) * 8.507059173023462e37 * factor
    v1 = _e2m1_nibble_bits(words, 1).to(tl.float32, bitcast=True) * 8.507059173023462e37 * factor
    v2 = _e2m1_nibble_bits(words, 2).to(tl.float32, bitcast=True) * 8.507059173023462e37 * factor
    v3 = _e2m1_nibble_bits(words, 3).to(tl.float32, bitcast=True) * 8.507059173023462e37 * factor
    v4 = _e2m1_nibble_bits(words, 4).to(tl.float32, bitcast=True) * 8.507059173023462e37 * factor
    v5 = _e2m1_nibble_bits(words, 5).to(tl.float32, bitcast=True) * 8.507059173023462e37 * factor
    v6 = _e2m1_nibble_bits(words, 6).to(tl.float32, bitcast=True) * 8.507059173023462e37 * factor
    v7 = _e2m1_nibble_bits(words, 7).to(tl.float32, bitcast=True) * 8.507059173023462e37 * factor
    return tl.reshape(_join8(v0, v1, v2, v3, v4, v5, v6, v7), (SLOTS, 8))


@triton.jit
def _decode_q_row(word_ptrs, scale_ptrs, amax_ptr, ok, R: tl.constexpr, row_words, scale_row_step, dequant_rcp,
                  PER_ROW_AMAX: tl.constexpr, rows_left, EVEN_ROWS: tl.constexpr, SLOTS: tl.constexpr,
                  PAIRS: tl.constexpr):
    """Row R of each slot's 8-row group: its word (or, with PAIRS, its 2 words = one 16-code scale
    block) decoded to fp32 [SLOTS, 8 or 16] in code order. Pointers are those of the group's row 0;
    a group's 8 rows never cross a 32-row boundary, so row R's scales are R * scale_row_step further
    on in every layout (16 bytes in the swizzled one)."""
    if not EVEN_ROWS:
        ok = ok & (R < rows_left)
    scale_code = tl.load(scale_ptrs + R * scale_row_step, mask=ok, other=0).to(tl.int32)
    if PER_ROW_AMAX:
        amax = tl.load(amax_ptr + R, mask=ok, other=0.0)
    else:
        amax = tl.load(amax_ptr)
    factor = (e4m3_decode_exact(scale_code) * amax) * dequant_rcp
    if PAIRS:
        words = tl.load(word_ptrs + R * row_words, mask=ok[:, None], other=0)  # [SLOTS, 2]: one 8-byte load
        first, second = tl.split(words)
        both = tl.join(_decode_word(first, factor, SLOTS), _decode_word(second, factor, SLOTS))  # [SLOTS, 8, 2]
        return tl.reshape(tl.permute(both, (0, 2, 1)), (SLOTS, 16))
    else:
        return _decode_word(tl.load(word_ptrs + R * row_words, mask=ok, other=0), factor, SLOTS)


@triton.jit
def _nvfp4_dequantize_t_kernel(
    words_ptr, scale_ptr, amax_ptr, out_ptr,
    rows, cols,  # Q is (rows, cols) = x^T; out is (cols, rows) = x; words_ptr holds cols // 8 words per row
    scale_stride,  # row stride of a compact or padded scale matrix
    scale_col_tiles,  # roundup(cols // 16, 4) // 4, for the swizzled layout
    dequant_rcp,  # fl(1/(6E))
    SWIZZLED: tl.constexpr,
    PER_ROW_AMAX: tl.constexpr,
    GROUPS: tl.constexpr,  # groups of 8 Q rows per program
    WORDS: tl.constexpr,  # words (8 codes each) per Q row per program
    LOCAL_I64: tl.constexpr,
    SOFT_BF16: tl.constexpr,
    EVEN_ROWS: tl.constexpr,  # rows % (8 * GROUPS) == 0
    EVEN_WORDS: tl.constexpr,  # (cols // 8) % WORDS == 0
    PAIRS: tl.constexpr,  # each thread takes 2 adjacent words (one scale block) per Q row
):
    # Each thread loads one word (8 codes along a Q row; with PAIRS 2 words, one scale block) from
    # each of 8 consecutive Q rows: that block of codes is 8 (16) output rows of 8 contiguous output
    # elements (one 16-byte store each), so the transpose is only a choice of which decoded value goes
    # where (joins of values the thread holds), no shuffles; but see the module docstring: the final
    # store's layout differs from the joined one, and that conversion is a shared-memory round trip. The tile is
    # one dimension of slots, group fastest: adjacent threads take the 8-row groups of one word (pair),
    # then the next, so a warp's stores cover GROUPS * 16 contiguous bytes of each output row (whole
    # 32-byte sectors: partial ones would cost the L2 a read-modify-write) and its loads whole sectors
    # of each Q row. A 1-D tile leaves the compiler no layout to choose: loads and stores share one.
    WPS: tl.constexpr = 2 if PAIRS else 1  # words per slot
    SLOTS: tl.constexpr = GROUPS * WORDS // WPS
    pid = tl.program_id(0)
    row_words = cols // 8
    word_tiles = tl.cdiv(row_words, WORDS)
    row0 = (pid // word_tiles).to(tl.int64) * (8 * GROUPS)
    word0 = (pid % word_tiles) * WORDS

    t = tl.arange(0, SLOTS)
    g = t % GROUPS
    w = t // GROUPS * WPS  # first word of the slot
    if LOCAL_I64:
        g = g.to(tl.int64)
        w = w.to(tl.int64)
    rows_left = rows - row0 - g * 8  # Q rows from each group's first row to the end of Q
    if EVEN_WORDS:
        ok = w < WORDS
    else:
        ok = w < row_words - word0
    if not EVEN_ROWS:
        ok = ok & (rows_left > 0)
    q_row = g * 8  # first Q row of each group, within the tile
    word_ptrs = words_ptr + row0 * row_words + word0 + q_row * row_words + w
    if PAIRS:
        word_ptrs = word_ptrs[:, None] + tl.arange(0, 2)[None, :]
    blk = (word0 + w) // 2  # scale column: a 16-code block is 2 words
    if SWIZZLED:
        band = scale_ptr + (row0 // 128) * scale_col_tiles * 512  # the tile's 128-row band
        scale_ptrs = band + swizzle_offset((row0 % 128).to(tl.int32) + q_row, blk, scale_col_tiles)
        scale_row_step = 16
    else:
        scale_ptrs = scale_ptr + row0 * scale_stride + q_row * scale_stride + blk
        scale_row_step = scale_stride
    if PER_ROW_AMAX:
        amax_ptrs = amax_ptr + row0 + q_row
    else:
        amax_ptrs = amax_ptr
    t0 = _decode_q_row(word_ptrs, scale_ptrs, amax_ptrs, ok, 0, row_words, scale_row_step, dequant_rcp,
                       PER_ROW_AMAX, rows_left, EVEN_ROWS, SLOTS, PAIRS)
    t1 = _decode_q_row(word_ptrs, scale_ptrs, amax_ptrs, ok, 1, row_words, scale_row_step, dequant_rcp,
                       PER_ROW_AMAX, rows_left, EVEN_ROWS, SLOTS, PAIRS)
    t2 = _decode_q_row(word_ptrs, scale_ptrs, amax_ptrs, ok, 2, row_words, scale_row_step, dequant_rcp,
                       PER_ROW_AMAX, rows_left, EVEN_ROWS, SLOTS, PAIRS)
    t3 = _decode_q_row(word_ptrs, scale_ptrs, amax_ptrs, ok, 3, row_words, scale_row_step, dequant_rcp,
                       PER_ROW_AMAX, rows_left, EVEN_ROWS, SLOTS, PAIRS)
    t4 = _decode_q_row(word_ptrs, scale_ptrs, amax_ptrs, ok, 4, row_words, scale_row_step, dequant_rcp,
                       PER_ROW_AMAX, rows_left, EVEN_ROWS, SLOTS, PAIRS)
    t5 = _decode_q_row(word_ptrs, scale_ptrs, amax_ptrs, ok, 5, row_words, scale_row_step, dequant_rcp,
                       PER_ROW_AMAX, rows_left, EVEN_ROWS, SLOTS, PAIRS)
    t6 = _decode_q_row(word_ptrs, scale_ptrs, amax_ptrs, ok, 6, row_words, scale_row_step, dequant_rcp,
                       PER_ROW_AMAX, rows_left, EVEN_ROWS, SLOTS, PAIRS)
    t7 = _decode_q_row(word_ptrs, scale_ptrs, amax_ptrs, ok, 7, row_words, scale_row_step, dequant_rcp,
                       PER_ROW_AMAX, rows_left, EVEN_ROWS, SLOTS, PAIRS)
    # [SLOTS, 8 * WPS (code n of the slot's words: output row), 8 (Q row r: output column)]
    out = tl.reshape(_join8(t0, t1, t2, t3, t4, t5, t6, t7), (SLOTS, 8 * WPS, 8))
    out = cast_to_out(out, out_ptr, SOFT_BF16)

    n = tl.arange(0, 8 * WPS)[None, :, None]
    r = tl.arange(0, 8)[None, None, :]
    x_row = w[:, None, None] * 8 + n  # output row within the tile
    x_col = g[:, None, None] * 8 + r  # output column within the tile
    o_ok = ok[:, None, None]
    if not EVEN_ROWS:
        o_ok = o_ok & (r < rows_left[:, None, None])
    out_base = out_ptr + word0.to(tl.int64) * 8 * rows + row0
    tl.store(out_base + x_row * rows + x_col, out, mask=o_ok)


@triton.jit
def _split4(x):
    """[S, 4] -> its 4 columns as [S] tensors, in order (held by one thread: no data movement)."""
    a, b = tl.split(tl.reshape(x, (x.shape[0], 2, 2)))
    a0, a2 = tl.split(a)
    a1, a3 = tl.split(b)
    return a0, a1, a2, a3


@triton.jit
def _join4(v0, v1, v2, v3):
    """[S] x 4 -> [S, 4] (v0..v3 in order, all in one thread)."""
    return tl.reshape(tl.join(tl.join(v0, v2), tl.join(v1, v3)), (v0.shape[0], 4))


@triton.jit
def _code_value(lo, hi, N: tl.constexpr, factor):
    """Code N (0..15) of a slot's 2-word scale block (lo: codes 0..7, hi: 8..15) times its block
    factor, with the reference's operation order: fl(q * factor), q exact."""
    if N < 8:
        bits = _e2m1_nibble_bits(lo, N)
    else:
        bits = _e2m1_nibble_bits(hi, N - 8)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37 * factor


@triton.jit
def _store_out_row(ptrs, mask, lo, hi, f, N: tl.constexpr, GR: tl.constexpr, SPLIT: tl.constexpr, SOFT_BF16: tl.constexpr):
    """Output row N of each slot's 16-row block: code N of the slot's GR Q rows (tuples lo, hi, f indexed
    by Q row) as GR contiguous outputs, stored as SPLIT [S, GR // SPLIT] pieces (16 bytes each)."""
    if GR == 8:
        if SPLIT == 1:
            v = _join8(_code_value(lo[0], hi[0], N, f[0]), _code_value(lo[1], hi[1], N, f[1]),
                       _code_value(lo[2], hi[2], N, f[2]), _code_value(lo[3], hi[3], N, f[3]),
                       _code_value(lo[4], hi[4], N, f[4]), _code_value(lo[5], hi[5], N, f[5]),
                       _code_value(lo[6], hi[6], N, f[6]), _code_value(lo[7], hi[7], N, f[7]))
            v = tl.reshape(v, (lo[0].shape[0], 8))
            tl.store(ptrs, cast_to_out(v, ptrs, SOFT_BF16), mask=mask)
        else:
            v = _join4(_code_value(lo[0], hi[0], N, f[0]), _code_value(lo[1], hi[1], N, f[1]),
                       _code_value(lo[2], hi[2], N, f[2]), _code_value(lo[3], hi[3], N, f[3]))
            tl.store(ptrs[0], cast_to_out(v, ptrs[0], SOFT_BF16), mask=mask[0])
            v = _join4(_code_value(lo[4], hi[4], N, f[4]), _code_value(lo[5], hi[5], N, f[5]),
                       _code_value(lo[6], hi[6], N, f[6]), _code_value(lo[7], hi[7], N, f[7]))
            tl.store(ptrs[1], cast_to_out(v, ptrs[1], SOFT_BF16), mask=mask[1])
    else:
        v = _join4(_code_value(lo[0], hi[0], N, f[0]), _code_value(lo[1], hi[1], N, f[1]),
                   _code_value(lo[2], hi[2], N, f[2]), _code_value(lo[3], hi[3], N, f[3]))
        tl.store(ptrs, cast_to_out(v, ptrs, SOFT_BF16), mask=mask)


@triton.jit
def _load_q_row(word_ptrs, scale_ptrs, amax, ok, R: tl.constexpr, row_words, scale_row_step, dequant_rcp,
                rows_left, EVEN_ROWS: tl.constexpr):
    """Row R of each slot's group: its 2-word scale block (lo, hi: [S] int32) and block factor [S]."""
    if not EVEN_ROWS:
        ok = ok & (R < rows_left)
    scale_code = tl.load(scale_ptrs + R * scale_row_step, mask=ok, other=0).to(tl.int32)
    factor = (e4m3_decode_exact(scale_code) * amax) * dequant_rcp
    lo, hi = tl.split(tl.load(word_ptrs + R * row_words, mask=ok[:, None], other=0))  # one 8-byte load
    return lo, hi, factor


@triton.jit
def _load_amax4(amax_ptr, q_row, ok, rows_left, R0: tl.constexpr, EVEN_ROWS: tl.constexpr):
    """Per-row amax of Q rows R0..R0+3 of each slot's group: one 16-byte load, split in registers."""
    r = tl.arange(0, 4)[None, :]
    m = ok[:, None]
    if not EVEN_ROWS:
        m = m & (R0 + r < rows_left[:, None])
    return _split4(tl.load(amax_ptr + q_row[:, None] + R0 + r, mask=m, other=0.0))


@triton.jit
def _nvfp4_dequantize_t_rows_kernel(
    words_ptr, scale_ptr, amax_ptr, out_ptr,
    rows, cols,  # Q is (rows, cols) = x^T; out is (cols, rows) = x; words_ptr holds cols // 8 words per row
    scale_stride,  # row stride of a compact or padded scale matrix
    scale_col_tiles,  # roundup(cols // 16, 4) // 4, for the swizzled layout
    dequant_rcp,  # fl(1/(6E))
    SWIZZLED: tl.constexpr,
    PER_ROW_AMAX: tl.constexpr,
    GROUPS: tl.constexpr,  # groups of GR Q rows per program
    WORDS: tl.constexpr,  # words (8 codes each) per Q row per program, even
    LOCAL_I64: tl.constexpr,
    SOFT_BF16: tl.constexpr,
    EVEN_ROWS: tl.constexpr,  # rows % (GR * GROUPS) == 0
    EVEN_WORDS: tl.constexpr,  # (cols // 8) % WORDS == 0
    GR: tl.constexpr,  # Q rows per group: 8, or 4 (fp32 output: one 16-byte store per output row)
    SPLIT: tl.constexpr,  # 16-byte stores per output row of a slot: GR * out bytes // 16
):
    # Same slots and numerics as _nvfp4_dequantize_t_kernel with PAIRS (a slot = one 16-code scale
    # block of GR consecutive Q rows = 16 output rows x GR contiguous outputs; group fastest), but each
    # of the slot's 16 output rows is decoded and stored on its own as an [S, GR] tensor whose layout
    # (slot per lane, GR contiguous values per thread) is the one the store's coalescing pass picks:
    # no layout conversion (the [S, 16, 8] store of the other kernel goes through shared memory and 4
    # barriers), and only the words and factors (2 * GR + GR registers per slot) stay live, not 16 * GR
    # decoded values.
    SLOTS: tl.constexpr = GROUPS * WORDS // 2
    pid = tl.program_id(0)
    row_words = cols // 8
    word_tiles = tl.cdiv(row_words, WORDS)
    row0 = (pid // word_tiles).to(tl.int64) * (GR * GROUPS)
    word0 = (pid % word_tiles) * WORDS

    t = tl.arange(0, SLOTS)
    g = t % GROUPS
    w = t // GROUPS * 2  # first word of the slot
    if LOCAL_I64:
        g = g.to(tl.int64)
        w = w.to(tl.int64)
    rows_left = rows - row0 - g * GR  # Q rows from each group's first row to the end of Q
    if EVEN_WORDS:
        ok = w < WORDS
    else:
        ok = w < row_words - word0
    if not EVEN_ROWS:
        ok = ok & (rows_left > 0)
    q_row = g * GR  # first Q row of each group, within the tile
    word_ptrs = (words_ptr + row0 * row_words + word0 + q_row * row_words + w)[:, None] + tl.arange(0, 2)[None, :]
    blk = (word0 + w) // 2  # scale column: a 16-code block is 2 words
    if SWIZZLED:
        band = scale_ptr + (row0 // 128) * scale_col_tiles * 512  # the tile's 128-row band
        scale_ptrs = band + swizzle_offset((row0 % 128).to(tl.int32) + q_row, blk, scale_col_tiles)
        scale_row_step = 16
    else:
        scale_ptrs = scale_ptr + row0 * scale_stride + q_row * scale_stride + blk
        scale_row_step = scale_stride
    if PER_ROW_AMAX:
        a0, a1, a2, a3 = _load_amax4(amax_ptr + row0, q_row, ok, rows_left, 0, EVEN_ROWS)
        if GR == 8:
            a4, a5, a6, a7 = _load_amax4(amax_ptr + row0, q_row, ok, rows_left, 4, EVEN_ROWS)
    else:
        a0 = tl.load(amax_ptr)
        a1, a2, a3, a4, a5, a6, a7 = a0, a0, a0, a0, a0, a0, a0
    l0, h0, f0 = _load_q_row(word_ptrs, scale_ptrs, a0, ok, 0, row_words, scale_row_step, dequant_rcp, rows_left, EVEN_ROWS)
    l1, h1, f1 = _load_q_row(word_ptrs, scale_ptrs, a1, ok, 1, row_words, scale_row_step, dequant_rcp, rows_left, EVEN_ROWS)
    l2, h2, f2 = _load_q_row(word_ptrs, scale_ptrs, a2, ok, 2, row_words, scale_row_step, dequant_rcp, rows_left, EVEN_ROWS)
    l3, h3, f3 = _load_q_row(word_ptrs, scale_ptrs, a3, ok, 3, row_words, scale_row_step, dequant_rcp, rows_left, EVEN_ROWS)
    if GR == 8:
        l4, h4, f4 = _load_q_row(word_ptrs, scale_ptrs, a4, ok, 4, row_words, scale_row_step, dequant_rcp, rows_left, EVEN_ROWS)
        l5, h5, f5 = _load_q_row(word_ptrs, scale_ptrs, a5, ok, 5, row_words, scale_row_step, dequant_rcp, rows_left, EVEN_ROWS)
        l6, h6, f6 = _load_q_row(word_ptrs, scale_ptrs, a6, ok, 6, row_words, scale_row_step, dequant_rcp, rows_left, EVEN_ROWS)
        l7, h7, f7 = _load_q_row(word_ptrs, scale_ptrs, a7, ok, 7, row_words, scale_row_step, dequant_rcp, rows_left, EVEN_ROWS)
        lo = (l0, l1, l2, l3, l4, l5, l6, l7)
        hi = (h0, h1, h2, h3, h4, h5, h6, h7)
        f = (f0, f1, f2, f3, f4, f5, f6, f7)
    else:
        lo = (l0, l1, l2, l3)
        hi = (h0, h1, h2, h3)
        f = (f0, f1, f2, f3)

    # output element (w * 8 + n, g * GR + r) of the tile, for output row n of each slot
    out_base = out_ptr + word0.to(tl.int64) * 8 * rows + row0
    row_stride = rows  # of the output, whose 16 rows per slot are n * row_stride apart
    if LOCAL_I64:
        row_stride = row_stride.to(tl.int64)
    PIECE: tl.constexpr = GR // SPLIT
    r = tl.arange(0, PIECE)[None, :]
    slot_ptrs = out_base + (w * 8)[:, None] * rows + (g * GR)[:, None] + r
    o_ok = ok[:, None]
    if SPLIT == 1:
        if not EVEN_ROWS:
            o_ok = o_ok & (r < rows_left[:, None])
        for n in tl.static_range(16):
            _store_out_row(slot_ptrs + n * row_stride, o_ok, lo, hi, f, n, GR, SPLIT, SOFT_BF16)
    else:
        o_ok1 = o_ok
        if not EVEN_ROWS:
            o_ok1 = o_ok & (PIECE + r < rows_left[:, None])
            o_ok = o_ok & (r < rows_left[:, None])
        for n in tl.static_range(16):
            _store_out_row((slot_ptrs + n * row_stride, slot_ptrs + n * row_stride + PIECE), (o_ok, o_ok1), lo, hi, f, n,
                           GR, SPLIT, SOFT_BF16)


def soft_bf16_cast(out: torch.Tensor) -> bool:
    """bf16 output under the interpreter (CPU tensors): its own fp32 -> bf16 cast truncates."""
    return out.dtype == torch.bfloat16 and out.device.type != "cuda"


def _tile_shape(rows: int, cols: int) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_COLS, num_warps) of the rowwise kernel."""
    block_cols, block_rows = 256, 32
    block_cols = max(16, min(block_cols, triton.next_power_of_2(cols)))
    block_rows = max(1, min(block_rows, triton.next_power_of_2(rows)))
    return block_rows, block_cols, 4


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


def _as_words(data: torch.Tensor) -> torch.Tensor:
    """The packed (R, C/2) bytes as (R, C/8) int32 words (C % 16 == 0, so rows hold whole words)."""
    data = data.contiguous()
    if data.storage_offset() % 4 != 0:
        data = data.clone()
    return data.view(torch.int32)


def _t_tile_shape(rows: int, cols: int) -> tuple[int, int]:
    """(GROUPS, WORDS) of the transposing kernel: 8 * GROUPS Q rows x WORDS words (8 codes each) per
    program. 8 x 32 (timed at 8192 x 8192, see :data:`T_PAIRS`): with pairs a warp's 32 slots are the
    8 groups x 4 pairs, so its loads read 32 contiguous bytes of each of 64 Q rows and its stores write
    128 contiguous bytes (bf16) of each of 64 output rows: whole sectors both ways."""
    groups = max(1, min(8, triton.next_power_of_2(triton.cdiv(rows, 8))))
    words = max(1, min(32, triton.next_power_of_2(cols // 8)))
    return groups, words


def _t_rows_tile_shape(rows: int, cols: int, gr: int) -> tuple[int, int]:
    """(GROUPS, WORDS) of the per-output-row transposing kernel: GROUPS groups of ``gr`` Q rows x WORDS
    words (even: whole scale blocks), 16 x 32 for both group heights (timed, see :data:`T_VARIANT`; 8 x 32
    and 16 x 16 measured 3-9% slower): 256 slots, 8 warps."""
    groups = max(1, min(16, triton.next_power_of_2(triton.cdiv(rows, gr))))
    words = max(2, min(32, triton.next_power_of_2(cols // 8)))
    return groups, words


def launch_nvfp4_dequantize(
    data: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    out: torch.Tensor,
    *,
    scale_layout: str,
    e4m3_max: float,
    transpose: bool,
    block_rows: int | None = None,
    block_cols: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Dequantize Q (data (R, C/2), scale, amax) into ``out`` ((R, C), or (C, R) with ``transpose``).

    Block sizes may be overridden (benchmark tuning); they must be powers of two. Rowwise:
    block_rows <= 128 rows and block_cols >= 16 columns per program. With ``transpose`` they count
    8-row groups of Q (block_rows * 8 <= 128) and 8-code words of Q's rows (block_cols) instead.
    """
    rows, cols = data.shape[0], data.shape[1] * 2
    if rows * cols == 0:
        return
    blocks = cols // 16
    scale_stride = blocks if scale_layout == "compact" else roundup(blocks, 4)
    common = dict(SWIZZLED=scale_layout == "swizzled", PER_ROW_AMAX=amax.numel() != 1, SOFT_BF16=soft_bf16_cast(out))
    variant = t_variant() if transpose else "join"
    if variant != "join" and (block_cols or 2) % 2 == 0:  # whole scale blocks per slot
        gr = 4 if variant == "rows4" and out.element_size() == 4 else 8
        d_groups, d_words = _t_rows_tile_shape(rows, cols, gr)
        groups, words = block_rows or d_groups, block_cols or d_words
        check_tile(groups * gr, words, min_cols=2)
        num_warps = num_warps or max(1, min(8, groups * words // 64))  # one warp per 32 two-word slots
        grid = (triton.cdiv(rows, gr * groups) * triton.cdiv(cols // 8, words),)
        _nvfp4_dequantize_t_rows_kernel[grid](
            _as_words(data), scale, amax, out, rows, cols, scale_stride, roundup(blocks, 4) // 4, rcp_f32(6.0 * e4m3_max),
            GROUPS=groups, WORDS=words, LOCAL_I64=max(gr * groups * cols // 8, 8 * words * rows) >= _INT32_LIMIT,
            EVEN_ROWS=rows % (gr * groups) == 0, EVEN_WORDS=(cols // 8) % words == 0, GR=gr,
            SPLIT=max(1, gr * out.element_size() // 16), num_warps=num_warps, **common,
        )
        return
    if transpose:
        d_groups, d_words = _t_tile_shape(rows, cols)
        groups, words = block_rows or d_groups, block_cols or d_words
        check_tile(groups * 8, words, min_cols=1)
        pairs = T_PAIRS and words % 2 == 0  # a 1-word tile cannot hold a pair
        # one 32-thread warp per 32 slots (a slot = one word, or one pair, of one 8-row group), <= 4 warps
        num_warps = num_warps or max(1, min(4, groups * words // (64 if pairs else 32)))
        grid = (triton.cdiv(rows, 8 * groups) * triton.cdiv(cols // 8, words),)
        _nvfp4_dequantize_t_kernel[grid](
            _as_words(data), scale, amax, out, rows, cols, scale_stride, roundup(blocks, 4) // 4, rcp_f32(6.0 * e4m3_max),
            GROUPS=groups, WORDS=words, LOCAL_I64=max(8 * groups * cols // 8, 8 * words * rows) >= _INT32_LIMIT,
            EVEN_ROWS=rows % (8 * groups) == 0, EVEN_WORDS=(cols // 8) % words == 0, PAIRS=pairs,
            num_warps=num_warps, **common,
        )
        return
    d_rows, d_cols, d_warps = _tile_shape(rows, cols)
    block_rows, block_cols, num_warps = block_rows or d_rows, block_cols or d_cols, num_warps or d_warps
    check_tile(block_rows, block_cols, min_cols=16)
    grid = (triton.cdiv(rows, block_rows) * triton.cdiv(cols, block_cols),)
    _nvfp4_dequantize_kernel[grid](
        _as_words(data), scale, amax, out, rows, cols, scale_stride, roundup(blocks, 4) // 4, rcp_f32(6.0 * e4m3_max),
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, LOCAL_I64=block_rows * cols >= _INT32_LIMIT,
        EVEN=rows % block_rows == 0 and cols % block_cols == 0, num_warps=num_warps, **common,
    )


@torch.library.custom_op("nvfp4lab::dequantize_nvfp4", mutates_args=())
def _dequantize_nvfp4_op(
    data: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, scale_layout: str, e4m3_max: float,
    transpose: bool, out_dtype: torch.dtype,
) -> torch.Tensor:
    rows, cols = data.shape[0], data.shape[1] * 2
    shape = (cols, rows) if transpose else (rows, cols)
    out = torch.empty(shape, dtype=out_dtype, device=data.device)
    launch_nvfp4_dequantize(data, scale, amax, out, scale_layout=scale_layout, e4m3_max=e4m3_max, transpose=transpose)
    return out


@_dequantize_nvfp4_op.register_fake
def _(data, scale, amax, scale_layout, e4m3_max, transpose, out_dtype):
    rows, cols = data.shape[0], data.shape[1] * 2
    return data.new_empty((cols, rows) if transpose else (rows, cols), dtype=out_dtype)


def _check_parts(which: str, data, scale, amax, rows: int, cols: int, layout: str, per_token: bool) -> None:
    prefix = f"{which}_"
    for name, t in (("data", data), ("scale", scale)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
            raise TypeError(f"{prefix}{name} must be a uint8 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if tuple(data.shape) != (rows, cols // 2):
        raise ValueError(f"{prefix}data must have shape {(rows, cols // 2)} (two E2M1 codes per byte), got {tuple(data.shape)}")
    blocks = cols // 16
    want = (rows, blocks) if layout == "compact" else (roundup(rows, 128), roundup(blocks, 4))
    if scale.numel() != want[0] * want[1] or (layout != "swizzled" and tuple(scale.shape) != want):
        raise ValueError(f"{prefix}scale must have shape {want} for scale_layout={layout!r}, got {tuple(scale.shape)}")
    if not isinstance(amax, torch.Tensor) or not amax.dtype.is_floating_point:
        raise TypeError(f"{prefix}amax must be a floating-point tensor")
    if amax.numel() != (rows if per_token else 1):
        raise ValueError(f"{prefix}amax must have {rows if per_token else 1} elements (per_token={per_token}), got {amax.numel()}")


def dequantize_nvfp4(t, dtype: torch.dtype, which: str = "rowwise") -> torch.Tensor:
    """NVFP4Tensor -> ``dtype`` tensor of the original shape; identical to ``ref.nvfp4.dequantize``.

    ``which="columnwise"`` reads the columnwise copy and returns x's orientation (transposed in the
    kernel's store; with RHT: kernel in fp32, then the reference inverse RHT, then transpose and cast).
    """
    if which not in ("rowwise", "columnwise"):
        raise ValueError(f"which must be 'rowwise' or 'columnwise', got {which!r}")
    m, k = t.m, t.k
    if which == "rowwise":
        data, scale, amax, rows, cols = t.rowwise_data, t.rowwise_scale, t.rowwise_amax, m, k
    else:
        data, scale, amax, rows, cols = t.columnwise_data, t.columnwise_scale, t.columnwise_amax, k, m
    if data is None:
        raise ValueError(f"which={which!r}: this NVFP4Tensor has no {which} copy")
    if cols % 16 != 0:
        raise ValueError(f"the quantized matrix must have a multiple of 16 columns (whole NVFP4 blocks), got {cols}")
    _check_parts(which, data, scale, amax, rows, cols, t.scale_layout, t.per_token)
    if data.numel() == 0:
        return torch.empty(t.shape, dtype=dtype, device=data.device)
    amax = amax.to(torch.float32).reshape(-1)
    data, scale = data.contiguous(), scale.contiguous()
    if which == "columnwise" and t.config.rht:
        from ..ref.nvfp4 import inverse_rht

        q_t = _dequantize_nvfp4_op(data, scale, amax, t.scale_layout, t.e4m3_max, False, torch.float32)
        return inverse_rht(q_t, t.config.rht_sign_mask).t().to(dtype).reshape(t.shape)
    out = _dequantize_nvfp4_op(data, scale, amax, t.scale_layout, t.e4m3_max, which == "columnwise", dtype)
    return out.reshape(t.shape)
