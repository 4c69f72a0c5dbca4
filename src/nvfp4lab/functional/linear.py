"""Linear and grouped linear layers as autograd Functions over quantized TN GEMMs.

With ``backward="quantized"`` (spec section 4; every GEMM is TN, ``a @ b^T`` of two K-major operands):

    fprop  y  = x W^T     nvfp4_gemm(x rowwise,          W rowwise)            (+ bias in the epilogue)
    dgrad  dx = dy W      nvfp4_gemm(dy rowwise,         W columnwise)
    wgrad  dW = dy^T x    nvfp4_gemm(dy columnwise,      x columnwise)         (RHT on both, SR on dy)
    bgrad  db = sum(dy)   fp32; with an NVFP4 cast of dy, from its amax pass (nvfp4lab.quantize_nvfp4_dbias, or
                          quantize_nvfp4_operands with dbias_dtype where dy's cast writes GEMM operands)

x is quantized once per forward with both copies (one call, one read), dy once per backward likewise,
and W once with both copies (or taken from the caller's cache, see :func:`quantize_weight`). Only the
copies a pass needs are produced: no columnwise x when W is frozen, no columnwise W when x needs no
grad. The columnwise copy of an (M, K) tensor holds x^T as (K, M) rows; :func:`transposed_operand`
hands it to the GEMM as a rowwise operand. With RHT both wgrad operands are transformed along the
token dim with the same orthogonal matrix, so their product is dy^T x. A 16x16 weight's columnwise copy is its
rowwise one transposed: where the dgrad GEMM expands its operands anyway (:func:`dgrad_reads_rowwise`), W is
quantized and saved with its rowwise copy only, and dgrad reads that copy transposed
(:func:`nvfp4lab.ops.nvfp4_operand`).

Columnwise copies block 16 tokens (32 for MXFP8): when a pass needs one and the token count M is not
a multiple, x and dy are zero-padded to the next multiple (zero rows add nothing to dW; TE asks the
caller to pad instead). Outputs are cut back to M rows.

``backward="dequantized"``: the backward GEMMs run in the compute dtype on the dequantized forward
operands (x and W rowwise copies) with dy unquantized; ``"high_precision"``: on the original x and W.

MXFP8 recipes quantize exactly like NVFP4 ones (:func:`nvfp4lab.quantize_mxfp8`), but there is no
MXFP8 GEMM kernel: each GEMM dequantizes its two operands to fp32 and multiplies in fp32 (the
products are exact, only the summation order differs from a tensor-core MXFP8 GEMM).

Dtypes: the compute dtype is ``torch.get_autocast_dtype`` when autocast is on for x's device, else
x's dtype. x and dy are cast to it before quantization (W is quantized from its own dtype); y has
it; dx has x's dtype, dW W's dtype, db the bias dtype (bias grad summed in fp32). Autocast is turned off inside
the Functions (the GEMMs choose their own dtypes).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections import OrderedDict
from typing import NamedTuple, Optional, Sequence, Union

import torch

from .. import moe, ops
from ..checks import check_integer_vector, check_split_sizes
from ..checks import check_tensor as _check_float
from ..config import MXFP8QuantConfig, NVFP4QuantConfig, operand_config, with_copies
from ..layout import roundup as _roundup
from ..recipes import MXFP8Recipe, NVFP4Recipe, block_multiple, resolve_recipe
from ..runtime import device_seed, fork, join, on_stream
from ..tensors import GroupedNVFP4Tensor, MXFP8Tensor, NVFP4Operand, NVFP4Tensor, cumulative_offsets

QuantizedTensor = Union[NVFP4Tensor, MXFP8Tensor]


# -------------------------------------------------------------------------------------- helpers
def _pad_rows(x2: torch.Tensor, rows: int) -> torch.Tensor:
    if x2.shape[0] == rows:
        return x2
    return torch.nn.functional.pad(x2, (0, 0, 0, rows - x2.shape[0]))


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of a layer's output for input ``x``: the autocast dtype of x's device when autocast
    is enabled there, else x's dtype."""
    device_type = x.device.type
    if device_type != "meta" and torch.is_autocast_enabled(device_type):  # no autocast exists for meta tensors
        return torch.get_autocast_dtype(device_type)
    return x.dtype


def transposed_operand(t: NVFP4Tensor) -> NVFP4Tensor:
    """The columnwise copy of ``t`` (logical (M, K)) as a rowwise GEMM operand of logical shape (K, M).

    No data moves: the columnwise data, scales and amax become the rowwise fields. With RHT the values
    held are those of RHT(x^T) (rows transformed in chunks of 16); the config of the view has rht off
    because its rowwise copy is already the transformed one.
    """
    if not isinstance(t, NVFP4Tensor):
        raise TypeError(f"t must be an NVFP4Tensor, got {type(t).__name__}")
    if t.columnwise_data is None:
        raise ValueError("t has no columnwise copy (quantize with columnwise=True)")
    config = operand_config(t.config, True)
    return NVFP4Tensor.from_parts(torch.Size((t.k, t.m)), t.dtype, config,
                                  rowwise=(t.columnwise_data, t.columnwise_scale, t.columnwise_amax))


def _replaced(config, **changes):
    """``dataclasses.replace`` of a frozen config, built and validated once per (config, changes) in
    eager mode (dynamo traces the build, not the cache)."""
    if torch.compiler.is_compiling():
        return dataclasses.replace(config, **changes)
    return _replaced_cached(config, tuple(changes.items()))


@functools.lru_cache(maxsize=4096)
def _replaced_cached(config, changes: tuple):
    return dataclasses.replace(config, **dict(changes))


def _tensor_config(recipe, tensor: str, rowwise: bool, columnwise: bool):
    """``recipe.tensor_config``, built and validated once per recipe and copies in eager mode (recipes
    are frozen)."""
    if torch.compiler.is_compiling():
        return recipe.tensor_config(tensor, rowwise=rowwise, columnwise=columnwise)
    return _tensor_config_cached(recipe, tensor, rowwise, columnwise)


@functools.lru_cache(maxsize=1024)
def _tensor_config_cached(recipe, tensor: str, rowwise: bool, columnwise: bool):
    return recipe.tensor_config(tensor, rowwise=rowwise, columnwise=columnwise)


def quantize_tensor(recipe, tensor: str, x2: torch.Tensor, *, rowwise: bool, columnwise: bool, backend) -> QuantizedTensor:
    """``x2`` quantized with the recipe's config for ``tensor`` ("input", "weight" or "grad") and the
    asked copies: what a layer's passes quantize (the recipe's NVFP4 or MXFP8 op)."""
    return _quantize(_tensor_config(recipe, tensor, rowwise, columnwise), x2, backend)


def _quantize(config, x2: torch.Tensor, backend, seed: Optional[torch.Tensor] = None) -> QuantizedTensor:
    """``x2`` quantized with a config of :func:`_tensor_config` (NVFP4 or MXFP8; ``seed``: an NVFP4 SR seed drawn on
    the device, else the cast draws its own)."""
    if isinstance(config, MXFP8QuantConfig):
        return ops.quantize_mxfp8(x2, config=config, backend=backend)
    return ops.quantize_nvfp4(x2, config=config, seed=seed, backend=backend)


def _dequantize(t: QuantizedTensor, which: str, dtype: torch.dtype, backend) -> torch.Tensor:
    if isinstance(t, MXFP8Tensor):
        return ops.dequantize_mxfp8(t, dtype=dtype, which=which, backend=backend)
    return ops.dequantize_nvfp4(t, dtype=dtype, which=which, backend=backend)


def _gemm_matrix(t: MXFP8Tensor, copy: str, backend) -> torch.Tensor:
    """The fp32 GEMM-orientation matrix of one MXFP8 copy: x (rowwise) or x^T (columnwise)."""
    if copy == "rowwise":
        return _dequantize(t, "rowwise", torch.float32, backend)
    return _dequantize(t, "columnwise", torch.float32, backend).t()


