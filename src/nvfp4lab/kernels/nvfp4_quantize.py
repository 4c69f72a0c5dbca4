"""NVFP4 quantize kernels: rowwise and columnwise outputs of every recipe from one read of x.

:func:`quantize` is one ``torch.library`` custom op, ``nvfp4lab::nvfp4_quantize``, with a fake implementation
(``torch.compile(fullgraph=True)`` and CUDA-graph capture work, no host sync); eager and traced calls
run the same plan (:class:`_EagerPlan`), two passes over x (M, K):

1. the amax pass (:func:`compute_amax` alone), only for outer amaxes the caller did not supply: per
   tensor, per row (M,), per column (K,), per tensor of the bf16 RHT output, or per column of PR 3045's
   fp32 RHT output (``nvfp4_quantize_details.amax``).
2. the cast (:func:`cast_outputs` alone), one read of x for both outputs unless said otherwise
   (``nvfp4_quantize_details.cast``):
   * ``cast16_kernel`` (every recipe without 4over6): 16-row groups x 128 columns per one-warp
     program (four groups in a row when a plain columnwise output is written); per-token recipes
     first compute their global scales once per row and column (``pt_scales_kernel``); RHT in
     registers; stochastic rounding from Philox.
   * ``four_over_six_1x16_kernel`` (1x16 4over6 casts of bf16 input, per tensor or per token, not grouped): one
     launch per output, each block's 16 values, both candidates, their index-order errors and the pick in one
     thread; a row+col cast reads x twice.
   * ``four_over_six_kernel`` (the other 4over6 casts, which take neither RHT nor SR): ``cast16_kernel``'s tiles
     and thread layout, each block's two candidates and their index-order errors in registers.
   * ``cast_row_kernel`` (rowwise-only 1x16 bf16 casts, SR or not, and the rowwise launch of split row+col
     casts, ``opt_flags.use_cast_row``): whole blocks per lane pair, SR rows in pairs (one Philox block per unit),
     the encode factors of the 128 E4M3 scale codes from a per-tensor table (``row_factor_table_kernel``,
     fp64 divisions, so no EXACT path), the block scale by the GPU's E4M3 convert (``cast_row``).
   * ``cast_rowcol_kernel`` (row+col per-tensor 1x16 bf16 casts without RHT and SR, from 2^24 elements): both
     copies from one read, four columns of 16 rows per lane (column blocks whole in a lane, row blocks over a quad),
     the two copies' encode factors from ``cast_row``'s table of each outer amax (``factor_tables_kernel``), a
     banded program order; its columnwise scales (swizzled: its rowwise ones too) go through a staging buffer that a
     second launch puts into their layout (``cast_rowcol``).
   * ``cast_col_kernel`` (columnwise-only per-tensor 1x16 RHT casts of bf16 input, SR or not: the
     columnwise launch of a split RHT cast): whole column blocks per thread in few registers, the encode
     factors divided in the kernel (with SR: ``cast_row``'s factor table), the RHT butterflies in
     registers (``cast_col``).
   Large row+col casts with SR or RHT run as a rowwise-only and a columnwise-only launch; inside a CUDA-graph
   capture, where a replay pays no host time per launch, smaller RHT casts too (``opt_flags.split_cast``). With
   SR and RHT both launches read factor tables, made by one ``factor_tables_kernel`` launch.
   :func:`quantize_operands` runs the same plan with a side writing the exact BF16 GEMM operand q * s ((M, K)
   rowwise, (K, M) columnwise) instead of codes and scales: ``cast16_kernel``'s ROW_OPERAND / COL_OPERAND, or the
   OPERAND output of ``cast_row_kernel`` / ``cast_col_kernel`` where those cast that side (split SR / RHT casts).

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
* Block amax is an integer max of |x| bits; E2M1/E4M3 come from ``formats`` (``e2m1_encode_fast``: the
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

import functools
from typing import Optional

import torch

from ..config import NVFP4QuantConfig, operand_config, with_copies
from ..ref.nvfp4 import broadcast_amax, dbias
from ..tensors import NVFP4Operand, NVFP4Tensor
from .formats import soft_bf16_loads
from .launch import Launch, aligned, arg_key, custom_op, keep_buffers, tracing
from .nvfp4_quantize_details import opt_flags
from .nvfp4_quantize_details.amax import (
    AMAX_NONE,
    AMAX_PER_TOKEN,
    AMAX_PER_TOKEN_RHT,
    AMAX_TENSOR,
    AMAX_TENSOR_RHT,
    amax_kernel,
    amax_rht_col_kernel,
    launch_amax,
    launch_column_sums,
    sums_rows,
    zeroed_amaxes,
)
from .nvfp4_quantize_details.cast import (
    FOUR_OVER_SIX_CODES,
    cast_dtypes,
    cast_shapes,
    cast_steps,
    draw_seed,
    launch_cast,
    run_cast,
    scale_buffer,
    seed_args,
    uninitialized,
)

__all__ = ["AMAX_NONE", "AMAX_PER_TOKEN", "AMAX_PER_TOKEN_RHT", "AMAX_TENSOR", "AMAX_TENSOR_RHT", "FOUR_OVER_SIX_CODES",
           "amax_modes", "cast_outputs", "compute_amax", "config_of_fields", "draw_seed", "nvfp4_quantize",
           "operand_cast_pays", "quantize", "quantize_dbias", "quantize_operands"]


def _amax_sizes(m: int, k: int, row_mode: int, col_mode: int) -> tuple[int, int]:
    sizes = {AMAX_NONE: 0, AMAX_TENSOR: 1, AMAX_TENSOR_RHT: 1}
    return (m if row_mode == AMAX_PER_TOKEN else sizes[row_mode],
            k if col_mode in (AMAX_PER_TOKEN, AMAX_PER_TOKEN_RHT) else sizes[col_mode])


@functools.lru_cache(maxsize=4096)
def _amax_launch(m: int, k: int, row_mode: int, col_mode: int, rht_sign_mask: int, table_e6: float, block_m: int,
                 block_k: int, num_warps: int, spec, fresh_scratch: bool = False, sums: bool = False) -> Launch:
    """The amax pass's launch; ``sums``: it also writes x's partial column sums (SUMS)."""
    if opt_flags.use_amax_rht_col(m, k, row_mode, col_mode, spec[1] == torch.bfloat16, spec[2]):
        meta = opt_flags.amax_rht_col_meta(m, k, row_mode, rht_sign_mask, block_m=block_m, block_k=block_k,
                                           num_warps=num_warps, fresh_scratch=fresh_scratch)
        kernel, grid = amax_rht_col_kernel, opt_flags.amax_rht_col_grid(m, k, meta)
    else:
        meta = opt_flags.amax_meta(m, k, row_mode, col_mode, rht_sign_mask, table_e6=table_e6, block_m=block_m,
                                   block_k=block_k, num_warps=num_warps, fresh_scratch=fresh_scratch)
        meta["SOFT_BF16"] = soft_bf16_loads(spec[0])
        kernel, grid = amax_kernel, opt_flags.amax_grid(m, k, meta)
    if sums:
        meta["SUMS"] = True
    return Launch(kernel, grid, meta)


def compute_amax(x: torch.Tensor, row_mode: int, col_mode: int, rht_sign_mask: int, block_m: int = 0,
                 block_k: int = 0, num_warps: int = 0):
    """The amax pass alone (benchmarks, tests; :func:`quantize` runs it through its plan): the outer
    amaxes of x (M, K) for the two outputs as fp32 device tensors, None for mode 0, in one launch.

    row_mode: 0 none, 1 per tensor (1,), 2 per row (M,).
    col_mode: 0 none, 1 per tensor (1,), 2 per column (K,), 3 per tensor of bf16(RHT(x^T)) (1,),
    4 per column of PR 3045's fp32 RHT(x^T) (K,).
    block_m, block_k, num_warps: an explicit tile (0: opt_flags' choice).
    """
    m, k = x.shape
    row_size, col_size = _amax_sizes(m, k, row_mode, col_mode)
    # the amax of nothing is 0; per-token passes accumulate into their zeroed outputs (opt_flags.amax_direct)
    zeroed = x.numel() == 0 or opt_flags.amax_direct(row_mode, col_mode, 0.0)
    make = torch.zeros if zeroed else torch.empty
    row_amax = make((row_size,), dtype=torch.float32, device=x.device) if row_mode != AMAX_NONE else None
    col_amax = make((col_size,), dtype=torch.float32, device=x.device) if col_mode != AMAX_NONE else None
    if x.numel() and (row_amax is not None or col_amax is not None):
        amax_launch = _amax_launch(m, k, row_mode, col_mode, rht_sign_mask, 0.0, block_m, block_k, num_warps,
                                   (x.device, x.dtype, aligned(x)))
        launch_amax(amax_launch, x, row_amax, col_amax, row_size if row_amax is not None else 0,
                    col_size if col_amax is not None else 0)
    return row_amax, col_amax


def cast_outputs(x, row_amax, col_amax, seed_tensor, seed, rowwise, columnwise, block_2d, per_token, rht_sign_mask,
                 four_over_six, e4m3_max, stochastic_rounding, scale_layout, block_m=0, block_k=0, num_warps=0,
                 poison=False, pr3045=False) -> tuple:
    """The cast pass alone (benchmarks, tests; :func:`quantize` runs it through its plan): quantize x
    (M, K) with the given fp32 outer amaxes into (row_data, row_scale, col_data, col_scale), absent
    ones None.

    rht_sign_mask < 0 means no RHT. four_over_six: 0 off, 1 MAE, 2 MSE. stochastic_rounding takes
    ``seed_tensor`` (int64 (1,) on x.device, read inside the kernel) when given, else the int ``seed``.
    block_m, block_k, num_warps: an explicit tile (0: opt_flags' choice). poison: fill the outputs
    with 0xFF before the kernels write them (tests). pr3045: PR 3045's numerics (per_token casts only;
    with RHT its fp32 transform). Combinations no recipe has are a ValueError.
    """
    m, k = x.shape
    dev = x.device
    row_data = uninitialized((m, k // 2), dev, poison) if rowwise else None
    row_scale = scale_buffer(m, k // 16, scale_layout, dev, poison) if rowwise else None
    col_data = uninitialized((k, m // 2), dev, poison) if columnwise else None
    col_scale = scale_buffer(k, m // 16, scale_layout, dev, poison) if columnwise else None
    outputs = (row_data, row_scale, col_data, col_scale)
    if x.numel():
        launch_cast(x, outputs, row_amax, col_amax, seed_tensor, seed, rowwise, columnwise, block_2d, per_token,
                    rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding, scale_layout, block_m=block_m,
                    block_k=block_k, num_warps=num_warps, pr3045=pr3045)
    return outputs


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


def _output_amaxes(config, amax, columnwise_amax, row_computed, col_computed) -> tuple:
    """The (row, column) outer amaxes the container keeps: a copy of the caller's where given, else the
    amax pass's (``col_computed`` None: the caller's per-tensor ``amax`` serves both copies)."""
    row_amax = col_amax = None
    if config.rowwise:
        row_amax = amax.clone() if amax is not None else row_computed
    if config.columnwise:
        if columnwise_amax is not None:
            col_amax = columnwise_amax.clone()
        elif col_computed is None:
            col_amax = amax.clone()
        else:
            col_amax = col_computed
    return row_amax, col_amax


class _EagerPlan:
    """What the config, shape, dtype and device of an eager (untraced) quantize fix: which amaxes the
    amax pass computes and its launch, the outputs' shapes, and the cast's launches (per SR seed
    kind), built once per key by :func:`_eager_plan` so that a call only allocates and launches."""

    __slots__ = ("config", "m", "k", "rowwise", "columnwise", "shared", "tables", "row_amax_shape", "col_amax_shape",
                 "amax_launch", "n_row", "n_col", "args", "out_shapes", "zero_scales", "poison", "pr3045", "steps",
                 "graph_sensitive", "empty", "zeroed_amax", "operands", "out_dtypes", "allocs", "amax_launch_fresh",
                 "sums_dtype", "sums_rows")

    def __init__(self, config: NVFP4QuantConfig, m: int, k: int, dtype, device, x_aligned: bool, amax_given: bool,
                 col_amax_given: bool, block_m: int, block_k: int, num_warps: int, poison: bool,
                 operands: tuple = (False, False), sums_dtype: Optional[torch.dtype] = None):
        row_mode, col_mode = amax_modes(config, True if amax_given else None, True if col_amax_given else None)
        self.shared = row_mode == col_mode == AMAX_TENSOR
        if self.shared:
            col_mode = AMAX_NONE
        self.tables = (config.per_token and config.numerics == "te_main"
                       and (row_mode == AMAX_PER_TOKEN or not config.rowwise)
                       and (col_mode == AMAX_PER_TOKEN or not config.columnwise)
                       and opt_flags.amax_tables(m * config.rowwise + k * config.columnwise))
        row_size, col_size = _amax_sizes(m, k, row_mode, col_mode)
        lead = (3,) if self.tables else ()
        self.row_amax_shape = lead + (row_size,) if row_mode != AMAX_NONE else None
        self.col_amax_shape = lead + (col_size,) if col_mode != AMAX_NONE else None
        self.n_row = row_size if row_mode != AMAX_NONE else 0
        self.n_col = col_size if col_mode != AMAX_NONE else 0
        self.empty = m * k == 0
        # the amax of nothing is 0; per-token passes accumulate into their zeroed outputs
        table_e6 = 6.0 if self.tables else 0.0
        self.zeroed_amax = self.empty or opt_flags.amax_direct(row_mode, col_mode, table_e6)
        self.amax_launch = self.amax_launch_fresh = None
        # x's column sums (sums_dtype) come from the amax pass where it runs, else from torch (ref.nvfp4.dbias)
        self.sums_dtype, self.sums_rows = sums_dtype, 0
        if not self.empty and self.n_row + self.n_col:
            amax_args = (m, k, row_mode, col_mode, config.rht_sign_mask if config.rht else 0,
                         6.0 * config.e4m3_max if self.tables else 0.0, block_m, block_k, num_warps,
                         (device, dtype, x_aligned))
            sums = sums_dtype is not None
            self.amax_launch = _amax_launch(*amax_args, False, sums)
            # where the call would zero a scratch of its own (keep_buffers), the per-tensor passes go DIRECT too
            if not self.zeroed_amax and opt_flags.amax_direct(row_mode, col_mode, table_e6, True):
                self.amax_launch_fresh = _amax_launch(*amax_args, True, sums)
            if sums:
                self.sums_rows = sums_rows(m, self.amax_launch)
        self.config, self.m, self.k = config, m, k
        self.rowwise, self.columnwise = config.rowwise, config.columnwise
        self.args = (config.rowwise, config.columnwise, config.block == "16x16", config.per_token,
                     config.rht_sign_mask if config.rht else -1, FOUR_OVER_SIX_CODES[config.four_over_six],
                     config.e4m3_max, config.stochastic_rounding, config.scale_layout)
        self.pr3045 = config.numerics == "te_pr3045"
        # whether a CUDA-graph capture casts in other launches than an eager call (opt_flags.split_cast)
        split_args = (m, k, config.rowwise, config.columnwise, config.block == "16x16", config.rht,
                      config.stochastic_rounding, config.four_over_six, False)
        self.graph_sensitive = (device.type == "cuda"
                                and opt_flags.split_cast(*split_args, True) != opt_flags.split_cast(*split_args, False))
        self.operands = operands = (operands[0] and config.rowwise, operands[1] and config.columnwise)
        shapes = cast_shapes(m, k, config.rowwise, config.columnwise, config.scale_layout, operands)
        present = (config.rowwise, config.rowwise and not operands[0], config.columnwise,
                   config.columnwise and not operands[1])
        self.out_shapes = [shape if p else None for shape, p in zip(shapes, present)]
        self.out_dtypes = cast_dtypes(operands)
        # scale buffers with padding are zero-filled (scale_buffer's rule)
        self.zero_scales = (shapes[1] != (m, k // 16), shapes[3] != (k, m // 16))
        self.poison = poison
        self.steps = {}
        # each output's allocation (None: absent), called with the device: scale buffers with padding zero-filled
        # (scale_buffer's rule), the others uninitialized or, with poison, filled (NaN operands, 0xFF bytes)
        allocs = []
        for i, shape in enumerate(self.out_shapes):
            dtype = self.out_dtypes[i]
            if shape is None:
                allocs.append(None)
            elif i & 1 and self.zero_scales[i >> 1]:
                allocs.append(functools.partial(torch.zeros, shape, dtype=dtype))
            elif poison:
                fill = float("nan") if dtype is torch.bfloat16 else 0xFF
                allocs.append(functools.partial(torch.full, shape, fill, dtype=dtype))
            else:
                allocs.append(functools.partial(torch.empty, shape, dtype=dtype))
        self.allocs = tuple(allocs)

    def _steps(self, x, seed_tensor, seed, block_m, block_k, num_warps):
        graphed = self.graph_sensitive and torch.cuda.is_current_stream_capturing()
        key = (seed_tensor is not None, arg_key(seed), graphed)
        steps = self.steps.get(key)
        if steps is None:
            steps = self.steps[key] = cast_steps(x, seed_tensor, seed, *self.args, block_m=block_m, block_k=block_k,
                                                 num_warps=num_warps, pr3045=self.pr3045, operands=self.operands,
                                                 graphed=graphed)
        return steps

    def parts(self, x, amax, columnwise_amax, seed_tensor, seed: int, block_m: int, block_k: int,
              num_warps: int) -> tuple:
        """Quantize x: (row_data, row_scale, row_amax, col_data, col_scale, col_amax, column sums), None where the
        config asks for no such copy (the sums: where the plan has no ``sums_dtype``); with :attr:`shared` the
        column amax is the row amax tensor. ``seed_tensor`` / ``seed``: the SR seed as :func:`draw_seed` gives it."""
        dev = x.device
        amax_launch = self.amax_launch
        zeroed = self.zeroed_amax
        if self.amax_launch_fresh is not None and not keep_buffers(dev):
            amax_launch, zeroed = self.amax_launch_fresh, True
        if zeroed and not self.tables:  # the zeroed outputs of a DIRECT pass, in one launch
            row_computed, col_computed = zeroed_amaxes(dev, self.n_row, self.n_col)
        else:  # tables are zeroed only for empty x, where nothing is launched
            make = torch.zeros if zeroed else torch.empty
            row_computed = col_computed = None
            if self.row_amax_shape is not None:
                row_computed = make(self.row_amax_shape, dtype=torch.float32, device=dev)
            if self.col_amax_shape is not None:
                col_computed = make(self.col_amax_shape, dtype=torch.float32, device=dev)
        sums = partials = None
        if self.sums_rows:  # the amax pass's partial sums, reduced by one more launch
            partials = torch.empty((self.sums_rows, self.k), dtype=torch.float32, device=dev)
            sums = torch.full((self.k,), float("nan"), dtype=self.sums_dtype, device=dev) if self.poison else \
                torch.empty(self.k, dtype=self.sums_dtype, device=dev)
        elif self.sums_dtype is not None:
            sums = dbias(x, self.sums_dtype)
        if amax_launch is not None:
            launch_amax(amax_launch, x, row_computed, col_computed, self.n_row, self.n_col, partials)
            if partials is not None:
                launch_column_sums(partials, sums)
        if amax is None and columnwise_amax is None:  # the amax pass's (what _output_amaxes returns then)
            row_amax = row_computed if self.rowwise else None
            col_amax = (row_computed if self.shared else col_computed) if self.columnwise else None
        else:
            row_amax, col_amax = _output_amaxes(self.config, amax, columnwise_amax, row_computed,
                                                row_computed if self.shared else col_computed)
        outputs = [None if alloc is None else alloc(device=dev) for alloc in self.allocs]
        if not self.empty:
            run_cast(self._steps(x, seed_tensor, seed, block_m, block_k, num_warps), x, outputs, row_amax,
                     col_amax, seed_tensor, seed, tables=self.tables)
        if self.tables:  # the amaxes are the tables' first rows
            row_amax = row_amax[0] if row_amax is not None else None
            col_amax = col_amax[0] if col_amax is not None else None
        row_data, row_scale, col_data, col_scale = outputs  # None where the config asks for no such copy
        return row_data, row_scale, row_amax, col_data, col_scale, col_amax, sums

    def __call__(self, x, amax, columnwise_amax, seed, generator, block_m, block_k, num_warps) -> NVFP4Tensor:
        seed_tensor, seed_int = seed_args(self.config, x, seed, generator, False)
        parts = self.parts(x, amax, columnwise_amax, seed_tensor, seed_int, block_m, block_k, num_warps)
        # the container directly: the plan makes exactly the copies the config asks for (from_parts' check)
        return NVFP4Tensor(x.shape, x.dtype, self.config, *parts[:6])


_EAGER_PLANS: dict = {}


def _eager_plan(config, x, amax, columnwise_amax, block_m, block_k, num_warps, poison,
                operands: tuple = (False, False), sums_dtype: Optional[torch.dtype] = None) -> _EagerPlan:
    m, k = x.shape
    x_aligned = aligned(x)
    key = (config, m, k, x.dtype, x.device, x_aligned, amax is None, columnwise_amax is None, block_m, block_k,
           num_warps, poison, operands, sums_dtype)
    plan = _EAGER_PLANS.get(key)
    if plan is None:
        if len(_EAGER_PLANS) >= 4096:
            _EAGER_PLANS.clear()
        plan = _EAGER_PLANS[key] = _EagerPlan(config, m, k, x.dtype, x.device, x_aligned, amax is not None,
                                              columnwise_amax is not None, block_m, block_k, num_warps, poison,
                                              operands, sums_dtype)
    return plan


@functools.lru_cache(maxsize=256)
def config_of_fields(block, rowwise, columnwise, per_token, rht, rht_sign_mask, four_over_six, e4m3_max,
                     stochastic_rounding, scale_layout, numerics) -> NVFP4QuantConfig:
    """The config of the quantize custom ops' fields (its checks raise on combinations no recipe has)."""
    return NVFP4QuantConfig(block=block, rowwise=rowwise, columnwise=columnwise, per_token=per_token, rht=rht,
                            rht_sign_mask=rht_sign_mask, four_over_six=four_over_six, e4m3_max=e4m3_max,
                            stochastic_rounding=stochastic_rounding, scale_layout=scale_layout, numerics=numerics)


