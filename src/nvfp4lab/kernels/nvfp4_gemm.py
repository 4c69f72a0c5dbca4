"""NVFP4 x NVFP4 GEMM for Hopper (and the Triton interpreter): ``out = A @ B^T``, dense and grouped (MoE).

Operands (both K-major, cuBLAS "TN"; the rowwise copies of two :class:`~nvfp4lab.NVFP4Tensor`)::

    A data  uint8 (M, K/2)        two E2M1 codes per byte, element 2j in the low nibble
    A scale uint8 E4M3            compact (M, K/16) | padded / swizzled (roundup(M,128), roundup(K/16,4))
    A amax  fp32 (1,) | (M,)      per tensor | per token (row of A)
    B       the same with N rows (grouped: E*N rows, expert e owns rows e*N..e*N+N-1); B amax
            (1,) | (E,) per expert | (E*N,) per row (output channel)

Numerics (spec section 12, :mod:`nvfp4lab.ref.gemm`)::

    acc[i, j]   = sum_k (q_a * s_a)[i, k] * (q_b * s_b)[j, k]            fp32 (tensor-core order)
    alpha[i, j] = fl(fl(amax_a[i] * amax_b[j]) * fl(1/(36 E_a E_b)))     in the epilogue, per element
    out         = out_dtype(fl(fl(acc * alpha) + bias[j]) + out_old)     bias / out_old optional

How: each K step loads the packed bytes and E4M3 scales of a BLOCK_M x BLOCK_K tile of A and a
BLOCK_N x BLOCK_K tile of B, expands them in registers to FP16 values q * s and feeds ``tl.dot``
(fp32 accumulation). Every product of an E2M1 value (2 significant bits) and an E4M3 scale (4 bits,
2^-9..448) is an FP16 normal number in [2^-10, 2688] or zero, so the expansion is exact and the tensor
core forms exactly the block products of Blackwell's FP4 MMA; only the fp32 summation order differs,
which the golden tolerance allows. FP16 rather than BF16: same tensor-core rate, and the Triton
interpreter computes FP16 dots in fp32 while it mis-handles BF16 operands. Within each K tile the
positions are permuted (:func:`_decode_tile`; both operands alike, so the dot is unchanged) so that a
thread's decoded register pairs are exactly the pairs its MMA fragment needs.

Two decoders of the codes (``DECODE``):

* ``1`` (GPU default): PTX inline asm on whole 32-bit words (8 codes): the FP16 high byte of each
  magnitude is looked up with ``prmt`` (byte permute over an 8-entry table; the low bytes are 0), the
  sign bits are moved into place with one more ``prmt`` and shifts, and the scales are applied by
  ``mul.rn.f16x2``: 28 instructions per 8 codes, all values normal. The tests run its text through a
  PTX emulator, alone and inside the kernel. ``NVFP4LAB_GEMM_DECODE=triton`` selects decoder 0.
* ``0`` (portable; the interpreter's): the 3 magnitude bits of a code go to FP16 bits 11..9 and the
  sign to bit 15, which reads exactly as ``value * 2^-14`` for all 16 codes (0.5 is the FP16 subnormal
  2^-15); widened to fp32 (exact), multiplied by ``s * 2^14`` and narrowed to FP16, both exact.

E4M3 scales decode exactly (0x7F / 0xFF give NaN, as in the reference), a zero scale gives zeros.

B expansion (``GemmConfig.b_predecode``, large M): B is first expanded to FP16 q * s by
:func:`_expand_kernel` (same tiling and permutation, zero-padded past K), and the GEMM then decodes only
A. B's tiles are then plain loads that Triton pipelines into shared memory, which lets the MMA run
asynchronously under A's decoding; when both operands are decoded in the loop, Triton waits for each
MMA before decoding the next tile. The expansion costs O(N K) traffic against the GEMM's O(M N K).

Weight stream (``GemmConfig.stream``, dense, chosen for M <= 64: :func:`_stream_kernel`): a decode GEMM
is a read of B (N K / 2 bytes of codes + N K / 16 of scales) plus the decoding of every code, so the kernel
is built around B. The product is formed as B A^T, so B's rows are the wgmma M side and its decoded
tile is the *register* operand: each thread reads 16 contiguous bytes per row and 128-wide K sub-tile
and decodes them (:data:`STREAM_ASM_TEXT`, 19 instructions per 8 codes, plus one cvt per two scales)
straight into its MMA fragment registers (:func:`_stream_decode` chooses the K permutation that makes
this so; no shuffles or shared memory on the way). A (at most 64 rows) is decoded once by
:func:`_stream_expand_kernel` (``a_pre``) or per tile in the loop, and is the shared-memory operand.
Codes are decoded by bit placement as e2m1 * 2^-14 (exact in FP16 with the scale applied); the fp32 sums
are multiplied by 2^28 before the epilogue (exact). Words and scales are loaded through Triton's
cp.async pipeline (``num_stages``), ``block_k / 128`` sub-tiles per stage. K is split over programs for
about ``ctas_per_sm`` programs per SM (:func:`stream_splits`: within one wave of ``max_resident`` and with at
least ``split_min_k_tiles`` K tiles per split); the last program of an output tile to arrive (a counter per tile,
reset by that program, so no memset per call) sums the fp32 partials in a fixed order and runs the
epilogue: one launch for the GEMM (two with ``a_pre``).

Split-K (``GemmConfig.split_k``, dense fused kernel, explicit configs only): program_id(1) takes a contiguous
range of K tiles and stores fp32 partials; :func:`_split_k_epilogue_kernel` sums them in a fixed order
(deterministic) and applies the epilogue.

Grouped GEMM: rows of A are split into E consecutive experts by ``offs`` (device int tensor (E,),
cumulative row ends; zero-size experts allowed; no host sync). The grid covers an upper bound of
``cdiv(M, BLOCK_M) + E`` row tiles; each program finds its expert from ``offs`` and exits if it has
no work. B is the stacked weights; alpha and bias follow the expert of the row. When the caller also
passes the split sizes on the host (``splits``; :class:`~nvfp4lab.GroupedLinear` knows them) and the
average expert is large enough for the dense dequant rule (:func:`grouped_dequant_applies`), the
grouped GEMM instead expands A and B to FP16 once each and runs one cuBLAS GEMM and one epilogue per
non-empty expert (:func:`_launch_grouped_dequant_mm`): H200, 8 experts x 2048 rows, N = K = 4096:
574 TFLOP/s against 490 for the one-launch kernel, 1.12x the time of one dense GEMM of the same FLOPs.

Constraints: K % 16 == 0 (whole scale blocks); BLOCK_K a multiple of 64; out may be strided.
Block sizes: :func:`choose_config` (a small table per GPU, ``_CONFIGS``).
Public launchers: the ``torch.library`` custom ops ``nvfp4lab::nvfp4_gemm``, ``nvfp4_gemm_out``,
``nvfp4_grouped_gemm``, ``nvfp4_grouped_gemm_out`` (fake impls for torch.compile), wrapped by
:func:`nvfp4_gemm` and :func:`nvfp4_grouped_gemm`; :func:`run` launches directly (tests, tuning).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from typing import List, Optional

import torch
import triton
import triton.language as tl


def _roundup(n: int, m: int) -> int:
    return (n + m - 1) // m * m


@functools.lru_cache(maxsize=None)
def gemm_inv(e4m3_max_a: float, e4m3_max_b: float) -> float:
    """fl32(1 / (36 E_a E_b)) as a Python float holding an exact fp32 value."""
    return torch.tensor(1.0 / (36.0 * e4m3_max_a * e4m3_max_b), dtype=torch.float32).item()


# -------------------------------------------------------------------------------- device helpers
@triton.jit
def _f32_to_bf16_rne(v):
    """fp32 -> bf16 with round-to-nearest-even from bits (the interpreter's own cast truncates)."""
    bits = v.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(v != v, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _scale_offsets(rows, cols, stride, cols4, SWIZZLED: tl.constexpr):
    """Byte offsets of scale entries (rows[:, None], cols[None, :]) in a compact/padded (row stride
    ``stride``) or swizzled (cuBLAS 128x4, ``cols4`` = roundup(K/16,4)/4) scale buffer."""
    if SWIZZLED:
        r = (rows // 128) * (cols4 * 512) + (rows % 32) * 16 + ((rows % 128) // 32) * 4
        c = (cols // 4) * 512 + (cols % 4)
        return r[:, None] + c[None, :]
    else:
        return rows[:, None] * stride + cols[None, :]


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
_TAB_LO = 0x3E3C3800  # FP16 high bytes of 0, 0.5, 1, 1.5: passed as a kernel argument so that it sits in one register


@triton.jit
def _e4m3_to_f32(bits):
    """E4M3 bits (int32) -> fp32, exact: the 7 low bits at FP16 bits 13..7 read as s * 2^-8 for every
    code (E4M3 subnormals land on FP16 subnormals), widened exactly and rescaled; 0x7F/0xFF -> NaN."""
    h = ((bits & 0x7F) << 7) | ((bits & 0x80) << 8)
    s = h.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    return tl.where((bits & 0x7F) == 0x7F, float("nan"), s)


@triton.jit
def _decode_tile(packed, scale_bits, tab_lo, ROWS: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr):
    """[ROWS, BK/2] uint8 codes + [ROWS, BK/16] uint8 E4M3 scales -> [ROWS, BK] fp16 values q * s,
    with the K positions permuted (the same permutation for both operands, so the dot is unchanged).

    Why permute: an MMA operand fragment gives each of 4 lanes 2-element pairs spread over every 16
    K positions, while the codes of a lane are best read as whole 32-bit words. With byte index bits
    B0..B(L-1) (L = log2(BK/2)) and nibble bit N, position bit 0 is B0, bits 1-2 are B(L-2), B(L-1)
    (the lane bits of the fragment) and bit 3 is N, the rest B1..B(L-3): each lane then owns BK/8
    contiguous bytes of a row and every decoded register pair is a pair the MMA wants.
    """
    L4: tl.constexpr = 4  # byte bits B(L-1), B(L-2)
    MID: tl.constexpr = BK // 64  # byte bits B(L-3)..B3: with L4, the 16-element block index
    x = tl.reshape(packed, (ROWS, L4, MID, 4, 2))  # last two dims: B2 B1, B0
    s = _e4m3_to_f32(scale_bits.to(tl.int32))
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
    v = tl.join(lo, hi)  # [ROWS, L4, MID, 4, 2, N]
    v = tl.permute(v, (0, 2, 3, 5, 1, 4))  # [ROWS, MID, 4, N, L4, 2]
    return tl.reshape(v, (ROWS, BK))


# ----------------------------------------------------------------------------------------- kernel
@triton.jit
def _nvfp4_gemm_kernel(
    a_ptr, a_scale_ptr, a_amax_ptr,
    b_ptr, b_scale_ptr, b_amax_ptr,
    bias_ptr, out_ptr, offs_ptr, ws_ptr,
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
    B_PRE: tl.constexpr,  # b_ptr is B already expanded by _expand_kernel: fp16 (rows, roundup(K, BLOCK_K))
    SPLIT_K: tl.constexpr,  # dense only: program_id(1) takes 1/SPLIT_K of the K tiles, partials to ws_ptr
):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    if GROUPED:
        e_idx = tl.arange(0, E_POW2)
        ends = tl.load(offs_ptr + e_idx, mask=e_idx < num_experts, other=0).to(tl.int32)
        starts = tl.load(offs_ptr + e_idx - 1, mask=(e_idx >= 1) & (e_idx < num_experts), other=0).to(tl.int32)
        ends = tl.minimum(ends, M)
        starts = tl.maximum(tl.minimum(starts, M), 0)
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
    if SPLIT_K > 1:
        pid_k = tl.program_id(1)
        per_split = tl.cdiv(k_tiles, SPLIT_K)
        k_first = pid_k * per_split
        k_last = tl.minimum(k_first + per_split, k_tiles)
        a_ptrs += k_first * BK2
        b_ptrs += k_first * (BLOCK_K if B_PRE else BK2)
    else:
        k_first = 0
        k_last = k_tiles
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_first, k_last):
        kb = k * BK16 + kk16
        a_sptrs = a_scale_ptr + _scale_offsets(rows_a, kb, stride_as, a_cols4, A_SWIZZLED)
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
            b_sptrs = b_scale_ptr + _scale_offsets(rows_b, kb, stride_bs, b_cols4, B_SWIZZLED)
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

    if SPLIT_K > 1:  # fp32 partial sums; _split_k_epilogue_kernel adds them and finishes
        ws_ptrs = ws_ptr + pid_k.to(tl.int64) * M * N + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws_ptrs, acc, mask=mask_m[:, None] & mask_n[None, :])
    else:
        _epilogue(acc, offs_m, offs_n, mask_m, mask_n, rows_a, rows_b, expert, a_amax_ptr, b_amax_ptr, bias_ptr,
                  out_ptr, N, stride_om, stride_on, inv_e, A_AMAX_ROWS, B_AMAX_MODE, BIAS_MODE, ACCUMULATE,
                  OUT_BF16, BLOCK_M, BLOCK_N)


@triton.jit
def _epilogue(acc, offs_m, offs_n, mask_m, mask_n, rows_a, rows_b, expert, a_amax_ptr, b_amax_ptr, bias_ptr,
              out_ptr, N, stride_om, stride_on, inv_e, A_AMAX_ROWS: tl.constexpr, B_AMAX_MODE: tl.constexpr,
              BIAS_MODE: tl.constexpr, ACCUMULATE: tl.constexpr, OUT_BF16: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """alpha per element from the two amax vectors, bias, out_old, cast: the reference's roundings."""
    if A_AMAX_ROWS:
        amax_a = tl.load(a_amax_ptr + rows_a)
    else:
        amax_a = tl.load(a_amax_ptr + tl.zeros((BLOCK_M,), dtype=tl.int32))
    if B_AMAX_MODE == 2:
        amax_b = tl.load(b_amax_ptr + rows_b)
    elif B_AMAX_MODE == 1:
        amax_b = tl.load(b_amax_ptr + expert + tl.zeros((BLOCK_N,), dtype=tl.int32))
    else:
        amax_b = tl.load(b_amax_ptr + tl.zeros((BLOCK_N,), dtype=tl.int32))
    alpha = (amax_a[:, None] * amax_b[None, :]) * inv_e
    res = acc * alpha
    if BIAS_MODE == 1:
        res = res + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    elif BIAS_MODE == 2:
        res = res + tl.load(bias_ptr + expert * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n.to(tl.int64)[None, :] * stride_on
    omask = mask_m[:, None] & mask_n[None, :]
    if ACCUMULATE:
        res = res + tl.load(out_ptrs, mask=omask, other=0.0).to(tl.float32)
    if OUT_BF16:
        tl.store(out_ptrs, _f32_to_bf16_rne(res), mask=omask)
    else:
        tl.store(out_ptrs, res.to(out_ptr.dtype.element_ty), mask=omask)


@triton.jit
def _split_k_epilogue_kernel(
    ws_ptr, a_amax_ptr, b_amax_ptr, bias_ptr, out_ptr,
    M, N, stride_om, stride_on, inv_e,
    SPLIT_K: tl.constexpr, A_AMAX_ROWS: tl.constexpr, B_AMAX_MODE: tl.constexpr, BIAS_MODE: tl.constexpr,
    ACCUMULATE: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Dense split-K: sum the SPLIT_K fp32 partials (fixed order, deterministic), then the epilogue."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    rows_a = tl.where(mask_m, offs_m, 0).to(tl.int64)
    rows_b = tl.where(mask_n, offs_n, 0).to(tl.int64)
    mask = mask_m[:, None] & mask_n[None, :]
    ptrs = ws_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    acc = tl.load(ptrs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ptrs + s * M * N, mask=mask, other=0.0)
    _epilogue(acc, offs_m, offs_n, mask_m, mask_n, rows_a, rows_b, 0, a_amax_ptr, b_amax_ptr, bias_ptr,
              out_ptr, N, stride_om, stride_on, inv_e, A_AMAX_ROWS, B_AMAX_MODE, BIAS_MODE, ACCUMULATE,
              OUT_BF16, BLOCK_M, BLOCK_N)


# ------------------------------------------------------------------ weight-stream kernel (M <= 64)
# PTX for the stream decoder (DECODE=1), one invocation per 32-bit word of 8 codes n0..n7 (code i in
# bits 4i..4i+3): $4 = the word, $5 = its FP16 block scale; $0..$3 = the FP16 pairs (n0, n4), (n1, n5),
# (n2, n6), (n3, n7) (low half, high half). Bit placement: the 3 magnitude bits of a code at FP16 bits
# 11..9 and its sign at bit 15 read exactly as e2m1(code) * 2^-14 (0.5 lands on the subnormal 2^-15).
# Codes i and i + 4 sit 16 bits apart, so one shift left by 9 - 4i places both magnitudes of a pair and
# one by 12 - 4i both signs; a bit-select (lop3 0xD8: a outside the sign bits, b on them) merges them and
# a mask clears the rest. q * s * 2^-14 is exact in FP16 for every code and E4M3 scale (a multiple of
# 2^-24 below 0.17), so the one rounding of mul.rn.f16x2 changes nothing; the kernel multiplies the fp32
# sums by 2^28 (both operands carry 2^-14), also exact. 19 instructions per 8 codes; no .ftz anywhere
# (FP16 subnormals are values here). Each output depends only on its own word, as Triton requires.
STREAM_ASM_TEXT = """
{
.reg .b32 a, b, m, s;
mov.b32 s, {$5, $5};
shl.b32 a, $4, 9;
shl.b32 b, $4, 12;
lop3.b32 m, a, b, 0x80008000, 0xD8;
and.b32 m, m, 0x8E008E00;
mul.rn.f16x2 $0, m, s;
shl.b32 a, $4, 5;
shl.b32 b, $4, 8;
lop3.b32 m, a, b, 0x80008000, 0xD8;
and.b32 m, m, 0x8E008E00;
mul.rn.f16x2 $1, m, s;
shl.b32 a, $4, 1;
shl.b32 b, $4, 4;
lop3.b32 m, a, b, 0x80008000, 0xD8;
and.b32 m, m, 0x8E008E00;
mul.rn.f16x2 $2, m, s;
shr.b32 a, $4, 3;
lop3.b32 m, a, $4, 0x80008000, 0xD8;
and.b32 m, m, 0x8E008E00;
mul.rn.f16x2 $3, m, s;
}
"""
_STREAM_ASM = tl.constexpr(STREAM_ASM_TEXT)
# Two E4M3 bytes (Triton's pack=2 over uint8: the low 16 bits of $1) -> an FP16 pair (sm_89+ cvt:
# exact, subnormals included; 0x7F / 0xFF give NaN as in the reference).
E4M3X2_ASM_TEXT = """
{
.reg .b16 l, h;
mov.b32 {l, h}, $1;
cvt.rn.f16x2.e4m3x2 $0, l;
}
"""
_E4M3X2_ASM = tl.constexpr(E4M3X2_ASM_TEXT)


@triton.jit
def _f16_halves(p):
    """int32 holding an FP16 pair -> [..., 2] FP16 (low half first)."""
    lo = p.to(tl.uint16).to(tl.float16, bitcast=True)
    hi = (p >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    return tl.join(lo, hi)


@triton.jit
def _stream_decode(w, sc, ROWS: tl.constexpr, DECODE: tl.constexpr):
    """Words w int32 [ROWS, 4, 4] (word 4t + u of each row's 128-wide K sub-tile, 8 codes each) and
    scales sc uint8 [ROWS, 4, 2] (E4M3, blocks 2t + e) -> FP16 [ROWS, 128] holding q * s * 2^-14, K
    permuted within the sub-tile (both operands alike, so the dot is unchanged).

    An MMA operand fragment gives thread t of a row, in each 16-wide K chunk, the pairs (2t, 2t + 1) and
    (2t + 8, 2t + 9). Thread t loads words 4t + u (16 contiguous bytes) and each decoded register
    (codes i, i + 4 of one word) becomes one of its pairs: logical k of code i of word (t, u) =
    32u + 16 ph + 8 pl + 2t + e for i = 4e + 2ph + pl. So the decoded registers are the MMA's operand
    registers as they stand (no shuffles, no shared memory)."""
    if DECODE == 1:
        s = tl.inline_asm_elementwise(_E4M3X2_ASM, "=r,r", [sc], dtype=tl.float16, is_pure=True, pack=2)
    else:
        s = _e4m3_to_f32(sc.to(tl.int32)).to(tl.float16)
    # the scale of word u is that of block 2t + u // 2
    s = tl.reshape(tl.broadcast_to(s[:, :, :, None], (ROWS, 4, 2, 2)), (ROWS, 4, 4))
    if DECODE == 1:
        p0, p1, p2, p3 = tl.inline_asm_elementwise(
            _STREAM_ASM, "=r,=r,=r,=r,r,h", [w, s], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1,
        )
        v = tl.join(tl.join(_f16_halves(p0), _f16_halves(p1)), tl.join(_f16_halves(p2), _f16_halves(p3)))
        # [ROWS, t, u, e, pl, ph]
    else:
        codes = (w[:, :, :, None] >> (tl.arange(0, 8) * 4)[None, None, None, :]) & 15  # [ROWS, t, u, i]
        h = ((codes & 7) << 9) | ((codes & 8) << 12)  # e2m1 * 2^-14 in FP16 bits
        v = h.to(tl.uint16).to(tl.float16, bitcast=True) * s[:, :, :, None]
        v = tl.permute(tl.reshape(v, (ROWS, 4, 4, 2, 2, 2)), (0, 1, 2, 3, 5, 4))  # i = (e, ph, pl)
    v = tl.permute(v, (0, 2, 5, 4, 1, 3))  # row, u, ph, pl, t, e
    return tl.reshape(v, (ROWS, 128))


@triton.jit
def _stream_load(w_ptr, scale_ptr, rows, kk, stride_w, stride_s, cols4, K,
                 SWIZZLED: tl.constexpr, EVEN_K: tl.constexpr, ROWS: tl.constexpr):
    """Code words [ROWS, 4, 4] (int32: the packed bytes read 4 at a time) and E4M3 scales [ROWS, 4, 2]
    of the 128-wide K sub-tile ``kk`` for ``rows`` [ROWS] (int64); zeros past K (zero codes and scales
    decode to exact zeros). Scales are read as runs of 4 bytes (whole 4-column groups of the swizzled
    layout) so that Triton can pipeline them (cp.async moves 4 bytes or more)."""
    # 2-D tiles with one contiguous run per row: Triton's coalescing then gives each row's run to
    # neighbouring lanes (a warp reads 8 rows x 64 bytes); a 3-D [rows, 4, 4] pointer tensor made it
    # put 32 rows on the lanes of one 16-byte access (half-used sectors, 4-way bank conflicts).
    r = rows[:, None]
    wcol = kk * 16 + tl.arange(0, 16)[None, :]
    c = tl.arange(0, 8)[None, :]  # scale byte: block 8 kk + c
    if SWIZZLED:  # 4-column groups are contiguous, groups 512 bytes apart
        soff = (r // 128) * (cols4 * 512) + (r % 32) * 16 + ((r % 128) // 32) * 4 + (kk * 2 + c // 4) * 512 + c % 4
    else:
        soff = r * stride_s + kk * 8 + c
    if EVEN_K:
        w = tl.load(w_ptr + r * stride_w + wcol)
        sc = tl.load(scale_ptr + soff)
    else:
        w = tl.load(w_ptr + r * stride_w + wcol, mask=wcol < K // 8, other=0)
        sc = tl.load(scale_ptr + soff, mask=kk * 8 + c < K // 16, other=0)
    return tl.reshape(w, (ROWS, 4, 4)), tl.reshape(sc, (ROWS, 4, 2))


@triton.jit
def _stream_rows(pid_n, N, BLOCK_N: tl.constexpr, WARPS: tl.constexpr):
    """The B rows (int64 [BLOCK_N]) that output tile ``pid_n`` loads, in load order: tile row r is read
    from B row r_mma(r), because the load's blocked layout gives row r = (rep, warp w, lane row g) to a
    thread and the MMA layout wants that thread to hold the rows (R, w, h, g). Padding rows read row 0
    (never stored). :func:`_stream_rows_back` restores the tile order of the decoded values."""
    r = tl.arange(0, BLOCK_N)
    G16: tl.constexpr = 16 * WARPS
    r_mma = (r // G16) * G16 + ((r // 8) % WARPS) * 16 + ((r // (8 * WARPS)) % 2) * 8 + r % 8
    offs_n = pid_n * BLOCK_N + r_mma
    return tl.where(offs_n < N, offs_n, 0).to(tl.int64)


@triton.jit
def _stream_rows_back(b_val, BLOCK_N: tl.constexpr, WARPS: tl.constexpr):
    """[BLOCK_N, 128] values loaded in :func:`_stream_rows` order -> tile row order (register renaming only)."""
    G16: tl.constexpr = 16 * WARPS
    return tl.reshape(tl.permute(tl.reshape(b_val, (BLOCK_N // G16, 2, WARPS, 8, 128)), (0, 2, 1, 3, 4)), (BLOCK_N, 128))


@triton.jit
def _stream_kernel(
    a_ptr, a_scale_ptr, a_amax_ptr,
    b_ptr, b_scale_ptr, b_amax_ptr,
    bias_ptr, out_ptr, ws_ptr, count_ptr,
    M, N, K, per_split, num_splits,
    stride_a, stride_as, a_cols4,
    stride_b, stride_bs, b_cols4,
    stride_om, stride_on,
    inv_e,
    A_SWIZZLED: tl.constexpr, B_SWIZZLED: tl.constexpr,
    A_AMAX_ROWS: tl.constexpr, B_AMAX_MODE: tl.constexpr, BIAS_MODE: tl.constexpr,
    ACCUMULATE: tl.constexpr, OUT_BF16: tl.constexpr, EVEN_K: tl.constexpr, DECODE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, V: tl.constexpr, WARPS: tl.constexpr,
    A_PRE: tl.constexpr,  # a_ptr: A already decoded by _stream_expand_kernel, FP16 (BLOCK_M, roundup(K, 128 V))
    SPLIT: tl.constexpr,
):
    """Dense GEMM for few rows of A (M <= 64): a weight stream (see the module notes).

    Grid (N tiles, K splits, M tiles). Each program owns BLOCK_N rows of B and ``per_split`` K tiles of 128 V.
    acc^T = B A^T: B's rows are the MMA's M side, decoded straight into its register operand (wgmma
    from registers); A (at most 64 rows, L2-resident) is decoded per tile (or read pre-decoded) into
    shared memory. With SPLIT, the fp32 partials go to ws_ptr and the last program of an output tile to
    arrive (a counter per tile) sums them in split order (deterministic), finishes the epilogue and sets
    the counter back to 0 for the next launch on the stream."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    BK: tl.constexpr = 128 * V
    rows_b = _stream_rows(pid_n, N, BLOCK_N, WARPS)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_a = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    k_tiles = tl.cdiv(K, BK)
    k_first = pid_k * per_split
    k_last = tl.minimum(k_first + per_split, k_tiles)  # the host makes every split non-empty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in range(k_first, k_last):
        # V sub-tiles of 128: all loaded in the same pipeline stage (64 V contiguous bytes of each row per
        # request burst, which DRAM serves better than 64), decoded and multiplied one after another.
        for v in tl.static_range(V):
            kk = k * V + v
            if A_PRE:
                a_val = tl.load(a_ptr + offs_m[:, None] * stride_a + kk * 128 + tl.arange(0, 128)[None, :])
            else:
                a_w, a_sc = _stream_load(a_ptr, a_scale_ptr, rows_a, kk, stride_a, stride_as, a_cols4, K,
                                         A_SWIZZLED, EVEN_K, BLOCK_M)
            b_w, b_sc = _stream_load(b_ptr, b_scale_ptr, rows_b, kk, stride_b, stride_bs, b_cols4, K,
                                     B_SWIZZLED, EVEN_K, BLOCK_N)
            b_val = _stream_rows_back(_stream_decode(b_w, b_sc, BLOCK_N, DECODE), BLOCK_N, WARPS)
            if not A_PRE:
                a_val = _stream_decode(a_w, a_sc, BLOCK_M, DECODE)
            acc = tl.dot(b_val, tl.trans(a_val), acc)
    acc = tl.trans(acc) * 268435456.0  # 2^28 undoes the 2^-14 of both decoded operands (exact)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    rows_b = tl.where(mask_n, offs_n, 0).to(tl.int64)
    if SPLIT:
        tile_off = offs_m[:, None] * N + offs_n[None, :]
        omask = mask_m[:, None] & mask_n[None, :]
        tl.store(ws_ptr + pid_k.to(tl.int64) * M * N + tile_off, acc, mask=omask)
        # Every thread's partial is stored before the counter is raised (barrier, then a gpu-scope
        # release); the last to raise it reads the partials through L2 (.cg: never a stale L1 line).
        tl.debug_barrier()
        count_ptr += pid_m * tl.num_programs(0) + pid_n
        prev = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if prev == num_splits - 1:
            # RED partials in flight at a time (a plain loop waits for each L2 round trip in turn; RED
            # keeps them within about 64 registers), summed in a fixed order.
            RED: tl.constexpr = max(1, 2048 * WARPS // (BLOCK_M * BLOCK_N))
            part_ptrs = ws_ptr + tile_off
            tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
            for s0 in range(0, num_splits, RED):
                left = zero + (num_splits - s0)  # partials left from s0 on
                chunk = tl.load(part_ptrs, mask=omask, other=0.0, cache_modifier=".cg")
                for j in tl.static_range(1, RED):
                    chunk += tl.load(part_ptrs + j * M * N, mask=omask & (left > j), other=0.0, cache_modifier=".cg")
                tot += chunk
                part_ptrs += RED * M * N
            tl.store(count_ptr, 0)  # all splits have arrived: ready for the next launch
            _epilogue(tot, offs_m, offs_n, mask_m, mask_n, rows_a, rows_b, 0, a_amax_ptr, b_amax_ptr, bias_ptr,
                      out_ptr, N, stride_om, stride_on, inv_e, A_AMAX_ROWS, B_AMAX_MODE, BIAS_MODE, ACCUMULATE,
                      OUT_BF16, BLOCK_M, BLOCK_N)
    else:
        _epilogue(acc, offs_m, offs_n, mask_m, mask_n, rows_a, rows_b, 0, a_amax_ptr, b_amax_ptr, bias_ptr,
                  out_ptr, N, stride_om, stride_on, inv_e, A_AMAX_ROWS, B_AMAX_MODE, BIAS_MODE, ACCUMULATE,
                  OUT_BF16, BLOCK_M, BLOCK_N)


@triton.jit
def _stream_expand_kernel(a_ptr, a_scale_ptr, out_ptr, M, K, stride_a, stride_as, a_cols4, stride_o,
                          A_SWIZZLED: tl.constexpr, DECODE: tl.constexpr, ROWS: tl.constexpr):
    """A (M rows) -> FP16 q * s * 2^-14 (grid rows x grid sub-tiles of 128) in _stream_decode's order per
    sub-tile; rows past M and columns past K are zeros (the stream kernel reads whole tiles)."""
    pid_r = tl.program_id(0)
    kk = tl.program_id(1)
    offs = pid_r * ROWS + tl.arange(0, ROWS)
    rows = tl.where(offs < M, offs, 0).to(tl.int64)
    w, sc = _stream_load(a_ptr, a_scale_ptr, rows, kk, stride_a, stride_as, a_cols4, K, A_SWIZZLED, False, ROWS)
    val = _stream_decode(w, sc, ROWS, DECODE)
    val = tl.where((offs < M)[:, None], val, 0.0)
    cols = kk * 128 + tl.arange(0, 128)
    tl.store(out_ptr + offs.to(tl.int64)[:, None] * stride_o + cols[None, :], val)


@triton.jit
def _expand_kernel(
    b_ptr, b_scale_ptr, out_ptr,
    rows, K, stride_b, stride_bs, b_cols4, stride_o,
    tab_lo,
    B_SWIZZLED: tl.constexpr, DECODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """B (rows, K) codes + scales -> fp16 q * s (rows, roundup(K, BLOCK_K)), each BLOCK_K tile in the
    decoder's permuted order (as the GEMM decodes A with the same BLOCK_K), zeros past K."""
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = offs_r < rows
    rows_b = tl.where(mask_r, offs_r, 0).to(tl.int64)
    kk2 = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    kb = pid_k * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16)
    raw = tl.load(b_ptr + rows_b[:, None] * stride_b + kk2[None, :], mask=(kk2 < K // 2)[None, :], other=0)
    sc = tl.load(b_scale_ptr + _scale_offsets(rows_b, kb, stride_bs, b_cols4, B_SWIZZLED),
                 mask=(kb < K // 16)[None, :], other=0)
    val = _decode_tile(raw, sc, tab_lo, BLOCK_R, BLOCK_K, DECODE)
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rows_b[:, None] * stride_o + cols[None, :], val, mask=mask_r[:, None])


# ------------------------------------------------------------------------------ block-size table
@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    maxnreg: Optional[int] = None  # cap registers (ptxas .maxnreg), e.g. for 2 CTAs per SM
    b_predecode: bool = False  # expand B to fp16 once (one extra pass), then decode only A per tile
    split_k: int = 1  # dense GEMMs: K split over this many CTAs, fp32 partials summed by a second kernel
    # Dense only: expand both operands to FP16 q * s (exact) with _expand_kernel (block_k = its tile),
    # cuBLAS FP16 GEMM with fp32 output, then the epilogue kernel. Temporary memory 2MK + 2NK + 4MN bytes.
    dequant_mm: bool = False
    # Dense only, the weight-stream kernel (_stream_kernel; M <= 64): block_k = 128 V, split_k = 0 lets
    # the launcher split K for about ctas_per_sm programs per SM; a_pre decodes A once up front
    # (_stream_expand_kernel) instead of in every program's loop.
    stream: bool = False
    ctas_per_sm: int = 4
    a_pre: bool = False
    # Stream kernel, computed splits only: at most max_resident programs per SM in all (the programs of
    # this config that fit on an SM: more would start a second wave; 0 = no cap), and at least
    # split_min_k_tiles K tiles per split (each split adds a BLOCK_M x BLOCK_N fp32 partial to reduce).
    max_resident: int = 0
    split_min_k_tiles: int = 1


# Per GPU: (max M, config) rows, first match wins (M: rows per expert for grouped GEMMs). H100 and H200
# share the SM (sm_90, 132 SMs), so they share rows; the split by M is what matters:
# * M <= 64 (decode): a weight-streaming problem whose cost is decoding B once. choose_config splits K
#   until there are about 16 warps per SM (decode latencies hidden, every SM streaming); deep K tiles
#   and stages keep enough bytes in flight; the few A rows are decoded per tile at little cost.
# * medium M: both operands decoded per tile (decode work per FLOP falls as 1/BLOCK_M + 1/BLOCK_N).
# * large M: B is expanded to FP16 once (about 4.6 bytes of traffic per weight) and only A is decoded
#   per tile; B's tiles then take Triton's pipelined path, which lets the MMA overlap A's decoding.
#   Expanding costs O(N K) against the GEMM's O(M N K), so it pays off once M is large.
# Rows are a starting point from instruction counts of the sm_90 SASS; ``benchmarks/gemm.py --sweep``
# times alternatives on the GPU.
_HOPPER = (
    (16, GemmConfig(16, 64, 256, 8, 8, 4)),
    (32, GemmConfig(32, 64, 256, 8, 8, 4)),
    (64, GemmConfig(64, 64, 256, 8, 8, 4)),
    (256, GemmConfig(64, 128, 128, 8, 4, 4)),
    (1024, GemmConfig(128, 128, 128, 8, 8, 3)),
    (1 << 62, GemmConfig(128, 256, 64, 8, 8, 4, b_predecode=True)),
)
_CONFIGS = {"H100": _HOPPER, "H200": _HOPPER, "default": _HOPPER}
# Dense GEMMs only (grouped GEMMs use the rows above), checked before them. Measured on an H200:
# * M <= 64: the stream kernel (_stream_kernel, every N). benchmarks/gemm.py --variants, us per GEMM at
#   K=4096, cuBLAS BF16 and the previous default (skinny kernel for N >= 8192, else the fused kernel with a
#   split-K epilogue kernel) in the same run:
#       M, N        cuBLAS  previous  stream (this row)  best variant
#       1, 4096     13.2    17.2      10.2               9.9  (A decoded in the loop, one launch)
#       16, 4096    13.3    17.2      11.5               10.8 (64 x 256 tiles, 4 programs / SM)
#       1, 14336    30.5    33.0      20.0               -
#       16, 14336   30.6    34.9      21.4               -
#       64, 4096    12.1    25.2      16.9               -
#       64, 14336   33.9    59.3      39.1               37.7 (64 x 128 tiles, 4 stages, 4 / SM)
#   maxnreg=128 at 16 rows: 4 programs per SM without spills (Triton 3.6); 32 rows spill under that cap,
#   so that row has none.
#   Splits (eighth session, tools/stream_probe.py --splits: production calls over explicit K splits, us):
#   each split adds a BLOCK_M x BLOCK_N fp32 partial that the tile's last program reads back, so at 32 and
#   64 rows short splits cost more than they bring: split_min_k_tiles=8 (M=32, N=K=4096: 13.0 at 4 splits
#   vs 14.2 at the previous 8). At 64 rows 128 x 128 tiles (217 registers: 2 programs per SM) with at most
#   one wave of programs (max_resident=2): N, K = 4096, 4096: 15.1 vs 16.6 (previous row: 64 x 256
#   tiles, 2 stages); 14336, 4096: 28.4 vs 38.1 (3 splits = 336 programs, two waves: 36.6); 7168, 2048:
#   14.1 vs 14.8; 4096, 14336: 30.1 vs 34.9. At 16 rows the splits rule stayed (its best split was within
#   0.6 us of it at every shape).
# * the old skinny kernel (the previous M <= 64 path for N >= 8192) was removed after the stream kernel replaced
#   it; its last H200 us per GEMM, skinny vs stream: 1x14336x4096 33.0 vs 20.0, 16x14336 34.9 vs 21.4, 64x14336
#   59.3 vs 39.1.
# * M >= DEQUANT_MIN_M and M*N*K >= DEQUANT_MIN_MNK: expand both operands to FP16 + cuBLAS fp32-output GEMM +
#   epilogue kernel: 8192^3 659 vs fused 533 [698]; 4096^3 612 vs 499 [729]; M=1024 N=K=4096 497 vs 255;
#   M=128 N=K=4096 135 vs 83 [291] TFLOP/s (cuBLAS BF16 in brackets): it beat the fused kernel at every M >= 128.
_HOPPER_DENSE = dict(
    stream=((16, GemmConfig(16, 128, 128, 8, 4, 3, maxnreg=128, stream=True, a_pre=True, split_k=0, ctas_per_sm=2)),
            (32, GemmConfig(32, 128, 128, 8, 4, 3, stream=True, a_pre=True, split_k=0, ctas_per_sm=2,
                            split_min_k_tiles=8)),
            (64, GemmConfig(64, 128, 128, 8, 4, 3, stream=True, a_pre=True, split_k=0, ctas_per_sm=2, max_resident=2,
                            split_min_k_tiles=8))),
    dequant_min_m=128,
    dequant_min_mnk=1 << 30,
    dequant=GemmConfig(128, 128, 128, 8, 4, 1, dequant_mm=True),
)
_DENSE_RULES = {"H100": _HOPPER_DENSE, "H200": _HOPPER_DENSE, "default": _HOPPER_DENSE}
# Interpreter: small tiles so that tests hit every edge mask; larger ones only for larger problems
# (numpy runs whole tiles, so fewer programs is what makes the interpreter fast).
_INTERPRET_SMALL = GemmConfig(32, 32, 64, 4, 4, 1)
_INTERPRET_LARGE = GemmConfig(64, 64, 128, 4, 4, 1)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _gpu_key_cached(index: int) -> str:
    name = torch.cuda.get_device_name(index)
    for key in _CONFIGS:
        if key in name:
            return key
    return "default"


def _gpu_key(device: torch.device) -> str:
    if device.type != "cuda":
        return "default"
    return _gpu_key_cached(device.index if device.index is not None else torch.cuda.current_device())


def grouped_dequant_applies(m: int, n: int, k: int, num_experts: int, device: torch.device) -> bool:
    """Whether a grouped GEMM whose split sizes are known on the host runs as per-expert dequantize +
    cuBLAS GEMMs (:func:`_launch_grouped_dequant_mm`): the dense rule for the average expert (M / E rows)."""
    if device.type != "cuda" or _interpreting():
        return False
    rules = _DENSE_RULES[_gpu_key(device)]
    m_e = m // max(num_experts, 1)
    return m_e >= rules["dequant_min_m"] and m_e * n * k >= rules["dequant_min_mnk"]


def stream_block_m(m: int) -> int:
    """The stream kernel's BLOCK_M for M rows of A (a multiple of 16, at most 64)."""
    return 16 if m <= 16 else (32 if m <= 32 else 64)


def stream_splits(cfg: GemmConfig, m: int, n: int, k: int, num_sms: int) -> int:
    """K splits for the stream kernel: about ``ctas_per_sm`` programs per SM, within one wave of
    ``max_resident`` per SM and with ``split_min_k_tiles`` K tiles per split (``split_k`` when positive),
    every split non-empty."""
    k_tiles = triton.cdiv(k, cfg.block_k)
    split = cfg.split_k
    if split <= 0:
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        split = triton.cdiv(cfg.ctas_per_sm * num_sms, tiles)
        if cfg.max_resident > 0:
            split = min(split, cfg.max_resident * num_sms // tiles)
        split = min(split, k_tiles // cfg.split_min_k_tiles)
    split = max(1, min(split, k_tiles))
    return triton.cdiv(k_tiles, triton.cdiv(k_tiles, split))


def choose_config(m: int, n: int, k: int, device: torch.device, grouped: bool = False) -> GemmConfig:
    """Block sizes for an (m, n, k) problem on ``device`` (m: rows per expert for grouped GEMMs)."""
    if device.type != "cuda" or _interpreting():
        return _INTERPRET_LARGE if min(m, n) >= 64 and k >= 128 else _INTERPRET_SMALL
    if not grouped:
        rules = _DENSE_RULES[_gpu_key(device)]
        for max_m, cfg in rules.get("stream", ()):
            if m <= max_m:
                return cfg
        if m >= rules["dequant_min_m"] and m * n * k >= rules["dequant_min_mnk"]:
            return rules["dequant"]
    for max_m, cfg in _CONFIGS[_gpu_key(device)]:
        if m <= max_m:
            break
    if max_m <= 64:
        # Decode-like: aim at ~16 warps per SM (enough to hide the decode's latencies), splitting K when
        # there are too few output tiles, each split keeping at least 2 K tiles.
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        target = 16 * _num_sms(device) // cfg.num_warps
        k_tiles = triton.cdiv(k, cfg.block_k)
        split = max(1, min(8, triton.cdiv(target, tiles), k_tiles // 2))
        split = triton.cdiv(k_tiles, triton.cdiv(k_tiles, split))  # no empty splits
        cfg = replace(cfg, split_k=split)
    return cfg


@functools.lru_cache(maxsize=None)
def _num_sms_cached(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    return _num_sms_cached(device.index if device.index is not None else torch.cuda.current_device())


def default_decode(device: torch.device) -> int:
    """1 (PTX decoder) on CUDA, 0 (portable) under the interpreter; ``NVFP4LAB_GEMM_DECODE=triton``
    selects the portable decoder on the GPU too."""
    if device.type != "cuda" or _interpreting():
        return 0
    return 0 if os.environ.get("NVFP4LAB_GEMM_DECODE", "asm") == "triton" else 1


# -------------------------------------------------------------------------------------- launcher
_EXPAND_ROWS = 64


def _asm_fits(rows: int, block_k: int, num_warps: int) -> bool:
    """The PTX decoder takes 4 bytes per invocation: Triton aborts the process (not an exception) when
    a thread holds a number of bytes that is not a multiple of 4, so only whole multiples are allowed."""
    return (rows * block_k // 2) % (4 * 32 * num_warps) == 0


def _scale_args(scale: torch.Tensor, layout: str, rows: int, k: int):
    """(tensor, row stride, cols4, swizzled?) for a scale buffer of the given layout."""
    k16 = k // 16
    if layout == "swizzled":
        return scale.reshape(-1), 0, _roundup(k16, 4) // 4, True
    if scale.dim() != 2 or scale.stride(1) != 1:
        scale = scale.contiguous()
    return scale, scale.stride(0), 0, False


def _launch(
    a_data, a_scale, a_layout, a_amax, b_data, b_scale, b_layout, b_amax, offs, bias, out,
    *, m, n, k, num_experts, e_max_a, e_max_b, accumulate, grouped, config=None, decode=None, splits=None,
):
    device = a_data.device
    if a_data.stride(-1) != 1:
        a_data = a_data.contiguous()
    if b_data.stride(-1) != 1:
        b_data = b_data.contiguous()
    a_sc, a_ss, a_c4, a_sw = _scale_args(a_scale, a_layout, m, k)
    b_sc, b_ss, b_c4, b_sw = _scale_args(b_scale, b_layout, num_experts * n, k)
    a_amax = a_amax.reshape(-1).to(torch.float32)
    b_amax = b_amax.reshape(-1).to(torch.float32)
    if b_amax.numel() == 1:
        b_mode = 0
    elif b_amax.numel() == num_experts * n and n != 1:
        b_mode = 2
    else:
        b_mode = 1
    if bias is None:
        bias_mode = 0
    else:
        bias_mode = 2 if bias.dim() == 2 else 1
        bias = bias.contiguous()
    if decode is None:
        decode = default_decode(device)
    if grouped and splits is not None and k > 0 and m > 0 and n > 0:
        # host split sizes: large experts run as per-expert cuBLAS GEMMs on expanded operands
        if config is None and grouped_dequant_applies(m, n, k, num_experts, device):
            config = _DENSE_RULES[_gpu_key(device)]["dequant"]
        if config is not None and config.dequant_mm:
            return _launch_grouped_dequant_mm(a_data, a_sc, a_ss, a_c4, a_sw, a_amax, b_data, b_sc, b_ss, b_c4,
                                              b_sw, b_amax, bias, out, b_mode, bias_mode, bool(accumulate),
                                              splits, n, k, gemm_inv(e_max_a, e_max_b), config, decode)
    if config is None:
        per_expert_m = m if not grouped else max(1, m // max(num_experts, 1))
        config = choose_config(per_expert_m, n, k, device, grouped=grouped)
    if (config.dequant_mm or config.stream) and (grouped or k == 0 or m == 0 or n == 0):
        config = choose_config(max(1, m // max(num_experts, 1)), n, k, device, grouped=True)  # dense-only paths
    flags = dict(A_AMAX_ROWS=a_amax.numel() != 1, B_AMAX_MODE=b_mode, BIAS_MODE=bias_mode,
                 ACCUMULATE=bool(accumulate), OUT_BF16=out.dtype == torch.bfloat16)
    dummy = a_amax
    bias_arg = bias if bias is not None else dummy
    inv_e = gemm_inv(e_max_a, e_max_b)
    if config.stream:
        return _launch_stream(a_data, a_sc, a_ss, a_c4, a_sw, a_amax, b_data, b_sc, b_ss, b_c4, b_sw, b_amax,
                              bias_arg, out, flags, m, n, k, inv_e, config, decode)
    if config.dequant_mm:
        return _launch_dequant_mm(a_data, a_sc, a_ss, a_c4, a_sw, a_amax, b_data, b_sc, b_ss, b_c4, b_sw, b_amax,
                                  bias_arg, out, flags, m, n, k, inv_e, config, decode)
    if decode == 1 and not all(_asm_fits(r, config.block_k, w) for r, w in (
            (config.block_m, config.num_warps), (config.block_n, config.num_warps), (_EXPAND_ROWS, 4))):
        decode = 0
    b_arg, b_stride = b_data, b_data.stride(0)
    if config.b_predecode:
        b_rows, block_r = b_data.shape[0], _EXPAND_ROWS
        b_arg = torch.empty((b_rows, _roundup(k, config.block_k)), dtype=torch.float16, device=device)
        b_stride = b_arg.stride(0)
        _expand_kernel[(triton.cdiv(b_rows, block_r), b_arg.shape[1] // config.block_k)](
            b_data, b_sc, b_arg, b_rows, k, b_data.stride(0), b_ss, b_c4, b_stride, _TAB_LO,
            B_SWIZZLED=b_sw, DECODE=decode, BLOCK_R=block_r, BLOCK_K=config.block_k, num_warps=4,
        )
    split_k = 1 if grouped else max(1, config.split_k)
    ws = torch.empty((split_k, m, n), dtype=torch.float32, device=device) if split_k > 1 else a_amax
    rows_tiles = triton.cdiv(m, config.block_m) + (num_experts if grouped else 0)
    grid = (rows_tiles * triton.cdiv(n, config.block_n), split_k)
    _nvfp4_gemm_kernel[grid](
        a_data, a_sc, a_amax,
        b_arg, b_sc, b_amax,
        bias if bias is not None else dummy, out, offs if offs is not None else dummy, ws,
        m, n, k,
        a_data.stride(0), a_ss, a_c4,
        b_stride, b_ss, b_c4,
        out.stride(0), out.stride(1),
        num_experts,
        gemm_inv(e_max_a, e_max_b),
        _TAB_LO,
        A_SWIZZLED=a_sw, B_SWIZZLED=b_sw, **flags,
        GROUPED=grouped, E_POW2=triton.next_power_of_2(max(num_experts, 1)),
        EVEN_K=k % config.block_k == 0,
        DECODE=decode,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
        B_PRE=config.b_predecode, SPLIT_K=split_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **({} if config.maxnreg is None else {"maxnreg": config.maxnreg}),
        enable_fp_fusion=False,  # alpha, bias and out_old are separate roundings, as in the reference
    )
    if split_k > 1:
        block = 32
        _split_k_epilogue_kernel[(triton.cdiv(m, block), triton.cdiv(n, block))](
            ws, a_amax, b_amax, bias if bias is not None else dummy, out,
            m, n, out.stride(0), out.stride(1), gemm_inv(e_max_a, e_max_b),
            SPLIT_K=split_k, **flags, BLOCK_M=block, BLOCK_N=block, num_warps=4, enable_fp_fusion=False,
        )
    return out


def _words(data: torch.Tensor) -> torch.Tensor:
    """Packed codes (rows, K/2) uint8 viewed as int32 words (rows, K/8): 8 codes per word, code i of a
    word in bits 4i..4i+3 (little-endian bytes). A copy only when the view is impossible (misaligned)."""
    try:
        return data.view(torch.int32)
    except RuntimeError:  # a row stride or storage offset that is not a multiple of 4 bytes
        return data.clone(memory_format=torch.contiguous_format).view(torch.int32)


_STREAM_COUNTERS: dict = {}


def _stream_counters(device: torch.device, size: int) -> torch.Tensor:
    """Per-tile arrival counters of the stream kernel's split-K reduction, one zeroed buffer per (device,
    stream), kept between calls: the kernel sets every counter it used back to 0, so no memset runs per
    call. Kernels on one stream run in order, so they never share counters concurrently. (CUDA graphs
    captured on one stream share its buffer: do not replay them concurrently on different streams.)"""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _STREAM_COUNTERS.get(key)
    if buf is None or buf.numel() < size:
        buf = torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
        _STREAM_COUNTERS[key] = buf
    return buf


def _launch_stream(a_data, a_sc, a_ss, a_c4, a_sw, a_amax, b_data, b_sc, b_ss, b_c4, b_sw, b_amax, bias, out,
                   flags, m, n, k, inv_e, config, decode):
    device = a_data.device
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    if bk % 128 or bn % (16 * config.num_warps) or bm % 16:
        raise ValueError(f"stream kernel: block_k must be a multiple of 128, block_n of 16 * num_warps and "
                         f"block_m of 16, got {config}")
    v = bk // 128
    a_w, b_w = _words(a_data), _words(b_data)
    num_sms = _num_sms(device) if device.type == "cuda" else 4
    splits = stream_splits(config, m, n, k, num_sms)
    per_split = triton.cdiv(triton.cdiv(k, bk), splits)
    m_tiles = triton.cdiv(m, bm)
    grid = (triton.cdiv(n, bn), splits, m_tiles)
    ws = torch.empty((splits, m, n), dtype=torch.float32, device=device) if splits > 1 else a_amax
    counts = _stream_counters(device, grid[0] * m_tiles) if splits > 1 else a_amax
    a_arg, a_stride = a_w, a_w.stride(0)
    if config.a_pre:
        a_arg = torch.empty((m_tiles * bm, _roundup(k, bk)), dtype=torch.float16, device=device)
        a_stride = a_arg.stride(0)
        _stream_expand_kernel[(m_tiles * bm // 16, a_arg.shape[1] // 128)](
            a_w, a_sc, a_arg, m, k, a_w.stride(0), a_ss, a_c4, a_stride,
            A_SWIZZLED=a_sw, DECODE=decode, ROWS=16, num_warps=4,
        )
    _stream_kernel[grid](
        a_arg, a_sc, a_amax, b_w, b_sc, b_amax, bias, out, ws, counts,
        m, n, k, per_split, splits,
        a_stride, a_ss, a_c4, b_w.stride(0), b_ss, b_c4, out.stride(0), out.stride(1),
        inv_e,
        A_SWIZZLED=a_sw, B_SWIZZLED=b_sw, **flags, EVEN_K=k % bk == 0, DECODE=decode,
        BLOCK_M=bm, BLOCK_N=bn, V=v, WARPS=config.num_warps, A_PRE=config.a_pre, SPLIT=splits > 1,
        num_warps=config.num_warps, num_stages=config.num_stages, enable_fp_fusion=False,
        **({} if config.maxnreg is None or _interpreting() else {"maxnreg": config.maxnreg}),
    )
    return out


def _expand(data, sc, ss, c4, sw, rows, k, block_k, decode):
    """FP16 q * s (rows, roundup(k, block_k)) in the decoder's permuted order per block_k tile."""
    buf = torch.empty((rows, _roundup(k, block_k)), dtype=torch.float16, device=data.device)
    _expand_kernel[(triton.cdiv(rows, _EXPAND_ROWS), buf.shape[1] // block_k)](
        data, sc, buf, rows, k, data.stride(0), ss, c4, buf.stride(0), _TAB_LO,
        B_SWIZZLED=sw, DECODE=decode, BLOCK_R=_EXPAND_ROWS, BLOCK_K=block_k, num_warps=4,
    )
    return buf


def _expand_both(a_data, a_sc, a_ss, a_c4, a_sw, b_data, b_sc, b_ss, b_c4, b_sw, k, config, decode):
    """FP16 q * s of all rows of A and of B (the dequant paths' operands, same K permutation)."""
    if decode == 1 and not _asm_fits(_EXPAND_ROWS, config.block_k, 4):
        decode = 0
    a16 = _expand(a_data, a_sc, a_ss, a_c4, a_sw, a_data.shape[0], k, config.block_k, decode)
    b16 = _expand(b_data, b_sc, b_ss, b_c4, b_sw, b_data.shape[0], k, config.block_k, decode)
    return a16, b16


def _mm_f32(a16, b16, out=None):
    """a16 @ b16^T with fp32 accumulation and fp32 output (into ``out`` when given)."""
    if a16.is_cuda:
        return torch.mm(a16, b16.t(), out_dtype=torch.float32, out=out)
    # CPU (interpreter tests): fp32 products of the exact values, fp32 accumulation
    return torch.mm(a16.float(), b16.float().t(), out=out)


def _dequant_epilogue(acc, a_amax, b_amax, bias, out, flags, m, n, inv_e):
    """The reference epilogue (alpha, bias, out_old, cast) over an fp32 product (m, n), one pass."""
    bm, bn, warps = (64, 128, 8) if out.is_cuda and not _interpreting() else (32, 32, 4)
    _split_k_epilogue_kernel[(triton.cdiv(m, bm), triton.cdiv(n, bn))](
        acc, a_amax, b_amax, bias, out, m, n, out.stride(0), out.stride(1), inv_e,
        SPLIT_K=1, **flags, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, enable_fp_fusion=False,
    )
    return out


def _launch_dequant_mm(a_data, a_sc, a_ss, a_c4, a_sw, a_amax, b_data, b_sc, b_ss, b_c4, b_sw, b_amax, bias, out,
                       flags, m, n, k, inv_e, config, decode):
    """Both operands expanded to FP16 q * s (exact; the same permutation of K within every block_k tile
    on both sides, so the products pair up as in the definition), one cuBLAS GEMM with fp32 accumulation
    and fp32 output, then the reference epilogue (alpha, bias, out_old, cast) in one pass. Temporaries:
    2MK + 2NK bytes of FP16 (freed before the epilogue) and 4MN bytes of fp32."""
    a16, b16 = _expand_both(a_data, a_sc, a_ss, a_c4, a_sw, b_data, b_sc, b_ss, b_c4, b_sw, k, config, decode)
    acc = _mm_f32(a16, b16)
    del a16, b16
    return _dequant_epilogue(acc, a_amax, b_amax, bias, out, flags, m, n, inv_e)


def _launch_grouped_dequant_mm(a_data, a_sc, a_ss, a_c4, a_sw, a_amax, b_data, b_sc, b_ss, b_c4, b_sw, b_amax,
                               bias, out, b_mode, bias_mode, accumulate, splits, n, k, inv_e, config, decode):
    """Grouped GEMM with host split sizes: A (all experts' rows) and B (all experts' weights) expanded to
    FP16 once each, then per expert one cuBLAS fp32-output GEMM into its rows of a shared fp32 buffer
    and the epilogue on those rows with the expert's amax and bias (the dense dequant path, expert by
    expert). Launches: 2 + 2 per non-empty expert."""
    a16, b16 = _expand_both(a_data, a_sc, a_ss, a_c4, a_sw, b_data, b_sc, b_ss, b_c4, b_sw, k, config, decode)
    acc = torch.empty((a_data.shape[0], n), dtype=torch.float32, device=a_data.device)
    a_rows = a_amax.numel() != 1
    # each expert's amax and bias as a dense GEMM's: scalar or per-row B amax, (N,) bias
    flags = dict(A_AMAX_ROWS=a_rows, B_AMAX_MODE=2 if b_mode == 2 else 0, BIAS_MODE=min(bias_mode, 1),
                 ACCUMULATE=accumulate, OUT_BF16=out.dtype == torch.bfloat16)
    row = 0
    for e, m_e in enumerate(splits):
        r0, row = row, row + m_e
        if m_e == 0:
            continue
        _mm_f32(a16[r0:row], b16[e * n:(e + 1) * n], out=acc[r0:row])
        b_amax_e = b_amax[e * n:(e + 1) * n] if b_mode == 2 else (b_amax[e:e + 1] if b_mode == 1 else b_amax)
        bias_e = bias if bias_mode == 1 else (bias[e] if bias_mode == 2 else a_amax)
        _dequant_epilogue(acc[r0:row], a_amax[r0:row] if a_rows else a_amax, b_amax_e, bias_e, out[r0:row], flags,
                          m_e, n, inv_e)
    return out


# ------------------------------------------------------------------- torch.library custom ops
# Tensors and plain values only (an NVFP4Tensor is unpacked by the Python wrappers below), so that
# torch.compile (fullgraph) and CUDA graphs see opaque ops with shape-only fake implementations.
@torch.library.custom_op("nvfp4lab::nvfp4_gemm", mutates_args=())
def _gemm_op(
    a_data: torch.Tensor, a_scale: torch.Tensor, a_amax: torch.Tensor, a_layout: str, e_max_a: float,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_amax: torch.Tensor, b_layout: str, e_max_b: float,
    bias: Optional[torch.Tensor], k: int, out_dtype: torch.dtype,
) -> torch.Tensor:
    m, n = a_data.shape[0], b_data.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=a_data.device)
    return _launch(a_data, a_scale, a_layout, a_amax, b_data, b_scale, b_layout, b_amax, None, bias, out,
                   m=m, n=n, k=k, num_experts=1, e_max_a=e_max_a, e_max_b=e_max_b, accumulate=False, grouped=False)


@_gemm_op.register_fake
def _(a_data, a_scale, a_amax, a_layout, e_max_a, b_data, b_scale, b_amax, b_layout, e_max_b, bias, k, out_dtype):
    return a_data.new_empty((a_data.shape[0], b_data.shape[0]), dtype=out_dtype)


@torch.library.custom_op("nvfp4lab::nvfp4_gemm_out", mutates_args=("out",))
def _gemm_out_op(
    a_data: torch.Tensor, a_scale: torch.Tensor, a_amax: torch.Tensor, a_layout: str, e_max_a: float,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_amax: torch.Tensor, b_layout: str, e_max_b: float,
    bias: Optional[torch.Tensor], k: int, out: torch.Tensor, accumulate: bool,
) -> None:
    _launch(a_data, a_scale, a_layout, a_amax, b_data, b_scale, b_layout, b_amax, None, bias, out,
            m=a_data.shape[0], n=b_data.shape[0], k=k, num_experts=1, e_max_a=e_max_a, e_max_b=e_max_b,
            accumulate=accumulate, grouped=False)


@_gemm_out_op.register_fake
def _(a_data, a_scale, a_amax, a_layout, e_max_a, b_data, b_scale, b_amax, b_layout, e_max_b, bias, k, out, accumulate):
    return None


@torch.library.custom_op("nvfp4lab::nvfp4_grouped_gemm", mutates_args=())
def _grouped_op(
    a_data: torch.Tensor, a_scale: torch.Tensor, a_amax: torch.Tensor, a_layout: str, e_max_a: float,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_amax: torch.Tensor, b_layout: str, e_max_b: float,
    offs: torch.Tensor, num_experts: int, bias: Optional[torch.Tensor], k: int, out_dtype: torch.dtype,
    splits: Optional[List[int]] = None,
) -> torch.Tensor:
    m, n = a_data.shape[0], b_data.shape[0] // num_experts
    out = torch.empty((m, n), dtype=out_dtype, device=a_data.device)
    return _launch(a_data, a_scale, a_layout, a_amax, b_data, b_scale, b_layout, b_amax, offs, bias, out,
                   m=m, n=n, k=k, num_experts=num_experts, e_max_a=e_max_a, e_max_b=e_max_b,
                   accumulate=False, grouped=True, splits=splits)


@_grouped_op.register_fake
def _(a_data, a_scale, a_amax, a_layout, e_max_a, b_data, b_scale, b_amax, b_layout, e_max_b, offs, num_experts,
      bias, k, out_dtype, splits=None):
    return a_data.new_empty((a_data.shape[0], b_data.shape[0] // num_experts), dtype=out_dtype)


@torch.library.custom_op("nvfp4lab::nvfp4_grouped_gemm_out", mutates_args=("out",))
def _grouped_out_op(
    a_data: torch.Tensor, a_scale: torch.Tensor, a_amax: torch.Tensor, a_layout: str, e_max_a: float,
    b_data: torch.Tensor, b_scale: torch.Tensor, b_amax: torch.Tensor, b_layout: str, e_max_b: float,
    offs: torch.Tensor, num_experts: int, bias: Optional[torch.Tensor], k: int, out: torch.Tensor,
    accumulate: bool, splits: Optional[List[int]] = None,
) -> None:
    _launch(a_data, a_scale, a_layout, a_amax, b_data, b_scale, b_layout, b_amax, offs, bias, out,
            m=a_data.shape[0], n=b_data.shape[0] // num_experts, k=k, num_experts=num_experts,
            e_max_a=e_max_a, e_max_b=e_max_b, accumulate=accumulate, grouped=True, splits=splits)


@_grouped_out_op.register_fake
def _(a_data, a_scale, a_amax, a_layout, e_max_a, b_data, b_scale, b_amax, b_layout, e_max_b, offs, num_experts,
      bias, k, out, accumulate, splits=None):
    return None


def run(a, b, out, *, bias=None, accumulate=False, offs=None, num_experts=1, config=None, decode=None, splits=None):
    """Direct launch without the custom op, for tests and tuning: writes ``out`` (M, N) and returns it.
    ``config`` (a :class:`GemmConfig`) and ``decode`` (0 or 1) override the defaults; ``splits``: the
    grouped GEMM's host split sizes (a ``dequant_mm`` config then takes the per-expert cuBLAS path)."""
    grouped = offs is not None
    return _launch(a.rowwise_data, a.rowwise_scale, a.scale_layout, a.rowwise_amax,
                   b.rowwise_data, b.rowwise_scale, b.scale_layout, b.rowwise_amax, offs, bias, out,
                   m=a.m, n=b.m // num_experts, k=a.k, num_experts=num_experts, e_max_a=a.e4m3_max,
                   e_max_b=b.e4m3_max, accumulate=accumulate, grouped=grouped, config=config, decode=decode,
                   splits=None if splits is None else list(splits))


def _operand(t):
    return (t.rowwise_data, t.rowwise_scale, t.rowwise_amax, t.scale_layout, float(t.e4m3_max))


# ------------------------------------------------------------------------------ Python wrappers
def nvfp4_gemm(a, b, *, out_dtype=torch.bfloat16, bias=None, out=None, accumulate=False):
    """``a @ b^T`` of two NVFP4Tensors' rowwise copies (checked by :func:`nvfp4lab.ops.nvfp4_gemm`,
    which also handles M, N or K == 0). Writes ``out`` in place when given."""
    if out is None:
        return torch.ops.nvfp4lab.nvfp4_gemm(*_operand(a), *_operand(b), bias, a.k, out_dtype)
    torch.ops.nvfp4lab.nvfp4_gemm_out(*_operand(a), *_operand(b), bias, a.k, out, bool(accumulate))
    return out


def nvfp4_grouped_gemm(a, b, offs, num_experts, *, out_dtype=torch.bfloat16, bias=None, out=None,
                       accumulate=False, splits=None):
    """Grouped ``a[rows of e] @ b[e]^T`` for the bulk ``a`` (M, K) and the stacked ``b`` (E*N rows);
    checked by :func:`nvfp4lab.ops.nvfp4_grouped_gemm`. ``offs``: device int tensor (E,) of cumulative
    row ends; ``splits``: the same sizes on the host, or None (then always the one-launch kernel)."""
    splits = None if splits is None else [int(s) for s in splits]
    if out is None:
        return torch.ops.nvfp4lab.nvfp4_grouped_gemm(*_operand(a), *_operand(b), offs, num_experts, bias, a.k,
                                                      out_dtype, splits)
    torch.ops.nvfp4lab.nvfp4_grouped_gemm_out(*_operand(a), *_operand(b), offs, num_experts, bias, a.k, out,
                                              bool(accumulate), splits)
    return out
