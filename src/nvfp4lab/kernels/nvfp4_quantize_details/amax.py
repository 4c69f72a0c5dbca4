"""Outer amaxes of x (M, K) for the NVFP4 cast: per tensor, per row (M,), per column (K,), per tensor
of the bf16 RHT output (x^T's rows transformed), or per column of PR 3045's fp32 RHT output.

Each program folds max |x| of STEPS_M tiles (consecutive along M) by ``atomic_max`` into the int32
accumulators of a scratch buffer (|x| >= 0, so int order is float order; NaN bits beat inf as
torch.amax's NaN). The last program to finish (a ticket counter in the same buffer) moves the maxima
into the fp32 outputs and sets the accumulators and the counter back to 0 (``finalize_amax``), so the
scratch is zero between launches and no memset runs per call: one launch for the whole pass. Per-token
passes whose outputs are plain vectors (no tables) accumulate straight into those outputs, zeroed by
the caller (DIRECT): a serial copy of thousands of maxima by one program would be the pass's tail.

The value atomics are relaxed (the default acq_rel ordering puts a memory barrier around each one, and
the per-token pass issues one per row and column); each program orders them before its ticket with a
barrier and the ticket's acq_rel, so the last program reads every maximum.

Scratch layout (int32, on the launch's device and stream, zero at rest): [ticket, row accumulators
(N_ROW), column accumulators (N_COL)] (``scratch_buffer``). Where a launch would get a zeroed scratch of its own
(stream capture, a compiled graph's call: ``keep_buffers``), per-tensor passes accumulate straight into their outputs
too (DIRECT), their outputs zeroed (as the per-token ones) by one launch of ``zero_kernel`` (``zeroed_amaxes``): the
same zeroing as the scratch's, and no ticket or finalize at the pass's end.

``amax_rht_col_kernel``: the per-tensor post-RHT amax (with the per-tensor amax of x, or alone) of bf16 x,
M a multiple of 16, K even: a word column (two bf16 columns) per thread, each column's 16-row blocks
transformed by ``rht16_sums``' butterflies in the thread (``amax_kernel`` takes the tile through a
block-diagonal ``tl.dot``, whose operand layouts go through shared memory), STEPS 16-row groups per
program, then the same atomics, ticket and finalize (or DIRECT ones).

SUMS (a gradient's quantize with its bias gradient, ``quantize_dbias``): both passes also store the fp32 column sums
of each program's rows into row p of a (programs along M, K) buffer (``amax_rht_col_kernel`` adds them row by row,
``amax_kernel`` elementwise over its steps, then by its tile's reduction), and one launch of ``column_sums_kernel``
adds those rows in order and rounds once to the bias dtype: the bias gradient without a second read of x, the same
bits call after call for one shape and tile.
"""
import functools

import torch
import triton
import triton.language as tl

from ..formats import f32_to_bf16_rne
from ..launch import Launch, arg_key, keep_buffers
from ..pdl import wait_prior_grid
from .common import (
    ONE_SIXTH,
    abs_bits,
    abs_max16_bits,
    bf16_half,
    bf16_hi,
    bf16_lo,
    global_scales,
    in_normal_range,
    load_rows,
    load_words16,
    program_columns,
    word_column_program,
)
from .rht import finish16_bits, rht16_sums, rht_rows_fp32, rht_tile

# amax modes of the two outputs (see nvfp4lab.kernels.nvfp4_quantize.compute_amax)
AMAX_NONE, AMAX_TENSOR, AMAX_PER_TOKEN, AMAX_TENSOR_RHT, AMAX_PER_TOKEN_RHT = 0, 1, 2, 3, 4


@triton.jit
def _store_table(out_ptr, idx, n, value, ok, TABLE_E6: tl.constexpr):
    """value -> out[idx]; with TABLE_E6 > 0 out is a (3, n) per-token table (``pt_scales_kernel``'s
    layout and values, for E = TABLE_E6 / 6) and its two scale planes are written too."""
    tl.store(out_ptr + idx, value, mask=ok)
    if TABLE_E6 > 0:
        s_enc, s_dec = global_scales(value, TABLE_E6, False)
        tl.store(out_ptr + (idx + n), s_enc * ONE_SIXTH, mask=ok)
        tl.store(out_ptr + ((idx + n) + n), tl.where(in_normal_range(value), s_dec, -1.0), mask=ok)


