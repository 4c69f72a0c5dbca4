"""Outer amaxes of x (M, K) for the NVFP4 cast: per tensor, per row (M,), per column (K,), or per tensor
of the bf16 RHT output (x^T's rows transformed).

Each program folds max |x| of STEPS_M tiles (consecutive along M) into zeroed fp32 buffers by
``atomic_max`` on their int32 view (|x| >= 0, so int order is float order; NaN bits beat inf as
torch.amax's NaN). The atomics are relaxed: only the next launch reads the maxima, and the default
acq_rel ordering puts a memory barrier around each one (the per-token pass issues one per row and column).
"""
import triton
import triton.language as tl

from .common import abs_bits, load_rows, program_columns
from .rht import rht_tile

# amax modes of the two outputs (see nvfp4lab.kernels.nvfp4_quantize.nvfp4_amax)
AMAX_NONE, AMAX_TENSOR, AMAX_PER_TOKEN, AMAX_TENSOR_RHT = 0, 1, 2, 3


@triton.jit
def amax_kernel(
    x_ptr, row_amax_ptr, col_amax_ptr, M, K,
    ROW_MODE: tl.constexpr, COL_MODE: tl.constexpr, TENSOR_AMAX: tl.constexpr, RHT_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT_BF16: tl.constexpr, STEPS_M: tl.constexpr = 1,
):
    """Folds max |x| of STEPS_M tiles (consecutive along M) into the int32 views of the amax buffers
    (zeroed by the caller). Per-tensor and per-column maxima are carried across the steps in
    registers, so one program issues one atomic per output (same-address atomics serialize in L2)."""
    pid_m, pid_k, cols, col_ok = program_columns(K, BLOCK_K)
    # maxima are carried elementwise across the steps and reduced once at the end (a reduction along
    # M crosses warps through shared memory)
    t = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
    t_rht = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
    for step in tl.static_range(STEPS_M):
        rows = ((pid_m * STEPS_M + step) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_ok, xf = load_rows(x_ptr, rows, cols, col_ok, M, K)
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


def launch_amax(x, row_view, col_view, grid, meta: dict) -> None:
    """The one launch of ``amax_kernel``: x (M, K), the int32 views of the zeroed amax buffers (an absent
    one gets the other's view, never touched), the grid and ``opt_flags.amax_meta``'s constexprs."""
    m, k = x.shape
    amax_kernel[grid](x, row_view, col_view, m, k, **meta, enable_fp_fusion=False)