def _operands_apply(recipe, tensor: str, rowwise: bool, columnwise: bool) -> bool:
    """Whether a pass may cast ``tensor`` with BF16 operand outputs (:func:`nvfp4lab.ops.quantize_nvfp4_operands`):
    NVFP4 recipes of the quantized backward whose config has such a cast (no 4over6, not PR 3045's 2D weight).
    Each GEMM then takes them where :func:`nvfp4lab.ops.gemm_takes_operands` (it expands its operands to BF16
    anyway); eager and compiled passes alike."""
    if not isinstance(recipe, NVFP4Recipe) or recipe.backward != "quantized":
        return False
    config = _tensor_config(recipe, tensor, rowwise, columnwise)
    return not (config.four_over_six or config.broadcast_2d)


# Which path a GEMM takes depends on its sizes and on a rule per device (ops.gemm_expand_rule). Eager passes cache
# the answer per problem; a compiled pass takes the rule as a constant (built while torch.compile traces, outside
# its guards) and compares its sizes, symbolic ones included (the graph then guards on them).
@torch.compiler.assume_constant_result
def _expand_rule(device, backend) -> Optional[tuple]:
    return _expand_rule_cached(device, backend)


@functools.lru_cache(maxsize=64)
def _expand_rule_cached(device, backend) -> Optional[tuple]:
    return ops.gemm_expand_rule(device, backend)


@functools.lru_cache(maxsize=1024)
def _takes_operands_cached(m: int, n: int, k: int, device, backend, fprop: bool, sr_rows: bool) -> bool:
    return ops.gemm_takes_operands(m, n, k, device, backend, fprop=fprop, sr_rows=sr_rows)


@functools.lru_cache(maxsize=1024)
def _takes_expanded_cached(m: int, n: int, k: int, device, backend, num_experts: int) -> bool:
    if num_experts:
        return ops.grouped_gemm_takes_expanded(m, n, k, num_experts, device, backend)
    return ops.gemm_takes_expanded(m, n, k, device, backend)


def _takes_operands(m: int, n: int, k: int, device, backend, fprop: bool = False, sr_rows: bool = False) -> bool:
    """:func:`nvfp4lab.ops.gemm_takes_operands` of one problem."""
    if ops.compiling():
        return ops.takes_operands_by_rule(m, n, k, _expand_rule(device, backend), fprop, sr_rows)
    return _takes_operands_cached(m, n, k, device, backend, fprop, sr_rows)


def _takes_expanded(m: int, n: int, k: int, device, backend, num_experts: int = 0) -> bool:
    """:func:`nvfp4lab.ops.gemm_takes_expanded` of one problem (``num_experts`` > 0:
    :func:`nvfp4lab.ops.grouped_gemm_takes_expanded`)."""
    if ops.compiling():
        return ops.takes_expanded_by_rule(m, n, k, _expand_rule(device, backend), num_experts)
    return _takes_expanded_cached(m, n, k, device, backend, num_experts)


def dgrad_reads_rowwise(recipe, m: int, n: int, k: int, device, backend=None, num_experts: int = 0) -> bool:
    """Whether the dgrad of a Linear (m tokens, k -> n features; a GroupedLinear of ``num_experts`` > 0 such experts
    with its grouped GEMMs) reads W's rowwise copy transposed (:func:`nvfp4lab.ops.nvfp4_operand` with
    ``transposed=True``) instead of a columnwise copy: NVFP4 recipes of the quantized backward whose weight has
    16x16 blocks and a per-tensor amax (its columnwise copy is the rowwise one transposed), where the dgrad GEMM
    (m, k, n) expands its operands to BF16 anyway; eager and compiled passes alike. The forward then quantizes and
    saves W's rowwise copy only (the modules' weight caches ask the same)."""
    if not isinstance(recipe, NVFP4Recipe) or recipe.backward != "quantized":
        return False
    config = _tensor_config(recipe, "weight", True, True)
    if config.block != "16x16" or config.per_token or config.broadcast_2d:
        return False
    return _takes_expanded(m, k, n, device, backend, num_experts)


def quantized_gemm(a: QuantizedTensor, a_copy: str, b: QuantizedTensor, b_copy: str, *, out_dtype, bias=None, backend=None):
    """A @ B^T where A (B) is the GEMM-orientation matrix of the named copy of a (b): the rowwise copy
    of an (M, K) tensor is x itself, the columnwise copy is x^T."""
    if isinstance(a, MXFP8Tensor):
        out = _gemm_matrix(a, a_copy, backend) @ _gemm_matrix(b, b_copy, backend).t()
        if bias is not None:
            out = out + bias.float()
        return out.to(out_dtype)
    a_op = a if a_copy == "rowwise" else transposed_operand(a)
    b_op = b if b_copy == "rowwise" else transposed_operand(b)
    return ops.nvfp4_gemm(a_op, b_op, out_dtype=out_dtype, bias=bias, backend=backend)


def quantize_weight(weight: torch.Tensor, recipe=None, *, columnwise: bool = True, backend: Optional[str] = None) -> QuantizedTensor:
    """Quantize a weight (N, K) with the recipe's weight config: rowwise copy (fprop) and, when
    ``columnwise``, the columnwise copy (dgrad) in the same call. Modules cache the result while the
    parameter is unchanged and pass it to :func:`linear` as ``quantized_weight``."""
    recipe = resolve_recipe(recipe)
    _check_float("weight", weight)
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    return quantize_tensor(recipe, "weight", weight, rowwise=True, columnwise=columnwise, backend=backend)


# ------------------------------------------------------------------- saving quantized copies
# ctx.save_for_backward takes tensors only; a quantized copy is saved as (data, scale, amax) plus
# metadata, and rebuilt as a container holding just that copy.
def _pack(t: Optional[QuantizedTensor], copy: str):
    if t is None:
        return [None, None, None], None
    amax = getattr(t, f"{copy}_amax", None)
    tensors = [getattr(t, f"{copy}_data"), getattr(t, f"{copy}_scale"), amax]
    return tensors, (type(t), t.shape, t.dtype, t.config, copy)


def _unpack(tensors, meta) -> Optional[QuantizedTensor]:
    if meta is None:
        return None
    cls, shape, dtype, config, copy = meta
    parts = tuple(tensors) if cls is NVFP4Tensor else tuple(tensors[:2])
    rowwise = copy == "rowwise"
    return cls.from_parts(shape, dtype, with_copies(config, rowwise, not rowwise),
                          rowwise=parts if rowwise else None, columnwise=None if rowwise else parts)


# ------------------------------------------------------------------------ one GEMM, both passes
class _GemmPlan(NamedTuple):
    """What a Linear GEMM's recipe, sizes (m tokens, k -> n), device, backend and needed gradients fix: the copies
    each pass quantizes, their configs and the GEMM paths (:func:`_gemm_plan`)."""

    w_columnwise: bool  # the forward quantizes W's columnwise copy (dgrad reads it)
    w_rowwise_t: bool  # dgrad reads W's rowwise copy transposed instead (dgrad_reads_rowwise)
    m_pad: int  # x's rows as quantized: m, or padded to the block multiple for a columnwise copy
    x_config: object  # x's quantize config (rowwise, and columnwise for wgrad)
    x_operand: bool  # the fprop operand straight from x's cast (the saved copy packed)
    w_beside: bool  # W's cast on the side stream of a captured graph, beside x's
    dy_rows: int  # dy's rows as quantized
    dy_config: object  # dy's quantize config (None without a quantized backward GEMM)
    dy_row_op: bool  # dgrad's / wgrad's dy operand straight from dy's cast
    dy_col_op: bool
    dy_beside: bool  # the backward's side stream (W^T's, x^T's operands) beside dy's cast in a captured graph
    x_col_ahead: bool  # wgrad's x^T operand expanded before dy's cast (beside it in a captured graph)
    dy_seed_ahead: bool  # dy's SR seed drawn by the forward on the side stream of a captured graph


