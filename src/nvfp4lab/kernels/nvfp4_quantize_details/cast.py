"""The cast pass of the NVFP4 quantize (single and grouped): output buffers, the choice of kernel and
launches (``opt_flags``), the per-token tables, and the SR seed."""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import torch

from ...layout import roundup
from ...runtime import SEED_BOUND, device_seed
from ..formats import soft_bf16_loads
from ..launch import Launch, aligned, arg_key, tracing
from ..swizzle import swizzle_launch
from . import opt_flags
from .cast16 import cast16_kernel
from .cast_col import cast_col_grid, cast_col_kernel
from .cast_row import TABLE_ENTRIES, cast_row_grid, cast_row_kernel, row_factor_table, row_factor_table_kernel
from .cast_rowcol import (
    cast_rowcol_grid,
    cast_rowcol_kernel,
    col_scales_grid,
    col_scales_kernel,
    factor_tables,
    factor_tables_kernel,
    launch_rowcol,
)
from .four_over_six import four_over_six_1x16_kernel, four_over_six_kernel
from .pt_scales import pt_scales_grid, pt_scales_kernel, pt_scales_tables

FOUR_OVER_SIX_CODES = {None: 0, "mae": 1, "mse": 2}


def uninitialized(shape, device, poison: bool = False) -> torch.Tensor:
    """A uint8 output the kernels write in full; ``poison`` fills it with 0xFF first, so that tests see
    every byte a kernel should write but does not."""
    out = torch.empty(shape, dtype=torch.uint8, device=device)
    return out.fill_(0xFF) if poison else out


def scale_shape(rows: int, cols: int, layout: str) -> tuple[int, int]:
    return (rows, cols) if layout == "compact" else (roundup(rows, 128), roundup(cols, 4))


def scale_buffer(rows: int, cols: int, layout: str, device, poison: bool = False) -> torch.Tensor:
    """Scale output for an (rows, cols) compact matrix; zero-filled only where padding exists."""
    shape = scale_shape(rows, cols, layout)
    if shape == (rows, cols):
        return uninitialized(shape, device, poison)
    return torch.zeros(shape, dtype=torch.uint8, device=device)


