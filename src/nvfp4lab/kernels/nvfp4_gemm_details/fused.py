"""The fused-decode NVFP4 GEMM kernel (dense and grouped) and the FP16 expansion kernel.

Each K step loads the packed bytes and E4M3 scales of a BLOCK_M x BLOCK_K tile of A and a BLOCK_N x
BLOCK_K tile of B, expands them in registers to FP16 values q * s and feeds ``tl.dot`` (fp32
accumulation). Within each K tile the positions are permuted (:func:`_decode_tile`; both operands alike,
so the dot is unchanged) so that a thread's decoded register pairs are exactly the pairs its MMA
fragment needs. Two decoders (``DECODE``):

* 1 (GPU): PTX inline asm on whole 32-bit words (8 codes, :data:`DECODE_ASM_TEXT`): the FP16 high byte
  of each magnitude is looked up with ``prmt`` (the low bytes are 0), the sign bits are moved into place
  with one more ``prmt`` and shifts, and the scales are applied by ``mul.rn.f16x2``: 28 instructions per
  8 codes, all values normal.
* 0 (portable; the interpreter's): the 3 magnitude bits of a code go to FP16 bits 11..9 and the sign to
  bit 15, which reads exactly as ``value * 2^-14`` for all 16 codes (0.5 is the FP16 subnormal 2^-15);
  widened to fp32 (exact), multiplied by ``s * 2^14`` and narrowed to FP16, both exact.

With ``B_PRE`` B comes pre-expanded by :func:`expand_kernel` (same tiling and permutation, zero-padded
past K) and only A is decoded: B's tiles are then plain loads that Triton pipelines into shared memory,
so the MMA runs asynchronously under A's decoding (when both operands are decoded in the loop, Triton
waits for each MMA before decoding the next tile).

Grouped: rows of A are split into E consecutive experts by ``offs`` (device int tensor (E,), cumulative
row ends; zero-size experts allowed; no host sync). The grid covers an upper bound of
``cdiv(M, BLOCK_M) + E`` row tiles; each program finds its expert from ``offs`` and exits if it has no
work. B is the stacked weights; alpha and bias follow the expert of the row. Every row of the output is
written whatever the offsets hold (they are not checked on the device, which would need a host sync):
expert e owns rows [end_{e-1}, end_e) with end_e the running maximum of offs[0..e] clipped to [0, M]
(exactly offs' ranges when offs is valid), and rows past the last end are written with zeros (left as
they are with ``ACCUMULATE``).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ...layout import cdiv, next_power_of_2, roundup
from ..formats import e4m3_decode
from ..launch import Launch, aligned
from ..pdl import wait_prior_grid
from . import opt_flags
from .common import epilogue, scale_offsets, store_alphas

# PTX for DECODE=1, one invocation per 4 bytes (Triton's pack=4). Operands: $0,$1 = low-nibble values
# of bytes (0,1) and (2,3); $2,$3 = high-nibble values of bytes (0,1) and (2,3) (FP16 pairs); $4 = the
# 4 packed bytes; $5, $6 = the FP16 scales of bytes (0,1) and (2,3); $7 ($8..$10 unused copies) = the
# low table word. Each output element is computed from its own byte and scale, so the result does not
# depend on which elements Triton groups together. Codes n0..n7 sit in nibbles 0..7 of $4.
# A prmt selector nibble k (bits 2..0) picks byte k of the result from {a: bytes 0-3, b: bytes 4-7};
# the table holds the FP16 high bytes of 0, .5, 1, 1.5, 2, 3, 4, 6 and selectors 0 give the zero low
# bytes. Selector nibbles 1 and 3 hold the codes of one output pair, so for the pair (n0, n2) it is
# ($4 << 4) & 0x7070, for (n1, n3) $4 & 0x7070, for (n4, n6) ($4 >> 12) & 0x7070, for (n5, n7)
# ($4 >> 16) & 0x7070. W = prmt($4, $4, 0x1302) holds byte b0 at byte 1 and b1 at byte 3 (the signs
# of n1, n3 at bits 15, 31) and b2, b3 at bytes 0, 2, so W << 4, W << 12 and W << 8 bring the signs
# of (n0, n2), (n4, n6) and (n5, n7) to bits 15 and 31. All values are normal, no .ftz anywhere.
DECODE_ASM_TEXT = """
{
.reg .b32 w, t, m, s;
prmt.b32 w, $4, $4, 0x1302;
shl.b32 t, $4, 4;
and.b32 t, t, 0x7070;
prmt.b32 m, $7, 0x46444240, t;
shl.b32 s, w, 4;
and.b32 s, s, 0x80008000;
or.b32 m, m, s;
mul.rn.f16x2 $0, m, $5;
and.b32 t, $4, 0x7070;
prmt.b32 m, $7, 0x46444240, t;
and.b32 s, w, 0x80008000;
or.b32 m, m, s;
mul.rn.f16x2 $2, m, $5;
shr.b32 t, $4, 12;
and.b32 t, t, 0x7070;
prmt.b32 m, $7, 0x46444240, t;
shl.b32 s, w, 12;
and.b32 s, s, 0x80008000;
or.b32 m, m, s;
mul.rn.f16x2 $1, m, $6;
shr.b32 t, $4, 16;
and.b32 t, t, 0x7070;
prmt.b32 m, $7, 0x46444240, t;
shl.b32 s, w, 8;
and.b32 s, s, 0x80008000;
or.b32 m, m, s;
mul.rn.f16x2 $3, m, $6;
}
"""
_DECODE_ASM = tl.constexpr(DECODE_ASM_TEXT)
TAB_LO = 0x3E3C3800  # FP16 high bytes of 0, 0.5, 1, 1.5: passed as a kernel argument so that it sits in one register


@triton.jit
def _decode_tile(packed, scale_bits, tab_lo, ROWS: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr,
                 NATURAL: tl.constexpr = False):
    """[ROWS, BK/2] uint8 codes + [ROWS, BK/16] uint8 E4M3 scales -> [ROWS, BK] fp16 values q * s,
    with the K positions permuted (the same permutation for both operands, so the dot is unchanged);
    NATURAL: in K order (the order of the BF16 operands a cast writes, :class:`~nvfp4lab.NVFP4Operand`).

    Why permute: an MMA operand fragment gives each of 4 lanes 2-element pairs spread over every 16
    K positions, while the codes of a lane are best read as whole 32-bit words. With byte index bits
    B0..B(L-1) (L = log2(BK/2)) and nibble bit N, position bit 0 is B0, bits 1-2 are B(L-2), B(L-1)
    (the lane bits of the fragment) and bit 3 is N, the rest B1..B(L-3): each lane then owns BK/8
    contiguous bytes of a row and every decoded register pair is a pair the MMA wants.
    """
    L4: tl.constexpr = 4  # byte bits B(L-1), B(L-2)
    MID: tl.constexpr = BK // 64  # byte bits B(L-3)..B3: with L4, the 16-element block index
    x = tl.reshape(packed, (ROWS, L4, MID, 4, 2))  # last two dims: B2 B1, B0
    s = e4m3_decode(scale_bits.to(tl.int32))
    s = tl.reshape(s, (ROWS, L4, MID))[:, :, :, None, None]
    if DECODE == 1:
        lo, hi = tl.inline_asm_elementwise(
            _DECODE_ASM, "=r,=r,=r,=r,r,r,r,r,r,r,r", [x, s.to(tl.float16), tab_lo],
            dtype=(tl.float16, tl.float16), is_pure=True, pack=4,
        )
    else:
        xi = x.to(tl.int32)
        lo_bits = ((xi & 7) << 9) | ((xi & 8) << 12)
        hi_bits = ((xi & 0x70) << 5) | ((xi & 0x80) << 8)
        s14 = s * 16384.0  # undo the 2^-14 of the bit placement
        lo = (lo_bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * s14).to(tl.float16)
        hi = (hi_bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * s14).to(tl.float16)
    v = tl.join(lo, hi)  # [ROWS, L4, MID, 4, 2, N]: byte order, then the nibble (K order)
    if not NATURAL:
        v = tl.permute(v, (0, 2, 3, 5, 1, 4))  # [ROWS, MID, 4, N, L4, 2]
    return tl.reshape(v, (ROWS, BK))


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def nvfp4_gemm_kernel(
    a_ptr, a_scale_ptr, a_amax_ptr,
    b_ptr, b_scale_ptr, b_amax_ptr,
    bias_ptr, out_ptr, offs_ptr,
    M, N, K,
    stride_a, stride_as, a_cols4,
    stride_b, stride_bs, b_cols4,
    stride_om, stride_on,
    num_experts,
    inv_e,  # fl(1/(36 E_a E_b))
    tab_lo,  # 0x3E3C3800, the low half of the decode table, in a register (DECODE=1)
    A_SWIZZLED: tl.constexpr, B_SWIZZLED: tl.constexpr,
    A_AMAX_ROWS: tl.constexpr,  # A amax per row of A
    B_AMAX_MODE: tl.constexpr,  # 0 scalar, 1 per expert, 2 per row of B
    BIAS_MODE: tl.constexpr,  # 0 none, 1 (N,), 2 (E, N)
    ACCUMULATE: tl.constexpr,
    OUT_BF16: tl.constexpr,
    GROUPED: tl.constexpr, E_POW2: tl.constexpr,
    EVEN_K: tl.constexpr,
    DECODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    B_PRE: tl.constexpr,  # b_ptr is B already expanded by expand_kernel: fp16 (rows, roundup(K, BLOCK_K))
    SOFT_BF16: tl.constexpr = False,  # bf16 bias / out_old loaded by bits (the interpreter)
    EPI_PR3045: tl.constexpr = False,  # PR 3045's epilogue order (common.epilogue)
    A_AMAX_EXPERT: tl.constexpr = False,  # grouped: A amax per expert (E,)
    PDL: tl.constexpr = False,
):
    wait_prior_grid(PDL)
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    if GROUPED:
        # lanes 0..E-1: the experts; lane E (E_POW2 > E): the rows past the last expert (zeros)
        e_idx = tl.arange(0, E_POW2)
        ends = tl.load(offs_ptr + e_idx, mask=e_idx < num_experts, other=0).to(tl.int32)
        ends = tl.where(e_idx == num_experts, M, ends)
        starts = tl.load(offs_ptr + e_idx - 1, mask=(e_idx >= 1) & (e_idx <= num_experts), other=0).to(tl.int32)
        starts = tl.where(e_idx == num_experts + 1, M, starts)
        # running maxima, clipped: disjoint ranges for any offs (offs' own for valid offs)
        ends = tl.minimum(tl.maximum(tl.associative_scan(ends, 0, _max_combine), 0), M)
        starts = tl.minimum(tl.maximum(tl.associative_scan(starts, 0, _max_combine), 0), M)
        sizes = tl.maximum(ends - starts, 0)
        tiles = (sizes + BLOCK_M - 1) // BLOCK_M
        cum = tl.cumsum(tiles, 0)  # inclusive
        num_pid_m = tl.sum(tiles, 0)
    else:
        num_pid_m = tl.cdiv(M, BLOCK_M)
    # Grouped ordering: GROUP_M row tiles share each column tile of B while it is in L2.
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    if first_pid_m >= num_pid_m:
        return  # grouped: past the real number of row tiles
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    if pid_n >= num_pid_n:
        return  # grouped: the last, partial group of row tiles

    if GROUPED:
        expert = tl.sum((cum <= pid_m).to(tl.int32), 0)
        sel = e_idx == expert
        tile_base = tl.sum(tl.where(sel, cum - tiles, 0), 0)
        row_start = tl.sum(tl.where(sel, starts, 0), 0) + (pid_m - tile_base) * BLOCK_M
        row_end = tl.sum(tl.where(sel, ends, 0), 0)
    else:
        expert = 0
        row_start = pid_m * BLOCK_M
        row_end = M

    offs_m = row_start + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < row_end
    mask_n = offs_n < N
    if GROUPED:
        if expert == num_experts:  # rows of no expert (offs[E-1] < M): zeros, or out as it is
            if not ACCUMULATE:
                out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n.to(tl.int64)[None, :] * stride_on
                tl.store(out_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty),
                         mask=mask_m[:, None] & mask_n[None, :])
            return
    # Out-of-range rows read row 0 / the expert's first row (always valid) instead of masking every
    # load; their results are never stored.
    rows_a = tl.where(mask_m, offs_m, row_start).to(tl.int64)
    rows_b = (expert * N + tl.where(mask_n, offs_n, 0)).to(tl.int64)

    BK2: tl.constexpr = BLOCK_K // 2
    BK16: tl.constexpr = BLOCK_K // 16
    kk2 = tl.arange(0, BK2)
    kk16 = tl.arange(0, BK16)
    a_ptrs = a_ptr + rows_a[:, None] * stride_a + kk2[None, :]
    if B_PRE:
        b_ptrs = b_ptr + rows_b[:, None] * stride_b + tl.arange(0, BLOCK_K)[None, :]
    else:
        b_ptrs = b_ptr + rows_b[:, None] * stride_b + kk2[None, :]
    K2 = K // 2
    K16 = K // 16

    k_tiles = tl.cdiv(K, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, k_tiles):
        kb = k * BK16 + kk16
        a_sptrs = a_scale_ptr + scale_offsets(rows_a, kb, stride_as, a_cols4, A_SWIZZLED)
        if EVEN_K:
            a_raw = tl.load(a_ptrs)
            a_sc = tl.load(a_sptrs)
        else:
            kmask2 = (k * BK2 + kk2) < K2
            kmask16 = kb < K16
            # Zero codes and zero scales past K: both decode to exact zeros.
            a_raw = tl.load(a_ptrs, mask=kmask2[None, :], other=0)
            a_sc = tl.load(a_sptrs, mask=kmask16[None, :], other=0)
        a_val = _decode_tile(a_raw, a_sc, tab_lo, BLOCK_M, BLOCK_K, DECODE)
        if B_PRE:
            # Expanded with the same BLOCK_K tiling and zero-padded past K: plain FP16 tiles, which
            # Triton pipelines into shared memory so the MMA overlaps the decoding of A.
            b_val = tl.load(b_ptrs)
            b_ptrs += BLOCK_K
        else:
            b_sptrs = b_scale_ptr + scale_offsets(rows_b, kb, stride_bs, b_cols4, B_SWIZZLED)
            if EVEN_K:
                b_raw = tl.load(b_ptrs)
                b_sc = tl.load(b_sptrs)
            else:
                b_raw = tl.load(b_ptrs, mask=kmask2[None, :], other=0)
                b_sc = tl.load(b_sptrs, mask=kmask16[None, :], other=0)
            b_val = _decode_tile(b_raw, b_sc, tab_lo, BLOCK_N, BLOCK_K, DECODE)
            b_ptrs += BK2
        acc = tl.dot(a_val, tl.trans(b_val), acc)
        a_ptrs += BK2

    epilogue(acc, offs_m, offs_n, mask_m, mask_n, rows_a, rows_b, expert, a_amax_ptr, b_amax_ptr, bias_ptr,
             out_ptr, N, stride_om, stride_on, inv_e, A_AMAX_ROWS, B_AMAX_MODE, BIAS_MODE, ACCUMULATE,
             OUT_BF16, BLOCK_M, BLOCK_N, SOFT_BF16, EPI_PR3045, A_AMAX_EXPERT)



@triton.jit
def _expand_rows(b_ptr, b_scale_ptr, out_ptr, rows, K, stride_b, stride_bs, b_cols4, stride_o, tab_lo, pid_r, pid_k,
                 B_SWIZZLED: tl.constexpr, DECODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                 NATURAL: tl.constexpr = False):
    """One [BLOCK_R, BLOCK_K] tile of :func:`expand_kernel` for one operand."""
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = offs_r < rows
    rows_b = tl.where(mask_r, offs_r, 0).to(tl.int64)
    kk2 = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    kb = pid_k * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16)
    raw = tl.load(b_ptr + rows_b[:, None] * stride_b + kk2[None, :], mask=(kk2 < K // 2)[None, :], other=0)
    sc = tl.load(b_scale_ptr + scale_offsets(rows_b, kb, stride_bs, b_cols4, B_SWIZZLED),
                 mask=(kb < K // 16)[None, :], other=0)
    val = _decode_tile(raw, sc, tab_lo, BLOCK_R, BLOCK_K, DECODE, NATURAL)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rows_b[:, None] * stride_o + cols[None, :], val, mask=mask_r[:, None])


@triton.jit
def expand_kernel(
    a_ptr, a_scale_ptr, a_out_ptr, a_rows, stride_a, stride_as, a_cols4, stride_ao,
    b_ptr, b_scale_ptr, b_out_ptr, b_rows, stride_b, stride_bs, b_cols4, stride_bo,
    K, a_tiles, tab_lo, alpha_ptr, alpha_a_amax_ptr, alpha_b_amax_ptr, alpha_num, inv_e,
    A_SWIZZLED: tl.constexpr, B_SWIZZLED: tl.constexpr, DECODE: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr, NATURAL: tl.constexpr = False, ALPHA: tl.constexpr = False,
    A_PER_EXPERT: tl.constexpr = False, B_PER_EXPERT: tl.constexpr = False, ALPHA_BLOCK: tl.constexpr = 2,
    PDL: tl.constexpr = False,
):
    """Operands (rows, K) codes + scales -> q * s (rows, roundup(K, BLOCK_K)) in the output pointers' type (FP16
    or BF16), each BLOCK_K tile in the decoder's permuted order (as the GEMM decodes A with the same BLOCK_K;
    NATURAL: in K order), zeros past K; row tiles [0, a_tiles) expand A, the following ones B (two operands,
    one launch). ALPHA: the first program also writes the alpha vector of the product that consumes the
    expansion (:func:`.common.store_alphas` of alpha_num experts), so that product needs no launch of its own
    for it."""
    wait_prior_grid(PDL)
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    if ALPHA:
        if (pid_r == 0) & (pid_k == 0):
            store_alphas(alpha_a_amax_ptr, alpha_b_amax_ptr, alpha_ptr, alpha_num, inv_e, A_PER_EXPERT, B_PER_EXPERT,
                         ALPHA_BLOCK)
    if pid_r < a_tiles:
        _expand_rows(a_ptr, a_scale_ptr, a_out_ptr, a_rows, K, stride_a, stride_as, a_cols4, stride_ao, tab_lo, pid_r,
                     pid_k, A_SWIZZLED, DECODE, BLOCK_R, BLOCK_K, NATURAL)
    else:
        _expand_rows(b_ptr, b_scale_ptr, b_out_ptr, b_rows, K, stride_b, stride_bs, b_cols4, stride_bo, tab_lo,
                     pid_r - a_tiles, pid_k, B_SWIZZLED, DECODE, BLOCK_R, BLOCK_K, NATURAL)


@triton.jit
def expand_split_k_kernel(
    a_ptr, a_scale_ptr, a_out_ptr, a_rows, stride_ao,
    b_ptr, b_scale_ptr, b_out_ptr, b_rows, stride_bo,
    offs_ptr, num_splits, a_tiles, tab_lo,
    DECODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
):
    """Two bulk copies split along their contraction dim (split e of an operand with R rows: the (R, m_e)
    matrix of codes at R * offs[e] / 2 bytes and compact scales at R * offs[e] / 16; ``offs``: the
    (E + 1,) cumulative split offsets, each m_e a multiple of 16) -> FP16 / BF16 (R, sum_e roundup(m_e, BLOCK_K)):
    split e's :func:`expand_kernel` tiles in the columns after those of the splits before it. Column
    tile ``pid_k`` finds its split by walking the offsets (A's row tiles first, then B's)."""
    wait_prior_grid(PDL)
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    tiles_before = tl.zeros((), dtype=tl.int64)
    first_tile = tl.zeros((), dtype=tl.int64)
    start = tl.zeros((), dtype=tl.int64)
    size = tl.zeros((), dtype=tl.int64)
    for e in range(0, num_splits):
        lo = tl.load(offs_ptr + e).to(tl.int64)
        hi = tl.load(offs_ptr + e + 1).to(tl.int64)
        tiles = (hi - lo + BLOCK_K - 1) // BLOCK_K
        hit = (pid_k >= tiles_before) & (pid_k < tiles_before + tiles)
        first_tile = tl.where(hit, tiles_before, first_tile)
        start = tl.where(hit, lo, start)
        size = tl.where(hit, hi - lo, size)
        tiles_before += tiles
    local_k = pid_k - first_tile
    # Split sizes and offsets are multiples of 16; written as such (a hint on the loop's results is lost), code
    # rows start on 8-byte boundaries and their masks hold over 8 bytes, so codes load as 64-bit words, not bytes.
    start = (start // 16) * 16
    size = (size // 16) * 16
    if pid_r < a_tiles:
        _expand_rows(a_ptr + a_rows * start // 2, a_scale_ptr + a_rows * start // 16, a_out_ptr + first_tile * BLOCK_K,
                     a_rows, size, size // 2, size // 16, 0, stride_ao, tab_lo, pid_r, local_k, False, DECODE, BLOCK_R,
                     BLOCK_K)
    else:
        _expand_rows(b_ptr + b_rows * start // 2, b_scale_ptr + b_rows * start // 16, b_out_ptr + first_tile * BLOCK_K,
                     b_rows, size, size // 2, size // 16, 0, stride_bo, tab_lo, pid_r - a_tiles, local_k, False, DECODE,
                     BLOCK_R, BLOCK_K)


def expand_split_k(a_data, a_scale, a_rows: int, b_data, b_scale, b_rows: int, offs, splits, block_k: int,
                   decode: int, dtype: torch.dtype = torch.float16) -> tuple:
    """q * s of two bulk copies split along K (see :func:`expand_split_k_kernel`) in ``dtype`` (FP16 or BF16: exact
    either way), in one launch: (a16 (a_rows, W), b16 (b_rows, W), column starts of the splits) with
    W = sum roundup(m_e, block_k)."""
    starts, width = [], 0
    for m_e in splits:
        starts.append(width)
        width += roundup(m_e, block_k)
    device = a_data.device
    a16 = torch.empty((a_rows, width), dtype=dtype, device=device)
    b16 = torch.empty((b_rows, width), dtype=dtype, device=device)
    if width:
        args = (a_data, a_scale, a16, a_rows, width, b_data, b_scale, b16, b_rows, width, offs, len(splits),
                cdiv(a_rows, opt_flags.EXPAND_ROWS), TAB_LO)
        spec = (device, offs.dtype, dtype, *(aligned(t) for t in (a_data, a_scale, b_data, b_scale, offs)))
        _expand_split_k_launch(a_rows, b_rows, width // block_k, block_k, decode, spec)(*args)
    return a16, b16, starts


@functools.lru_cache(maxsize=4096)
def _expand_split_k_launch(a_rows: int, b_rows: int, k_tiles: int, block_k: int, decode: int, spec) -> Launch:
    """The split-K expansion's launch (``spec``: device, offsets dtype and alignments, part of the key only)."""
    grid = (cdiv(a_rows, opt_flags.EXPAND_ROWS) + cdiv(b_rows, opt_flags.EXPAND_ROWS), k_tiles)
    return Launch(expand_split_k_kernel, grid, dict(DECODE=decode, BLOCK_R=opt_flags.EXPAND_ROWS, BLOCK_K=block_k,
                                                    num_warps=4))