def _new_gemm_plan(recipe, m: int, n: int, k: int, device, backend, need_dgrad: bool, need_wgrad: bool) -> _GemmPlan:
    quantized = recipe.backward == "quantized"
    x_columnwise = quantized and need_wgrad
    w_columnwise = quantized and need_dgrad
    w_rowwise_t = w_columnwise and dgrad_reads_rowwise(recipe, m, n, k, device, backend)
    m_pad = _roundup(m, block_multiple(recipe)) if x_columnwise else m
    x_operand = (_operands_apply(recipe, "input", True, x_columnwise)
                 and _takes_operands(m_pad, n, k, device, backend, fprop=True))
    # beside a packed cast of x, or an operand cast (4x the bytes) below the general operand size, where the two
    # still gain from running together rather than only competing for bandwidth
    w_beside = not (x_operand and _takes_operands(m_pad, n, k, device, backend))
    dy_rows = m_pad if need_wgrad else m
    dy_config, dy_row_op, dy_col_op = None, False, False
    if quantized and (need_dgrad or need_wgrad):
        dy_config = _tensor_config(recipe, "grad", need_dgrad, need_wgrad)
        operands = _operands_apply(recipe, "grad", need_dgrad, need_wgrad)
        # TE's gradient recipe (per tensor, SR, an RHT columnwise copy): its split cast's rowwise launch
        # (cast_row_kernel) writes the operand from a smaller size (opt_flags.SR_ROW_OPERAND_MIN_ELEMENTS)
        sr_rows = (isinstance(dy_config, NVFP4QuantConfig) and dy_config.stochastic_rounding and dy_config.rht
                   and not dy_config.per_token and need_wgrad)
        dy_row_op = operands and need_dgrad and _takes_operands(dy_rows, k, n, device, backend, sr_rows=sr_rows)
        dy_col_op = operands and need_wgrad and _takes_operands(n, k, dy_rows, device, backend)
    # beside a packed cast of dy, or operand casts below the general operand size (as the forward's W beside x)
    dy_beside = not ((dy_row_op or dy_col_op) and ops.operand_cast_pays(dy_rows, n))
    x_col_ahead = x_columnwise and isinstance(recipe, NVFP4Recipe) and _takes_expanded(n, k, dy_rows, device, backend)
    # a seed the backward's capture would draw first, on its critical path (the Triton casts read device seeds)
    dy_seed_ahead = (isinstance(recipe, NVFP4Recipe) and dy_config is not None and dy_config.stochastic_rounding
                     and ops.resolve_backend(backend, device) == "triton")
    return _GemmPlan(w_columnwise and not w_rowwise_t, w_rowwise_t, m_pad,
                     _tensor_config(recipe, "input", True, x_columnwise), x_operand, w_beside, dy_rows, dy_config,
                     dy_row_op, dy_col_op, dy_beside, x_col_ahead, dy_seed_ahead)


_GEMM_PLANS: dict = {}


def _clear_path_caches() -> None:
    """Forget every cached path decision: the rule per device, each problem's answers and the GEMM plans (tests that
    replace :mod:`nvfp4lab.ops`' path rules call it; the rules are constant in a program)."""
    for cache in (_expand_rule_cached, _takes_expanded_cached, _takes_operands_cached):
        cache.cache_clear()
    _GEMM_PLANS.clear()


def _gemm_plan(recipe, m: int, n: int, k: int, device, backend, need_dgrad: bool, need_wgrad: bool) -> _GemmPlan:
    """The :class:`_GemmPlan` of one problem: built once per key in eager mode, anew while torch.compile traces."""
    if ops.compiling():
        return _new_gemm_plan(recipe, m, n, k, device, backend, need_dgrad, need_wgrad)
    key = (recipe, m, n, k, device, backend, need_dgrad, need_wgrad)
    plan = _GEMM_PLANS.get(key)
    if plan is None:
        if len(_GEMM_PLANS) >= 4096:
            _GEMM_PLANS.clear()
        plan = _GEMM_PLANS[key] = _new_gemm_plan(recipe, m, n, k, device, backend, need_dgrad, need_wgrad)
    return plan


def _forward_gemm(x2, weight, bias, qweight, recipe, cdtype, need_dgrad, need_wgrad, backend):
    """y = x2 W^T (+ bias). Returns (y, tensors to save, metadata for :func:`_backward_gemm`)."""
    m, k = x2.shape
    n = weight.shape[0]
    meta = dict(m=m, n=n, k=k, x_dtype=x2.dtype, w_dtype=weight.dtype, bias_dtype=None if bias is None else bias.dtype,
                need_dgrad=need_dgrad, need_wgrad=need_wgrad, m_pad=m, x_meta=None, w_meta=None, w_rowwise_t=False)
    if m == 0:
        return x2.new_zeros((0, n), dtype=cdtype), [None] * 6, meta
    if x2.dtype != cdtype:
        x2 = x2.to(cdtype)
    mode = recipe.backward
    plan = _gemm_plan(recipe, m, n, k, x2.device, backend, need_dgrad, need_wgrad)
    meta["plan"] = plan
    w_rowwise_t, w_columnwise, m_pad = plan.w_rowwise_t, plan.w_columnwise, plan.m_pad
    meta["w_rowwise_t"] = w_rowwise_t
    meta["m_pad"] = m_pad
    x_op = None
    w_cast = qweight is None or (w_columnwise and qweight.columnwise_data is None)
    # in a captured graph, the side stream first draws dy's SR seed, then casts W beside x's cast (plan.w_beside)
    side = fork(x2.device) if plan.dy_seed_ahead or (w_cast and plan.w_beside) else None
    if side is not None and plan.dy_seed_ahead:
        with on_stream(side):
            meta["dy_seed"] = device_seed(x2.device)
    if w_cast:
        with on_stream(side if plan.w_beside else None):
            qweight = quantize_weight(weight, recipe, columnwise=w_columnwise, backend=backend)
    if plan.x_operand:  # the fprop operand straight from the cast; the saved copy packed
        qx, x_op, _ = ops.quantize_nvfp4_operands(_pad_rows(x2, m_pad), config=plan.x_config, columnwise_operand=False,
                                                  backend=backend)
    else:
        qx = _quantize(plan.x_config, _pad_rows(x2, m_pad), backend)
    if side is not None:
        join(side, *_tensors(qweight), *([meta["dy_seed"]] if "dy_seed" in meta else []))
    if x_op is not None:
        y = ops.nvfp4_gemm(x_op, qweight, out_dtype=cdtype, bias=bias, backend=backend)
    else:
        y = quantized_gemm(qx, "rowwise", qweight, "rowwise", out_dtype=cdtype, bias=bias, backend=backend)
    if m_pad != m:
        y = y[:m]
    if mode == "quantized":
        x_saved, meta["x_meta"] = _pack(qx if need_wgrad else None, "columnwise")
        w_saved, meta["w_meta"] = _pack(qweight if need_dgrad else None, "rowwise" if w_rowwise_t else "columnwise")
    elif mode == "dequantized":
        x_saved, meta["x_meta"] = _pack(qx if need_wgrad else None, "rowwise")
        w_saved, meta["w_meta"] = _pack(qweight if need_dgrad else None, "rowwise")
    else:
        x_saved = [x2 if need_wgrad else None, None, None]
        w_saved = [weight if need_dgrad else None, None, None]
    return y, x_saved + w_saved, meta


