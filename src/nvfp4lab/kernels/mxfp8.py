"""MXFP8 quantize and dequantize kernels (E4M3 or E5M2 data, one E8M0 scale per 32 elements).

Numerics (spec sections 2.3 and 13, :mod:`nvfp4lab.ref.mxfp8`), per block of 32 elements:

    c    = e8m0_round_up(fl(bamax * fl(1/max)))      max = 448 (E4M3) or 57344 (E5M2)
    mult = 2^(127 - c)                                built from bits
    q    = fp8_satRNE(fl(x * mult))
    dequantize: out = out_dtype(fl(float(q) * 2^(c - 127)))

Layouts (:class:`nvfp4lab.tensors.MXFP8Tensor`), x is (M, K):

    rowwise_data     uint8 (M, K)  blocks of 32 along K;  rowwise_scale compact (M, K/32),
                     padded (roundup(M,128), roundup(K/32,4)), swizzled = swizzle of the compact matrix
    columnwise_data  uint8 (M, K)  (not transposed) blocks of 32 along M;  columnwise_scale compact
                     (M/32, K), padded (roundup(M/32,4), roundup(K,128)), swizzled = swizzle of the
                     transposed (K, M/32) matrix, shape (roundup(K,128), roundup(M/32,4))

Quantize reads each tile of x once, as a plain [BLOCK_ROWS, BLOCK_COLS] tile, reshaped to
[R, C/32, 32] for the rowwise block amax and to [R/32, 32, C] for the columnwise one (splitting a
dimension keeps the load's layout), so both outputs come from the same registers. Block amaxes are
integer maxima of |x|'s bit patterns (exact, NaN-propagating like the reference's amax). Padded and
swizzled scale buffers are zero-filled before the kernel writes the real entries.

The fp8 rounding is integer/fp32 bit arithmetic (``formats.e4m3_encode_finite`` / ``e5m2_...``:
one fma onto the fp8 grid of the value's binade, the code read by one integer multiply-add), bit
identical to the reference's integer encoder (the house rule: no float8 casts in kernels, the
interpreter's do not round to nearest even); ``fp8_cast="hw"`` selects the GPU's cvt.rn.satfinite
instead (GPU only: the same operation, spec 2.2, so the same bits for every non-NaN input, which the
GPU tier of tests/kernels/test_mxfp8.py checks). With a columnwise copy, a tile whose column block maxima are all
finite (ordinary data: one reduction of the maxima decides it) skips the saturation and uses the
6-instruction E8M0 scale (``formats.e8m0_scale_finite``); a tile holding an inf or NaN takes the
general scale and clamps |x * mult| first. With the integer encoder, columnwise data of whole tiles
(K % 4 == 0, 4-byte aligned outputs) is stored as uint32 words of 4 codes (:func:`_pack_top_bytes`:
fewer instructions and registers than byte stores); other tiles store bytes. On sm_90 these kernels are bound by
instruction issue, the integer ALU pipe (half the fp32 pipe's width) first: ``tools/sass_kernels.py``
counts their SASS instructions per element.

Dequantize reads [BLOCK_ROWS, BLOCK_COLS/32, 32] (rowwise) or [BLOCK_ROWS/32, 32, BLOCK_COLS]
(columnwise) tiles; swizzled scales are read through :func:`.swizzle.swizzle_offset`.

Constraints: rowwise needs K % 32 == 0, columnwise M % 32 == 0 (the other dimension is free and
masked). Tile bases are 64-bit, in-tile offsets 32-bit unless a tile spans 2^31 elements.
Public launchers are ``torch.library`` custom ops (``nvfp4lab::quantize_mxfp8``,
``nvfp4lab::dequantize_mxfp8``) with fake implementations; empty inputs launch nothing.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..layout import cdiv, next_power_of_2, roundup
from ..rht import DTYPE_MAX
from . import formats
from .decode_common import (
    cast_to_out,
    check_tile,
    rcp_f32,
    soft_bf16_cast,
)
from .launch import custom_op, interpreting, launch
from .pdl import wait_prior_grid
from .swizzle import swizzle_offset

_INT32_LIMIT = 2**31
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
FP8_CASTS = ("soft", "hw")  # integer encoders of .formats | the GPU's cvt.rn.satfinite


@triton.jit
def _fp8_encode(v, clamp, E5M2: tl.constexpr, HW_CAST: tl.constexpr):
    """fp32 -> fp8 bits (satfinite RNE; NaN -> 0x7F | sign), as uint8. ``clamp`` is the block's
    :func:`_block_clamp` (used by the soft encoder only). HW_CAST: the GPU's cvt.rn.satfinite.{e4m3,
    e5m2}x2.f32 (same bits, one instruction per 2 values); never under the interpreter, whose float8
    casts do not round to nearest even."""
    if HW_CAST:
        if E5M2:
            return v.to(tl.float8e5).to(tl.uint8, bitcast=True)
        else:
            return v.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        if E5M2:
            return formats.e5m2_encode_fast(v, clamp).to(tl.uint8)
        else:
            return formats.e4m3_encode_fast(v, clamp).to(tl.uint8)


@triton.jit
def _block_amax(abs_bits, axis: tl.constexpr):
    """max |x| along ``axis`` as an integer max of the sign-cleared bits: exact, and a NaN (whose bits
    exceed inf's) wins, as in the reference's amax."""
    return tl.max(abs_bits, axis=axis).to(tl.float32, bitcast=True)


@triton.jit
def _block_clamp(code, E5M2: tl.constexpr):
    """The soft encoder's saturation bound for a block with E8M0 code ``code``: the max finite value,
    or for a NaN block (code 0xFF: multiplier NaN, so every element is NaN) the value of the all-ones
    code 0x7F, which min(NaN, bound) = bound then encodes (see ``formats._fp8_encode_fast``)."""
    if E5M2:
        return tl.where(code == 255, 114688.0, 57344.0)
    else:
        return tl.where(code == 255, 480.0, 448.0)


@triton.jit
def _encode_block(x, mult, code, E5M2: tl.constexpr, HW_CAST: tl.constexpr, FINITE: tl.constexpr,
                  TOP_BYTE: tl.constexpr = False):
    """fp8 bits (uint8) of x * mult, mult a block's multiplier broadcast to x's shape. FINITE: every
    block maximum of the tile is finite, so every |x * mult| is within range and nothing saturates;
    otherwise |x * mult| is first clamped to the block's :func:`_block_clamp` (inf -> max; a NaN
    block's NaNs -> the all-ones code's value, since min(NaN, clamp) = clamp). Same bits as the
    reference either way (the clamp only changes the ties-free saturation region)."""
    if HW_CAST:
        return _fp8_encode(x * mult, 0.0, E5M2, True)
    a = tl.abs(x) * mult
    if not FINITE:
        a = tl.minimum(a, _block_clamp(code, E5M2))
    sign_bits = x.to(tl.int32, bitcast=True)
    if E5M2:
        code = formats.e5m2_encode_finite(a, sign_bits)
    else:
        code = formats.e4m3_encode_finite(a, sign_bits)
    if TOP_BYTE:
        q = code.to(tl.uint32, bitcast=True)
    else:
        q = (code >> 24).to(tl.uint8)
    return q


@triton.jit
def _pack_top_bytes(codes, ROWS: tl.constexpr, COLS: tl.constexpr):
    """uint32 [ROWS, COLS] with a code in each top byte -> uint32 words [ROWS, COLS // 4], 4 codes
    each in memory order: byte selects (PRMT) of the top bytes, where a uint8 store would first
    shift every code down."""
    quads = tl.reshape(codes, (ROWS, COLS // 4, 2, 2))  # [.., j, k] = element 2j + k
    even, odd = tl.split(quads)
    c0, c2 = tl.split(even)
    c1, c3 = tl.split(odd)
    return (c0 >> 24) | ((c1 >> 16) & 0xFF00) | ((c2 >> 8) & 0xFF0000) | (c3 & 0xFF000000)


@triton.jit
def _block_scale(amax, max_rcp, FINITE: tl.constexpr):
    """(E8M0 code, multiplier) of block maxima (fp32)."""
    if FINITE:
        return formats.e8m0_scale_finite(amax, max_rcp)
    else:
        code = formats.e8m0_encode_round_up(amax * max_rcp)
        return code, formats.e8m0_quant_multiplier(code)


@triton.jit
def all_finite(abs_bits):
    """Whether every |x| bit pattern given is below inf's (so none is inf or NaN)."""
    return tl.max(abs_bits) < 0x7F800000


@triton.jit
def _quantize_tile_body(x, col_amax, offs, mask, r, c, r_ok, c_ok, row0, col0, rows, cols, row_data_ptr, row_scale_ptr,
                        col_data_ptr, col_scale_ptr, row_scale_stride, row_scale_tiles, col_scale_stride,
                        col_scale_tiles, max_rcp, ROWWISE: tl.constexpr, COLWISE: tl.constexpr, E5M2: tl.constexpr,
                        SWIZZLED: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
                        LOCAL_I64: tl.constexpr, EVEN: tl.constexpr, HW_CAST: tl.constexpr, FINITE: tl.constexpr,
                        PACK: tl.constexpr):
    """Encode and store a loaded tile (x fp32 [BLOCK_ROWS, BLOCK_COLS]) in the wanted directions;
    col_amax: its columnwise block maxima [RB, C] (when COLWISE). FINITE: all of them are finite."""
    RB: tl.constexpr = BLOCK_ROWS // 32
    CB: tl.constexpr = BLOCK_COLS // 32
    base = row0 * cols + col0
    if ROWWISE:
        xr = tl.reshape(x, (BLOCK_ROWS, CB, 32))
        amax = _block_amax(tl.reshape(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, (BLOCK_ROWS, CB, 32)), 2)  # [R, CB]
        code, mult = _block_scale(amax, max_rcp, FINITE)
        q = _encode_block(xr, mult[:, :, None], code[:, :, None], E5M2, HW_CAST, FINITE)
        tl.store(row_data_ptr + base + offs, tl.reshape(q, (BLOCK_ROWS, BLOCK_COLS)), mask=mask)
        cb = tl.arange(0, CB)
        blk = col0 // 32 + cb  # scale column
        if EVEN:
            s_mask = r_ok[:, None] & (cb < CB)[None, :]
        else:
            s_mask = r_ok[:, None] & (blk < cols // 32)[None, :]
        if SWIZZLED:
            # BLOCK_ROWS divides 128: the tile's rows lie in one 128-row band
            s_base = row_scale_ptr + (row0 // 128) * row_scale_tiles * 512
            s_off = swizzle_offset((row0 % 128).to(tl.int32) + r[:, None], blk[None, :], row_scale_tiles)
        else:
            s_base = row_scale_ptr + row0 * row_scale_stride
            s_off = r[:, None] * row_scale_stride + blk[None, :]
        tl.store(s_base + s_off, code.to(tl.uint8), mask=s_mask)

    if COLWISE:
        code, mult = _block_scale(col_amax, max_rcp, FINITE)
        if PACK and not HW_CAST:
            q = _encode_block(tl.reshape(x, (RB, 32, BLOCK_COLS)), mult[:, None, :], code[:, None, :], E5M2, HW_CAST,
                              FINITE, True)
            words = _pack_top_bytes(tl.reshape(q, (BLOCK_ROWS, BLOCK_COLS)), BLOCK_ROWS, BLOCK_COLS)
            w_offs = r[:, None] * (cols // 4) + tl.arange(0, BLOCK_COLS // 4)[None, :]
            tl.store(col_data_ptr.to(tl.pointer_type(tl.uint32)) + base // 4 + w_offs, words)
        else:
            q = _encode_block(tl.reshape(x, (RB, 32, BLOCK_COLS)), mult[:, None, :], code[:, None, :], E5M2, HW_CAST,
                              FINITE)
            tl.store(col_data_ptr + base + offs, tl.reshape(q, (BLOCK_ROWS, BLOCK_COLS)), mask=mask)
        rb = tl.arange(0, RB)
        if LOCAL_I64:
            rb = rb.to(tl.int64)
        mblk = row0 // 32 + rb  # scale row (block of 32 rows), int64
        if EVEN:
            rb_ok = rb < RB
        else:
            rb_ok = rb * 32 < rows - row0  # M % 32 == 0 here: a block is valid when its first row is
        s_mask = rb_ok[:, None] & c_ok[None, :]
        if SWIZZLED:
            # the swizzled matrix is the transpose (K, M/32): row = column of x
            s_base = col_scale_ptr
            s_off = swizzle_offset(col0.to(tl.int64) + c[None, :], mblk[:, None], col_scale_tiles)
        else:
            s_base = col_scale_ptr + col0
            s_off = mblk[:, None] * col_scale_stride + c[None, :]
        tl.store(s_base + s_off, code.to(tl.uint8), mask=s_mask)


@triton.jit
def _mxfp8_quantize_kernel(
    x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr,
    rows, cols,
    row_scale_stride,  # compact K/32, padded roundup(K/32, 4)
    row_scale_tiles,  # roundup(K/32, 4) // 4 (swizzled)
    col_scale_stride,  # compact K, padded roundup(K, 128)
    col_scale_tiles,  # roundup(M/32, 4) // 4 (swizzled, transposed matrix)
    max_rcp,  # fl(1/max)
    ROWWISE: tl.constexpr,
    COLWISE: tl.constexpr,
    E5M2: tl.constexpr,
    SWIZZLED: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    LOCAL_I64: tl.constexpr,
    EVEN: tl.constexpr,
    HW_CAST: tl.constexpr,
    PACK: tl.constexpr,  # store the data as uint32 words of 4 codes (EVEN tiles, K % 4 == 0)
    SOFT_BF16: tl.constexpr = False,  # bf16 x converted by bits (the interpreter: ``formats.to_f32``)
    PDL: tl.constexpr = False,
):
    wait_prior_grid(PDL)
    RB: tl.constexpr = BLOCK_ROWS // 32
    pid = tl.program_id(0)
    col_tiles = tl.cdiv(cols, BLOCK_COLS)
    row0 = (pid // col_tiles).to(tl.int64) * BLOCK_ROWS
    col0 = (pid % col_tiles) * BLOCK_COLS

    # A plain 2-D [BLOCK_ROWS, BLOCK_COLS] tile (columns fastest, as in memory), reshaped for each
    # direction's block reductions: [R, CB, 32] (rowwise) and [RB, 32, C] (columnwise). Splitting a
    # dimension keeps the load's layout (no data movement), so loads and stores stay 16-byte row
    # vectors and no thread computes another thread's scales many times over.
    r = tl.arange(0, BLOCK_ROWS)
    c = tl.arange(0, BLOCK_COLS)
    if LOCAL_I64:
        r = r.to(tl.int64)
    if EVEN:
        r_ok = r < BLOCK_ROWS
        c_ok = c < BLOCK_COLS
    else:
        r_ok = r < rows - row0
        c_ok = c < cols - col0
    mask = r_ok[:, None] & c_ok[None, :]
    offs = r[:, None] * cols + c[None, :]
    base = row0 * cols + col0
    x = formats.to_f32(tl.load(x_ptr + base + offs, mask=mask, other=0.0), SOFT_BF16)
    abs_bits = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF

    if COLWISE:
        col_amax = _block_amax(tl.reshape(abs_bits, (RB, 32, BLOCK_COLS)), 1)  # [RB, C]
        # every element lies in some column block: finite column maxima mean a finite tile
        if HW_CAST:  # the hardware cast saturates by itself: one path for every tile
            _quantize_tile_body(x, col_amax, offs, mask, r, c, r_ok, c_ok, row0, col0, rows, cols, row_data_ptr,
                                row_scale_ptr, col_data_ptr, col_scale_ptr, row_scale_stride, row_scale_tiles,
                                col_scale_stride, col_scale_tiles, max_rcp, ROWWISE, COLWISE, E5M2, SWIZZLED,
                                BLOCK_ROWS, BLOCK_COLS, LOCAL_I64, EVEN, HW_CAST, False, PACK)
        elif all_finite(col_amax.to(tl.int32, bitcast=True)):
            _quantize_tile_body(x, col_amax, offs, mask, r, c, r_ok, c_ok, row0, col0, rows, cols, row_data_ptr,
                                row_scale_ptr, col_data_ptr, col_scale_ptr, row_scale_stride, row_scale_tiles,
                                col_scale_stride, col_scale_tiles, max_rcp, ROWWISE, COLWISE, E5M2, SWIZZLED,
                                BLOCK_ROWS, BLOCK_COLS, LOCAL_I64, EVEN, HW_CAST, True, PACK)
        else:  # a tile holding an inf or NaN: the saturating encoder and the general scale
            _quantize_tile_body(x, col_amax, offs, mask, r, c, r_ok, c_ok, row0, col0, rows, cols, row_data_ptr,
                                row_scale_ptr, col_data_ptr, col_scale_ptr, row_scale_stride, row_scale_tiles,
                                col_scale_stride, col_scale_tiles, max_rcp, ROWWISE, COLWISE, E5M2, SWIZZLED,
                                BLOCK_ROWS, BLOCK_COLS, LOCAL_I64, EVEN, HW_CAST, False, PACK)
    else:
        _quantize_tile_body(x, abs_bits, offs, mask, r, c, r_ok, c_ok, row0, col0, rows, cols, row_data_ptr,
                            row_scale_ptr, col_data_ptr, col_scale_ptr, row_scale_stride, row_scale_tiles,
                            col_scale_stride, col_scale_tiles, max_rcp, ROWWISE, COLWISE, E5M2, SWIZZLED,
                            BLOCK_ROWS, BLOCK_COLS, LOCAL_I64, EVEN, HW_CAST, False, PACK)


@triton.jit
def _mxfp8_dequantize_kernel(
    data_ptr, scale_ptr, out_ptr,
    rows, cols,
    scale_stride,  # rowwise: compact K/32, padded roundup(K/32,4); columnwise: compact K, padded roundup(K,128)
    scale_tiles,  # swizzled: roundup(K/32,4)//4 rowwise, roundup(M/32,4)//4 columnwise
    COLWISE: tl.constexpr,
    E5M2: tl.constexpr,
    SWIZZLED: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    LOCAL_I64: tl.constexpr,
    SOFT_BF16: tl.constexpr,
    EVEN: tl.constexpr,
    OUT_MAX: tl.constexpr, PDL: tl.constexpr = False,  # the output dtype's largest finite value
):
    wait_prior_grid(PDL)
    pid = tl.program_id(0)
    col_tiles = tl.cdiv(cols, BLOCK_COLS)
    row0 = (pid // col_tiles).to(tl.int64) * BLOCK_ROWS
    col0 = (pid % col_tiles) * BLOCK_COLS
    base = row0 * cols + col0

    if COLWISE:
        RB: tl.constexpr = BLOCK_ROWS // 32
        rb = tl.arange(0, RB)
        i = tl.arange(0, 32)
        c = tl.arange(0, BLOCK_COLS)
        if LOCAL_I64:
            rb = rb.to(tl.int64)
            i = i.to(tl.int64)
        r_loc = rb[:, None] * 32 + i[None, :]  # [RB, 32]
        if EVEN:
            r_ok = r_loc < BLOCK_ROWS
            c_ok = c < BLOCK_COLS
        else:
            r_ok = r_loc < rows - row0
            c_ok = c < cols - col0
        mask = r_ok[:, :, None] & c_ok[None, None, :]
        offs = r_loc[:, :, None] * cols + c[None, None, :]  # [RB, 32, C]
        mblk = row0 // 32 + rb
        if EVEN:
            rb_ok = rb < RB
        else:
            rb_ok = rb * 32 < rows - row0
        s_mask = rb_ok[:, None] & c_ok[None, :]  # [RB, C]
        if SWIZZLED:
            # the swizzled matrix is the transpose (K, M/32): row = column of x
            s_base = scale_ptr
            s_off = swizzle_offset(col0.to(tl.int64) + c[None, :], mblk[:, None], scale_tiles)
        else:
            s_base = scale_ptr + col0
            s_off = mblk[:, None] * scale_stride + c[None, :]
        factor = formats.e8m0_decode(tl.load(s_base + s_off, mask=s_mask, other=0).to(tl.int32))[:, None, :]
    else:
        CB: tl.constexpr = BLOCK_COLS // 32
        r = tl.arange(0, BLOCK_ROWS)
        cb = tl.arange(0, CB)
        j = tl.arange(0, 32)
        if LOCAL_I64:
            r = r.to(tl.int64)
        c_loc = cb[:, None] * 32 + j[None, :]  # [CB, 32]
        if EVEN:
            r_ok = r < BLOCK_ROWS
            c_ok = c_loc < BLOCK_COLS
        else:
            r_ok = r < rows - row0
            c_ok = c_loc < cols - col0
        mask = r_ok[:, None, None] & c_ok[None, :, :]
        offs = r[:, None, None] * cols + c_loc[None, :, :]  # [R, CB, 32]
        blk = col0 // 32 + cb
        if EVEN:
            s_mask = r_ok[:, None] & (cb < CB)[None, :]  # [R, CB]
        else:
            s_mask = r_ok[:, None] & (blk < cols // 32)[None, :]
        if SWIZZLED:
            s_base = scale_ptr + (row0 // 128) * scale_tiles * 512
            s_off = swizzle_offset((row0 % 128).to(tl.int32) + r[:, None], blk[None, :], scale_tiles)
        else:
            s_base = scale_ptr + row0 * scale_stride
            s_off = r[:, None] * scale_stride + blk[None, :]
        factor = formats.e8m0_decode(tl.load(s_base + s_off, mask=s_mask, other=0).to(tl.int32))[:, :, None]

    code = tl.load(data_ptr + base + offs, mask=mask, other=0).to(tl.int32)
    if E5M2:
        val = formats.e5m2_decode(code)
    else:
        val = formats.e4m3_decode(code)
    out = val * factor
    # a finite code's product past the output range saturates (bf16 / fp32 maxima give 256 * 2^120 =
    # 2^128), as ref.mxfp8.dequantize; NaN stays NaN, an E5M2 inf code stays inf
    out = tl.where((tl.abs(out) > OUT_MAX) & (tl.abs(val) < float("inf")), tl.where(out > 0, OUT_MAX, -OUT_MAX), out)
    tl.store(out_ptr + base + offs, cast_to_out(out, out_ptr, SOFT_BF16), mask=mask)


# ------------------------------------------------------------------------------------- launchers
def _quantize_tile(rows: int, cols: int, rowwise: bool, colwise: bool, hw_cast: bool = False) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_COLS, num_warps) per direction. Rowwise only: 32 x 256, 2 warps. Columnwise
    only: one 32-row block x 64 columns per single-warp program (each thread 8 rows x 8 columns: the
    columnwise amax is 8 in-thread maxima and 2 shuffles; wider tiles spill). Row+col: 32 x 128, 1 warp
    with the integer encoders, 2 with the hardware cast. 32 x 64 with 4 warps when K % 16 != 0 (scalar
    accesses). (Timings of the alternatives: benchmarks/RESULTS.md.)"""
    if cols % 16 != 0:
        return 32, 64, 4
    if rowwise and not colwise:
        block_cols, warps = 256, 2
    elif rowwise:
        block_cols, warps = 128, (2 if hw_cast else 1)
    else:
        block_cols, warps = 64, 1
    return 32, max(32, min(block_cols, next_power_of_2(cols))), warps


def scale_shapes(rows: int, cols: int, layout: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rowwise, columnwise) scale shapes of an (M, K) = (rows, cols) MXFP8 tensor in ``layout``."""
    if layout == "compact":
        return (rows, cols // 32), (rows // 32, cols)
    if layout == "padded":
        return (roundup(rows, 128), roundup(cols // 32, 4)), (roundup(rows // 32, 4), roundup(cols, 128))
    return (roundup(rows, 128), roundup(cols // 32, 4)), (roundup(cols, 128), roundup(rows // 32, 4))


def launch_mxfp8_quantize(
    x: torch.Tensor,
    row_data, row_scale, col_data, col_scale,
    *,
    fp8_format: str,
    scale_layout: str,
    fp8_cast: str = "soft",
    block_rows: int | None = None,
    block_cols: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Quantize x (M, K) into the given outputs (None where that direction is not wanted).

    Scale buffers must already hold zeros in their padding (padded / swizzled layouts).
    fp8_cast: "soft" (the integer encoders, bit-identical to the reference everywhere) or "hw" (the
    GPU's cvt.rn.satfinite: same bits, fewer instructions; CUDA only).
    """
    rows, cols = x.shape
    if fp8_cast not in FP8_CASTS:
        raise ValueError(f"fp8_cast must be 'soft' or 'hw', got {fp8_cast!r}")
    if fp8_cast == "hw" and x.device.type != "cuda":
        raise ValueError("fp8_cast='hw' needs a CUDA tensor: the interpreter's float8 casts are not round-to-nearest-even")
    if rows * cols == 0:
        return
    rowwise, colwise = row_data is not None, col_data is not None
    d_rows, d_cols, d_warps = _quantize_tile(rows, cols, rowwise, colwise, fp8_cast == "hw")
    block_rows, block_cols, num_warps = block_rows or d_rows, block_cols or d_cols, num_warps or d_warps
    dummy = x  # stands in for an output pointer that a constexpr-disabled branch never touches
    check_tile(block_rows, block_cols, min_cols=32, row_multiple=32)
    even = rows % block_rows == 0 and cols % block_cols == 0
    grid = (cdiv(rows, block_rows) * cdiv(cols, block_cols),)
    launch(_mxfp8_quantize_kernel, grid, (
        x, row_data if rowwise else dummy, row_scale if rowwise else dummy,
        col_data if colwise else dummy, col_scale if colwise else dummy,
        rows, cols,
        cols // 32 if scale_layout == "compact" else roundup(cols // 32, 4), roundup(cols // 32, 4) // 4,
        cols if scale_layout == "compact" else roundup(cols, 128), roundup(rows // 32, 4) // 4,
        rcp_f32(FP8_MAX[fp8_format]),
    ), dict(
        ROWWISE=rowwise, COLWISE=colwise, E5M2=fp8_format == "e5m2", SWIZZLED=scale_layout == "swizzled",
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, LOCAL_I64=block_rows * cols >= _INT32_LIMIT,
        EVEN=even, HW_CAST=fp8_cast == "hw", PACK=even and cols % 4 == 0 and fp8_cast == "soft"
        and all(t is None or t.data_ptr() % 4 == 0 for t in (row_data, col_data)), num_warps=num_warps,
        SOFT_BF16=formats.soft_bf16_loads(x.device),
    ))


def _dequantize_tile(rows: int, cols: int, colwise: bool) -> tuple[int, int, int]:
    """(BLOCK_ROWS, BLOCK_COLS, num_warps): 32 x 256 tiles (a columnwise tile is one 32-row block)."""
    block_rows = 32 if colwise else max(1, min(32, next_power_of_2(rows)))
    block_cols = max(32, min(256, next_power_of_2(cols)))
    return block_rows, block_cols, 4


def launch_mxfp8_dequantize(
    data: torch.Tensor,
    scale: torch.Tensor,
    out: torch.Tensor,
    *,
    fp8_format: str,
    scale_layout: str,
    colwise: bool,
    block_rows: int | None = None,
    block_cols: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Dequantize one MXFP8 copy (data (M, K), its scale in ``scale_layout``) into ``out`` (M, K)."""
    rows, cols = data.shape
    if rows * cols == 0:
        return
    d_rows, d_cols, d_warps = _dequantize_tile(rows, cols, colwise)
    block_rows, block_cols, num_warps = block_rows or d_rows, block_cols or d_cols, num_warps or d_warps
    check_tile(block_rows, block_cols, min_cols=32, row_multiple=32 if colwise else 1)
    if colwise:
        stride = cols if scale_layout == "compact" else roundup(cols, 128)
        tiles = roundup(rows // 32, 4) // 4
    else:
        stride = cols // 32 if scale_layout == "compact" else roundup(cols // 32, 4)
        tiles = roundup(cols // 32, 4) // 4
    grid = (cdiv(rows, block_rows) * cdiv(cols, block_cols),)
    launch(_mxfp8_dequantize_kernel, grid, (data, scale, out, rows, cols, stride, tiles), dict(
        COLWISE=colwise, E5M2=fp8_format == "e5m2", SWIZZLED=scale_layout == "swizzled",
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, LOCAL_I64=block_rows * cols >= _INT32_LIMIT,
        SOFT_BF16=soft_bf16_cast(out.dtype, out.device), EVEN=rows % block_rows == 0 and cols % block_cols == 0,
        OUT_MAX=DTYPE_MAX[out.dtype], num_warps=num_warps,
    ))


# ------------------------------------------------------------------------------------ custom ops
def _quantize_outputs(x: torch.Tensor, rowwise: bool, columnwise: bool, scale_layout: str, alloc):
    rows, cols = x.shape
    row_shape, col_shape = scale_shapes(rows, cols, scale_layout)
    # padding of padded / swizzled scales must read 0; compact scales are fully written
    scale_alloc = torch.empty if scale_layout == "compact" else torch.zeros
    none = lambda: alloc((0,), torch.uint8)  # noqa: E731  (a custom op returns tensors, never None)
    row_data = alloc((rows, cols), torch.uint8) if rowwise else none()
    row_scale = alloc(row_shape, torch.uint8, scale_alloc) if rowwise else none()
    col_data = alloc((rows, cols), torch.uint8) if columnwise else none()
    col_scale = alloc(col_shape, torch.uint8, scale_alloc) if columnwise else none()
    return row_data, row_scale, col_data, col_scale


@custom_op("nvfp4lab::quantize_mxfp8", mutates_args=())
def _quantize_mxfp8_op(
    x: torch.Tensor, rowwise: bool, columnwise: bool, fp8_format: str, scale_layout: str, fp8_cast: str = "soft"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    def alloc(shape, dtype, fn=torch.empty):
        return fn(shape, dtype=dtype, device=x.device)

    row_data, row_scale, col_data, col_scale = _quantize_outputs(x, rowwise, columnwise, scale_layout, alloc)
    launch_mxfp8_quantize(
        x.contiguous(), row_data if rowwise else None, row_scale, col_data if columnwise else None, col_scale,
        fp8_format=fp8_format, scale_layout=scale_layout, fp8_cast=fp8_cast,
    )
    return row_data, row_scale, col_data, col_scale


@_quantize_mxfp8_op.register_fake
def _(x, rowwise, columnwise, fp8_format, scale_layout, fp8_cast="soft"):
    return _quantize_outputs(x, rowwise, columnwise, scale_layout, lambda shape, dtype, fn=None: x.new_empty(shape, dtype=dtype))


@custom_op("nvfp4lab::dequantize_mxfp8", mutates_args=())
def _dequantize_mxfp8_op(
    data: torch.Tensor, scale: torch.Tensor, fp8_format: str, scale_layout: str, columnwise: bool, out_dtype: torch.dtype
) -> torch.Tensor:
    out = torch.empty(data.shape, dtype=out_dtype, device=data.device)
    launch_mxfp8_dequantize(data, scale, out, fp8_format=fp8_format, scale_layout=scale_layout, colwise=columnwise)
    return out


@_dequantize_mxfp8_op.register_fake
def _(data, scale, fp8_format, scale_layout, columnwise, out_dtype):
    return data.new_empty(data.shape, dtype=out_dtype)


# ------------------------------------------------------------------------------------ entry points
def quantize_mxfp8(x2d: torch.Tensor, config, *, fp8_cast: str | None = None):
    """MXFP8-quantize a 2-D (M, K) tensor with an :class:`MXFP8QuantConfig`; identical to
    ``ref.mxfp8.quantize``. Rowwise needs K % 32 == 0, columnwise M % 32 == 0. ``fp8_cast``: see
    :func:`launch_mxfp8_quantize`; None takes the GPU's conversion ("hw", the same bits in fewer
    instructions) on CUDA and the integer encoders ("soft") under the interpreter."""
    from ..config import MXFP8QuantConfig
    from ..tensors import MXFP8Tensor

    if not isinstance(config, MXFP8QuantConfig):
        raise TypeError(f"config must be an MXFP8QuantConfig, got {type(config).__name__}")
    if not isinstance(x2d, torch.Tensor) or x2d.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x2d must be a float32, bfloat16 or float16 tensor, got {getattr(x2d, 'dtype', type(x2d).__name__)}")
    if x2d.dim() != 2:
        raise ValueError(f"x2d must be 2-D (M, K), got shape {tuple(x2d.shape)}")
    rows, cols = x2d.shape
    if config.rowwise and cols % 32 != 0:
        raise ValueError(f"x2d.shape[1] (K) must be a multiple of 32 (MXFP8 rowwise blocks hold 32 elements along K), got {cols}")
    if config.columnwise and rows % 32 != 0:
        raise ValueError(f"x2d.shape[0] (M) must be a multiple of 32 (MXFP8 columnwise blocks hold 32 rows), got {rows}")
    if fp8_cast is None:
        fp8_cast = "hw" if x2d.is_cuda and not interpreting() else "soft"
    row_data, row_scale, col_data, col_scale = _quantize_mxfp8_op(
        x2d, config.rowwise, config.columnwise, config.fp8_format, config.scale_layout, fp8_cast
    )
    out = MXFP8Tensor(shape=x2d.shape, dtype=x2d.dtype, config=config)
    if config.rowwise:
        out.rowwise_data, out.rowwise_scale = row_data, row_scale
    if config.columnwise:
        out.columnwise_data, out.columnwise_scale = col_data, col_scale
    return out


def dequantize_mxfp8(t, dtype: torch.dtype, which: str = "rowwise") -> torch.Tensor:
    """MXFP8Tensor -> ``dtype`` (M, K) from its rowwise or columnwise copy; identical to
    ``ref.mxfp8.dequantize``. The parts are checked by :func:`nvfp4lab.ops.dequantize_mxfp8`
    (``checks.check_mxfp8_copy``)."""
    data = t.rowwise_data if which == "rowwise" else t.columnwise_data
    scale = t.rowwise_scale if which == "rowwise" else t.columnwise_scale
    if data.numel() == 0:
        return torch.empty(t.shape, dtype=dtype, device=data.device)
    return _dequantize_mxfp8_op(data.contiguous(), scale.contiguous(), t.fp8_format, t.scale_layout, which == "columnwise", dtype)
