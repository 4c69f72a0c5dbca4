"""Outer amaxes of x (M, K) for the NVFP4 cast: per tensor, per row (M,), per column (K,), or per tensor
of the bf16 RHT output (x^T's rows transformed).

Each program folds max |x| of STEPS_M tiles (consecutive along M) by ``atomic_max`` into the int32
accumulators of a scratch buffer (|x| >= 0, so int order is float order; NaN bits beat inf as
torch.amax's NaN). The last program to finish (a ticket counter in the same buffer) moves the maxima
into the fp32 outputs and sets the accumulators and the counter back to 0 (``finalize_amax``), so the
scratch is zero between launches and no memset runs per call: one launch for the whole pass.

The value atomics are relaxed (the default acq_rel ordering puts a memory barrier around each one, and
the per-token pass issues one per row and column); each program orders them before its ticket with a
barrier and the ticket's acq_rel, so the last program reads every maximum.

Scratch layout (int32, on the launch's device and stream, zero at rest): [ticket, row accumulators
(N_ROW), column accumulators (N_COL)] (``scratch_buffer``).
"""
import torch
import triton
import triton.language as tl

from .._codecs import soft_bf16_loads
from .common import abs_bits, load_rows, program_columns
from .rht import rht_tile

# amax modes of the two outputs (see nvfp4lab.kernels.nvfp4_quantize.nvfp4_amax)
AMAX_NONE, AMAX_TENSOR, AMAX_PER_TOKEN, AMAX_TENSOR_RHT = 0, 1, 2, 3


@triton.jit
def finalize_amax(scratch_ptr, row_out_ptr, col_out_ptr, N_ROW, N_COL, BLOCK: tl.constexpr):
    """Called by every program after its last atomic: the last program to arrive copies the N_ROW + N_COL
    accumulators (scratch[1:]) into the fp32 outputs and zeroes them and the ticket (scratch[0])."""
    tl.debug_barrier()  # every thread's atomics are issued before the ticket
    ticket = tl.atomic_add(scratch_ptr, 1, sem="acq_rel")
    if ticket == tl.num_programs(0) - 1:
        total = N_ROW + N_COL
        for start in range(0, total, BLOCK):
            idx = start + tl.arange(0, BLOCK)
            ok = idx < total
            bits = tl.atomic_xchg(scratch_ptr + 1 + idx, tl.zeros_like(idx).to(tl.int32), mask=ok, sem="relaxed")
            value = bits.to(tl.float32, bitcast=True)
            tl.store(row_out_ptr + idx, value, mask=idx < N_ROW)
            tl.store(col_out_ptr + (idx - N_ROW), value, mask=ok & (idx >= N_ROW))
        tl.atomic_xchg(scratch_ptr, 0, sem="relaxed")


@triton.jit
def amax_kernel(
    x_ptr, scratch_ptr, row_out_ptr, col_out_ptr, M, K, N_ROW, N_COL,
    ROW_MODE: tl.constexpr, COL_MODE: tl.constexpr, TENSOR_AMAX: tl.constexpr, RHT_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT_BF16: tl.constexpr, STEPS_M: tl.constexpr = 1,
    FINAL_BLOCK: tl.constexpr = 1024, SOFT_BF16: tl.constexpr = False,
):
    """Folds max |x| of STEPS_M tiles (consecutive along M) into the scratch accumulators, then
    ``finalize_amax``. Per-tensor and per-column maxima are carried across the steps in registers, so
    one program issues one atomic per output (same-address atomics serialize in L2)."""
    row_amax_ptr = scratch_ptr + 1
    col_amax_ptr = scratch_ptr + 1 + N_ROW
    pid_m, pid_k, cols, col_ok = program_columns(K, BLOCK_K)
    # maxima are carried elementwise across the steps and reduced once at the end (a reduction along
    # M crosses warps through shared memory)
    t = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
    t_rht = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
    for step in tl.static_range(STEPS_M):
        rows = ((pid_m * STEPS_M + step) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_ok, xf = load_rows(x_ptr, rows, cols, col_ok, M, K, SOFT_BF16)
        mag = abs_bits(xf)  # |x| bits
        if TENSOR_AMAX or COL_MODE == 2:
            t = tl.maximum(t, mag)
        if ROW_MODE == 2:
            r = tl.max(mag, axis=1)
            r = tl.where(r > 0x7F800000, 0x7FC00000, r)
            tl.atomic_max(row_amax_ptr + rows, r, mask=row_ok, sem="relaxed")
        if COL_MODE == 3:
            y = rht_tile(xf, BLOCK_M, RHT_MASK, x_ptr.dtype.element_ty == tl.bfloat16, DOT_BF16)
            t_rht = tl.maximum(t_rht, abs_bits(y))
    if TENSOR_AMAX:
        tt = tl.max(tl.max(t, axis=1), axis=0)
        tt = tl.where(tt > 0x7F800000, 0x7FC00000, tt)
        if ROW_MODE == 1:
            tl.atomic_max(row_amax_ptr, tt, sem="relaxed")
        if COL_MODE == 1:
            tl.atomic_max(col_amax_ptr, tt, sem="relaxed")
    if COL_MODE == 3:
        tr = tl.max(tl.max(t_rht, axis=1), axis=0)
        tl.atomic_max(col_amax_ptr, tl.where(tr > 0x7F800000, 0x7FC00000, tr), sem="relaxed")
    if COL_MODE == 2:
        c = tl.max(t, axis=0)
        c = tl.where(c > 0x7F800000, 0x7FC00000, c)
        tl.atomic_max(col_amax_ptr + cols, c, mask=col_ok, sem="relaxed")
    finalize_amax(scratch_ptr, row_out_ptr, col_out_ptr, N_ROW, N_COL, FINAL_BLOCK)


_SCRATCH: dict = {}


def scratch_buffer(device: torch.device, size: int) -> torch.Tensor:
    """The amax scratch (int32, zero at rest) of ``device`` and its current stream, at least ``size``
    entries. Launches on one stream run in order, so they never share it concurrently (CUDA graphs
    captured on one stream share its buffer: do not replay them concurrently on different streams).
    A buffer that a larger one replaces stays referenced, since a captured graph may still use it."""
    stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0
    key = (device, stream)
    buffers = _SCRATCH.get(key)
    if buffers is None or buffers[-1].numel() < size:
        buffers = _SCRATCH.setdefault(key, [])
        buffers.append(torch.zeros(max(size, 4096), dtype=torch.int32, device=device))
    return buffers[-1]


def launch_amax(x, row_out, col_out, grid, meta: dict) -> None:
    """The one launch of ``amax_kernel``: x (M, K), the fp32 outputs (an absent one is a (0,) tensor),
    the grid and ``opt_flags.amax_meta``'s constexprs."""
    m, k = x.shape
    n_row, n_col = row_out.numel(), col_out.numel()
    scratch = scratch_buffer(x.device, 1 + n_row + n_col)
    amax_kernel[grid](x, scratch, row_out if n_row else col_out, col_out if n_col else row_out, m, k, n_row, n_col,
                      **meta, SOFT_BF16=soft_bf16_loads(x.device), enable_fp_fusion=False)
