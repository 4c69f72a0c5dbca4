"""NVFP4 dequantize kernels: packed E2M1 codes + E4M3 block scales + fp32 amax -> bf16 / fp16 / fp32.

Numerics (spec section 11, :func:`nvfp4lab.ref.nvfp4.dequantize_rows`), per 16-element block:

    factor = fl(fl(float(s) * amax) * fl(1/(6E)))        E = the tensor's own e4m3_max (448 or 256)
    out    = out_dtype(fl(q * factor))

except where fl(s * amax) overflows for a finite amax (amax > FLT_MAX / 448): there the factor is
formed from amax / 2^32 and multiplied back by 2^32 (``_block_factor``); and with a finite factor a
value past out_dtype's range saturates to its max (``_saturate``), as the reference does.

PR 3045's numerics (``pr3045``): factor = fl(float(s) * fl(amax / 2688)) with the raw stored amax: the
launcher divides the amax vector once (a correctly rounded torch division) and the kernel multiplies by
1 instead of fl(1/(6E)), which is exact.

Input layout of the quantized matrix Q (R, C) (rowwise copy: Q = x, R = M, C = K; columnwise copy:
Q = x^T, R = K, C = M):

    data   uint8 (R, C/2), element 2j in the low nibble
    scale  uint8 E4M3 bits, entry [r, b] scales Q[r, 16b:16b+16]:
           compact (R, C/16); padded (roundup(R,128), roundup(C/16,4)); swizzled: the padded shape in
           cuBLAS' 128x4 order, read through :func:`.swizzle.swizzle_offset` (no unswizzle pass)
    amax   fp32 (1,) per tensor, or (R,) per row (per token)

Output: Q itself (R, C) (:func:`_nvfp4_dequantize_kernel`), or with ``transpose`` its transpose (C, R)
= x's orientation for the columnwise copy (:func:`_nvfp4_dequantize_t_kernel`). With RHT the columnwise
copy is dequantized by the row kernel in fp32 and the inverse RHT is then :func:`nvfp4lab.rht.inverse_rht`
(a torch matmul, the reference's own): the fp32 sum of 16 products depends on summation order, so one
shared matmul is what keeps the result identical to the reference on each device.

Row kernel tiling: one program per BLOCK_ROWS x BLOCK_COLS output tile (1-D grid, row-major over
tiles). The packed data is read as int32 words, [BLOCK_ROWS, BLOCK_COLS/16, 2] (8 codes per word, 2 words per
block), so one block factor broadcasts over 16 codes held by the same thread and the codes come out of
each word by shifts, already in element order for 16-byte vector stores. The E2M1 and E4M3 decodes
are bit placements plus one exact power-of-two multiply (no conversion instructions).

Transposing kernel: a slot is one 16-code scale block (2 words) of GR consecutive Q rows, i.e. 16 output
rows of GR contiguous outputs; GR = 8 for 2-byte outputs and 4 for fp32, so that each output row of a
slot is one 16-byte store. Each of the 16 output rows is decoded and stored on its own, in the layout it
was decoded in (slot per lane, GR contiguous values per thread): no shared-memory transpose, and only the
words and factors stay live. Slots run group-fastest, so a warp's loads read whole sectors of each Q row
and its stores whole sectors of each output row.

bf16 output uses the hardware cast on the GPU and an integer round-to-nearest-even under the interpreter
(whose own fp32 -> bf16 cast truncates). Constraints: C % 16 == 0 (whole blocks). Tile bases are 64-bit;
offsets inside a tile are 32-bit unless a tile spans 2^31 elements (``LOCAL_I64``).

The public launcher is the ``torch.library`` custom op ``nvfp4lab::dequantize_nvfp4`` with a fake
implementation (torch.compile, CUDA graphs: no host sync); empty inputs return without a launch.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..layout import cdiv, next_power_of_2, roundup
from ..rht import DTYPE_MAX, inverse_rht, saturate_finite
from .decode_common import (
    cast_to_out,
    check_tile,
    rcp_f32,
    soft_bf16_cast,
)
from .formats import e2m1_decode, e4m3_decode
from .launch import Launch, aligned, custom_op
from .pdl import wait_prior_grid
from .swizzle import swizzle_offset

_INT32_LIMIT = 2**31


@triton.jit
def _block_factor(scale_code, amax, dequant_rcp):
    """fl(fl(float(s) * amax) * fl(1/(6E))); where fl(s * amax) overflows for a finite amax, the same
    roundings on amax / 2^32, times 2^32 (exact: ``ref.nvfp4.dequantize_factor``)."""
    s = e4m3_decode(scale_code)
    amax = amax + tl.zeros_like(s)  # a per-tensor amax is a scalar
    prod = s * amax
    overflow = (tl.abs(prod) == float("inf")) & (tl.abs(amax) < float("inf"))
    rescaled = ((s * (amax * 2.3283064365386963e-10)) * dequant_rcp) * 4294967296.0
    return tl.where(overflow, rescaled, prod * dequant_rcp)


@triton.jit
def _saturate(v, factor, OUT_MAX: tl.constexpr):
    """q * factor past the output dtype's range -> +-OUT_MAX where the factor is finite (the plain cast
    gives inf); NaN stays NaN, and an infinite factor (non-finite amax) keeps TE's inf."""
    big = (tl.abs(v) > OUT_MAX) & (tl.abs(factor) < float("inf"))
    return tl.where(big, tl.where(v > 0, OUT_MAX, -OUT_MAX), v)


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
    OUT_MAX: tl.constexpr, PDL: tl.constexpr = False,  # the output dtype's largest finite value
):
    wait_prior_grid(PDL)
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
    factor = _block_factor(scale_code, amax, dequant_rcp)  # [R, BLOCKS]

    shifts = tl.arange(0, 8) * 4
    codes = (words[:, :, :, None] >> shifts[None, None, None, :]) & 0xF  # [R, BLOCKS, 2, 8]
    vals = _saturate(e2m1_decode(codes) * factor[:, :, None, None], factor[:, :, None, None], OUT_MAX)
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
def _code_value(lo, hi, N: tl.constexpr, factor, OUT_MAX: tl.constexpr):
    """Code N (0..15) of a slot's 2-word scale block (lo: codes 0..7, hi: 8..15) times its block
    factor, with the reference's operation order: fl(q * factor), q exact (then ``_saturate``)."""
    if N < 8:
        bits = _e2m1_nibble_bits(lo, N)
    else:
        bits = _e2m1_nibble_bits(hi, N - 8)
    return _saturate(bits.to(tl.float32, bitcast=True) * 8.507059173023462e37 * factor, factor, OUT_MAX)


