"""NVFP4 quantize kernels: rowwise and columnwise outputs of every recipe from one read of x.

Passes over x (M, K), each a ``torch.library`` custom op with a fake implementation
(``torch.compile(fullgraph=True)`` and CUDA-graph capture work, no host sync):

1. ``nvfp4_amax``, only for outer amaxes the caller did not supply: per tensor, per row (M,), per
   column (K,), per tensor of the bf16 RHT output, or per column of PR 3045's fp32 RHT output
   (``nvfp4_quantize_details.amax``).
2. ``nvfp4_quantize_cast``, one read of x for both outputs (``nvfp4_quantize_details.cast``):
   * ``cast16_kernel`` (every recipe without 4over6): one 16-row group x 128 columns per one-warp
     program; per-token recipes first compute their global scales once per row and column
     (``pt_scales_kernel``); RHT in registers; stochastic rounding from Philox.
   * ``four_over_six_kernel`` (4over6 recipes, which take neither RHT nor SR): [BLOCK_M, BLOCK_K] tiles.
   Row+col casts with SR or RHT run as a rowwise-only and a columnwise-only launch (``opt_flags``).

Kernel choices (tiles, warps, register caps, launch splits) are in ``nvfp4_quantize_details.opt_flags``;
``quantize`` takes an explicit tile (block_m, block_k, num_warps) that overrides them.

Layout (:mod:`nvfp4lab.tensors`): data (M, K/2) and (K, M/2) is stored as two int32 words per 16-element
block (code i in bits 4(i%8).. of word i//8 = element 2j in the low nibble of byte j, little-endian).
Scales are E4M3 bytes, compact (R, C/16), padded (roundup(R,128), roundup(C/16,4)) or swizzled 128x4
(``ref.swizzle``); padded buffers are zero-filled first only when padding exists.

Numerics: those of :mod:`nvfp4lab.ref.nvfp4`, op for op in fp32.
* Launches pass ``enable_fp_fusion=False`` (an FMA would merge the 4over6 ``err + d*d``).
* Divisions are correctly rounded; tiles with an outer amax outside [2^-100, 2^100] (or NaN) take an
  EXACT path of fp64 divisions (``nvfp4_quantize_details.common``).
* Block amax is an integer max of |x| bits; E2M1/E4M3 come from ``_codecs`` (``e2m1_encode_fast``: the
  codes of ``e2m1_encode`` for all 2^32 inputs in half the instructions; Hopper has no E2M1 convert,
  so the encoder bounds the kernel's instruction count).
* RHT: bf16(v @ T) of every 16 rows v of each column, fp32 sums rounded to bf16 once
  (``nvfp4_quantize_details.rht``).
* Stochastic rounding: Philox4x32-10, 8 random bits per element, stream 0 rowwise / 1 columnwise,
  the seed an int or an int64 device tensor read by the kernel (``nvfp4_quantize_details.stochastic_rounding``).
* PR 3045's numerics (``config.numerics == "te_pr3045"``, per token): the cast's PR3045 constexpr
  (floored S_enc, enc = S_enc / s, its fp32 RHT); its 2D weight is the per-tensor 16x16 cast with the
  scalar amax copied into the vectors (``ref.nvfp4.broadcast_amax``).

Constraints: x contiguous (M, K) bf16/fp16/fp32; K % 16 == 0; M % 16 == 0 when a columnwise or 16x16
output is asked (rowwise 1x16 takes any M). 64-bit offsets. Empty inputs launch nothing.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..config import NVFP4QuantConfig
from ..ref.nvfp4 import broadcast_amax
from ..tensors import NVFP4Tensor
from .launch import custom_op
from .nvfp4_quantize_details import opt_flags
from .nvfp4_quantize_details.amax import (
    AMAX_NONE,
    AMAX_PER_TOKEN,
    AMAX_PER_TOKEN_RHT,
    AMAX_TENSOR,
    AMAX_TENSOR_RHT,
    launch_amax,
)
from .nvfp4_quantize_details.cast import (
    FOUR_OVER_SIX_CODES,
    cast_shapes,
    draw_seed,
    launch_cast,
    scale_buffer,
    uninitialized,
)

__all__ = ["AMAX_NONE", "AMAX_PER_TOKEN", "AMAX_PER_TOKEN_RHT", "AMAX_TENSOR", "AMAX_TENSOR_RHT", "FOUR_OVER_SIX_CODES",
           "amax_modes",
           "draw_seed", "nvfp4_amax", "nvfp4_quantize_cast", "quantize"]


def _amax_sizes(m: int, k: int, row_mode: int, col_mode: int) -> tuple[int, int]:
    sizes = {AMAX_NONE: 0, AMAX_TENSOR: 1, AMAX_TENSOR_RHT: 1}
    return (m if row_mode == AMAX_PER_TOKEN else sizes[row_mode],
            k if col_mode in (AMAX_PER_TOKEN, AMAX_PER_TOKEN_RHT) else sizes[col_mode])


@custom_op("nvfp4lab::nvfp4_amax", mutates_args=())
def nvfp4_amax(x: torch.Tensor, row_mode: int, col_mode: int, rht_sign_mask: int, block_m: int = 0,
               block_k: int = 0, num_warps: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Outer amax of x (M, K) for the two outputs, as fp32 device tensors (no host sync).

    row_mode: 0 none (returns a (0,) tensor), 1 per tensor (1,), 2 per row (M,).
    col_mode: 0 none, 1 per tensor (1,), 2 per column (K,), 3 per tensor of bf16(RHT(x^T)) (1,),
    4 per column of PR 3045's fp32 RHT(x^T) (K,).
    block_m, block_k, num_warps: an explicit tile (0: opt_flags' choice).
    """
    m, k = x.shape
    row_size, col_size = _amax_sizes(m, k, row_mode, col_mode)
    if x.numel() == 0:  # the amax of nothing is 0
        return (torch.zeros(row_size, dtype=torch.float32, device=x.device),
                torch.zeros(col_size, dtype=torch.float32, device=x.device))
    row_amax = torch.empty(row_size, dtype=torch.float32, device=x.device)
    col_amax = torch.empty(col_size, dtype=torch.float32, device=x.device)
    if row_mode == AMAX_NONE and col_mode == AMAX_NONE:
        return row_amax, col_amax
    meta = opt_flags.amax_meta(m, k, row_mode, col_mode, rht_sign_mask, block_m=block_m, block_k=block_k,
                               num_warps=num_warps)
    launch_amax(x, row_amax, col_amax, opt_flags.amax_grid(m, k, meta), meta)
    return row_amax, col_amax


