"""The NVFP4 GEMM for large M: operands expanded to FP16, one cuBLAS GEMM, one epilogue kernel.

Both operands are expanded to FP16 q * s in one launch of :func:`.fused.expand` (exact: every product of an E2M1 value
and an E4M3 scale is an FP16 normal number or zero; the same permutation of K within every block_k tile
on both sides, so the products pair up as in the definition). cuBLAS multiplies them with fp32
accumulation and fp32 output, and :func:`epilogue_kernel` applies the reference epilogue (alpha, bias,
out_old, cast) in one pass. Temporaries: 2MK + 2NK bytes of FP16 (freed before the epilogue) and 4MN bytes
of fp32. Grouped GEMMs with host split sizes expand A and B once, then run one cuBLAS GEMM per non-empty
expert and one epilogue over all rows (:func:`grouped_epilogue_kernel`, each row's expert read from the
device row ends): 2 launches + one cuBLAS call per non-empty expert.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ...layout import cdiv, roundup
from ..formats import soft_bf16_loads, to_f32
from ..launch import Launch, aligned
from . import opt_flags
from .common import epilogue, finish
from .fused import expand, expand_split_k


@triton.jit
def epilogue_kernel(
    acc_ptr, a_amax_ptr, b_amax_ptr, bias_ptr, out_ptr,
    M, N, stride_om, stride_on, inv_e,
    A_AMAX_ROWS: tl.constexpr, B_AMAX_MODE: tl.constexpr, BIAS_MODE: tl.constexpr,
    ACCUMULATE: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SOFT_BF16: tl.constexpr = False, EPI_PR3045: tl.constexpr = False,
):
    """The epilogue over an fp32 product (M, N), row stride N."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    rows_a = tl.where(mask_m, offs_m, 0).to(tl.int64)
    rows_b = tl.where(mask_n, offs_n, 0).to(tl.int64)
    mask = mask_m[:, None] & mask_n[None, :]
    ptrs = acc_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    acc = tl.load(ptrs, mask=mask, other=0.0)
    epilogue(acc, offs_m, offs_n, mask_m, mask_n, rows_a, rows_b, 0, a_amax_ptr, b_amax_ptr, bias_ptr,
             out_ptr, N, stride_om, stride_on, inv_e, A_AMAX_ROWS, B_AMAX_MODE, BIAS_MODE, ACCUMULATE,
             OUT_BF16, BLOCK_M, BLOCK_N, SOFT_BF16, EPI_PR3045)


