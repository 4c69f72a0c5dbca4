"""Per-token global scales computed once per row or column for ``cast16_kernel``.

``pt_scales_kernel`` (a tiny launch over the (M,) row or (K,) column amaxes, grouped (n, K) included)
writes (3, N) tables [amax, fl(S_enc * fl(1/6)), S_dec] that the cast loads instead of dividing for
them per row and column of every tile; the values are bit for bit those the cast would compute. S_dec
-1 marks an amax outside the normal range, so the tile's ``normal_range`` decision is the same one,
and EXACT tiles still recompute from the amax. With PR 3045's numerics (PR3045) the third plane holds
S_enc itself (its encode factor is S_enc / s) and the range test is on the floored amax.
"""
import torch
import triton
import triton.language as tl

from ...layout import cdiv
from ..pdl import wait_prior_grid
from .common import ONE_SIXTH, global_encode_pr3045, global_scales, in_normal_range, pr3045_floor


@triton.jit
def normal_range_pt(s_dec):
    """``normal_range`` of a tile read from per-token tables (``pt_scales_kernel``): there S_dec is
    stored negated (-1) for an outer amax outside the normal range, and is > 0 for every other one
    (S_enc in (0, FLT_MAX] for amax 0 or in [2^-100, 2^100]); masked rows/columns load 1."""
    return tl.min((s_dec > 0.0).to(tl.int32)) == 1


@triton.jit
def pt_table_load(table_ptr, idx, n, ok):
    """(fl(S_enc * fl(1/6)), S_dec, normal range?) of entries ``idx`` of a per-token table of length n
    (planes 1 and 2; plane 0, the amax, only EXACT tiles read). Masked entries load S_dec 1, in
    range, as ``normal_range`` counts them (their amax loads as 0)."""
    enc6 = tl.load(table_ptr + (idx + n), mask=ok, other=0.0)
    s_dec = tl.load(table_ptr + ((idx + n) + n), mask=ok, other=1.0)
    return enc6, s_dec, normal_range_pt(s_dec)


@triton.jit
def pt_scales_kernel(row_amax_ptr, row_table_ptr, N_ROW, col_amax_ptr, col_table_ptr, N_COL, E6: tl.constexpr,
                     BLOCK: tl.constexpr, PR3045: tl.constexpr = False, PDL: tl.constexpr = False):
    """Per-token global scales, once per row or column instead of once per block (``cast16_kernel``
    with PER_TOKEN), of two amax vectors in one launch (programs past the row vector's take the column
    vector): amax (N,) -> table (3, N) = [amax, fl(S_enc * fl(1/6)), S_dec], with S_dec replaced by -1
    where the amax is outside the normal range (``in_normal_range``), which ``normal_range_pt`` reads
    as the tile's EXACT flag. S_enc and S_dec are those of ``_scale_and_factor_fast``: the same
    ``global_scales`` (div_rn) and product, op for op, hence the same bits; EXACT tiles recompute
    theirs in fp64 from the amax (plane 0), so their out-of-range values here are never read."""
    wait_prior_grid(PDL)
    pid = tl.program_id(0).to(tl.int64)
    row_programs = tl.cdiv(N_ROW, BLOCK)
    if pid < row_programs:
        amax_ptr, table_ptr, n, offs = row_amax_ptr, row_table_ptr, N_ROW, pid * BLOCK + tl.arange(0, BLOCK)
    else:
        amax_ptr, table_ptr, n = col_amax_ptr, col_table_ptr, N_COL
        offs = (pid - row_programs) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    outer = tl.load(amax_ptr + offs, mask=ok, other=0.0)
    if PR3045:  # plane 2 = S_enc (the encode factor is S_enc / s); the floored amax is never 0
        s_enc = global_encode_pr3045(outer, False)
        third = s_enc
        in_range = in_normal_range(pr3045_floor(outer))
    else:
        s_enc, third = global_scales(outer, E6, False)
        in_range = in_normal_range(outer)
    tl.store(table_ptr + offs, outer, mask=ok)
    tl.store(table_ptr + (offs + n), s_enc * ONE_SIXTH, mask=ok)
    tl.store(table_ptr + ((offs + n) + n), tl.where(in_range, third, -1.0), mask=ok)


def pt_scales_grid(n_row: int, n_col: int, meta: dict) -> tuple[int]:
    return (cdiv(n_row, meta["BLOCK"]) + cdiv(n_col, meta["BLOCK"]),)


def pt_scales_tables(tables_launch, row_amax, n_row: int, col_amax, n_col: int) -> tuple:
    """The (3, n) fp32 tables [amax, fl(S_enc * fl(1/6)), S_dec or -1] of per-token amaxes (n,) that
    ``cast16_kernel`` reads for per-token casts, for the row and/or column amax (None: absent, returned
    as None), in one tiny launch of ``tables_launch`` (a :class:`~nvfp4lab.kernels.launch.Launch` of
    ``pt_scales_kernel`` for these n_row, n_col; no host sync)."""
    tables = []
    for amax, n in ((row_amax, n_row), (col_amax, n_col)):
        if amax is not None and amax.numel() != n:
            raise ValueError(f"per-token amax has {amax.numel()} values, expected {n}")
        tables.append(None if amax is None else torch.empty((3, n), dtype=torch.float32, device=amax.device))
    n_row, n_col = (n_row if row_amax is not None else 0), (n_col if col_amax is not None else 0)
    if n_row + n_col:
        any_amax = row_amax if n_row else col_amax
        any_table = tables[0] if n_row else tables[1]
        tables_launch(row_amax if n_row else any_amax, tables[0] if n_row else any_table, n_row,
                      col_amax if n_col else any_amax, tables[1] if n_col else any_table, n_col)
    return tables[0], tables[1]
