"""The cast pass of the NVFP4 quantize (single and grouped): output buffers, the choice of kernel and
launches (``opt_flags``), the per-token tables, and the SR seed."""
from __future__ import annotations

from typing import Optional

import torch

from ...ref.swizzle import roundup
from ..launch import tracing
from . import opt_flags
from .cast16 import launch_cast16
from .four_over_six import launch_four_over_six
from .pt_scales import pt_scales_tables

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


def cast_shapes(m: int, k: int, rowwise: bool, columnwise: bool, layout: str) -> list:
    """Shapes of (row_data, row_scale, col_data, col_scale); absent outputs are (0,)."""
    return [
        (m, k // 2) if rowwise else (0,),
        scale_shape(m, k // 16, layout) if rowwise else (0,),
        (k, m // 2) if columnwise else (0,),
        scale_shape(k, m // 16, layout) if columnwise else (0,),
    ]


def draw_seed(x: torch.Tensor, generator: Optional[torch.Generator] = None) -> tuple[Optional[torch.Tensor], int]:
    """The SR seed of a cast of ``x``, as (int64 (1,) device tensor, 0) or (None, int): drawn from
    ``generator`` (torch's default generator of x's device when None).

    On the device (the kernel reads it from memory) whenever the call may be replayed or traced: a
    CUDA generator, CUDA-graph capture, torch.compile. Otherwise on the host from the CPU generator
    (no kernel launch): eager calls on CUDA tensors with ``generator=None`` then follow
    ``torch.manual_seed``, which seeds both generators."""
    device = x.device
    on_device = generator.device.type != "cpu" if generator is not None else device.type == "cuda"
    if on_device and (generator is not None or tracing(x) or torch.cuda.is_current_stream_capturing()):
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device, generator=generator)
        return seed, 0
    return None, int(torch.randint(0, 2**62, (1,), dtype=torch.int64, generator=generator))


def check_cast_args(rowwise, columnwise, block_2d, per_token, rht_sign_mask, four_over_six,
                    stochastic_rounding, pr3045: bool = False) -> None:
    """The recipe rules the cast kernels rely on (those of ``NVFP4QuantConfig``), for direct op calls."""
    rht = rht_sign_mask >= 0
    if four_over_six not in (0, 1, 2):
        raise ValueError(f"four_over_six must be 0 (off), 1 (MAE) or 2 (MSE), got {four_over_six!r}")
    if four_over_six and (rht or stochastic_rounding):
        raise ValueError("four_over_six takes neither RHT (rht_sign_mask >= 0) nor stochastic_rounding")
    if pr3045 and (not per_token or block_2d or four_over_six):
        raise ValueError("pr3045 (PR 3045's numerics) is the per-token 1x16 cast: per_token, no 16x16 blocks, no 4over6")
    if rht and (block_2d or (per_token and not pr3045)):
        raise ValueError("RHT (rht_sign_mask >= 0) takes neither 16x16 blocks nor per_token (but PR 3045's fp32 RHT: pr3045)")


def launch_cast(x, outputs, row_amax, col_amax, seed_tensor, seed, rowwise, columnwise, block_2d, per_token,
                rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding, scale_layout,
                offsets=None, num_splits=0, split_steps=0, group_split=None,
                block_m: int = 0, block_k: int = 0, num_warps: int = 0, pr3045: bool = False) -> None:
    """Launch the cast of a recipe into ``outputs`` = (row_data, row_scale, col_data, col_scale):
    ``cast16_kernel`` (per-token tables first) or ``four_over_six_kernel``, in one or two launches
    (``opt_flags.split_cast``). ``offsets`` (int64 split row offsets) with ``group_split`` (the grouped
    amax pass's int32 split of each 16-row group) makes it the grouped cast. block_m, block_k,
    num_warps: an explicit tile (0: opt_flags' choice). pr3045: PR 3045's numerics (per-token casts)."""
    check_cast_args(rowwise, columnwise, block_2d, per_token, rht_sign_mask, four_over_six, stochastic_rounding, pr3045)
    m, k = x.shape
    grouped = offsets is not None
    tile = dict(block_k=block_k, num_warps=num_warps)
    if opt_flags.split_cast(m, k, rowwise, columnwise, block_2d, rht_sign_mask >= 0, stochastic_rounding,
                            four_over_six, grouped):
        for row_only in (True, False):
            launch_cast(x, outputs, row_amax if row_only else None, None if row_only else col_amax, seed_tensor,
                        seed, row_only, not row_only, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max,
                        stochastic_rounding, scale_layout, block_m=block_m, **tile, pr3045=pr3045)
        return
    steps = split_steps if grouped else None
    if opt_flags.use_cast16(four_over_six):
        meta = opt_flags.cast16_meta(k, rowwise, columnwise, block_2d, per_token, rht_sign_mask, e4m3_max,
                                     stochastic_rounding, seed_tensor is not None, scale_layout, split_steps=steps,
                                     **tile, pr3045=pr3045)
        if per_token:  # the kernel then reads the tables through the amax pointers
            row_amax, col_amax = pt_scales_tables(row_amax if rowwise else None, m,
                                                  col_amax if columnwise else None, k * num_splits if grouped else k,
                                                  opt_flags.pt_scales_meta(meta["E6"], pr3045))
        launch_cast16(x, outputs, row_amax, col_amax, seed_tensor, seed, offsets, group_split, num_splits,
                      opt_flags.cast16_grid(m, k, meta), meta)
    else:
        meta = opt_flags.four_over_six_meta(m, k, rowwise, columnwise, block_2d, per_token, four_over_six, e4m3_max,
                                            scale_layout, split_steps=steps, block_m=block_m, **tile)
        launch_four_over_six(x, outputs, row_amax, col_amax, offsets, group_split, num_splits,
                             opt_flags.four_over_six_grid(m, k, meta), meta)