@functools.lru_cache(maxsize=4096)
def _expand_launch(a_rows: int, b_rows: int, k: int, block_k: int, decode: int, a_swizzled: bool, b_swizzled: bool,
                   spec, natural: bool = False, alpha_key: tuple = ()) -> Launch:
    """The expansion kernel's launch for one or two operand shapes (``b_rows`` 0: A only); ``spec``:
    the tensors' device, dtypes, alignment and strides (part of the cache key only); ``alpha_key``: (number of
    alphas, A per expert, B per expert) when the launch also writes the alpha vector."""
    tiles = cdiv(a_rows, opt_flags.EXPAND_ROWS) + cdiv(b_rows, opt_flags.EXPAND_ROWS)
    grid = (tiles, roundup(k, block_k) // block_k)
    alpha = {}
    if alpha_key:
        num, a_per_expert, b_per_expert = alpha_key
        alpha = dict(ALPHA=True, A_PER_EXPERT=a_per_expert, B_PER_EXPERT=b_per_expert,
                     ALPHA_BLOCK=triton.next_power_of_2(num + 1))
    return Launch(expand_kernel, grid, dict(A_SWIZZLED=a_swizzled, B_SWIZZLED=b_swizzled, DECODE=decode,
                                            BLOCK_R=opt_flags.EXPAND_ROWS, BLOCK_K=block_k, NATURAL=natural,
                                            **alpha, num_warps=4))


def expand(a, k: int, block_k: int, decode: int, b=None, dtype: torch.dtype = torch.float16,
           natural: bool = False, alpha=None) -> tuple:
    """q * s in ``dtype`` (FP16 or BF16: exact either way) of all rows of operand ``a`` (and of ``b`` when
    given, in the same launch), each (rows, roundup(k, block_k)) in the decoder's permuted order per
    block_k tile (``natural``: in K order), zeros past k. Returns (a16, b16 or None).

    ``alpha``: (out, a_amax, b_amax, num, a_per_expert, b_per_expert, inv_e): the same launch writes the
    (num + 1,) fp32 alpha vector ``out`` of the product that consumes the expansion (:func:`.common.store_alphas`)."""
    width = roundup(k, block_k)
    a_rows = a.data.shape[0]
    a16 = torch.empty((a_rows, width), dtype=dtype, device=a.data.device)
    a_args = (a.data, a.scale, a16, a_rows, a.data.stride(0), a.scale_stride, a.cols4, width)
    if b is None:
        b16, b_args, b_rows = None, a_args, 0
    else:
        b_rows = b.data.shape[0]
        b16 = torch.empty((b_rows, width), dtype=dtype, device=a.data.device)
        b_args = (b.data, b.scale, b16, b_rows, b.data.stride(0), b.scale_stride, b.cols4, width)
    if alpha is None:
        alpha_args, alpha_key = (a16, a16, a16, 0, 0.0), ()  # stand-ins ALPHA=False never reads
    else:
        out, a_amax, b_amax, num, a_per_expert, b_per_expert, inv_e = alpha
        alpha_args, alpha_key = (out, a_amax, b_amax, num, inv_e), (num, a_per_expert, b_per_expert)
    args = (*a_args, *b_args, k, cdiv(a_rows, opt_flags.EXPAND_ROWS), TAB_LO, *alpha_args)
    spec = (a16.device, a.data.dtype, dtype, aligned(a.data), aligned(a.scale), aligned(b_args[0]), aligned(b_args[1]),
            args[4:7], args[12:15], *[(t.dtype, aligned(t)) for t in alpha_args[:3]])
    _expand_launch(a_rows, b_rows, k, block_k, decode, a.swizzled, (b if b is not None else a).swizzled, spec,
                   natural, alpha_key)(*args)
    return a16, b16


@functools.lru_cache(maxsize=4096)
def gemm_launch(m: int, n: int, k: int, num_experts: int, grouped: bool, config, decode: int, flags: tuple,
                 a_swizzled: bool, b_swizzled: bool, spec) -> Launch:
    """The fused kernel's launch for one problem; ``spec``: its tensors' device, dtypes, alignment and
    strides (part of the cache key only)."""
    rows_tiles = cdiv(m, config.block_m) + (num_experts if grouped else 0)
    grid = (rows_tiles * cdiv(n, config.block_n),)
    return Launch(nvfp4_gemm_kernel, grid, dict(
        A_SWIZZLED=a_swizzled, B_SWIZZLED=b_swizzled, **dict(flags),
        GROUPED=grouped, E_POW2=next_power_of_2(num_experts + 1),  # + the lane of rows past the experts
        EVEN_K=k % config.block_k == 0,
        DECODE=decode,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
        B_PRE=config.b_predecode,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **({} if config.maxnreg is None else {"maxnreg": config.maxnreg}),
        enable_fp_fusion=False,  # alpha, bias and out_old are separate roundings, as in the reference
    ))


def gemm(a, b, bias, out, offs, flags: dict, m: int, n: int, k: int, num_experts: int, inv_e: float, grouped: bool,
         config, decode: int) -> torch.Tensor:
    """The fused kernel over operands ``a``, ``b`` (:class:`.common.Operand`); ``bias`` / ``offs`` may be
    any stand-in tensor when unused (``flags`` says so). Writes ``out`` (M, N) and returns it."""
    decode = opt_flags.fused_decode(decode, config)
    b_arg, b_stride = b.data, b.data.stride(0)
    if config.b_predecode:
        b_arg = expand(b, k, config.block_k, decode)[0]
        b_stride = b_arg.stride(0)
    args = (a.data, a.scale, a.amax, b_arg, b.scale, b.amax, bias, out, offs, m, n, k,
            a.data.stride(0), a.scale_stride, a.cols4, b_stride, b.scale_stride, b.cols4,
            out.stride(0), out.stride(1), num_experts, inv_e, TAB_LO)
    spec = (out.device, *[(t.dtype, aligned(t)) for t in args[:9]], args[12:20])
    gemm_launch(m, n, k, num_experts, grouped, config, decode, tuple(flags.items()), a.swizzled, b.swizzled,
                 spec)(*args)
    return out