@triton.jit
def _store_out_row(ptrs, mask, lo, hi, f, N: tl.constexpr, GR: tl.constexpr, SOFT_BF16: tl.constexpr,
                   OUT_MAX: tl.constexpr):
    """Output row N of each slot's 16-row block: code N of the slot's GR Q rows (tuples lo, hi, f indexed
    by Q row) as GR contiguous outputs, stored as one [S, GR] piece (16 bytes per slot)."""
    if GR == 8:
        v = _join8(_code_value(lo[0], hi[0], N, f[0], OUT_MAX), _code_value(lo[1], hi[1], N, f[1], OUT_MAX),
                   _code_value(lo[2], hi[2], N, f[2], OUT_MAX), _code_value(lo[3], hi[3], N, f[3], OUT_MAX),
                   _code_value(lo[4], hi[4], N, f[4], OUT_MAX), _code_value(lo[5], hi[5], N, f[5], OUT_MAX),
                   _code_value(lo[6], hi[6], N, f[6], OUT_MAX), _code_value(lo[7], hi[7], N, f[7], OUT_MAX))
        v = tl.reshape(v, (lo[0].shape[0], 8))
        tl.store(ptrs, cast_to_out(v, ptrs, SOFT_BF16), mask=mask)
    else:
        v = _join4(_code_value(lo[0], hi[0], N, f[0], OUT_MAX), _code_value(lo[1], hi[1], N, f[1], OUT_MAX),
                   _code_value(lo[2], hi[2], N, f[2], OUT_MAX), _code_value(lo[3], hi[3], N, f[3], OUT_MAX))
        tl.store(ptrs, cast_to_out(v, ptrs, SOFT_BF16), mask=mask)