@nvfp4_amax.register_fake
def _nvfp4_amax_fake(x, row_mode, col_mode, rht_sign_mask, block_m=0, block_k=0, num_warps=0):
    m, k = x.shape
    row_size, col_size = _amax_sizes(m, k, row_mode, col_mode)
    return x.new_empty(row_size, dtype=torch.float32), x.new_empty(col_size, dtype=torch.float32)


@custom_op("nvfp4lab::nvfp4_quantize_cast", mutates_args=())
def nvfp4_quantize_cast(
    x: torch.Tensor,
    row_amax: Optional[torch.Tensor],
    col_amax: Optional[torch.Tensor],
    seed_tensor: Optional[torch.Tensor],
    seed: int,
    rowwise: bool,
    columnwise: bool,
    block_2d: bool,
    per_token: bool,
    rht_sign_mask: int,
    four_over_six: int,
    e4m3_max: float,
    stochastic_rounding: bool,
    scale_layout: str,
    block_m: int = 0,
    block_k: int = 0,
    num_warps: int = 0,
    poison: bool = False,
    pr3045: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize x (M, K) with the given outer amaxes; returns (row_data, row_scale, col_data, col_scale).

    Absent outputs are (0,) uint8 tensors. rht_sign_mask < 0 means no RHT. four_over_six: 0 off,
    1 MAE, 2 MSE. stochastic_rounding takes ``seed_tensor`` (int64 (1,) on x.device, read inside the
    kernel) when given, else the int ``seed``. block_m, block_k, num_warps: an explicit tile (0:
    opt_flags' choice). poison: fill the outputs with 0xFF before the kernels write them (tests).
    pr3045: PR 3045's numerics (per_token casts only; with RHT its fp32 transform).
    """
    m, k = x.shape
    dev = x.device
    row_data = uninitialized((m, k // 2) if rowwise else (0,), dev, poison)
    row_scale = scale_buffer(m, k // 16, scale_layout, dev, poison) if rowwise else uninitialized((0,), dev)
    col_data = uninitialized((k, m // 2) if columnwise else (0,), dev, poison)
    col_scale = scale_buffer(k, m // 16, scale_layout, dev, poison) if columnwise else uninitialized((0,), dev)
    if x.numel() == 0:
        return row_data, row_scale, col_data, col_scale
    launch_cast(x, (row_data, row_scale, col_data, col_scale), row_amax, col_amax, seed_tensor, seed, rowwise,
                columnwise, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding,
                scale_layout, block_m=block_m, block_k=block_k, num_warps=num_warps, pr3045=pr3045)
    return row_data, row_scale, col_data, col_scale


@nvfp4_quantize_cast.register_fake
def _nvfp4_quantize_cast_fake(x, row_amax, col_amax, seed_tensor, seed, rowwise, columnwise, block_2d, per_token,
                              rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding, scale_layout,
                              block_m=0, block_k=0, num_warps=0, poison=False, pr3045=False):
    m, k = x.shape
    return tuple(x.new_empty(shape, dtype=torch.uint8) for shape in cast_shapes(m, k, rowwise, columnwise, scale_layout))


# ------------------------------------------------------------------------------- entry point
def amax_modes(config: NVFP4QuantConfig, amax, columnwise_amax) -> tuple[int, int]:
    """Which outer amaxes the amax pass must compute (the reference's rules in ref.nvfp4.quantize)."""
    row_mode = col_mode = AMAX_NONE
    if config.rowwise and amax is None:
        row_mode = AMAX_PER_TOKEN if config.per_token else AMAX_TENSOR
    if config.columnwise and columnwise_amax is None:
        if amax is not None and not config.rht and not config.per_token:
            col_mode = AMAX_NONE  # the supplied per-tensor amax serves both outputs
        elif config.rht and config.per_token:  # PR 3045's per-token fp32 RHT
            col_mode = AMAX_PER_TOKEN_RHT
        elif config.rht:
            col_mode = AMAX_TENSOR_RHT
        else:
            col_mode = AMAX_PER_TOKEN if config.per_token else AMAX_TENSOR
    return row_mode, col_mode


def quantize(
    x2d: torch.Tensor,
    config: NVFP4QuantConfig,
    *,
    amax: Optional[torch.Tensor] = None,
    columnwise_amax: Optional[torch.Tensor] = None,
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    block_m: int = 0,
    block_k: int = 0,
    num_warps: int = 0,
    poison: bool = False,
) -> NVFP4Tensor:
    """Triton NVFP4 quantization of a contiguous (M, K) tensor; the same fields as ``ref.nvfp4.quantize``.

    Stochastic rounding uses ``seed`` (an int) when given, else a seed drawn from ``generator``
    (``nvfp4_quantize_details.cast.draw_seed``: on the device when the call may be replayed or traced).
    block_m, block_k, num_warps: the tile of every kernel of this call (0: opt_flags' choice;
    ``cast16_kernel`` takes BLOCK_K and num_warps, its BLOCK_M is 16); any tile gives the same bits.
    poison: fill the outputs with 0xFF before the kernels write them (tests).
    """
    if config.broadcast_2d:  # PR 3045's 2D weight: TE main's per-tensor 16x16 cast, amax into the vectors
        inner = quantize(x2d, config.per_tensor_2d(), amax=amax, columnwise_amax=columnwise_amax, seed=seed,
                         generator=generator, block_m=block_m, block_k=block_k, num_warps=num_warps, poison=poison)
        return broadcast_amax(inner, config)
    tile = dict(block_m=block_m, block_k=block_k, num_warps=num_warps)
    row_mode, col_mode = amax_modes(config, amax, columnwise_amax)
    row_computed, col_computed = nvfp4_amax(x2d, row_mode, col_mode, config.rht_sign_mask if config.rht else 0, **tile)

    row_amax = None
    if config.rowwise:
        row_amax = amax.clone() if amax is not None else row_computed
    col_amax = None
    if config.columnwise:
        if columnwise_amax is not None:
            col_amax = columnwise_amax.clone()
        elif col_mode == AMAX_NONE:
            col_amax = amax.clone()
        else:
            col_amax = col_computed

    seed_tensor, seed_int = None, 0
    if config.stochastic_rounding:
        if seed is not None:
            seed_int = int(seed) % (1 << 63)
        else:
            seed_tensor, seed_int = draw_seed(x2d, generator)
    row_data, row_scale, col_data, col_scale = nvfp4_quantize_cast(
        x2d, row_amax, col_amax, seed_tensor, seed_int,
        config.rowwise, config.columnwise, config.block == "16x16", config.per_token,
        config.rht_sign_mask if config.rht else -1, FOUR_OVER_SIX_CODES[config.four_over_six],
        config.e4m3_max, config.stochastic_rounding, config.scale_layout, **tile, poison=poison,
        pr3045=config.numerics == "te_pr3045",
    )
    out = NVFP4Tensor(shape=x2d.shape, dtype=x2d.dtype, config=config)
    if config.rowwise:
        out.rowwise_data, out.rowwise_scale, out.rowwise_amax = row_data, row_scale, row_amax
    if config.columnwise:
        out.columnwise_data, out.columnwise_scale, out.columnwise_amax = col_data, col_scale, col_amax
    return out