def _config_fields(config: NVFP4QuantConfig) -> tuple:
    return (config.block, config.rowwise, config.columnwise, config.per_token, config.rht, config.rht_sign_mask,
            config.four_over_six, config.e4m3_max, config.stochastic_rounding, config.scale_layout, config.numerics)


def _shared_amax(config: NVFP4QuantConfig, amax, columnwise_amax) -> bool:
    """Whether one per-tensor amax of the amax pass serves both copies (:class:`_EagerPlan`'s ``shared``):
    :func:`nvfp4_quantize` then returns it once, as the row amax."""
    row_mode, col_mode = amax_modes(config, amax, columnwise_amax)
    return row_mode == col_mode == AMAX_TENSOR


@custom_op("nvfp4lab::nvfp4_quantize", mutates_args=())
def nvfp4_quantize(
    x: torch.Tensor,
    amax: Optional[torch.Tensor],
    columnwise_amax: Optional[torch.Tensor],
    seed_tensor: Optional[torch.Tensor],
    seed: int,
    block: str,
    rowwise: bool,
    columnwise: bool,
    per_token: bool,
    rht: bool,
    rht_sign_mask: int,
    four_over_six: Optional[str],
    e4m3_max: float,
    stochastic_rounding: bool,
    scale_layout: str,
    numerics: str,
    block_m: int = 0,
    block_k: int = 0,
    num_warps: int = 0,
    poison: bool = False,
    row_operand: bool = False,
    col_operand: bool = False,
    sums_dtype: Optional[torch.dtype] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize` of x (M, K) as one op (traced calls): the config as its fields
    (:class:`~nvfp4lab.config.NVFP4QuantConfig`, not ``broadcast_2d``), the optional outer amaxes, the SR seed
    as :func:`draw_seed` gives it (``seed_tensor``: int64 (1,) on x.device, read by the kernel, else the
    int ``seed``). Returns the container's (row_data, row_scale, row_amax, col_data, col_scale, col_amax);
    absent copies are (0,) tensors (uint8 data and scales, fp32 amax), and so is the column amax where the
    row amax serves both copies (:func:`_shared_amax`: no output aliases another). Runs the cached plan
    of eager calls (:class:`_EagerPlan`). ``row_operand`` / ``col_operand``: that copy's data is the BF16
    GEMM operand (M, K) / (K, M) and its scale a (0,) tensor (:func:`quantize_operands`). The seventh output: x's
    column sums (K,) in ``sums_dtype`` (:func:`quantize_dbias`), else a (0,) fp32 tensor.
    """
    config = config_of_fields(block, rowwise, columnwise, per_token, rht, rht_sign_mask, four_over_six, e4m3_max,
                              stochastic_rounding, scale_layout, numerics)
    plan = _eager_plan(config, x, amax, columnwise_amax, block_m, block_k, num_warps, poison, (row_operand, col_operand),
                       sums_dtype)
    parts = plan.parts(x, amax, columnwise_amax, seed_tensor, seed, block_m, block_k, num_warps)
    if plan.shared:
        parts = parts[:5] + (None,) + parts[6:]
    dev = x.device
    return tuple(t if t is not None else torch.empty(0, dtype=torch.float32 if i % 3 == 2 or i == 6 else torch.uint8,
                                                     device=dev)
                 for i, t in enumerate(parts))


@nvfp4_quantize.register_fake
def _nvfp4_quantize_fake(x, amax, columnwise_amax, seed_tensor, seed, block, rowwise, columnwise, per_token, rht,
                         rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding, scale_layout, numerics,
                         block_m=0, block_k=0, num_warps=0, poison=False, row_operand=False, col_operand=False,
                         sums_dtype=None):
    m, k = x.shape
    operands = (row_operand and rowwise, col_operand and columnwise)
    row_data, row_scale, col_data, col_scale = (
        x.new_empty(shape, dtype=dtype)
        for shape, dtype in zip(cast_shapes(m, k, rowwise, columnwise, scale_layout, operands), cast_dtypes(operands)))
    no_amax = x.new_empty(0, dtype=torch.float32)
    if not rowwise:
        row_amax = no_amax
    elif amax is not None:
        row_amax = torch.empty_like(amax)  # the caller's, copied
    else:
        row_amax = x.new_empty(m if per_token else 1, dtype=torch.float32)
    if not columnwise:
        col_amax = no_amax
    elif columnwise_amax is not None:
        col_amax = torch.empty_like(columnwise_amax)
    elif amax is not None and not rht and not per_token:  # the caller's per-tensor amax serves both copies
        col_amax = torch.empty_like(amax)
    elif amax is None and rowwise and not rht and not per_token:  # the row amax (_shared_amax)
        col_amax = x.new_empty(0, dtype=torch.float32)
    else:
        col_amax = x.new_empty(k if per_token else 1, dtype=torch.float32)
    sums = x.new_empty(0 if sums_dtype is None else k, dtype=sums_dtype or torch.float32)
    return row_data, row_scale, row_amax, col_data, col_scale, col_amax, sums


def quantize(
    x2d: torch.Tensor,
    config: NVFP4QuantConfig,
    *,
    amax: Optional[torch.Tensor] = None,
    columnwise_amax: Optional[torch.Tensor] = None,
    seed=None,
    generator: Optional[torch.Generator] = None,
    block_m: int = 0,
    block_k: int = 0,
    num_warps: int = 0,
    poison: bool = False,
) -> NVFP4Tensor:
    """Triton NVFP4 quantization of a contiguous (M, K) tensor; the same fields as ``ref.nvfp4.quantize``.

    Stochastic rounding uses ``seed`` (an int, or an int64 one-element tensor on x's device read by the kernel)
    when given, else a seed drawn from ``generator``
    (``nvfp4_quantize_details.cast.draw_seed``: on the device when the call may be replayed or traced).
    block_m, block_k, num_warps: the tile of every kernel of this call (0: opt_flags' choice;
    ``cast16_kernel`` takes BLOCK_K, num_warps and block_m / 16 groups of 16 rows, 1, 2 or 4); any
    tile gives the same bits.
    poison: fill the outputs with 0xFF before the kernels write them (tests).

    Eager calls run a plan cached per config, shape and argument kinds (:class:`_EagerPlan`); traced
    calls (torch.compile, fake tensors) go through the one custom op :func:`nvfp4_quantize`, whose
    implementation runs the same plan.
    """
    if config.broadcast_2d:  # PR 3045's 2D weight: TE main's per-tensor 16x16 cast, amax into the vectors
        inner = quantize(x2d, config.per_tensor_2d(), amax=amax, columnwise_amax=columnwise_amax, seed=seed,
                         generator=generator, block_m=block_m, block_k=block_k, num_warps=num_warps, poison=poison)
        return broadcast_amax(inner, config)
    if not tracing(x2d):
        plan = _eager_plan(config, x2d, amax, columnwise_amax, block_m, block_k, num_warps, poison)
        return plan(x2d, amax, columnwise_amax, seed, generator, block_m, block_k, num_warps)
    seed_tensor, seed_int = seed_args(config, x2d, seed, generator, True)
    parts = nvfp4_quantize(x2d, amax, columnwise_amax, seed_tensor, seed_int, *_config_fields(config), block_m, block_k,
                           num_warps, poison)
    row_data, row_scale, row_amax, col_data, col_scale, col_amax = (
        t if present else None for t, present in zip(parts, (config.rowwise,) * 3 + (config.columnwise,) * 3))
    if _shared_amax(config, amax, columnwise_amax):
        col_amax = row_amax
    return NVFP4Tensor(x2d.shape, x2d.dtype, config, row_data, row_scale, row_amax, col_data, col_scale, col_amax)


def quantize_dbias(
    x2d: torch.Tensor,
    config: NVFP4QuantConfig,
    dbias_dtype: torch.dtype,
    *,
    seed=None,
    generator: Optional[torch.Generator] = None,
    poison: bool = False,
) -> tuple:
    """(:func:`quantize` of x (M, K), x's column sums (K,) in ``dbias_dtype``): the bias gradient of a layer whose
    output gradient x is, from the amax pass's read of x (SUMS partial sums per program along M, then one
    ``column_sums_kernel`` launch adding them in order, fp32, rounded once); where no amax pass runs (PR 3045's
    broadcast 2D weight, empty x), ``ref.nvfp4.dbias``. Fixed summation order per shape and tile, so repeated calls
    give the same bits; not torch.sum's order."""
    if config.broadcast_2d:
        return quantize(x2d, config, seed=seed, generator=generator, poison=poison), dbias(x2d, dbias_dtype)
    parts = _amax_cast_parts(x2d, config, seed, generator, poison, (False, False), dbias_dtype)
    parts = tuple(t if present else None
                  for t, present in zip(parts, (config.rowwise,) * 3 + (config.columnwise,) * 3 + (True,)))
    return NVFP4Tensor(x2d.shape, x2d.dtype, config, *parts[:6]), parts[6]


def _amax_cast_parts(x2d, config, seed, generator, poison: bool, operands: tuple, sums_dtype=None) -> tuple:
    """The seven parts of :meth:`_EagerPlan.parts` for a call of x (M, K) without outer amaxes, through the cached
    plan (eager) or the custom op (traced; a shared amax then fills the column amax's place)."""
    traced = tracing(x2d)
    seed_tensor, seed_int = seed_args(config, x2d, seed, generator, traced)
    if not traced:
        plan = _eager_plan(config, x2d, None, None, 0, 0, 0, poison, operands, sums_dtype)
        return plan.parts(x2d, None, None, seed_tensor, seed_int, 0, 0, 0)
    parts = nvfp4_quantize(x2d, None, None, seed_tensor, seed_int, *_config_fields(config), 0, 0, 0, poison,
                           *operands, sums_dtype)
    if _shared_amax(config, None, None):
        parts = parts[:5] + (parts[2],) + parts[6:]
    return parts


def operand_cast_pays(m: int, k: int, fprop: bool = False, sr_rows: bool = False) -> bool:
    """Whether a cast with a BF16 operand output (:func:`quantize_operands`) of an (m, k) GEMM operand is expected
    to beat the packed cast plus the GEMM's expansion (``opt_flags.operand_cast_pays``; ``fprop``: a Linear forward's
    x; ``sr_rows``: the rowwise operand of a stochastically rounded cast with an RHT columnwise copy)."""
    return opt_flags.operand_cast_pays(m, k, fprop, sr_rows)


def quantize_operands(
    x2d: torch.Tensor,
    config: NVFP4QuantConfig,
    *,
    row_operand: bool,
    col_operand: bool,
    seed=None,
    generator: Optional[torch.Generator] = None,
    poison: bool = False,
    dbias_dtype: Optional[torch.dtype] = None,
) -> tuple:
    """:func:`quantize` of x (M, K) where the copies named by ``row_operand`` / ``col_operand`` (of those
    the config asks for) come as exact BF16 GEMM operands (:class:`~nvfp4lab.tensors.NVFP4Operand`: the
    rowwise one (M, K), the columnwise one (K, M), i.e. x^T or RHT(x^T)) written by the cast itself instead
    of codes and scales, so the GEMM expands nothing for them. Same amax pass, same codes, same bits as
    :func:`quantize` followed by the GEMM's expansion. Recipes of ``cast16_kernel`` only (no 4over6, not
    PR 3045's broadcast 2D weight). Returns (packed, row, col): an NVFP4Tensor of the remaining copies
    (None when none remain) and the operands (None where not asked); with ``dbias_dtype``, (packed, row, col, dbias):
    x's column sums from the amax pass too, as :func:`quantize_dbias`'s."""
    if config.broadcast_2d or config.four_over_six:
        raise ValueError("quantize_operands: recipes without four_over_six and without PR 3045's 2D weight only")
    operands = (bool(row_operand) and config.rowwise, bool(col_operand) and config.columnwise)
    row_data, row_scale, row_amax, col_data, col_scale, col_amax, sums = _amax_cast_parts(
        x2d, config, seed, generator, poison, operands, dbias_dtype)
    row = col = None
    if operands[0]:
        row = NVFP4Operand(row_data, row_amax, operand_config(config, False))
    if operands[1]:
        col = NVFP4Operand(col_data, col_amax, operand_config(config, True))
    keep_row, keep_col = config.rowwise and not operands[0], config.columnwise and not operands[1]
    packed = None
    if keep_row or keep_col:
        packed = NVFP4Tensor.from_parts(x2d.shape, x2d.dtype, with_copies(config, keep_row, keep_col),
                                        rowwise=(row_data, row_scale, row_amax) if keep_row else None,
                                        columnwise=(col_data, col_scale, col_amax) if keep_col else None)
    return (packed, row, col) if dbias_dtype is None else (packed, row, col, sums)