@triton.jit
def _load_q_row(word_ptrs, scale_ptrs, amax, ok, R: tl.constexpr, row_words, scale_row_step, dequant_rcp,
                rows_left, EVEN_ROWS: tl.constexpr):
    """Row R of each slot's group: its 2-word scale block (lo, hi: [S] int32) and block factor [S]."""
    if not EVEN_ROWS:
        ok = ok & (R < rows_left)
    scale_code = tl.load(scale_ptrs + R * scale_row_step, mask=ok, other=0).to(tl.int32)
    factor = _block_factor(scale_code, amax, dequant_rcp)
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
def _nvfp4_dequantize_t_kernel(
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
    GR: tl.constexpr,  # Q rows per group: 8, or 4 (fp32 output): one 16-byte store per output row
    OUT_MAX: tl.constexpr, PDL: tl.constexpr = False,  # the output dtype's largest finite value
):
    # A slot is one 16-code scale block of GR consecutive Q rows = 16 output rows x GR contiguous
    # outputs (group fastest). Each of the slot's 16 output rows is decoded and stored on its own as an
    # [S, GR] tensor whose layout (slot per lane, GR contiguous values per thread) is the one the store's
    # coalescing pass picks: no layout conversion (joining all 16 x GR values into one [S, 16, GR] store
    # would go through shared memory), and only the words and factors (2 * GR + GR registers per slot)
    # stay live, not 16 * GR decoded values.
    wait_prior_grid(PDL)
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
    r = tl.arange(0, GR)[None, :]
    slot_ptrs = out_base + (w * 8)[:, None] * rows + (g * GR)[:, None] + r
    o_ok = ok[:, None]
    if not EVEN_ROWS:
        o_ok = o_ok & (r < rows_left[:, None])
    for n in tl.static_range(16):
        _store_out_row(slot_ptrs + n * row_stride, o_ok, lo, hi, f, n, GR, SOFT_BF16, OUT_MAX)


def _as_words(data: torch.Tensor) -> torch.Tensor:
    """The packed (R, C/2) bytes as (R, C/8) int32 words (C % 16 == 0, so rows hold whole words)."""
    data = data.contiguous()
    if data.storage_offset() % 4 != 0:
        data = data.clone()
    return data.view(torch.int32)