def _quantized_backward(dy2, saved, meta, backend):
    """(dx, dW, db) of one GEMM with a quantized backward GEMM."""
    m = meta["m"]
    need_dgrad, need_wgrad = meta["need_dgrad"], meta["need_wgrad"]
    need_bgrad = meta["bias_dtype"] is not None
    qx, qw = _unpack(saved[0:3], meta["x_meta"]), _unpack(saved[3:6], meta["w_meta"])
    plan = meta["plan"]
    # what does not wait for dy's cast runs first: the operands of W^T (dgrad) and x^T (wgrad), then the bias
    # gradient where dy's cast does not sum dy itself; in a captured graph on the side stream, beside dy's cast
    # (plan.dy_beside)
    w_ahead = need_dgrad and meta["w_rowwise_t"]
    x_ahead = need_wgrad and plan.x_col_ahead
    fused_db = need_bgrad and isinstance(plan.dy_config, NVFP4QuantConfig)
    torch_db = need_bgrad and not fused_db
    side = fork(dy2.device) if (w_ahead or x_ahead or torch_db) and plan.dy_beside else None
    with on_stream(side):
        w_op = ops.nvfp4_operand(qw, transposed=True, backend=backend) if w_ahead else None
        x_op = ops.nvfp4_operand(transposed_operand(qx), backend=backend) if x_ahead else None
        db = dy2.sum(0, dtype=torch.float32).to(meta["bias_dtype"]) if torch_db else None
    dy_rows = _pad_rows(dy2, plan.dy_rows)  # zero rows: they add nothing to the bias gradient
    row_op, col_op = plan.dy_row_op, plan.dy_col_op
    seed = meta.get("dy_seed")  # drawn by a captured forward (plan.dy_seed_ahead), else by the cast
    if row_op or col_op:  # the GEMMs' BF16 operands straight from the cast (and the bias gradient from its amax pass)
        qdy, dy_row, dy_col, *fused = ops.quantize_nvfp4_operands(
            dy_rows, config=plan.dy_config, rowwise_operand=row_op, columnwise_operand=col_op, seed=seed,
            backend=backend, dbias_dtype=meta["bias_dtype"] if fused_db else None)
        if fused_db:
            db = fused[0]
    elif fused_db:  # the bias gradient from the cast's amax pass (its read of dy)
        qdy, db = ops.quantize_nvfp4_dbias(dy_rows, config=plan.dy_config, dbias_dtype=meta["bias_dtype"], seed=seed,
                                           backend=backend)
        dy_row = dy_col = None
    else:
        qdy = _quantize(plan.dy_config, dy_rows, backend, seed)
        dy_row = dy_col = None
    if side is not None:
        join(side, *[t for t in (w_op and w_op.values, x_op and x_op.values, db if torch_db else None) if t is not None])
    dx = dw = None
    if need_dgrad:
        if w_op is not None or dy_row is not None:  # NVFP4 operands
            dx = ops.nvfp4_gemm(qdy if dy_row is None else dy_row, transposed_operand(qw) if w_op is None else w_op,
                                out_dtype=meta["x_dtype"], backend=backend)[:m]
        else:
            dx = quantized_gemm(qdy, "rowwise", qw, "columnwise", out_dtype=meta["x_dtype"], backend=backend)[:m]
    if need_wgrad:
        if dy_col is not None or x_op is not None:
            dw = ops.nvfp4_gemm(transposed_operand(qdy) if dy_col is None else dy_col,
                                transposed_operand(qx) if x_op is None else x_op, out_dtype=meta["w_dtype"],
                                backend=backend)
        else:
            dw = quantized_gemm(qdy, "columnwise", qx, "columnwise", out_dtype=meta["w_dtype"], backend=backend)
    return dx, dw, db


def _backward_gemm(dy2, saved, meta, recipe, cdtype, backend):
    """(dx, dW, db) of one GEMM; None where not needed."""
    m, n, k = meta["m"], meta["n"], meta["k"]
    need_dgrad, need_wgrad = meta["need_dgrad"], meta["need_wgrad"]
    need_bgrad = meta["bias_dtype"] is not None
    device = dy2.device
    if m == 0:
        dx = torch.zeros((0, k), dtype=meta["x_dtype"], device=device) if need_dgrad else None
        dw = torch.zeros((n, k), dtype=meta["w_dtype"], device=device) if need_wgrad else None
        db = torch.zeros((n,), dtype=meta["bias_dtype"], device=device) if need_bgrad else None
        return dx, dw, db
    if dy2.dtype != cdtype:
        dy2 = dy2.to(cdtype)
    mode = recipe.backward
    if mode == "quantized" and (need_dgrad or need_wgrad):
        return _quantized_backward(dy2, saved, meta, backend)
    db = dy2.sum(0, dtype=torch.float32).to(meta["bias_dtype"]) if need_bgrad else None
    dx = dw = None
    if mode == "quantized":
        return dx, dw, db
    if mode == "dequantized":
        qx, qw = _unpack(saved[0:3], meta["x_meta"]), _unpack(saved[3:6], meta["w_meta"])
        x_hp = _dequantize(qx, "rowwise", cdtype, backend) if need_wgrad else None
        w_hp = _dequantize(qw, "rowwise", cdtype, backend) if need_dgrad else None
    else:
        x_hp = saved[0]
        w_hp = saved[3].to(cdtype) if need_dgrad else None
    if need_dgrad:
        dx = (dy2 @ w_hp).to(meta["x_dtype"])
    if need_wgrad:
        dw = (dy2.t() @ x_hp).to(meta["w_dtype"])
    return dx, dw, db


# -------------------------------------------------------------------- grouped (MoE) fast path
# With an NVFP4 recipe and backward="quantized", GroupedLinear runs each pass as one grouped quantize
# (every split with its own amax, as the per-expert path) and one grouped GEMM against the stacked
# expert weights; wgrad stays a per-expert GEMM on the columnwise split views (each contracts over its
# own token count). Every split is quantized and multiplied exactly as by the per-expert loop.
def stack_grouped_weights(quantized_weights: Sequence[NVFP4Tensor], *, columnwise: bool = True,
                          backend: Optional[str] = None) -> tuple:
    """Per-expert quantized weights (from :func:`quantize_weight`) -> (rowwise stack (E, N, K), columnwise
    stack (E, K, N) or None) for :func:`grouped_linear`'s ``stacked_weights`` (modules cache it).
    ``backend`` unswizzles the scales (as :func:`nvfp4lab.moe.stack_weights`'s)."""
    rowwise = moe.stack_weights(list(quantized_weights), backend=backend)
    col = None
    if columnwise:
        if any(q.columnwise_data is None for q in quantized_weights):
            raise ValueError("columnwise=True needs quantized weights with a columnwise copy")
        col = moe.stack_weights([transposed_operand(q) for q in quantized_weights], backend=backend)
    return rowwise, col