@triton.jit
def grouped_epilogue_kernel(
    acc_ptr, a_amax_ptr, b_amax_ptr, bias_ptr, out_ptr, offs_ptr,
    M, N, num_experts, stride_om, stride_on, inv_e,
    A_AMAX_ROWS: tl.constexpr, B_AMAX_MODE: tl.constexpr, BIAS_MODE: tl.constexpr,
    ACCUMULATE: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SOFT_BF16: tl.constexpr = False, EPI_PR3045: tl.constexpr = False, A_AMAX_EXPERT: tl.constexpr = False,
    EXPERT_ROWS: tl.constexpr = 0,
):
    """The epilogue over the fp32 product (M, N) of every expert at once: row r belongs to the expert
    e with offs[e-1] <= r < offs[e] (``offs``: the E cumulative row ends), or e = r // EXPERT_ROWS when
    EXPERT_ROWS > 0 (``offs`` unused), whose amax (B_AMAX_MODE 1: per expert, 2: per row of B (E*N,);
    A_AMAX_EXPERT: A's per expert) and bias (BIAS_MODE 2: (E, N)) it takes. Per element the
    arithmetic of the dense epilogue with that expert's operands."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    rows_a = tl.where(mask_m, offs_m, 0).to(tl.int64)
    cols = tl.where(mask_n, offs_n, 0).to(tl.int64)
    if EXPERT_ROWS > 0:
        expert = rows_a // EXPERT_ROWS
    else:
        expert = tl.zeros((BLOCK_M,), dtype=tl.int64)
        for e in range(0, num_experts - 1):  # rows at or past an expert's end belong to a later one
            expert += (rows_a >= tl.load(offs_ptr + e).to(tl.int64)).to(tl.int64)
    mask = mask_m[:, None] & mask_n[None, :]
    acc = tl.load(acc_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :], mask=mask, other=0.0)
    if A_AMAX_EXPERT:
        amax_a = tl.load(a_amax_ptr + expert)
    elif A_AMAX_ROWS:
        amax_a = tl.load(a_amax_ptr + rows_a)
    else:
        amax_a = tl.load(a_amax_ptr + tl.zeros((BLOCK_M,), dtype=tl.int32))
    if B_AMAX_MODE == 2:
        amax_b = tl.load(b_amax_ptr + (expert[:, None] * N + cols[None, :]))
    elif B_AMAX_MODE == 1:
        amax_b = tl.load(b_amax_ptr + expert)[:, None]
    else:
        amax_b = tl.load(b_amax_ptr + tl.zeros((BLOCK_N,), dtype=tl.int32))[None, :]
    if BIAS_MODE == 1:
        bias = to_f32(tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0), SOFT_BF16)[None, :]
    elif BIAS_MODE == 2:
        bias = to_f32(tl.load(bias_ptr + (expert[:, None] * N + cols[None, :]), mask=mask, other=0.0), SOFT_BF16)
    else:
        bias = 0.0
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n.to(tl.int64)[None, :] * stride_on
    finish(acc, amax_a[:, None], amax_b, bias, out_ptrs, mask, inv_e, BIAS_MODE != 0, ACCUMULATE, OUT_BF16,
           SOFT_BF16, EPI_PR3045)


@functools.lru_cache(maxsize=4096)
def _epilogue_launch(m: int, n: int, flags: tuple, interpreted: bool, spec) -> Launch:
    """The epilogue kernel's launch for one product shape; ``spec``: its tensors' device, dtypes,
    alignment and the output strides (part of the cache key only)."""
    bm, bn, warps = (32, 32, 4) if interpreted else (64, 128, 8)
    return Launch(epilogue_kernel, (cdiv(m, bm), cdiv(n, bn)),
                  dict(**dict(flags), BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, enable_fp_fusion=False))


def _dequant_epilogue(acc, a_amax, b_amax, bias, out, flags, m, n, inv_e):
    """The reference epilogue (alpha, bias, out_old, cast) over an fp32 product (m, n), one pass."""
    args = (acc, a_amax, b_amax, bias, out, m, n, out.stride(0), out.stride(1), inv_e)
    spec = (out.device, *[(t.dtype, aligned(t)) for t in args[:5]], args[7:9])
    interpreted = not out.is_cuda or opt_flags.interpreting()
    _epilogue_launch(m, n, tuple(flags.items()), interpreted, spec)(*args)
    return out


def _expand_both(a, b, k, config, decode):
    """FP16 q * s of all rows of A and of B (same K permutation), in one launch."""
    return expand(a, k, config.block_k, opt_flags.expand_decode(decode, config.block_k), b)


def _mm_f32(a16, b16, out=None):
    """a16 @ b16^T with fp32 accumulation and fp32 output (into ``out`` when given)."""
    if a16.is_cuda:
        return torch.mm(a16, b16.t(), out_dtype=torch.float32, out=out)
    # CPU (interpreter tests): fp32 products of the exact values, fp32 accumulation
    return torch.mm(a16.float(), b16.float().t(), out=out)


def gemm(a, b, bias, out, flags: dict, m: int, n: int, k: int, inv_e: float, config, decode: int) -> torch.Tensor:
    """Dense: both operands expanded, one fp32-output matmul, the epilogue. Writes ``out`` (M, N)."""
    a16, b16 = _expand_both(a, b, k, config, decode)
    acc = _mm_f32(a16, b16)
    del a16, b16
    return _dequant_epilogue(acc, a.amax, b.amax, bias, out, flags, m, n, inv_e)


@functools.lru_cache(maxsize=4096)
def _grouped_epilogue_launch(m: int, n: int, num_experts: int, flags: tuple, interpreted: bool, spec) -> Launch:
    """The grouped epilogue kernel's launch for one product shape and expert count (``spec`` as in
    :func:`_epilogue_launch`)."""
    bm, bn, warps = (32, 32, 4) if interpreted else (64, 128, 8)
    return Launch(grouped_epilogue_kernel, (cdiv(m, bm), cdiv(n, bn)),
                  dict(**dict(flags), BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, enable_fp_fusion=False))


def _grouped_epilogue(acc, a_amax, b_amax, bias, out, offs, m: int, n: int, num_experts: int, inv_e: float,
                      flags: dict) -> None:
    """One :func:`grouped_epilogue_kernel` launch over the fp32 product (m, n) of ``num_experts`` experts
    (``bias`` / ``offs``: any stand-in tensor where ``flags`` leaves them unread)."""
    args = (acc, a_amax, b_amax, bias, out, offs, m, n, num_experts, out.stride(0), out.stride(1), inv_e)
    spec = (out.device, *[(t.dtype, aligned(t)) for t in args[:6]], args[9:11])
    interpreted = not out.is_cuda or opt_flags.interpreting()
    _grouped_epilogue_launch(m, n, num_experts, tuple(flags.items()), interpreted, spec)(*args)


def grouped_gemm(a, b, bias, out, offs, b_mode: int, bias_mode: int, accumulate: bool, splits, n: int, k: int,
                 inv_e: float, config, decode: int, pr3045: bool = False) -> torch.Tensor:
    """Grouped with host split sizes: A (all experts' rows) and B (all experts' weights) expanded once
    each, then per expert one fp32-output matmul into its rows of a shared fp32 buffer, and one epilogue
    over all rows, each with its expert's amax and bias (``offs``: the device row ends, the sizes
    ``splits`` holds); per element the dense path's arithmetic, expert by expert."""
    a16, b16 = _expand_both(a, b, k, config, decode)
    m = a.data.shape[0]
    acc = torch.empty((m, n), dtype=torch.float32, device=a.data.device)
    row = 0
    for e, m_e in enumerate(splits):
        r0, row = row, row + m_e
        if m_e != 0:
            _mm_f32(a16[r0:row], b16[e * n:(e + 1) * n], out=acc[r0:row])
    del a16, b16
    flags = dict(A_AMAX_ROWS=a.amax.numel() != 1, B_AMAX_MODE=b_mode, BIAS_MODE=bias_mode, ACCUMULATE=accumulate,
                 OUT_BF16=out.dtype == torch.bfloat16, SOFT_BF16=soft_bf16_loads(out.device), EPI_PR3045=pr3045)
    bias_arg = bias if bias is not None else a.amax  # a stand-in pointer that BIAS_MODE=0 never reads
    _grouped_epilogue(acc, a.amax, b.amax, bias_arg, out, offs, m, n, len(splits), inv_e, flags)
    return out