def _tile_shape(rows: int, cols: int) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_COLS, num_warps) of the rowwise kernel: 32 x 256, 4 warps (smaller for small Q)."""
    block_cols, block_rows = 256, 32
    block_cols = max(16, min(block_cols, next_power_of_2(cols)))
    block_rows = max(1, min(block_rows, next_power_of_2(rows)))
    return block_rows, block_cols, 4


def _t_group_rows(out_dtype: torch.dtype) -> int:
    """GR of the transposing kernel: Q rows per group, so that GR outputs are 16 bytes (one store)."""
    return 4 if out_dtype.itemsize == 4 else 8


def _t_tile_shape(rows: int, cols: int, gr: int) -> tuple[int, int]:
    """(GROUPS, WORDS) of the transposing kernel: GROUPS groups of ``gr`` Q rows x WORDS words (even:
    whole scale blocks), 16 x 32 (256 slots, 8 warps) for both group heights, smaller for small Q."""
    groups = max(1, min(16, next_power_of_2(cdiv(rows, gr))))
    words = max(2, min(32, next_power_of_2(cols // 8)))
    return groups, words


@functools.lru_cache(maxsize=4096)
def _dequantize_plan(rows: int, cols: int, scale_layout: str, e4m3_max: float, transpose: bool, out_dtype: torch.dtype,
                     per_row_amax: bool, block_rows, block_cols, num_warps, pr3045: bool, spec) -> tuple:
    """(Launch, its scalar arguments after the four tensors) of one dequantize shape and choice of
    kernel; ``spec``: the tensors' device, dtypes and alignment (part of the cache key only).
    ``pr3045``: the amax arrives divided by 2688 and the kernel's factor multiplies by 1 (exact)."""
    blocks = cols // 16
    scale_stride = blocks if scale_layout == "compact" else roundup(blocks, 4)
    scalars = (rows, cols, scale_stride, roundup(blocks, 4) // 4, 1.0 if pr3045 else rcp_f32(6.0 * e4m3_max))
    common = dict(SWIZZLED=scale_layout == "swizzled", PER_ROW_AMAX=per_row_amax,
                  SOFT_BF16=soft_bf16_cast(out_dtype, spec[0]), OUT_MAX=DTYPE_MAX[out_dtype])
    if transpose:
        gr = _t_group_rows(out_dtype)
        d_groups, d_words = _t_tile_shape(rows, cols, gr)
        groups, words = block_rows or d_groups, block_cols or d_words
        check_tile(groups * gr, words, min_cols=2)  # a slot holds one 2-word scale block
        num_warps = num_warps or max(1, min(8, groups * words // 64))  # one warp per 32 two-word slots
        grid = (cdiv(rows, gr * groups) * cdiv(cols // 8, words),)
        meta = dict(GROUPS=groups, WORDS=words, LOCAL_I64=max(gr * groups * cols // 8, 8 * words * rows) >= _INT32_LIMIT,
                    EVEN_ROWS=rows % (gr * groups) == 0, EVEN_WORDS=(cols // 8) % words == 0, GR=gr,
                    num_warps=num_warps, **common)
        return Launch(_nvfp4_dequantize_t_kernel, grid, meta), scalars
    d_rows, d_cols, d_warps = _tile_shape(rows, cols)
    block_rows, block_cols, num_warps = block_rows or d_rows, block_cols or d_cols, num_warps or d_warps
    check_tile(block_rows, block_cols, min_cols=16)
    grid = (cdiv(rows, block_rows) * cdiv(cols, block_cols),)
    meta = dict(BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, LOCAL_I64=block_rows * cols >= _INT32_LIMIT,
                EVEN=rows % block_rows == 0 and cols % block_cols == 0, num_warps=num_warps, **common)
    return Launch(_nvfp4_dequantize_kernel, grid, meta), scalars


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
    pr3045: bool = False,
) -> None:
    """Dequantize Q (data (R, C/2), scale, amax) into ``out`` ((R, C), or (C, R) with ``transpose``).
    ``pr3045``: PR 3045's factor fl(s * fl(amax / 2688)) (module docstring).

    Block sizes may be overridden (benchmark tuning); they must be powers of two. Rowwise:
    block_rows <= 128 rows and block_cols >= 16 columns per program. With ``transpose`` they count
    groups of GR Q rows (8, or 4 for fp32 output; block_rows * GR <= 128) and 8-code words of Q's rows
    (block_cols, even: whole scale blocks) instead.
    """
    rows, cols = data.shape[0], data.shape[1] * 2
    if rows * cols == 0:
        return
    words = _as_words(data)
    if pr3045:  # the factor fl(s * fl(amax / 2688)): one correctly rounded division of the amax vector
        amax = amax / torch.full_like(amax, 2688.0)  # a tensor divisor: a true division on every device
    spec = (out.device, out.dtype, amax.dtype, aligned(words), aligned(scale), aligned(amax), aligned(out))
    bound, scalars = _dequantize_plan(rows, cols, scale_layout, e4m3_max, transpose, out.dtype, amax.numel() != 1,
                                      block_rows, block_cols, num_warps, pr3045, spec)
    bound(words, scale, amax, out, *scalars)


@custom_op("nvfp4lab::dequantize_nvfp4", mutates_args=())
def _dequantize_nvfp4_op(
    data: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, scale_layout: str, e4m3_max: float,
    transpose: bool, out_dtype: torch.dtype, pr3045: bool = False,
) -> torch.Tensor:
    rows, cols = data.shape[0], data.shape[1] * 2
    shape = (cols, rows) if transpose else (rows, cols)
    out = torch.empty(shape, dtype=out_dtype, device=data.device)
    launch_nvfp4_dequantize(data, scale, amax, out, scale_layout=scale_layout, e4m3_max=e4m3_max, transpose=transpose,
                            pr3045=pr3045)
    return out


@_dequantize_nvfp4_op.register_fake
def _(data, scale, amax, scale_layout, e4m3_max, transpose, out_dtype, pr3045=False):
    rows, cols = data.shape[0], data.shape[1] * 2
    return data.new_empty((cols, rows) if transpose else (rows, cols), dtype=out_dtype)


def dequantize_nvfp4(t, dtype: torch.dtype, which: str = "rowwise") -> torch.Tensor:
    """NVFP4Tensor -> ``dtype`` tensor of the original shape; identical to ``ref.nvfp4.dequantize``.

    ``which="columnwise"`` reads the columnwise copy and returns x's orientation (transposed in the
    kernel's store; with RHT: kernel in fp32, then :func:`nvfp4lab.rht.inverse_rht`, then transpose and cast).
    The parts are checked by :func:`nvfp4lab.ops.dequantize_nvfp4` (``checks.check_nvfp4_copy``).
    """
    if which == "rowwise":
        data, scale, amax = t.rowwise_data, t.rowwise_scale, t.rowwise_amax
    else:
        data, scale, amax = t.columnwise_data, t.columnwise_scale, t.columnwise_amax
    if data.numel() == 0:
        return torch.empty(t.shape, dtype=dtype, device=data.device)
    amax = amax.to(torch.float32).reshape(-1)
    data, scale = data.contiguous(), scale.contiguous()
    pr3045 = t.config.numerics == "te_pr3045"
    if which == "columnwise" and t.config.rht:
        q_t = _dequantize_nvfp4_op(data, scale, amax, t.scale_layout, t.e4m3_max, False, torch.float32, pr3045)
        return saturate_finite(inverse_rht(q_t, t.config.rht_sign_mask).t(), dtype).to(dtype).reshape(t.shape)
    out = _dequantize_nvfp4_op(data, scale, amax, t.scale_layout, t.e4m3_max, which == "columnwise", dtype, pr3045)
    return out.reshape(t.shape)