@triton.jit
def finalize_amax(scratch_ptr, row_out_ptr, col_out_ptr, N_ROW, N_COL, BLOCK: tl.constexpr,
                  TABLE_E6: tl.constexpr = 0.0):
    """Called by every program after its last atomic: the last program to arrive copies the N_ROW + N_COL
    accumulators (scratch[1:]) into the fp32 outputs and zeroes them and the ticket (scratch[0]).
    TABLE_E6 > 0: the outputs are per-token tables (``_store_table``)."""
    tl.debug_barrier()  # every thread's atomics are issued before the ticket
    ticket = tl.atomic_add(scratch_ptr, 1, sem="acq_rel")
    if ticket == tl.num_programs(0) - 1:
        total = N_ROW + N_COL
        for start in range(0, total, BLOCK):
            idx = start + tl.arange(0, BLOCK)
            ok = idx < total
            bits = tl.atomic_xchg(scratch_ptr + 1 + idx, tl.zeros_like(idx).to(tl.int32), mask=ok, sem="relaxed")
            value = bits.to(tl.float32, bitcast=True)
            _store_table(row_out_ptr, idx, N_ROW, value, idx < N_ROW, TABLE_E6)
            _store_table(col_out_ptr, idx - N_ROW, N_COL, value, ok & (idx >= N_ROW), TABLE_E6)
        tl.atomic_xchg(scratch_ptr, 0, sem="relaxed")


