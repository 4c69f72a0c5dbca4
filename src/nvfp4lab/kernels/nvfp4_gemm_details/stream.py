"""The weight-stream NVFP4 GEMM kernel: dense, few rows of A (M <= 64).

A decode GEMM is a read of B (N K / 2 bytes of codes + N K / 16 of scales) plus the decoding of every
code, so the kernel is built around B. The product is formed as B A^T, so B's rows are the wgmma M side
and its decoded tile is the *register* operand: each thread reads 16 contiguous bytes per row and
128-wide K sub-tile and decodes them (:data:`STREAM_ASM_TEXT`, 19 instructions per 8 codes, plus one cvt
per two scales) straight into its MMA fragment registers (:func:`stream_decode` chooses the K permutation
that makes this so; no shuffles or shared memory on the way). A (at most 64 rows) is decoded once by
:func:`stream_expand_kernel` (``a_pre``) or per tile in the loop, and is the shared-memory operand.
Codes are decoded by bit placement as e2m1 * 2^-14 (exact in FP16 with the scale applied); the fp32 sums
are multiplied by 2^28 before the epilogue (exact). Words and scales are loaded through Triton's cp.async
pipeline (``num_stages``), ``block_k / 128`` sub-tiles per stage.

K is split over programs (:func:`.opt_flags.stream_splits`); the last program of an output tile to arrive
(a counter per tile, reset by that program, so no memset per call) sums the fp32 partials in a fixed
order (deterministic) and runs the epilogue: one launch for the GEMM (two with ``a_pre``).
Constraints: block_k a multiple of 128, block_n of 16 * num_warps, block_m of 16.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...layout import cdiv, roundup
from ..formats import e4m3_decode
from ..launch import keep_buffers, launch
from ..pdl import wait_prior_grid
from ..swizzle import swizzle_offset
from . import opt_flags
from .common import epilogue, words

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
def f16_halves(p):
    """int32 holding an FP16 pair -> [..., 2] FP16 (low half first)."""
    lo = p.to(tl.uint16).to(tl.float16, bitcast=True)
    hi = (p >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    return tl.join(lo, hi)


@triton.jit
def stream_decode(w, sc, ROWS: tl.constexpr, DECODE: tl.constexpr):
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
        s = e4m3_decode(sc.to(tl.int32)).to(tl.float16)
    # the scale of word u is that of block 2t + u // 2
    s = tl.reshape(tl.broadcast_to(s[:, :, :, None], (ROWS, 4, 2, 2)), (ROWS, 4, 4))
    if DECODE == 1:
        p0, p1, p2, p3 = tl.inline_asm_elementwise(
            _STREAM_ASM, "=r,=r,=r,=r,r,h", [w, s], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1,
        )
        v = tl.join(tl.join(f16_halves(p0), f16_halves(p1)), tl.join(f16_halves(p2), f16_halves(p3)))
        # [ROWS, t, u, e, pl, ph]
    else:
        codes = (w[:, :, :, None] >> (tl.arange(0, 8) * 4)[None, None, None, :]) & 15  # [ROWS, t, u, i]
        h = ((codes & 7) << 9) | ((codes & 8) << 12)  # e2m1 * 2^-14 in FP16 bits
        v = h.to(tl.uint16).to(tl.float16, bitcast=True) * s[:, :, :, None]
        v = tl.permute(tl.reshape(v, (ROWS, 4, 4, 2, 2, 2)), (0, 1, 2, 3, 5, 4))  # i = (e, ph, pl)
    v = tl.permute(v, (0, 2, 5, 4, 1, 3))  # row, u, ph, pl, t, e
    return tl.reshape(v, (ROWS, 128))


@triton.jit
def stream_load(w_ptr, scale_ptr, rows, kk, stride_w, stride_s, cols4, K,
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
        soff = swizzle_offset(r, kk * 8 + c, cols4)
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
def stream_rows(pid_n, N, BLOCK_N: tl.constexpr, WARPS: tl.constexpr):
    """The B rows (int64 [BLOCK_N]) that output tile ``pid_n`` loads, in load order: tile row r is read
    from B row r_mma(r), because the load's blocked layout gives row r = (rep, warp w, lane row g) to a
    thread and the MMA layout wants that thread to hold the rows (R, w, h, g). Padding rows read row 0
    (never stored). :func:`stream_rows_back` restores the tile order of the decoded values."""
    r = tl.arange(0, BLOCK_N)
    G16: tl.constexpr = 16 * WARPS
    r_mma = (r // G16) * G16 + ((r // 8) % WARPS) * 16 + ((r // (8 * WARPS)) % 2) * 8 + r % 8
    offs_n = pid_n * BLOCK_N + r_mma
    return tl.where(offs_n < N, offs_n, 0).to(tl.int64)


@triton.jit
def stream_rows_back(b_val, BLOCK_N: tl.constexpr, WARPS: tl.constexpr):
    """[BLOCK_N, 128] values loaded in :func:`stream_rows` order -> tile row order (register renaming only)."""
    G16: tl.constexpr = 16 * WARPS
    return tl.reshape(tl.permute(tl.reshape(b_val, (BLOCK_N // G16, 2, WARPS, 8, 128)), (0, 2, 1, 3, 4)), (BLOCK_N, 128))


@triton.jit
def stream_kernel(
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
    A_PRE: tl.constexpr,  # a_ptr: A already decoded by stream_expand_kernel, FP16 (BLOCK_M, roundup(K, 128 V))
    SPLIT: tl.constexpr, SOFT_BF16: tl.constexpr = False,
    EPI_PR3045: tl.constexpr = False,  # PR 3045's epilogue order (common.epilogue)
    PDL: tl.constexpr = False,
):
    """Dense GEMM for few rows of A (M <= 64): a weight stream (see the module docstring).

    Grid (N tiles, K splits, M tiles). Each program owns BLOCK_N rows of B and ``per_split`` K tiles of 128 V.
    acc^T = B A^T: B's rows are the MMA's M side, decoded straight into its register operand (wgmma
    from registers); A (at most 64 rows, L2-resident) is decoded per tile (or read pre-decoded) into
    shared memory. With SPLIT, the fp32 partials go to ws_ptr and the last program of an output tile to
    arrive (a counter per tile) sums them in split order (deterministic), finishes the epilogue and sets
    the counter back to 0 for the next launch on the stream."""
    wait_prior_grid(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    BK: tl.constexpr = 128 * V
    rows_b = stream_rows(pid_n, N, BLOCK_N, WARPS)
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
                a_w, a_sc = stream_load(a_ptr, a_scale_ptr, rows_a, kk, stride_a, stride_as, a_cols4, K,
                                         A_SWIZZLED, EVEN_K, BLOCK_M)
            b_w, b_sc = stream_load(b_ptr, b_scale_ptr, rows_b, kk, stride_b, stride_bs, b_cols4, K,
                                     B_SWIZZLED, EVEN_K, BLOCK_N)
            b_val = stream_rows_back(stream_decode(b_w, b_sc, BLOCK_N, DECODE), BLOCK_N, WARPS)
            if not A_PRE:
                a_val = stream_decode(a_w, a_sc, BLOCK_M, DECODE)
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
            epilogue(tot, offs_m, offs_n, mask_m, mask_n, rows_a, rows_b, 0, a_amax_ptr, b_amax_ptr, bias_ptr,
                      out_ptr, N, stride_om, stride_on, inv_e, A_AMAX_ROWS, B_AMAX_MODE, BIAS_MODE, ACCUMULATE,
                      OUT_BF16, BLOCK_M, BLOCK_N, SOFT_BF16, EPI_PR3045)
    else:
        epilogue(acc, offs_m, offs_n, mask_m, mask_n, rows_a, rows_b, 0, a_amax_ptr, b_amax_ptr, bias_ptr,
                  out_ptr, N, stride_om, stride_on, inv_e, A_AMAX_ROWS, B_AMAX_MODE, BIAS_MODE, ACCUMULATE,
                  OUT_BF16, BLOCK_M, BLOCK_N, SOFT_BF16, EPI_PR3045)


@triton.jit
def stream_expand_kernel(a_ptr, a_scale_ptr, out_ptr, M, K, stride_a, stride_as, a_cols4, stride_o,
                          A_SWIZZLED: tl.constexpr, DECODE: tl.constexpr, ROWS: tl.constexpr,
                          PDL: tl.constexpr = False):
    """A (M rows) -> FP16 q * s * 2^-14 (grid rows x grid sub-tiles of 128) in stream_decode's order per
    sub-tile; rows past M and columns past K are zeros (the stream kernel reads whole tiles)."""
    wait_prior_grid(PDL)
    pid_r = tl.program_id(0)
    kk = tl.program_id(1)
    offs = pid_r * ROWS + tl.arange(0, ROWS)
    rows = tl.where(offs < M, offs, 0).to(tl.int64)
    w, sc = stream_load(a_ptr, a_scale_ptr, rows, kk, stride_a, stride_as, a_cols4, K, A_SWIZZLED, False, ROWS)
    val = stream_decode(w, sc, ROWS, DECODE)
    val = tl.where((offs < M)[:, None], val, 0.0)
    cols = kk * 128 + tl.arange(0, 128)
    tl.store(out_ptr + offs.to(tl.int64)[:, None] * stride_o + cols[None, :], val)



_STREAM_COUNTERS: dict = {}


def stream_counters(device: torch.device, size: int) -> torch.Tensor:
    """Per-tile arrival counters of the stream kernel's split-K reduction, one zeroed buffer per (device,
    stream), kept between calls: the kernel sets every counter it used back to 0, so no memset runs per
    call. Kernels on one stream run in order, so they never share counters concurrently. Where a buffer
    must not outlive the call (``launch.keep_buffers``) the call gets zeroed counters of its own."""
    if not keep_buffers(device):
        return torch.zeros(max(size, 1), dtype=torch.int32, device=device)  # see launch.keep_buffers
    stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _STREAM_COUNTERS.get(key)
    if buf is None or buf.numel() < size:
        buf = torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
        _STREAM_COUNTERS[key] = buf
    return buf


def launch_a_expand_kernel(grid, a_w, a, out16, m, k, constexprs: dict):
    """A's words ``a_w`` (int32) -> FP16 ``out16`` (rows, roundup(k, 128 V)) in :func:`stream_decode`'s order."""
    launch(stream_expand_kernel, grid,
           (a_w, a.scale, out16, m, k, a_w.stride(0), a.scale_stride, a.cols4, out16.stride(0)), constexprs)


def _launch_stream_kernel(grid, a_arg, a_stride, a, b_w, b, bias, out, ws, counts, m, n, k, per_split, splits, inv_e,
                          constexprs: dict):
    launch(stream_kernel, grid, (
        a_arg, a.scale, a.amax, b_w, b.scale, b.amax, bias, out, ws, counts,
        m, n, k, per_split, splits,
        a_stride, a.scale_stride, a.cols4, b_w.stride(0), b.scale_stride, b.cols4, out.stride(0), out.stride(1),
        inv_e,
    ), constexprs)


def gemm(a, b, bias, out, flags: dict, m: int, n: int, k: int, inv_e: float, config, decode: int) -> torch.Tensor:
    """The stream kernel over operands ``a``, ``b`` (:class:`.common.Operand`); writes ``out`` (M, N)."""
    device = a.data.device
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    if bk % 128 or bn % (16 * config.num_warps) or bm % 16:
        raise ValueError(f"stream kernel: block_k must be a multiple of 128, block_n of 16 * num_warps and "
                         f"block_m of 16, got {config}")
    a_w, b_w = words(a.data), words(b.data)
    splits = opt_flags.stream_splits(config, m, n, k, opt_flags.num_sms(device))
    per_split = cdiv(cdiv(k, bk), splits)
    m_tiles = cdiv(m, bm)
    grid = (cdiv(n, bn), splits, m_tiles)
    ws = torch.empty((splits, m, n), dtype=torch.float32, device=device) if splits > 1 else a.amax
    counts = stream_counters(device, grid[0] * m_tiles) if splits > 1 else a.amax
    a_arg, a_stride = a_w, a_w.stride(0)
    if config.a_pre:
        a_arg = torch.empty((m_tiles * bm, roundup(k, bk)), dtype=torch.float16, device=device)
        a_stride = a_arg.stride(0)
        launch_a_expand_kernel((m_tiles * bm // 16, a_arg.shape[1] // 128), a_w, a, a_arg, m, k,
                               dict(A_SWIZZLED=a.swizzled, DECODE=decode, ROWS=16, num_warps=4))
    _launch_stream_kernel(grid, a_arg, a_stride, a, b_w, b, bias, out, ws, counts, m, n, k, per_split, splits, inv_e, dict(
        A_SWIZZLED=a.swizzled, B_SWIZZLED=b.swizzled, **flags, EVEN_K=k % bk == 0, DECODE=decode,
        BLOCK_M=bm, BLOCK_N=bn, V=bk // 128, WARPS=config.num_warps, A_PRE=config.a_pre, SPLIT=splits > 1,
        num_warps=config.num_warps, num_stages=config.num_stages, enable_fp_fusion=False,
        **({} if config.maxnreg is None or opt_flags.interpreting() else {"maxnreg": config.maxnreg}),
    ))
    return out
