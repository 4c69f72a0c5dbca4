"""NVFP4 GEMM reference (spec sections 9 and 12): out = A_deq @ B_deq^T, both operands K-major (TN).

    acc[i, j]  = sum_k (q_a * s_a)[i, k] * (q_b * s_b)[j, k]        fp32; each q*s is exact in fp32
    alpha[i,j] = fl(fl(amax_a[i] * amax_b[j]) * fl(1 / (36 * E_a * E_b)))
    out        = out_dtype(fl(acc * alpha) [+ bias] [+ C])           one rounding to out_dtype

amax_a / amax_b are per tensor (1,) or per token ((M,) rows of A, (N,) rows of B). With per-tensor
operands alpha is exactly cuBLAS' device alpha. Where fl(amax_a * amax_b) overflows for finite amaxes
(e.g. 1e20 * 1e19), alpha is formed from amax_a / 2^64 and amax_b / 2^64 and the product acc * alpha is
multiplied back by 2^64 twice (:func:`apply_alpha`): the value of TE's order with an unbounded exponent
range, instead of inf (and NaN where acc = 0). The fp32 summation order of ``acc`` is not part of the
contract: implementations agree within the golden tolerance (rtol 2^-7).

Operands with PR 3045's numerics (``config.numerics == "te_pr3045"``, both or neither) take the order
of that PR's fused CUTLASS epilogue (its module path; shared/golden_pr3045/README.md, "GEMM"), with the
raw per-token amaxes as alphas:

    out = out_dtype(fl(fl(fl(fl(amax_a[i] * acc) * amax_b[j]) * fl(1/7225344)) [+ bias] [+ C]))

The bias is added in fp32 before the one cast, as the PR's grouped GEMM does (its dense module path
adds it to the bf16 output, a second rounding, which is not reproduced).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch

from ..config import operand_config, with_copies
from ..tensors import NVFP4Operand, NVFP4Tensor
from . import codecs
from .swizzle import compact_scales

_F32 = torch.float32


def block_dequantized(data: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """E2M1 codes times their E4M3 block scale, without the global scale: (R, K) fp32, exact."""
    q = codecs.e2m1_decode(codecs.unpack_fp4(data))
    return q * codecs.e4m3_decode(scale).repeat_interleave(16, dim=1)


def expanded_operands(t: NVFP4Tensor, rowwise: bool, columnwise: bool) -> tuple:
    """(packed, row, col) of a quantized tensor, as ``ops.quantize_nvfp4_operands`` gives them: the named copies
    (of those ``t`` holds) as :class:`NVFP4Operand` (BF16 q * s, exact; the columnwise one (K, M)), the others
    kept in an NVFP4Tensor (None when none remain)."""
    config, m, k = t.config, t.m, t.k
    row = col = None
    rowwise, columnwise = rowwise and config.rowwise, columnwise and config.columnwise
    if rowwise:
        values = block_dequantized(t.rowwise_data, compact_scales(t.rowwise_scale, config.scale_layout, m, k // 16))
        row = NVFP4Operand(values.to(torch.bfloat16), t.rowwise_amax, operand_config(config, False))
    if columnwise:
        values = block_dequantized(t.columnwise_data, compact_scales(t.columnwise_scale, config.scale_layout, k, m // 16))
        col = NVFP4Operand(values.to(torch.bfloat16), t.columnwise_amax, operand_config(config, True))
    keep_row, keep_col = config.rowwise and not rowwise, config.columnwise and not columnwise
    packed = None
    if keep_row or keep_col:
        packed = NVFP4Tensor.from_parts(t.shape, t.dtype, with_copies(config, keep_row, keep_col),
                                        rowwise=(t.rowwise_data, t.rowwise_scale, t.rowwise_amax) if keep_row else None,
                                        columnwise=(t.columnwise_data, t.columnwise_scale, t.columnwise_amax)
                                        if keep_col else None)
    return packed, row, col


def grouped_rowwise_operand(t) -> NVFP4Operand:
    """The rowwise copy of a grouped quantize (a :class:`~nvfp4lab.tensors.GroupedNVFP4Tensor`, compact scales) as
    one :class:`NVFP4Operand`: BF16 q * s (M, K), exact, with the per-split amaxes (n,) (per row (M,) per token)."""
    values = block_dequantized(t.rowwise_data, t.rowwise_scale)
    return NVFP4Operand(values.to(torch.bfloat16), t.rowwise_amax, operand_config(t.config, False))


def grouped_operands(t) -> tuple:
    """(packed, row) of a grouped quantize ``t`` with a rowwise copy: ``t``'s columnwise copy alone (a
    GroupedNVFP4Tensor, None when ``t`` has none) and its rowwise copy as :func:`grouped_rowwise_operand`."""
    packed = None
    if t.columnwise_data is not None:
        packed = type(t).from_parts(t.shape, t.dtype, with_copies(t.config, False, True), t.split_offsets,
                                    columnwise=(t.columnwise_data, t.columnwise_scale, t.columnwise_amax))
    return packed, grouped_rowwise_operand(t)


def _operand_values(t, rows: int, k: int) -> tuple:
    """(fp32 q * s (rows, K), amax) of a GEMM operand: an NVFP4Tensor's rowwise copy or an NVFP4Operand."""
    if isinstance(t, NVFP4Operand):
        return t.values.to(_F32), t.amax
    return block_dequantized(t.rowwise_data, compact_scales(t.rowwise_scale, t.scale_layout, rows, k // 16)), t.rowwise_amax


def gemm_alpha(amax_a: torch.Tensor, amax_b: torch.Tensor, e4m3_max_a: float, e4m3_max_b: float) -> torch.Tensor:
    """(M or 1, N or 1) fp32 epilogue scale."""
    inv = torch.tensor(1.0 / (36.0 * e4m3_max_a * e4m3_max_b), dtype=_F32, device=amax_a.device)
    return (amax_a.to(_F32).reshape(-1, 1) * amax_b.to(_F32).reshape(1, -1)) * inv


def uses_pr3045_epilogue(a, b) -> bool:
    """Whether the GEMM of ``a`` and ``b`` takes PR 3045's epilogue order (both operands have its numerics)."""
    return a.config.numerics == "te_pr3045" and b.config.numerics == "te_pr3045"


def pr3045_scaled(acc: torch.Tensor, amax_a: torch.Tensor, amax_b: torch.Tensor) -> torch.Tensor:
    """PR 3045's epilogue scaling of an fp32 product: fl(fl(fl(amax_a[i] * acc) * amax_b[j]) * fl(1/(36*448^2)))."""
    inv = torch.tensor(1.0 / (36.0 * 448.0 * 448.0), dtype=_F32, device=acc.device)
    return ((acc * amax_a.to(_F32).reshape(-1, 1)) * amax_b.to(_F32).reshape(1, -1)) * inv
_HALF_RESCALE = 2.0**64


def apply_alpha(acc: torch.Tensor, amax_a: torch.Tensor, amax_b: torch.Tensor, e4m3_max_a: float,
                e4m3_max_b: float) -> torch.Tensor:
    """fl(acc * alpha) with alpha = :func:`gemm_alpha`, except where fl(amax_a * amax_b) overflows for
    finite amaxes: there fl(fl(acc * fl(fl(amax_a/2^64 * amax_b/2^64) * inv)) * 2^64) * 2^64 (exact
    power-of-two steps: only a result past fp32's range overflows, as it should)."""
    a = amax_a.to(_F32).reshape(-1, 1)
    b = amax_b.to(_F32).reshape(1, -1)
    inv = torch.tensor(1.0 / (36.0 * e4m3_max_a * e4m3_max_b), dtype=_F32, device=a.device)
    overflow = torch.isinf(a * b) & torch.isfinite(a) & torch.isfinite(b)
    rescaled = ((acc * (((a * (1.0 / _HALF_RESCALE)) * (b * (1.0 / _HALF_RESCALE))) * inv)) * _HALF_RESCALE) * _HALF_RESCALE
    return torch.where(overflow, rescaled, acc * ((a * b) * inv))


def nvfp4_gemm(
    a,
    b,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    accumulate: bool = False,
) -> torch.Tensor:
    """Reference GEMM of two :class:`NVFP4Tensor` (their rowwise copies) or :class:`NVFP4Operand`: (M, K) x (N, K)
    -> (M, N)."""
    m, k = a.m, a.k
    n = b.m
    a_blk, amax_a = _operand_values(a, m, k)
    b_blk, amax_b = _operand_values(b, n, k)
    acc = a_blk @ b_blk.t()
    if uses_pr3045_epilogue(a, b):
        result = pr3045_scaled(acc, amax_a, amax_b)
    else:
        result = apply_alpha(acc, amax_a, amax_b, a.e4m3_max, b.e4m3_max)
    if bias is not None:
        result = result + bias.to(_F32)
    if accumulate and out is not None:
        result = result + out.to(_F32)
    result = result.to(out_dtype)
    if out is not None:
        out.copy_(result)
        return out
    return result


def nvfp4_grouped_gemm(
    a,
    b,
    offs: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
    accumulate: bool = False,
) -> torch.Tensor:
    """Grouped (MoE) GEMM, defined as one :func:`nvfp4_gemm` per expert.

    a: (M, K) with amax (1,) or (M,) (an NVFP4Tensor, or an NVFP4Operand of values (M, K)); b: the E experts'
    weights stacked, E*N rows, amax (1,), (E,)
    per expert or (E*N,) per row (an NVFP4Tensor, or an NVFP4Operand of values (E, N, K)); offs: (E,)
    cumulative row ends, expert e owns rows offs[e-1]:offs[e] of a and out (offs[-1] = 0), offs[E-1] == M.
    bias: (N,) or (E, N).
    """
    ends = [int(v) for v in offs.tolist()]
    num_experts = len(ends)
    m, k = a.m, a.k
    n = b.m // num_experts
    starts = [0] + ends[:-1]
    if any(e < s for s, e in zip(starts, ends)) or ends[-1] != m:
        raise ValueError(f"offs must be nondecreasing cumulative row ends with offs[-1] == M = {m}, got {ends}")
    expanded_a, expanded_b = isinstance(a, NVFP4Operand), isinstance(b, NVFP4Operand)
    a_scale = None if expanded_a else compact_scales(a.rowwise_scale, a.scale_layout, m, k // 16)
    b_scale = None if expanded_b else compact_scales(b.rowwise_scale, b.scale_layout, b.m, k // 16)
    a_amax, b_amax = (a.amax if expanded_a else a.rowwise_amax).reshape(-1), (b.amax if expanded_b else b.rowwise_amax).reshape(-1)
    result = torch.empty(m, n, dtype=out_dtype, device=a_amax.device) if out is None else out
    for e, (r0, r1) in enumerate(zip(starts, ends)):
        if r1 == r0:
            continue
        a_amax_e = a_amax if a_amax.numel() == 1 else a_amax[r0:r1]
        if expanded_a:
            a_e = NVFP4Operand(a.values[r0:r1], a_amax_e, a.config)
        else:
            a_e = _rows(a, a_scale, a_amax_e, r0, r1)
        if b_amax.numel() == 1:
            b_amax_e = b_amax
        elif b_amax.numel() == num_experts * n and n != 1:
            b_amax_e = b_amax[e * n:(e + 1) * n]
        else:
            b_amax_e = b_amax[e:e + 1]
        if expanded_b:
            b_e = NVFP4Operand(b.values.reshape(num_experts, n, k)[e], b_amax_e, b.config)
        else:
            b_e = _rows(b, b_scale, b_amax_e, e * n, (e + 1) * n)
        bias_e = None if bias is None else (bias[e] if bias.dim() == 2 else bias)
        nvfp4_gemm(a_e, b_e, out_dtype=out_dtype, bias=bias_e, out=result[r0:r1], accumulate=accumulate)
    return result


def _rows(t, compact_scale: torch.Tensor, amax: torch.Tensor, r0: int, r1: int):
    """Rows r0:r1 of an NVFP4Tensor's rowwise copy as an NVFP4Tensor with compact scales."""
    config = with_copies(replace(t.config, scale_layout="compact"), True, False)
    return NVFP4Tensor.from_parts(torch.Size((r1 - r0, t.k)), t.dtype, config,
                                  rowwise=(t.rowwise_data[r0:r1], compact_scale[r0:r1], amax))