@triton.jit
def amax_kernel(
    x_ptr, scratch_ptr, row_out_ptr, col_out_ptr, sums_ptr, M, K, N_ROW, N_COL,
    ROW_MODE: tl.constexpr, COL_MODE: tl.constexpr, TENSOR_AMAX: tl.constexpr, RHT_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT_BF16: tl.constexpr, STEPS_M: tl.constexpr = 1,
    FINAL_BLOCK: tl.constexpr = 1024, TABLE_E6: tl.constexpr = 0.0, SOFT_BF16: tl.constexpr = False,
    DIRECT: tl.constexpr = False, SUMS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """Folds max |x| of STEPS_M tiles (consecutive along M) into the scratch accumulators, then
    ``finalize_amax`` (TABLE_E6 > 0: per-token outputs as (3, N) tables for the cast). Per-tensor and
    per-column maxima are carried across the steps in registers, so one program issues one atomic per
    output (same-address atomics serialize in L2). DIRECT (per-token modes only): the outputs, zeroed
    by the caller and passed as int32, are the accumulators; no scratch, no finalize (whose serial copy
    of N_ROW + N_COL values would be the pass's tail for long vectors). SUMS: also the fp32 column sums of
    the program's rows (elementwise over the steps, then the tile's reduction), row pid_m of sums (programs
    along M, K)."""
    wait_prior_grid(PDL)
    if DIRECT:
        row_amax_ptr = row_out_ptr
        col_amax_ptr = col_out_ptr
    else:
        row_amax_ptr = scratch_ptr + 1
        col_amax_ptr = scratch_ptr + 1 + N_ROW
    pid_m, pid_k, cols, col_ok = program_columns(K, BLOCK_K)
    # maxima are carried elementwise across the steps and reduced once at the end (a reduction along
    # M crosses warps through shared memory)
    t = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
    t_rht = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
    sums = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    for step in tl.static_range(STEPS_M):
        rows = ((pid_m * STEPS_M + step) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_ok, xf = load_rows(x_ptr, rows, cols, col_ok, M, K, SOFT_BF16)
        if SUMS:
            sums += xf
        mag = abs_bits(xf)  # |x| bits
        if TENSOR_AMAX or COL_MODE == 2:
            t = tl.maximum(t, mag)
        if ROW_MODE == 2:
            r = tl.max(mag, axis=1)
            r = tl.where(r > 0x7F800000, 0x7FC00000, r)
            tl.atomic_max(row_amax_ptr + rows, r, mask=row_ok, sem="relaxed")
        if COL_MODE == 3:  # the raw sums, finished once after the reduction (finish16_bits)
            y = rht_tile(xf, BLOCK_M, RHT_MASK, x_ptr.dtype.element_ty == tl.bfloat16, DOT_BF16, False)
            t_rht = tl.maximum(t_rht, abs_bits(y))
        if COL_MODE == 4:  # rows past M load 0 and transform to 0 (16-row groups lie within or past M)
            t_rht = tl.maximum(t_rht, abs_bits(rht_rows_fp32(xf, BLOCK_M, BLOCK_K, RHT_MASK)))
    if TENSOR_AMAX:
        tt = tl.max(tl.max(t, axis=1), axis=0)
        tt = tl.where(tt > 0x7F800000, 0x7FC00000, tt)
        if ROW_MODE == 1:
            tl.atomic_max(row_amax_ptr, tt, sem="relaxed")
        if COL_MODE == 1:
            tl.atomic_max(col_amax_ptr, tt, sem="relaxed")
    if COL_MODE == 3:
        tr = finish16_bits(tl.max(tl.max(t_rht, axis=1), axis=0))
        tl.atomic_max(col_amax_ptr, tl.where(tr > 0x7F800000, 0x7FC00000, tr), sem="relaxed")
    if COL_MODE == 2:
        c = tl.max(t, axis=0)
        c = tl.where(c > 0x7F800000, 0x7FC00000, c)
        tl.atomic_max(col_amax_ptr + cols, c, mask=col_ok, sem="relaxed")
    if COL_MODE == 4:
        c = tl.max(t_rht, axis=0)
        c = tl.where(c > 0x7F800000, 0x7FC00000, c)
        tl.atomic_max(col_amax_ptr + cols, c, mask=col_ok, sem="relaxed")
    if SUMS:
        tl.store(sums_ptr + pid_m.to(tl.int64) * K + cols, tl.sum(sums, axis=0), mask=col_ok)
    if not DIRECT:
        finalize_amax(scratch_ptr, row_out_ptr, col_out_ptr, N_ROW, N_COL, FINAL_BLOCK, TABLE_E6)


@triton.jit
def max_mag_pairs(acc, w, HW: tl.constexpr):
    """Halfwise max of ``acc`` and the bf16 magnitudes of int32 words w (two bf16 each): unsigned 16-bit max of
    each half (one packed max on the GPU)."""
    mag = w & 0x7FFF7FFF
    if HW:
        out = tl.inline_asm_elementwise("max.u16x2 $0, $1, $2;", "=r,r,r", [acc, mag], dtype=tl.int32,
                                        is_pure=True, pack=1)
    else:
        out = tl.maximum(acc & -65536, mag & -65536) | tl.maximum(acc & 0xFFFF, mag & 0xFFFF)
    return out


@triton.jit
def rht_block_max(w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, RHT_MASK: tl.constexpr,
                   HI: tl.constexpr):
    """max |s| (int32 bits) of the 16 sums with T / 16 of one column's block: the low bf16 of words w0..w15
    (column 2p), or with HI the high one (2p + 1)."""
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = rht16_sums(
        bf16_half(w0, HI), bf16_half(w1, HI), bf16_half(w2, HI), bf16_half(w3, HI), bf16_half(w4, HI),
        bf16_half(w5, HI), bf16_half(w6, HI), bf16_half(w7, HI), bf16_half(w8, HI), bf16_half(w9, HI),
        bf16_half(w10, HI), bf16_half(w11, HI), bf16_half(w12, HI), bf16_half(w13, HI), bf16_half(w14, HI),
        bf16_half(w15, HI), RHT_MASK, True)
    return abs_max16_bits(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15)


@triton.jit
def rht_group_max(t_rht, t_row, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15,
                  ROW: tl.constexpr, RHT_MASK: tl.constexpr, HW: tl.constexpr):
    """One 16-row group of word columns (words w0..w15) folded into the running maxima of a thread: t_rht, max |s|
    (int32 bits) of the RHT sums with T / 16 of both columns of each word; with ROW, t_row, the halfwise bf16
    magnitudes of x (``max_mag_pairs``; ``halves_max_bits`` reduces them)."""
    if ROW:
        t_row = max_mag_pairs(t_row, w0, HW)
        t_row = max_mag_pairs(t_row, w1, HW)
        t_row = max_mag_pairs(t_row, w2, HW)
        t_row = max_mag_pairs(t_row, w3, HW)
        t_row = max_mag_pairs(t_row, w4, HW)
        t_row = max_mag_pairs(t_row, w5, HW)
        t_row = max_mag_pairs(t_row, w6, HW)
        t_row = max_mag_pairs(t_row, w7, HW)
        t_row = max_mag_pairs(t_row, w8, HW)
        t_row = max_mag_pairs(t_row, w9, HW)
        t_row = max_mag_pairs(t_row, w10, HW)
        t_row = max_mag_pairs(t_row, w11, HW)
        t_row = max_mag_pairs(t_row, w12, HW)
        t_row = max_mag_pairs(t_row, w13, HW)
        t_row = max_mag_pairs(t_row, w14, HW)
        t_row = max_mag_pairs(t_row, w15, HW)
    lo = rht_block_max(w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, RHT_MASK, False)
    hi = rht_block_max(w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, RHT_MASK, True)
    return tl.maximum(t_rht, tl.maximum(lo, hi)), t_row


@triton.jit
def column_pair_sums(s_lo, s_hi, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15):
    """The running fp32 sums of both bf16 columns of word columns, with the 16 rows of words w0..w15 added in row
    order."""
    s_lo = s_lo + bf16_lo(w0) + bf16_lo(w1) + bf16_lo(w2) + bf16_lo(w3) + bf16_lo(w4) + bf16_lo(w5) + bf16_lo(w6)
    s_lo = s_lo + bf16_lo(w7) + bf16_lo(w8) + bf16_lo(w9) + bf16_lo(w10) + bf16_lo(w11) + bf16_lo(w12)
    s_lo = s_lo + bf16_lo(w13) + bf16_lo(w14) + bf16_lo(w15)
    s_hi = s_hi + bf16_hi(w0) + bf16_hi(w1) + bf16_hi(w2) + bf16_hi(w3) + bf16_hi(w4) + bf16_hi(w5) + bf16_hi(w6)
    s_hi = s_hi + bf16_hi(w7) + bf16_hi(w8) + bf16_hi(w9) + bf16_hi(w10) + bf16_hi(w11) + bf16_hi(w12)
    s_hi = s_hi + bf16_hi(w13) + bf16_hi(w14) + bf16_hi(w15)
    return s_lo, s_hi


@triton.jit
def halves_max_bits(t_row):
    """The largest magnitude of ``rht_group_max``'s halfwise maxima t_row, as fp32 bits (a bf16's bits shifted up)."""
    return tl.max(tl.maximum(t_row & -65536, t_row << 16), axis=0)


@triton.jit
def amax_rht_col_kernel(x_ptr, scratch_ptr, row_out_ptr, col_out_ptr, sums_ptr, M, K, N_ROW, N_COL,
                        ROW_MODE: tl.constexpr, RHT_MASK: tl.constexpr, BLOCK_C: tl.constexpr, STEPS: tl.constexpr,
                        HW: tl.constexpr, FINAL_BLOCK: tl.constexpr = 1024, DIRECT: tl.constexpr = False,
                        SUMS: tl.constexpr = False, PDL: tl.constexpr = False):
    """The per-tensor amax of bf16(RHT(x^T)) (``AMAX_TENSOR_RHT``) and, with ROW_MODE 1, the per-tensor amax of x,
    of bf16 x (M, K) read as (M, K / 2) int32 words: BLOCK_C word columns (a word column per thread or more) x
    STEPS 16-row groups per program; M % 16 == 0. The maxima of the raw sums are finished once (``finish16_bits``),
    as in ``amax_kernel``; HW: the packed 16-bit max (GPU) for x's own amax. DIRECT: the outputs, zeroed by the
    caller and passed as int32, are the accumulators (no scratch, no finalize). SUMS: also the fp32 column sums of
    the program's rows, added in row order (``column_pair_sums``), at row g0 / STEPS of sums (programs along M, K)."""
    wait_prior_grid(PDL)
    if DIRECT:
        row_acc_ptr = row_out_ptr
        col_acc_ptr = col_out_ptr
    else:
        row_acc_ptr = scratch_ptr + 1
        col_acc_ptr = scratch_ptr + 1 + N_ROW
    wc, c_ok, g0, kw = word_column_program(K, BLOCK_C, STEPS)
    n_groups = M // 16
    t_rht = tl.zeros([BLOCK_C], tl.int32)
    t_row = tl.zeros([BLOCK_C], tl.int32)
    s_lo = tl.zeros([BLOCK_C], tl.float32)
    s_hi = tl.zeros([BLOCK_C], tl.float32)
    for step in range(STEPS):
        g = wc * 0 + (g0 + step)  # broadcast first: the interpreter takes no scalar comparison into a mask
        ok = c_ok & (g < n_groups)
        w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15 = load_words16(x_ptr, g, kw, wc, ok)
        t_rht, t_row = rht_group_max(t_rht, t_row, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15,
                                     ROW_MODE == 1, RHT_MASK, HW)
        if SUMS:
            s_lo, s_hi = column_pair_sums(s_lo, s_hi, w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14,
                                          w15)
    if ROW_MODE == 1:
        tt = halves_max_bits(t_row)
        tl.atomic_max(row_acc_ptr, tl.where(tt > 0x7F800000, 0x7FC00000, tt), sem="relaxed")
    tr = finish16_bits(tl.max(t_rht, axis=0))
    tl.atomic_max(col_acc_ptr, tl.where(tr > 0x7F800000, 0x7FC00000, tr), sem="relaxed")
    if SUMS:  # columns 2 wc and 2 wc + 1, side by side
        tl.store(sums_ptr + (g0 // STEPS) * K + tl.join(2 * wc, 2 * wc + 1), tl.join(s_lo, s_hi),
                 mask=tl.join(c_ok, c_ok))
    if not DIRECT:
        finalize_amax(scratch_ptr, row_out_ptr, col_out_ptr, N_ROW, N_COL, FINAL_BLOCK)


@triton.jit
def column_sums_kernel(part_ptr, out_ptr, P, K, BLOCK: tl.constexpr, UNROLL: tl.constexpr,
                       PDL: tl.constexpr = False):
    """out[k] = the fp32 sum of part[p, k] over p = 0, 1, .., P - 1 in that order, rounded once to out's dtype: the
    column sums of x from a SUMS amax pass's partial sums (one row per program along M). UNROLL rows' loads per
    step are issued together (the adds stay in row order; rows past P add +0.0, which changes no sum that starts
    at +0.0)."""
    wait_prior_grid(PDL)
    cols = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    ok = cols < K
    acc = tl.zeros([BLOCK], tl.float32)
    for p0 in range(0, P, UNROLL):
        for r in tl.static_range(UNROLL):
            row = cols * 0 + (p0 + r)  # broadcast first: the interpreter takes no scalar comparison into a mask
            acc += tl.load(part_ptr + row * K + cols, mask=ok & (row < P), other=0.0)
    if out_ptr.dtype.element_ty == tl.bfloat16:  # RNE on every backend (the interpreter's cast truncates)
        out = f32_to_bf16_rne(acc)
    else:
        out = acc.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + cols, out, mask=ok)


@triton.jit
def zero_kernel(a_ptr, n_a, b_ptr, n_b, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """a[:n_a] = 0 and b[:n_b] = 0 (int32): the accumulators of DIRECT amax passes (``zeroed_amaxes``)."""
    wait_prior_grid(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    zeros = tl.zeros([BLOCK], tl.int32)
    tl.store(a_ptr + offs, zeros, mask=offs < n_a)
    tl.store(b_ptr + offs, zeros, mask=offs < n_b)


ZERO_BLOCK = 1024


@functools.lru_cache(maxsize=256)
def _zero_launch(n: int, spec: tuple = ()) -> Launch:
    """The launch of ``zero_kernel`` for vectors of up to n entries; ``spec``: the :func:`arg_key` of its two lengths
    (what Triton specializes the launch on: each length's 16-divisibility, and the value 1)."""
    return Launch(zero_kernel, (triton.cdiv(n, ZERO_BLOCK),), dict(BLOCK=ZERO_BLOCK, num_warps=4))


def zeroed_amaxes(device: torch.device, n_row: int, n_col: int) -> tuple:
    """Zeroed fp32 vectors of n_row and n_col entries (0: None) for DIRECT amax passes: two tensors (a custom op's
    outputs may not alias), zeroed by one launch of ``zero_kernel`` on a GPU (whose memset then takes part in
    programmatic dependent launch, as the amax pass after it), by ``torch.zeros`` elsewhere."""
    if device.type != "cuda":
        return tuple(torch.zeros(n, dtype=torch.float32, device=device) if n else None for n in (n_row, n_col))
    row = torch.empty(n_row, dtype=torch.float32, device=device) if n_row else None
    col = torch.empty(n_col, dtype=torch.float32, device=device) if n_col else None
    if n_row or n_col:
        a = (row if row is not None else col).view(torch.int32)
        b = (col if col is not None else row).view(torch.int32)
        n_a, n_b = (n_row, n_col) if row is not None and col is not None else (n_row or n_col,) * 2
        _zero_launch(max(n_a, n_b), (arg_key(n_a), arg_key(n_b)))(a, n_a, b, n_b)
    return row, col


_SCRATCH: dict = {}


def scratch_buffer(device: torch.device, size: int) -> torch.Tensor:
    """The amax scratch (int32, zero at rest) of ``device`` and its current stream, at least ``size``
    entries, kept between calls. Launches on one stream run in order, so they never share it
    concurrently. Where a buffer must not outlive the call (:func:`~nvfp4lab.kernels.launch.keep_buffers`:
    stream capture, a compiled graph's call) the call gets a zeroed scratch of its own (a memset).
    """
    if not keep_buffers(device):
        return torch.zeros(size, dtype=torch.int32, device=device)
    stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0
    key = (device, stream)
    buffers = _SCRATCH.get(key)
    if buffers is None or buffers[-1].numel() < size:
        buffers = _SCRATCH.setdefault(key, [])
        buffers.append(torch.zeros(max(size, 4096), dtype=torch.int32, device=device))
    return buffers[-1]


def launch_amax(amax_launch, x, row_out, col_out, n_row: int, n_col: int, sums=None) -> None:
    """The one launch of ``amax_kernel`` (``amax_launch``: its :class:`~nvfp4lab.kernels.launch.Launch` for
    this shape and modes): x (M, K), the fp32 outputs (an absent one: None) of n_row / n_col amaxes
    ((3, n) tables with TABLE_E6); ``sums``: the fp32 (:func:`sums_rows`, K) partial column sums of a SUMS launch."""
    m, k = x.shape
    if amax_launch.kernel is amax_rht_col_kernel:  # bf16 pairs as int32 words
        x = x.view(torch.int32)
    if amax_launch.meta.get("DIRECT"):  # the zeroed outputs are the accumulators (int32 views)
        row_bits = row_out.view(torch.int32) if n_row else None
        col_bits = col_out.view(torch.int32) if n_col else None
        any_bits = row_bits if row_bits is not None else col_bits
        amax_launch(x, any_bits, row_bits if n_row else any_bits, col_bits if n_col else any_bits,
                    any_bits if sums is None else sums, m, k, n_row, n_col)
        return
    scratch = scratch_buffer(x.device, 1 + n_row + n_col)
    amax_launch(x, scratch, row_out if n_row else col_out, col_out if n_col else row_out,
                scratch if sums is None else sums, m, k, n_row, n_col)


def sums_rows(m: int, amax_launch) -> int:
    """The rows of a SUMS amax launch's partial column sums: its programs along M."""
    meta = amax_launch.meta
    if amax_launch.kernel is amax_rht_col_kernel:
        return triton.cdiv(triton.cdiv(m, 16), meta["STEPS"])
    return triton.cdiv(m, meta["BLOCK_M"] * meta["STEPS_M"])


# column_sums_kernel: a warp per 32 columns (many programs), 64 partial rows' loads in flight a step (the pass is
# bound by the loads' latency: a few steps at the partial rows' usual counts)
SUMS_BLOCK, SUMS_UNROLL = 32, 64


@functools.lru_cache(maxsize=256)
def _column_sums_launch(k: int, spec: tuple = ()) -> Launch:
    """The launch of ``column_sums_kernel`` over k columns; ``spec``: the :func:`arg_key` of its sizes."""
    return Launch(column_sums_kernel, (triton.cdiv(k, SUMS_BLOCK),),
                  dict(BLOCK=SUMS_BLOCK, UNROLL=SUMS_UNROLL, num_warps=1))


def launch_column_sums(partials: torch.Tensor, out: torch.Tensor) -> None:
    """out (K,) = the column sums of a SUMS amax pass's fp32 partials (P, K), in row order (one launch, right after
    the pass)."""
    p, k = partials.shape
    _column_sums_launch(k, (arg_key(p), arg_key(k), out.dtype))(partials, out, p, k)