def cast_shapes(m: int, k: int, rowwise: bool, columnwise: bool, layout: str,
                operands: tuple = (False, False)) -> list:
    """Shapes of (row_data, row_scale, col_data, col_scale); absent outputs are (0,). A side cast as the
    BF16 GEMM operand (``operands``: rowwise, columnwise) has data (M, K) / (K, M) and no scales."""
    row_op, col_op = operands
    return [
        ((m, k) if row_op else (m, k // 2)) if rowwise else (0,),
        scale_shape(m, k // 16, layout) if rowwise and not row_op else (0,),
        ((k, m) if col_op else (k, m // 2)) if columnwise else (0,),
        scale_shape(k, m // 16, layout) if columnwise and not col_op else (0,),
    ]


def cast_dtypes(operands: tuple = (False, False)) -> tuple:
    """Dtypes of (row_data, row_scale, col_data, col_scale): uint8, but BF16 data for a side cast as the GEMM
    operand (``operands``: rowwise, columnwise)."""
    return (torch.bfloat16 if operands[0] else torch.uint8, torch.uint8,
            torch.bfloat16 if operands[1] else torch.uint8, torch.uint8)


def draw_seed(x: torch.Tensor, generator: Optional[torch.Generator] = None,
              traced: Optional[bool] = None) -> tuple[Optional[torch.Tensor], int]:
    """The SR seed of a cast of ``x``, as (int64 (1,) device tensor, 0) or (None, int): drawn from
    ``generator`` (torch's default generator of x's device when None).

    As a tensor on x's device (the kernel reads it from memory) whenever the call may be replayed or
    traced: a CUDA generator, CUDA-graph capture, torch.compile (also on the CPU, with a generator of
    x's device: reading a host int would break the graph). Otherwise on the host from the CPU generator (no kernel launch): eager
    calls on CUDA tensors with ``generator=None`` then follow ``torch.manual_seed``, which seeds both
    generators. ``traced``: the caller's ``tracing(x)``, if known."""
    device = x.device
    generator_device = generator.device.type if generator is not None else device.type
    on_device = generator_device != "cpu"
    if traced is None:
        traced = tracing(x)
    if ((on_device and (generator is not None or traced or torch.cuda.is_current_stream_capturing()))
            or (traced and generator_device == device.type)):
        return device_seed(device, generator), 0
    return None, int(torch.randint(0, SEED_BOUND, (1,), dtype=torch.int64, generator=generator))


def seed_args(config, x: torch.Tensor, seed, generator, traced: bool) -> tuple:
    """A quantize call's SR seed arguments for ``config`` (an NVFP4QuantConfig), as its cast takes them (seed_tensor
    or None, int seed): the caller's ``seed`` (an int, or an int64 one-element tensor on x's device, which the kernel
    reads), else one drawn (:func:`draw_seed`); (None, 0) without stochastic rounding. ``traced``: the caller's
    ``tracing(x)``."""
    if not config.stochastic_rounding:
        return None, 0
    if isinstance(seed, torch.Tensor):  # a view at an address the launches do not specialize on is copied first
        return (seed.reshape(1) if aligned(seed) else seed.reshape(1).clone()), 0
    if seed is not None:
        return None, int(seed) % (1 << 63)
    return draw_seed(x, generator, traced)


def check_cast_args(rowwise, columnwise, block_2d, per_token, rht_sign_mask, four_over_six,
                    stochastic_rounding, pr3045: bool = False, operands: tuple = (False, False)) -> None:
    """The recipe rules the cast kernels rely on (those of ``NVFP4QuantConfig``), for direct op calls."""
    rht = rht_sign_mask >= 0
    if any(operands) and four_over_six:
        raise ValueError("BF16 operand outputs are cast by cast16_kernel: recipes without four_over_six only")
    if four_over_six not in (0, 1, 2):
        raise ValueError(f"four_over_six must be 0 (off), 1 (MAE) or 2 (MSE), got {four_over_six!r}")
    if four_over_six and (rht or stochastic_rounding):
        raise ValueError("four_over_six takes neither RHT (rht_sign_mask >= 0) nor stochastic_rounding")
    if pr3045 and (not per_token or block_2d or four_over_six):
        raise ValueError("pr3045 (PR 3045's numerics) is the per-token 1x16 cast: per_token, no 16x16 blocks, no 4over6")
    if rht and (block_2d or (per_token and not pr3045)):
        raise ValueError("RHT (rht_sign_mask >= 0) takes neither 16x16 blocks nor per_token (but PR 3045's fp32 RHT: pr3045)")


class CastStep(NamedTuple):
    """One launch of a cast: the cast kernel, preceded for per-token casts by the launch that fills the
    (3, n) global-scale tables of its row (n_row) and / or column (n_col) amaxes (for the per-tensor
    ``cast_row_kernel``: the launch of its factor table, n_row = 0, or of both launches' tables,
    ``factor_tables_kernel``, whose columnwise one the next step's ``cast_col_kernel`` reads: it then has no
    launch of its own); for ``cast_rowcol_kernel``, ``finish`` holds
    the launches after it (``cast_rowcol.launch_rowcol``: its columnwise scales, the swizzle of its rowwise ones or
    None)."""
    cast: Launch
    tables: Optional[Launch]
    rowwise: bool
    columnwise: bool
    n_row: int
    n_col: int
    finish: tuple = ()


@functools.lru_cache(maxsize=4096)
def cast_plan(m, k, rowwise, columnwise, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max,
              stochastic_rounding, seed_from_ptr, scale_layout, num_splits, split_steps, block_m, block_k, num_warps,
              pr3045, spec, operands: tuple = (False, False), graphed: bool = False) -> tuple:
    """The launches (:class:`CastStep`) of a cast: ``cast_row_kernel`` for the rowwise-only casts and split casts'
    rowwise launches of ``opt_flags.use_cast_row`` (its factor table or per-token tables first),
    ``cast_rowcol_kernel`` for the row+col casts of ``opt_flags.use_cast_rowcol`` (its two factor tables first,
    ``col_scales_kernel`` after it),
    ``cast16_kernel`` (per-token tables first) or ``four_over_six_kernel``, in one or two launches
    (``opt_flags.split_cast``). ``split_steps`` None: the single cast; else the grouped cast of ``num_splits``
    splits. ``spec``: the specialization of the caller's tensors and ints (part of the cache key only, see
    :class:`~nvfp4lab.kernels.launch.Launch`).
    ``pr3045``: PR 3045's numerics (per-token casts). ``operands``: the sides (rowwise, columnwise) cast as BF16
    GEMM operands (through ``cast16_kernel`` only; the columnwise one for single casts only). ``graphed``: launched
    into a CUDA-graph capture (``opt_flags.split_cast``)."""
    check_cast_args(rowwise, columnwise, block_2d, per_token, rht_sign_mask, four_over_six, stochastic_rounding, pr3045,
                    operands)
    grouped = split_steps is not None
    if operands[1] and grouped:
        raise ValueError("a columnwise BF16 operand output is for single casts, not grouped ones")
    tile = dict(block_k=block_k, num_warps=num_warps)
    if opt_flags.split_cast(m, k, rowwise, columnwise, block_2d, rht_sign_mask >= 0, stochastic_rounding,
                            four_over_six, grouped, graphed):
        sides = ((True, False), (False, True))
    else:
        sides = ((rowwise, columnwise),)
    if opt_flags.use_cast_rowcol(m, k, rowwise, columnwise, block_2d, per_token, four_over_six, rht_sign_mask >= 0,
                                 stochastic_rounding, grouped, pr3045, spec[1] == torch.bfloat16, spec[2], operands):
        swizzle_rows = scale_layout == "swizzled"  # rowwise scales written compact, then swizzled
        meta = opt_flags.cast_rowcol_meta(m, k, "compact" if swizzle_rows else scale_layout, block_m=block_m, **tile)
        tables = Launch(factor_tables_kernel, (2,), opt_flags.row_factor_table_meta(e4m3_max))
        scales_meta = opt_flags.col_scales_meta(scale_layout)
        finish = (Launch(col_scales_kernel, col_scales_grid(m, k, scales_meta), scales_meta),
                  swizzle_launch(m, k // 16) if swizzle_rows else None)
        return (CastStep(Launch(cast_rowcol_kernel, cast_rowcol_grid(m, k, meta), meta), tables, True, True, 0, 0,
                         finish),)
    steps = []
    split = len(sides) == 2
    # a split SR cast's columnwise launch on cast_col_kernel reads a factor table: the rowwise one's comes with it
    tables_shared = split and stochastic_rounding and opt_flags.use_cast_col(
        m, k, False, True, block_2d, per_token, four_over_six, rht_sign_mask >= 0, grouped, pr3045,
        spec[1] == torch.bfloat16, spec[2])
    for row_side, col_side in sides:
        if (row_side and not col_side
                and opt_flags.use_cast_row(m, k, True, False, block_2d, per_token, four_over_six, stochastic_rounding,
                                           grouped, pr3045, spec[1] == torch.bfloat16, spec[2], split, tables_shared)):
            meta = opt_flags.cast_row_meta(m, k, scale_layout, per_token, e4m3_max, stochastic_rounding, seed_from_ptr,
                                           block_m=block_m, **tile, operand=operands[0])
            if per_token:  # the per-row tables (n_row = m marks them)
                tables_meta = opt_flags.pt_scales_meta(meta["E6"])
                table = Launch(pt_scales_kernel, pt_scales_grid(m, 0, tables_meta), tables_meta)
            elif tables_shared:  # both launches' factor tables in one launch
                table = Launch(factor_tables_kernel, (2,), opt_flags.row_factor_table_meta(e4m3_max))
            else:
                table = Launch(row_factor_table_kernel, (1,), opt_flags.row_factor_table_meta(e4m3_max))
            steps.append(CastStep(Launch(cast_row_kernel, cast_row_grid(m, k, meta), meta), table, True, False,
                                  m if per_token else 0, 0))
        elif opt_flags.use_cast_col(m, k, row_side, col_side, block_2d, per_token, four_over_six, rht_sign_mask >= 0,
                                  grouped, pr3045, spec[1] == torch.bfloat16, spec[2]):
            meta = opt_flags.cast_col_meta(m, k, scale_layout, rht_sign_mask, e4m3_max, stochastic_rounding,
                                           seed_from_ptr, block_m=block_m, **tile, operand=operands[1])
            shared = bool(steps) and steps[0].cast.kernel is cast_row_kernel and tables_shared
            table = (Launch(row_factor_table_kernel, (1,), opt_flags.row_factor_table_meta(e4m3_max))
                     if meta["TABLE"] and not shared else None)
            steps.append(CastStep(Launch(cast_col_kernel, cast_col_grid(m, k, meta), meta), table, False, True, 0, 0))
        elif opt_flags.use_cast16(four_over_six):
            meta = opt_flags.cast16_meta(m, k, row_side, col_side, block_2d, per_token, rht_sign_mask, e4m3_max,
                                         stochastic_rounding, seed_from_ptr, scale_layout, split_steps=split_steps,
                                         block_m=block_m, **tile, pr3045=pr3045, row_operand=operands[0],
                                         col_operand=operands[1])
            meta["SOFT_BF16"] = soft_bf16_loads(spec[0])
            tables = None
            n_row = m if per_token and row_side else 0
            n_col = (k * num_splits if grouped else k) if per_token and col_side else 0
            if per_token:  # the kernel then reads the tables through the amax pointers
                tables_meta = opt_flags.pt_scales_meta(meta["E6"], pr3045)
                tables = Launch(pt_scales_kernel, pt_scales_grid(n_row, n_col, tables_meta), tables_meta)
            steps.append(CastStep(Launch(cast16_kernel, opt_flags.cast16_grid(m, k, meta), meta), tables, row_side,
                                  col_side, n_row, n_col))
        elif opt_flags.use_four_over_six_1x16(m, k, row_side, col_side, block_2d, grouped, spec[1] == torch.bfloat16,
                                              spec[2], graphed):
            for columnwise_out, on in ((False, row_side), (True, col_side)):
                if on:
                    meta = opt_flags.four_over_six_1x16_meta(m, k, columnwise_out, per_token, four_over_six, e4m3_max,
                                                             scale_layout, block_m=block_m, **tile)
                    steps.append(CastStep(Launch(four_over_six_1x16_kernel, opt_flags.four_over_six_1x16_grid(m, k, meta),
                                                 meta), None, not columnwise_out, columnwise_out, 0, 0))
        else:
            meta = opt_flags.four_over_six_meta(m, k, row_side, col_side, block_2d, per_token, four_over_six, e4m3_max,
                                                scale_layout, split_steps=split_steps, block_m=block_m, **tile)
            meta["SOFT_BF16"] = soft_bf16_loads(spec[0])
            steps.append(CastStep(Launch(four_over_six_kernel, opt_flags.four_over_six_grid(m, k, meta), meta), None,
                                  row_side, col_side, 0, 0))
    return tuple(steps)


def cast_steps(x, seed_tensor, seed, rowwise, columnwise, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max,
               stochastic_rounding, scale_layout, offsets=None, num_splits=0, split_steps=None, group_split=None,
               block_m: int = 0, block_k: int = 0, num_warps: int = 0, pr3045: bool = False,
               amax_aligned: tuple = (True, True), operands: tuple = (False, False), graphed: bool = False) -> tuple:
    """The :class:`CastStep` launches of :func:`launch_cast`'s cast (its arguments; ``amax_aligned``:
    whether the row / column amax tensors are 16-byte aligned; ``graphed``: launched into a CUDA-graph capture)."""
    m, k = x.shape
    seed_from_ptr = seed_tensor is not None
    spec = (x.device, x.dtype, aligned(x), arg_key(seed), seed_from_ptr,
            offsets is not None and aligned(offsets), group_split is not None and aligned(group_split), *amax_aligned)
    return cast_plan(m, k, rowwise, columnwise, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max,
                     stochastic_rounding, seed_from_ptr, scale_layout, num_splits, split_steps, block_m, block_k,
                     num_warps, pr3045, spec, operands, graphed)


def run_cast(steps: tuple, x, outputs, row_amax, col_amax, seed_tensor, seed, offsets=None, num_splits=0,
             group_split=None, tables: bool = False) -> None:
    """Launch the cast ``steps`` (from :func:`cast_steps`) into ``outputs``; arguments as :func:`launch_cast`'s."""
    m, k = x.shape
    any_out = next(o for o in outputs if o is not None)
    col_table = None  # the columnwise launch's factor table, made with the rowwise one's
    for step in steps:
        if step.cast.kernel is cast_row_kernel:  # x and the data as int32 words, the tables from the amax
            if step.n_row:
                table = row_amax if tables else pt_scales_tables(step.tables, row_amax, step.n_row, None, 0)[0]
            elif step.tables.kernel is factor_tables_kernel:
                table = factor_tables(step.tables, row_amax, col_amax)
                col_table = table[TABLE_ENTRIES:]
            else:
                table = row_factor_table(step.tables, row_amax)
            # (an operand output has no scales: the data's pointer stands in, not written)
            step.cast(x.view(torch.int32), outputs[0].view(torch.int32), outputs[1] if outputs[1] is not None else any_out,
                      table, seed_tensor if seed_tensor is not None else x, seed, m, k)
            continue
        if step.cast.kernel is cast_rowcol_kernel:  # x and the data as words, both tables from the amaxes
            launch_rowcol(step.cast, *step.finish, x.view(torch.int32), outputs[0].view(torch.int16), outputs[1],
                          outputs[2].view(torch.int32), outputs[3], factor_tables(step.tables, row_amax, col_amax), m, k)
            continue
        if step.cast.kernel is cast_col_kernel:  # x and the data as int32 words, from the column amax
            if step.tables is not None:
                table = row_factor_table(step.tables, col_amax)
            else:
                table = col_table if col_table is not None else col_amax
            step.cast(x.view(torch.int32), outputs[2].view(torch.int32), outputs[3] if outputs[3] is not None else any_out,
                      table, col_amax, seed_tensor if seed_tensor is not None else x, seed, m, k, m // 8)
            continue
        if step.cast.kernel is four_over_six_1x16_kernel:  # one output; x and the data as int32 words
            if step.rowwise:
                step.cast(x.view(torch.int32), outputs[0].view(torch.int32), outputs[1], row_amax, m, k, m // 8)
            else:
                step.cast(x.view(torch.int32), outputs[2].view(torch.int32), outputs[3], col_amax, m, k, m // 8)
            continue
        row_in = row_amax if step.rowwise else None
        col_in = col_amax if step.columnwise else None
        if step.tables is not None and not tables:
            row_in, col_in = pt_scales_tables(step.tables, row_in, step.n_row, col_in, step.n_col)
        any_f32 = row_in if row_in is not None else col_in
        row_data, row_scale, col_data, col_scale = (o if o is not None else any_out for o in outputs)
        if step.rowwise and row_data.dtype == torch.uint8:  # packed codes as int32 words (operands: bf16)
            row_data = row_data.view(torch.int32)
        if step.columnwise and col_data.dtype == torch.uint8:
            col_data = col_data.view(torch.int32)
        # absent outputs get a present one's pointer, never written
        step.cast(
            x,
            row_data if step.rowwise else col_data, row_scale if step.rowwise else col_scale,
            col_data if step.columnwise else row_data, col_scale if step.columnwise else row_scale,
            row_in if row_in is not None else any_f32, col_in if col_in is not None else any_f32,
            *((seed_tensor if seed_tensor is not None else x, seed) if step.cast.kernel is cast16_kernel else ()),
            m, k, offsets if offsets is not None else x, group_split if group_split is not None else x, num_splits,
        )


def launch_cast(x, outputs, row_amax, col_amax, seed_tensor, seed, rowwise, columnwise, block_2d, per_token,
                rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding, scale_layout,
                offsets=None, num_splits=0, split_steps=None, group_split=None,
                block_m: int = 0, block_k: int = 0, num_warps: int = 0, tables: bool = False,
                pr3045: bool = False, operands: tuple = (False, False)) -> None:
    """Launch the cast of a recipe into ``outputs`` = (row_data, row_scale, col_data, col_scale) (absent
    ones: None) from the fp32 outer amaxes (absent: None). ``offsets`` (int64 split row offsets) with
    ``group_split`` (the grouped amax pass's int32 split of each 16-row group) and ``split_steps``
    (2^split_steps >= num_splits) makes it the grouped cast. block_m, block_k, num_warps: an explicit
    tile (0: opt_flags' choice). ``tables``: per-token amaxes given as the cast's (3, n) tables (from
    the amax pass), so no table launch runs. ``pr3045``: PR 3045's numerics (per-token casts). ``operands``:
    the sides (rowwise, columnwise) written as BF16 GEMM operands (:func:`cast_shapes`)."""
    steps = cast_steps(x, seed_tensor, seed, rowwise, columnwise, block_2d, per_token, rht_sign_mask, four_over_six,
                       e4m3_max, stochastic_rounding, scale_layout, offsets, num_splits, split_steps, group_split,
                       block_m, block_k, num_warps, pr3045,
                       (row_amax is not None and aligned(row_amax), col_amax is not None and aligned(col_amax)),
                       operands, x.is_cuda and torch.cuda.is_current_stream_capturing())
    run_cast(steps, x, outputs, row_amax, col_amax, seed_tensor, seed, offsets, num_splits, group_split, tables)