def packed_weights(weights: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """The (E, N, K) tensor whose slices are ``weights`` (E plain contiguous (N, K) tensors of one dtype,
    consecutive in one storage, as :class:`~nvfp4lab.GroupedLinear` keeps them), detached; None otherwise
    or while torch.compile traces (fake tensors have no addresses)."""
    w0 = weights[0]
    if ops.compiling() or type(w0) not in (torch.Tensor, torch.nn.Parameter) or w0.dim() != 2 or not w0.is_contiguous():
        return None
    n, k = w0.shape
    step = n * k * w0.element_size()
    start = w0.data_ptr()
    for i, w in enumerate(weights):
        if (type(w) is not type(w0) or w.dtype != w0.dtype or w.data_ptr() != start + i * step or w.shape != w0.shape
                or not w.is_contiguous()):
            return None
    # consecutive addresses inside w0's own storage: one allocation (as_strided checks the bound too)
    if (w0.storage_offset() * w0.element_size() + len(weights) * step > w0.untyped_storage().nbytes()
            or step == 0):
        return None
    return w0.detach().as_strided((len(weights), n, k), (n * k, k, 1))


def quantize_grouped_weights(weights: Sequence[torch.Tensor], recipe=None, *, columnwise: bool = True,
                             backend: Optional[str] = None, operand: bool = False) -> tuple:
    """E expert weights (N, K) of one shape -> the (rowwise (E, N, K), columnwise (E, K, N) or None) pair
    of :func:`stack_grouped_weights`, from one grouped quantize of all experts (each its own amax:
    bit-identical to quantizing each with :func:`quantize_weight` and stacking; 2 launches whatever E).
    Weights packed in one storage (:func:`packed_weights`) are read in place, others are stacked first
    (one copy). PR 3045's 2D weight config (a per-tensor cast the grouped op rejects) takes the
    per-expert path.

    ``operand=True`` (rowwise only: ``columnwise=False``): the pair is (the rowwise stack as the
    :class:`~nvfp4lab.NVFP4Operand` (E, N, K) the Hopper grouped GEMM consumes, None), the same values as
    :func:`nvfp4lab.ops.nvfp4_operand` of the packed stack: written by the cast itself where
    :func:`nvfp4lab.ops.operand_cast_pays` (E * N, K), else expanded from the packed stack."""
    recipe = resolve_recipe(recipe)
    if not isinstance(recipe, NVFP4Recipe):
        raise TypeError(f"quantize_grouped_weights needs an NVFP4 recipe, got {type(recipe).__name__}")
    if operand and columnwise:
        raise ValueError("operand=True gives the rowwise stack alone: pass columnwise=False")
    config = _tensor_config(recipe, "weight", True, columnwise)
    num = len(weights)
    n, k = weights[0].shape
    if operand and not (config.broadcast_2d or config.four_over_six) and ops.operand_cast_pays(num * n, k):
        stacked_hp, offsets = _stacked_weights_hp(weights)
        _, op = ops.quantize_nvfp4_grouped_operands(stacked_hp.reshape(num * n, k), [n] * num, split_offsets=offsets,
                                                    config=_replaced(config, scale_layout="compact"), backend=backend)
        return NVFP4Operand(op.values.view(num, n, k), op.amax, op.config), None
    if operand:
        rowwise, _ = quantize_grouped_weights(weights, recipe, columnwise=False, backend=backend)
        return ops.nvfp4_operand(rowwise, backend=backend), None
    if config.broadcast_2d:
        return stack_grouped_weights([quantize_weight(w, recipe, columnwise=columnwise, backend=backend) for w in weights],
                                     columnwise=columnwise, backend=backend)
    stacked_hp, offsets = _stacked_weights_hp(weights)
    bulk = ops.quantize_nvfp4_grouped_bulk(stacked_hp.reshape(num * n, k), [n] * num, split_offsets=offsets,
                                           config=_replaced(config, scale_layout="compact"), backend=backend)
    row_config = _stack_config(config)
    rowwise = NVFP4Tensor.from_parts(torch.Size((num, n, k)), bulk.dtype, row_config,
                                     rowwise=(bulk.rowwise_data, bulk.rowwise_scale, bulk.rowwise_amax))
    col = None
    if columnwise:
        col_config = _stack_config(operand_config(config, True))
        col = NVFP4Tensor.from_parts(torch.Size((num, k, n)), bulk.dtype, col_config,
                                     rowwise=(bulk.columnwise_data.view(num * k, n // 2),
                                              bulk.columnwise_scale.view(num * k, n // 16),
                                              bulk.columnwise_amax.reshape(-1)))
    return rowwise, col


def _stacked_weights_hp(weights: Sequence[torch.Tensor]) -> tuple:
    """(the experts' weights as one (E, N, K) tensor, read in place where :func:`packed_weights` allows, the
    device int64 row offsets of their splits (E + 1,), cached)."""
    num = len(weights)
    n = weights[0].shape[0]
    stacked_hp = packed_weights(weights)
    if stacked_hp is None:
        stacked_hp = torch.stack([w.detach() for w in weights])
    return stacked_hp, _WEIGHT_SPLITS.get((n,) * num, stacked_hp.device).quantized_splits(False)[1]


def _stack_config(config):
    """The config :func:`nvfp4lab.moe.stack_weights` gives a stack of tensors with ``config``."""
    return _replaced(config, scale_layout="compact", rowwise=True, columnwise=False)


def _grouped_applies(recipe, m_splits, biases) -> bool:
    if not isinstance(recipe, NVFP4Recipe) or recipe.backward != "quantized" or sum(m_splits) == 0:
        return False
    if all(b is None for b in biases):
        return True
    return all(b is not None and b.dtype == biases[0].dtype for b in biases)


_TOKEN_BLOCK = 16  # columnwise NVFP4 copies block 16 tokens


def _split_sizes(m_splits) -> tuple:
    check_split_sizes("m_splits", m_splits)
    return tuple(m_splits)


class SplitLayout:
    """One ``m_splits`` on one device, in the forms the grouped path needs: the split sizes on the host
    (shapes, split views) and their int64 row offsets (n + 1,) on the device (read by the grouped
    quantize and GEMM kernels).

    Columnwise copies block 16 tokens, so a pass that needs them zero-pads each split to a multiple of
    16 rows, as the per-expert path pads each split (zero rows change no amax and add nothing to dW):
    ``padded_sizes`` / ``padded_offsets`` describe the padded tokens and ``pad_index`` (M,) gives each
    token's padded row (None when every split is a multiple of 16). All device tensors are built here,
    with at most one host->device copy (see :func:`nvfp4lab.ops.host_ints_on_device`); keep layouts
    in a :class:`SplitLayoutCache` so that repeated splits copy nothing.
    """

    def __init__(self, m_splits: Sequence[int], device):
        self.m_splits = _split_sizes(m_splits)
        self.device = torch.device(device)
        self.padded_sizes = tuple(_roundup(s, _TOKEN_BLOCK) for s in self.m_splits)
        num_offsets = len(self.m_splits) + 1
        host = cumulative_offsets(self.m_splits)
        if self.needs_padding:
            host += cumulative_offsets(self.padded_sizes)
        both = ops.host_ints_on_device(host, self.device)  # one copy for both offset vectors
        self.offsets = both[:num_offsets]
        self.padded_offsets = both[num_offsets:] if self.needs_padding else self.offsets
        self.pad_index = None
        if self.needs_padding:
            m = host[num_offsets - 1]
            shift = self.padded_offsets[:-1] - self.offsets[:-1]
            # built from the device offsets: no (M,) host copy, and capturable
            self.pad_index = torch.arange(m, device=self.device) + torch.repeat_interleave(
                shift, self.offsets.diff(), output_size=m)

    @property
    def needs_padding(self) -> bool:
        return self.padded_sizes != self.m_splits

    def quantized_splits(self, padded: bool) -> tuple:
        """(host sizes, device offsets) of the splits as quantized: padded to 16 rows each, or not."""
        return (self.padded_sizes, self.padded_offsets) if padded else (self.m_splits, self.offsets)

    def pad(self, t: torch.Tensor) -> torch.Tensor:
        out = t.new_zeros((sum(self.padded_sizes), t.shape[1]))
        return out.index_copy_(0, self.pad_index, t)

    def unpad(self, t: torch.Tensor) -> torch.Tensor:
        return t.index_select(0, self.pad_index)


class SplitLayoutCache:
    """The :class:`SplitLayout` of each ``(m_splits, device)`` seen, kept for reuse by its owner (a
    :class:`~nvfp4lab.GroupedLinear` holds one; pass it to :func:`grouped_linear` as ``split_cache``):
    after the first call with some splits, later calls copy nothing to the device, so the step can be
    CUDA-graph captured. At most ``max_entries`` layouts, the least recently used dropped first.

    Layouts made during CUDA graph capture are not kept (their tensors live in the graph's private
    memory pool), nor while torch.compile traces (its graph holds the tensors it builds).
    """

    def __init__(self, max_entries: int = 64):
        if not isinstance(max_entries, int) or isinstance(max_entries, bool) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        self.max_entries = max_entries
        self._layouts: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._layouts)

    def clear(self) -> None:
        self._layouts.clear()

    def get(self, m_splits: Sequence[int], device) -> SplitLayout:
        """The layout of ``m_splits`` (host ints) on ``device``, built on first use."""
        device = torch.device(device)
        if ops.compiling():
            return SplitLayout(m_splits, device)
        key = (_split_sizes(m_splits), device)
        layout = self._layouts.get(key)
        if layout is not None:
            self._layouts.move_to_end(key)
            return layout
        layout = SplitLayout(key[0], device)
        if not ops.graph_capturing(device):
            self._layouts[key] = layout
            if len(self._layouts) > self.max_entries:
                self._layouts.popitem(last=False)
        return layout


_WEIGHT_SPLITS = SplitLayoutCache(max_entries=16)  # the experts' row offsets per (E, N)


def _grouped_quantize(recipe, tensor: str, x2, sizes, offsets, *, rowwise: bool, columnwise: bool, backend):
    config = _replaced(_tensor_config(recipe, tensor, rowwise, columnwise), scale_layout="compact")
    return ops.quantize_nvfp4_grouped_bulk(x2, list(sizes), split_offsets=offsets, config=config, backend=backend)


def _grouped_forward(x2, layout, weights, biases, qweights, stacked, recipe, cdtype, need_dgrad, need_wgrads, backend,
                     save_weight_operand: bool):
    """y of all experts in one grouped quantize + one grouped GEMM. Returns (y, tensors to save, meta).
    ``save_weight_operand``: where dgrad reads W's rowwise copy transposed, W's BF16 operand is made once here
    (by the cast where that pays) and saved for dgrad (:func:`grouped_linear`). Where the grouped GEMM expands its
    operands, x's cast writes x's rowwise operand itself (:func:`_x_operand_applies`)."""
    m, k = x2.shape
    n = weights[0].shape[0]
    num = len(weights)
    any_wgrad = any(need_wgrads)
    x_dtype = x2.dtype
    x2 = x2.to(cdtype)
    padded = any_wgrad and layout.needs_padding  # only columnwise copies need 16-token splits
    sizes, offsets = layout.quantized_splits(padded)
    w_rowwise_t = need_dgrad and dgrad_reads_rowwise(recipe, m, n, k, x2.device, backend, num_experts=num)
    w_columnwise = need_dgrad and not w_rowwise_t
    w_op = None
    side = None
    if save_weight_operand and w_rowwise_t:
        side = fork(x2.device)
        with on_stream(side):
            if stacked is not None:
                w_op = ops.nvfp4_operand(stacked[0], backend=backend)
            elif qweights is not None:
                w_op = ops.nvfp4_operand(stack_grouped_weights(qweights, columnwise=False, backend=backend)[0],
                                         backend=backend)
            else:
                w_op = quantize_grouped_weights(weights, recipe, columnwise=False, backend=backend, operand=True)[0]
    elif stacked is None or (w_columnwise and stacked[1] is None):
        if qweights is None or (w_columnwise and any(q.columnwise_data is None for q in qweights)):
            stacked = quantize_grouped_weights(weights, recipe, columnwise=w_columnwise, backend=backend)
        else:
            stacked = stack_grouped_weights(qweights, columnwise=w_columnwise, backend=backend)
    x_in = layout.pad(x2) if padded else x2
    if _x_operand_applies(recipe, sum(sizes), n, k, num, x2.device, backend):
        config = _replaced(_tensor_config(recipe, "input", True, any_wgrad), scale_layout="compact")
        qx, x_op = ops.quantize_nvfp4_grouped_operands(x_in, list(sizes), split_offsets=offsets, config=config,
                                                       backend=backend)
        a, offs = x_op, offsets[1:]
    else:
        qx = a = _grouped_quantize(recipe, "input", x_in, sizes, offsets, rowwise=True, columnwise=any_wgrad,
                                   backend=backend)
        offs = None
    if side is not None:  # W's cast ran beside x's: the GEMM waits for it, W's operand lives on
        join(side, w_op.values, w_op.amax)
    bias = None if biases[0] is None else torch.stack([b.detach() for b in biases])
    y = ops.nvfp4_grouped_gemm(a, stacked[0] if w_op is None else w_op, offs, out_dtype=cdtype, bias=bias,
                               backend=backend, m_splits=list(sizes))
    if padded:
        y = layout.unpad(y)
    meta = dict(m=m, n=n, k=k, x_dtype=x_dtype, w_dtypes=[w.dtype for w in weights],
                bias_dtype=None if biases[0] is None else biases[0].dtype, need_dgrad=need_dgrad,
                need_wgrads=list(need_wgrads), layout=layout, padded=padded, x_meta=None, w_meta=None,
                w_rowwise_t=w_rowwise_t)
    saved = [None] * 7
    if any_wgrad:
        saved[0:4] = [qx.split_offsets, qx.columnwise_data, qx.columnwise_scale, qx.columnwise_amax]
        meta["x_meta"] = (qx.shape, qx.dtype, _replaced(qx.config, rowwise=False))
    if w_op is not None:  # the operand of W^T for dgrad: a transposed view of the same values
        saved[4:6] = [w_op.values, w_op.amax]
        meta["w_meta"] = ("operand", operand_config(w_op.config, True))
    elif need_dgrad:
        w = stacked[0] if w_rowwise_t else stacked[1]
        saved[4:7] = [w.rowwise_data, w.rowwise_scale, w.rowwise_amax]
        meta["w_meta"] = (w.shape, w.dtype, w.config)
    return y, saved, meta


def _x_operand_applies(recipe, m: int, n: int, k: int, num_experts: int, device, backend) -> bool:
    """Whether the forward's grouped cast of x (m, k) writes x's rowwise copy as the BF16 operand
    (:func:`nvfp4lab.ops.quantize_nvfp4_grouped_operands`): where the grouped GEMM (m, n, k) of ``num_experts``
    expands its operands anyway, for x configs whose cast has that output (no four_over_six, no PR 3045 2D)."""
    config = _tensor_config(recipe, "input", True, False)
    if config.four_over_six or config.broadcast_2d:
        return False
    return _takes_expanded(m, n, k, device, backend, num_experts)


def _tensors(t) -> list:
    """The tensor fields of a quantized container (what :func:`nvfp4lab.runtime.join` keeps allocated)."""
    return [v for v in (getattr(t, f.name) for f in dataclasses.fields(t)) if isinstance(v, torch.Tensor)]


def _grouped_backward(dy2, saved, meta, recipe, cdtype, backend):
    """(dx, [dW_i], [db_i]) of the grouped path."""
    n, k = meta["n"], meta["k"]
    layout, padded = meta["layout"], meta["padded"]
    sizes, offsets = layout.quantized_splits(padded)
    need_dgrad, need_wgrads = meta["need_dgrad"], meta["need_wgrads"]
    any_wgrad = any(need_wgrads)
    dy2 = dy2.to(cdtype)
    num = len(sizes)
    dbs = [None] * num
    if meta["bias_dtype"] is not None:
        dbs = [part.sum(0, dtype=torch.float32).to(meta["bias_dtype"]) for part in dy2.split(list(layout.m_splits))]
    dx, dws = None, [None] * num
    if not (need_dgrad or any_wgrad):
        return dx, dws, dbs
    qdy = _grouped_quantize(recipe, "grad", layout.pad(dy2) if padded else dy2, sizes, offsets,
                            rowwise=need_dgrad, columnwise=any_wgrad, backend=backend)
    if need_dgrad:
        w_meta = meta["w_meta"]
        if w_meta[0] == "operand":  # saved by the forward: W's values (E, N, K) -> W^T's operand (E, K, N)
            w = NVFP4Operand(saved[4].transpose(-1, -2), saved[5], w_meta[1])
        else:
            w = NVFP4Tensor.from_parts(*w_meta, rowwise=tuple(saved[4:7]))
            if meta["w_rowwise_t"]:
                w = ops.nvfp4_operand(w, transposed=True, backend=backend)
        dx = ops.nvfp4_grouped_gemm(qdy, w, out_dtype=meta["x_dtype"], backend=backend, m_splits=list(sizes))
        if padded:
            dx = layout.unpad(dx)
    if any_wgrad:
        shape, dtype, config = meta["x_meta"]
        qx = GroupedNVFP4Tensor.from_parts(shape, dtype, config, saved[0], columnwise=tuple(saved[1:4]))
        w_dtypes = meta["w_dtypes"]
        if all(need_wgrads) and all(d == w_dtypes[0] for d in w_dtypes):  # every expert at once
            dw = ops.nvfp4_grouped_wgrad(qdy, qx, sizes, out_dtype=w_dtypes[0], backend=backend)
            return dx, list(dw.unbind(0)), dbs
        x_parts, dy_parts = qx.split(sizes), qdy.split(sizes)
        for i in range(num):
            if not need_wgrads[i]:
                continue
            w_dtype = meta["w_dtypes"][i]
            if sizes[i] == 0:
                dws[i] = torch.zeros((n, k), dtype=w_dtype, device=dy2.device)
            else:
                dws[i] = ops.nvfp4_gemm(transposed_operand(dy_parts[i]), transposed_operand(x_parts[i]), out_dtype=w_dtype,
                                        backend=backend)
    return dx, dws, dbs


def _no_autocast(device: torch.device):
    """Autocast off inside the Functions (a no-op context when it is off already, the common case, and
    for meta tensors, which have no autocast to turn off)."""
    if device.type != "meta" and torch.is_autocast_enabled(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------- autograd Functions
class _LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, quantized_weight, recipe, cdtype, backend):
        in_shape = x.shape
        x2 = x.reshape(in_shape[:-1].numel(), in_shape[-1])  # not -1: in_features may be 0
        need_dgrad, need_wgrad = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        with _no_autocast(x.device):
            y2, saved, meta = _forward_gemm(x2, weight, bias, quantized_weight, recipe, cdtype, need_dgrad, need_wgrad, backend)
        ctx.save_for_backward(*saved)
        ctx.meta, ctx.recipe, ctx.cdtype, ctx.backend, ctx.in_shape = meta, recipe, cdtype, backend, in_shape
        out_shape = torch.Size((*in_shape[:-1], meta["n"]))
        # a same-shape reshape returns a view, which FSDP2 flags when it is a module's output
        return y2 if y2.shape == out_shape else y2.reshape(out_shape)

    @staticmethod
    def backward(ctx, dy):
        meta = ctx.meta
        with _no_autocast(dy.device):
            dx2, dw, db = _backward_gemm(dy.reshape(meta["m"], meta["n"]), ctx.saved_tensors, meta, ctx.recipe, ctx.cdtype, ctx.backend)
        dx = dx2.reshape(ctx.in_shape) if dx2 is not None else None
        return dx, dw, db, None, None, None, None


_GROUPED_PARAMS_AT = 10  # index of the first weight among _GroupedLinearFunction.forward's inputs
_NO_GRADS = (None,) * (_GROUPED_PARAMS_AT - 1)  # m_splits .. num_gemms take no gradient


class _GroupedLinearFunction(torch.autograd.Function):
    """y[split i] = x[split i] W_i^T (+ b_i). NVFP4 recipes with backward="quantized": one grouped
    quantize of all expert weights, one grouped quantize + one grouped GEMM per pass (fprop, dgrad) and
    one grouped wgrad over the bulk columnwise copies (:func:`_grouped_forward`); otherwise a loop of
    per-split quantize + GEMM calls (the definition)."""

    @staticmethod
    def forward(ctx, x, m_splits, layout, quantized_weights, stacked_weights, recipe, cdtype, backend, save_weight_operand,
                num_gemms, *params):
        # layout: the SplitLayout of m_splits when the grouped path applies, else None
        weights, biases = params[:num_gemms], params[num_gemms:]
        in_shape = x.shape
        x2 = x.reshape(in_shape[:-1].numel(), in_shape[-1])  # not -1: in_features may be 0
        need_dgrad = bool(ctx.needs_input_grad[0])
        need_wgrads = [bool(ctx.needs_input_grad[_GROUPED_PARAMS_AT + i]) for i in range(num_gemms)]
        ctx.grouped = layout is not None
        with _no_autocast(x.device):
            if ctx.grouped:
                y, all_saved, metas = _grouped_forward(x2, layout, weights, biases, quantized_weights, stacked_weights,
                                                       recipe, cdtype, need_dgrad, need_wgrads, backend,
                                                       save_weight_operand)
            else:
                ys, all_saved, metas = [], [], []
                offset = 0
                for i, rows in enumerate(m_splits):
                    qw = None if quantized_weights is None else quantized_weights[i]
                    y, saved, meta = _forward_gemm(x2[offset:offset + rows], weights[i], biases[i], qw, recipe, cdtype,
                                                   need_dgrad, need_wgrads[i], backend)
                    ys.append(y)
                    all_saved.extend(saved)
                    metas.append(meta)
                    offset += rows
                y = torch.cat(ys, dim=0)
        ctx.save_for_backward(*all_saved)
        ctx.metas, ctx.recipe, ctx.cdtype, ctx.backend, ctx.in_shape = metas, recipe, cdtype, backend, in_shape
        ctx.num_gemms, ctx.has_bias = num_gemms, [b is not None for b in biases]
        out_shape = torch.Size((*in_shape[:-1], y.shape[-1]))
        return y if y.shape == out_shape else y.reshape(out_shape)  # no view: see _LinearFunction

    @staticmethod
    def backward(ctx, dy):
        metas = ctx.metas
        saved = ctx.saved_tensors
        if ctx.grouped:
            with _no_autocast(dy.device):
                dy2 = dy.reshape(ctx.in_shape[:-1].numel(), metas["n"])
                dx, dws, dbs = _grouped_backward(dy2, saved, metas, ctx.recipe, ctx.cdtype, ctx.backend)
            dx = dx.reshape(ctx.in_shape) if dx is not None else None
            return (dx, *_NO_GRADS, *dws, *dbs)
        dy2 = dy.reshape(ctx.in_shape[:-1].numel(), metas[0]["n"])
        dxs, dws, dbs = [], [], []
        offset = 0
        with _no_autocast(dy.device):
            for i, meta in enumerate(metas):
                dx, dw, db = _backward_gemm(dy2[offset:offset + meta["m"]], saved[6 * i:6 * i + 6], meta, ctx.recipe,
                                            ctx.cdtype, ctx.backend)
                dxs.append(dx)
                dws.append(dw)
                dbs.append(db)
                offset += meta["m"]
            dx = torch.cat(dxs, dim=0).reshape(ctx.in_shape) if metas[0]["need_dgrad"] else None
        return (dx, *_NO_GRADS, *dws, *dbs)


# ---------------------------------------------------------------------------------- public API
def _check_weight_bias(weight, bias, in_features: int, recipe, weight_name="weight", bias_name="bias"):
    _check_float(weight_name, weight)
    if weight.dim() != 2:
        raise ValueError(f"{weight_name} must be 2-D (out_features, in_features), got shape {tuple(weight.shape)}")
    n, k = weight.shape
    if k != in_features:
        raise ValueError(f"x.shape[-1] ({in_features}) must equal {weight_name}.shape[1] (in_features = {k})")
    mult = block_multiple(recipe)
    for name, value in (("in_features", k), ("out_features", n)):
        if value % mult != 0:
            raise ValueError(f"{name} of {weight_name} must be a multiple of {mult} for {type(recipe).__name__}, got {value}")
    if bias is not None:
        _check_float(bias_name, bias)
        if bias.shape != (n,):
            raise ValueError(f"{bias_name} must have shape (out_features,) = ({n},), got {tuple(bias.shape)}")


def _check_quantized_weight(name: str, qw, weight, recipe) -> None:
    if qw is None:
        return
    expected = MXFP8Tensor if isinstance(recipe, MXFP8Recipe) else NVFP4Tensor
    if not isinstance(qw, expected):
        raise TypeError(f"{name} must be an {expected.__name__} (from quantize_weight) or None, got {type(qw).__name__}")
    if tuple(qw.shape) != tuple(weight.shape) or qw.rowwise_data is None:
        raise ValueError(f"{name} must hold a rowwise copy of a weight of shape {tuple(weight.shape)}, got shape {tuple(qw.shape)}")
    if qw.config != _tensor_config(recipe, "weight", True, qw.config.columnwise):
        raise ValueError(f"{name} was quantized with {qw.config}, not with this recipe's weight config")


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    recipe=None,
    quantized_weight: Optional[QuantizedTensor] = None,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """``y = x W^T + b`` with quantized GEMMs (see the module docstring); x is (..., in_features).

    recipe: an :class:`NVFP4Recipe` (default ``te_default()``) or :class:`MXFP8Recipe`.
    quantized_weight: the weight already quantized by :func:`quantize_weight` with this recipe (a
        cache); a copy without the columnwise copy is re-quantized when dgrad needs it.
    backend: passed to every :mod:`nvfp4lab.ops` call (None: Triton on CUDA, the reference otherwise).
    """
    recipe = resolve_recipe(recipe)
    _check_float("x", x)
    if x.dim() < 1:
        raise ValueError(f"x must have at least 1 dim (..., in_features), got shape {tuple(x.shape)}")
    _check_weight_bias(weight, bias, x.shape[-1], recipe)
    _check_quantized_weight("quantized_weight", quantized_weight, weight, recipe)
    return _LinearFunction.apply(x, weight, bias, quantized_weight, recipe, compute_dtype(x), backend)


def _splits_to_list(m_splits, num_gemms: int, total: int) -> tuple:
    if isinstance(m_splits, torch.Tensor):
        check_integer_vector("m_splits", m_splits)
        m_splits = m_splits.tolist()  # a device tensor costs one synchronization
    check_split_sizes("m_splits", m_splits, total, count=num_gemms)
    return tuple(m_splits)


def grouped_linear(
    x: torch.Tensor,
    m_splits: Union[Sequence[int], torch.Tensor],
    weights: Sequence[torch.Tensor],
    biases: Optional[Sequence[Optional[torch.Tensor]]] = None,
    *,
    recipe=None,
    quantized_weights: Optional[Sequence[QuantizedTensor]] = None,
    stacked_weights: Optional[tuple] = None,
    split_cache: Optional[SplitLayoutCache] = None,
    backend: Optional[str] = None,
    save_weight_operand: bool = True,
) -> torch.Tensor:
    """MoE grouped linear: tokens ``x`` (M, in_features) (leading dims flatten into M) are split along M
    into ``m_splits`` (ints or a 1-D integer tensor, one per weight); split i goes through weight i.
    Each split is quantized with its own amax (TE's split_quantize semantics); zero-size splits are
    skipped (their weight gradient is zero).

    NVFP4 recipes with backward="quantized" run fprop and dgrad as one grouped quantize + one grouped
    GEMM each (:func:`nvfp4lab.nvfp4_grouped_gemm`), wgrad per expert on the bulk columnwise copies;
    the results equal the per-expert loop used otherwise. ``stacked_weights``: a cache of
    :func:`stack_grouped_weights` of ``quantized_weights`` (ignored by the per-expert loop).

    The grouped kernels read the split offsets on the device. ``split_cache`` (a
    :class:`SplitLayoutCache`, kept by the caller) holds them per ``m_splits``, so calls with splits seen
    before copy nothing to the device and a step can be CUDA-graph captured; without it each call
    builds them (one small host->device copy; fill kernels during capture). A tensor ``m_splits`` is
    read on the host (one synchronization, not capturable).

    ``save_weight_operand``: where the grouped GEMMs run on BF16 operands (the Triton backend on Hopper) and dgrad
    reads W's rowwise copy transposed (:func:`dgrad_reads_rowwise`), the forward makes W's BF16 operand once
    (written by the cast itself where :func:`nvfp4lab.ops.operand_cast_pays`) and saves it for dgrad, instead of
    saving the packed copy and expanding it again in backward: 2 bytes per weight element held from forward to
    backward instead of 0.5625 (BF16 autocast's weight cache holds as much), one weight expansion less per step.
    False keeps the packed copy. Same results either way; no effect elsewhere."""
    recipe = resolve_recipe(recipe)
    _check_float("x", x)
    if not isinstance(weights, (list, tuple)) or len(weights) == 0:
        raise TypeError("weights must be a non-empty list of tensors")
    num = len(weights)
    biases = [None] * num if biases is None else list(biases)
    if len(biases) != num:
        raise ValueError(f"biases must have one entry per weight ({num}), got {len(biases)}")
    if x.dim() < 1:
        raise ValueError(f"x must have at least 1 dim (..., in_features), got shape {tuple(x.shape)}")
    total = x.shape[:-1].numel()
    splits = _splits_to_list(m_splits, num, total)
    for i, (w, b) in enumerate(zip(weights, biases)):
        _check_weight_bias(w, b, x.shape[-1], recipe, f"weights[{i}]", f"biases[{i}]")
        if w.shape != weights[0].shape:
            raise ValueError(f"weights[{i}] must have the shape of weights[0] {tuple(weights[0].shape)}, got {tuple(w.shape)}")
    if quantized_weights is not None:
        if len(quantized_weights) != num:
            raise ValueError(f"quantized_weights must have one entry per weight ({num}), got {len(quantized_weights)}")
        for i, qw in enumerate(quantized_weights):
            _check_quantized_weight(f"quantized_weights[{i}]", qw, weights[i], recipe)
        quantized_weights = tuple(quantized_weights)
    if stacked_weights is not None and (not isinstance(stacked_weights, tuple) or len(stacked_weights) != 2):
        raise TypeError("stacked_weights must be the (rowwise, columnwise) pair of stack_grouped_weights or None")
    if split_cache is not None and not isinstance(split_cache, SplitLayoutCache):
        raise TypeError(f"split_cache must be a SplitLayoutCache or None, got {type(split_cache).__name__}")
    layout = None
    if _grouped_applies(recipe, splits, biases):
        layout = split_cache.get(splits, x.device) if split_cache is not None else SplitLayout(splits, x.device)
    if not isinstance(save_weight_operand, bool):
        raise TypeError(f"save_weight_operand must be a bool, got {type(save_weight_operand).__name__}")
    return _GroupedLinearFunction.apply(x, splits, layout, quantized_weights, stacked_weights, recipe, compute_dtype(x),
                                        backend, save_weight_operand, num, *weights, *biases)


def grouped_linear_high_precision(
    x: torch.Tensor,
    m_splits: Union[Sequence[int], torch.Tensor],
    weights: Sequence[torch.Tensor],
    biases: Optional[Sequence[Optional[torch.Tensor]]] = None,
) -> torch.Tensor:
    """:func:`grouped_linear` without quantization (``nvfp4lab.autocast(enabled=False)``): split i of
    the tokens through ``torch.nn.functional.linear`` with weight i and bias i, in x's (or autocast's) dtype."""
    _check_float("x", x)
    if not isinstance(weights, (list, tuple)) or len(weights) == 0:
        raise TypeError("weights must be a non-empty list of tensors")
    biases = [None] * len(weights) if biases is None else list(biases)
    if len(biases) != len(weights):
        raise ValueError(f"biases must have one entry per weight ({len(weights)}), got {len(biases)}")
    if x.dim() < 1:
        raise ValueError(f"x must have at least 1 dim (..., in_features), got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, x.shape[-1])
    splits = _splits_to_list(m_splits, len(weights), x2.shape[0])
    parts = [torch.nn.functional.linear(part, w, b) for part, w, b in zip(x2.split(list(splits)), weights, biases)]
    y = torch.cat(parts, dim=0)
    return y.reshape(*x.shape[:-1], y.shape[-1])