def grouped_wgrad(a_data, a_scale, a_amax, b_data, b_scale, b_amax, offs, splits, a_mode: int, b_mode: int, out,
                  n_a: int, n_b: int, inv_e: float, config, decode: int, pr3045: bool = False) -> torch.Tensor:
    """Experts' products over their own contraction length (MoE weight gradients): ``out`` (E, n_a, n_b)
    gets out[e] = A_e @ B_e^T for the bulk copies split along K (split e: A_e (n_a, m_e), B_e (n_b, m_e);
    ``offs`` the device split offsets (E + 1,), ``splits`` the same sizes on the host). Both operands
    expanded in one launch (:func:`.fused.expand_split_k`), one fp32-output cuBLAS GEMM per non-empty
    expert into its rows of a shared fp32 buffer (zeros for empty ones), one epilogue over all rows
    (expert = row // n_a): A's amax per expert (``a_mode`` 1) or per row (2), B's per expert
    (``b_mode`` 1) or per (expert, row of B) (2)."""
    num = len(splits)
    a16, b16, starts = expand_split_k(a_data, a_scale, n_a, b_data, b_scale, n_b, offs, splits, config.block_k,
                                      opt_flags.expand_decode(decode, config.block_k))
    acc = torch.empty((num * n_a, n_b), dtype=torch.float32, device=out.device)
    for e, (m_e, col) in enumerate(zip(splits, starts)):
        rows = acc[e * n_a:(e + 1) * n_a]
        if m_e == 0:
            rows.zero_()
        else:
            width = roundup(m_e, config.block_k)
            _mm_f32(a16[:, col:col + width], b16[:, col:col + width], out=rows)
    del a16, b16
    out2 = out.view(num * n_a, n_b)
    flags = dict(A_AMAX_ROWS=a_mode == 2, B_AMAX_MODE=b_mode, BIAS_MODE=0, ACCUMULATE=False,
                 OUT_BF16=out.dtype == torch.bfloat16, SOFT_BF16=soft_bf16_loads(out.device), EPI_PR3045=pr3045,
                 A_AMAX_EXPERT=a_mode == 1, EXPERT_ROWS=n_a)
    _grouped_epilogue(acc, a_amax, b_amax, a_amax, out2, a_amax, num * n_a, n_b, num, inv_e, flags)
    return out
