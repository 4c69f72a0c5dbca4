"""The NVFP4 GEMM for large M: operands expanded (exact), cuBLAS, and the epilogue in cuBLAS or in a kernel of its own.

Both operands are expanded to q * s in one launch of :func:`.fused.expand` (exact in FP16 and in BF16: every product
of an E2M1 value and an E4M3 scale has at most 5 significant bits and lies in [2^-10, 2688] or is zero; the same
permutation of K within every block_k tile on both sides, so the products pair up as in the definition). Then one of
two epilogues:

* cuBLAS' own (:mod:`.cublaslt`), where alpha is one number per product (A's and B's amax per tensor or per
  expert), without accumulation or PR 3045's order, into a bf16 / fp32 output with unit column stride: the
  operands are expanded to BF16, the expansion launch writes alpha[e] = fl(fl(amax_a * amax_b) * inv_e) per expert
  to device memory (:func:`alpha_kernel` where both operands come expanded), and cuBLASLt writes fl(acc * alpha[e]) (plus the
  bias in fp32: its bias epilogue, for 16-byte aligned output rows) rounded once to the output's dtype. This is TE's own
  GEMM (cuBLAS with a device alpha). Where fl(amax_a * amax_b) overflows for finite amaxes, alpha[e] =
  fl(fl(alpha_low * 2^64) * 2^64): fl(acc * alpha) then equals the reference's fl(fl(fl(acc * alpha_low) * 2^64)
  * 2^64) (:func:`nvfp4lab.ref.gemm.apply_alpha`), because acc is 0 or at least 2^-20 in magnitude (a sum of
  multiples of 2^-20), so fl(acc * alpha_low) is never subnormal; only where alpha itself passes fp32's range
  (amax_a * amax_b * inv_e >= 2^128) the result is inf (NaN where acc = 0), as TE's, where the reference keeps the
  finite values of its unbounded exponent range.
* otherwise FP16 operands, cuBLAS with fp32 output and :func:`epilogue_kernel` (alpha, bias, out_old, cast) in one
  pass.

Temporaries: 2MK + 2NK bytes of expanded operands (and 4MN bytes of fp32 for the kernel epilogue). Grouped GEMMs with
host split sizes expand A and B once, then run one cuBLAS GEMM per non-empty expert and, on the kernel-epilogue path,
one epilogue over all rows (:func:`grouped_epilogue_kernel`, each row's expert read from the device row ends). On the GPU
the cuBLASLt plans of a call's products and their views' offsets are kept per shapes (:class:`.cublaslt.Batch`), so an
eager call with shapes seen before neither slices its operands per expert nor looks up a plan per product.
"""
from __future__ import annotations

import functools
import itertools

import torch
import triton
import triton.language as tl

from ...layout import cdiv, roundup
from ..formats import soft_bf16_loads, to_f32
from ..launch import Launch, aligned
from ..pdl import wait_prior_grid
from . import cublaslt, opt_flags
from .common import epilogue, finish, store_alphas
from .fused import expand, expand_split_k


@triton.jit
def epilogue_kernel(
    acc_ptr, a_amax_ptr, b_amax_ptr, bias_ptr, out_ptr,
    M, N, stride_om, stride_on, inv_e,
    A_AMAX_ROWS: tl.constexpr, B_AMAX_MODE: tl.constexpr, BIAS_MODE: tl.constexpr,
    ACCUMULATE: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SOFT_BF16: tl.constexpr = False, EPI_PR3045: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """The epilogue over an fp32 product (M, N), row stride N."""
    wait_prior_grid(PDL)
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
    EXPERT_ROWS: tl.constexpr = 0, PDL: tl.constexpr = False,
):
    """The epilogue over the fp32 product (M, N) of every expert at once: row r belongs to the expert
    e with offs[e-1] <= r < offs[e] (``offs``: the E cumulative row ends), or e = r // EXPERT_ROWS when
    EXPERT_ROWS > 0 (``offs`` unused), whose amax (B_AMAX_MODE 1: per expert, 2: per row of B (E*N,);
    A_AMAX_EXPERT: A's per expert) and bias (BIAS_MODE 2: (E, N)) it takes. Per element the
    arithmetic of the dense epilogue with that expert's operands."""
    wait_prior_grid(PDL)
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


@triton.jit
def alpha_kernel(a_amax_ptr, b_amax_ptr, alpha_ptr, num, inv_e, A_PER_EXPERT: tl.constexpr,
                 B_PER_EXPERT: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """cuBLAS' alphas (:func:`.common.store_alphas`) where no expansion launch writes them (both operands given
    expanded)."""
    wait_prior_grid(PDL)
    store_alphas(a_amax_ptr, b_amax_ptr, alpha_ptr, num, inv_e, A_PER_EXPERT, B_PER_EXPERT, BLOCK)


@functools.lru_cache(maxsize=4096)
def _alpha_launch(num: int, a_per_expert: bool, b_per_expert: bool, spec) -> Launch:
    """The alpha kernel's launch for ``num`` alphas (``spec``: its tensors' device and alignments, the cache key
    only)."""
    return Launch(alpha_kernel, (1,), dict(A_PER_EXPERT=a_per_expert, B_PER_EXPERT=b_per_expert,
                                           BLOCK=triton.next_power_of_2(num + 1), num_warps=1, enable_fp_fusion=False))


def _alphas(a_amax, b_amax, num: int, a_per_expert: bool, b_per_expert: bool, inv_e: float) -> torch.Tensor:
    """A new fp32 (num + 1,) vector from :func:`alpha_kernel`."""
    alpha = torch.empty(num + 1, dtype=torch.float32, device=a_amax.device)
    spec = (alpha.device, aligned(a_amax), aligned(b_amax))
    _alpha_launch(num, a_per_expert, b_per_expert, spec)(a_amax, b_amax, alpha, num, inv_e)
    return alpha


def _cublas_epilogue(flags: dict, out: torch.Tensor) -> bool:
    """Whether cuBLAS' epilogue (one alpha per product, a bias per output column) can compute these flags' epilogue
    into ``out`` on its device (module docstring): then the operands are expanded to BF16, and the product runs there
    where :func:`cublaslt.supports` its tensors (a bias: into 16-byte aligned rows only)."""
    if (flags["A_AMAX_ROWS"] or flags["B_AMAX_MODE"] == 2 or flags["ACCUMULATE"] or flags["EPI_PR3045"]
            or out.dtype not in (torch.bfloat16, torch.float32) or out.stride(-1) != 1):
        return False
    return not out.is_cuda or cublaslt.available()


def _scaled_mm(a16, b16, out, bias=None):
    """The callable that writes out = alpha[e] * (a16 @ b16^T) [+ bias] (args a16, b16, alpha, out, e, bias):
    cuBLASLt's plan on the GPU, its PyTorch twin on the CPU; None where cuBLASLt has no plan (the kernel epilogue
    then)."""
    if not out.is_cuda:
        return cublaslt.matmul_torch if cublaslt.supports(a16, b16, out, bias) else None
    return cublaslt.plan(a16, b16, out, bias)


_BATCHES: dict = {}


def _base_key(t) -> tuple:
    """What fixes the views of a base tensor and their pointers' alignments: shape, strides, dtype, address mod 256."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() & 255)


def _per_expert_scaled_mm(products, a_amax, b_amax, num_experts: int, a_per_expert: bool, b_per_expert: bool,
                          inv_e: float, bases: tuple, key: tuple, alpha=None) -> bool:
    """Runs every (a16, b16, out, expert, bias or None) product of ``products()`` with cuBLAS' epilogue and one
    alpha vector (E + 1 entries: ``alpha`` where the expansion launch wrote it, else :func:`alpha_kernel`'s) and
    returns True; False (nothing run) where cuBLASLt has no plan for one of them.
    ``products`` is a callable: its views are of ``bases`` (a16, b16, out, bias or None), and what else fixes them
    is ``key``. On the GPU the plans and view offsets are kept per key and bases (:class:`.cublaslt.Batch`), so a
    repeated call neither slices nor plans."""
    out = bases[2]
    if out.is_cuda:
        full_key = (key, out.device.index, *map(_base_key, bases))
        run = _BATCHES.get(full_key, _BATCHES)
        if run is _BATCHES:
            if len(_BATCHES) >= 4096:
                _BATCHES.clear()
            items = products()
            plans = [_scaled_mm(a16, b16, o, bias) for a16, b16, o, _, bias in items]
            run = _BATCHES[full_key] = cublaslt.batch(items, plans, *bases) if None not in plans else None
        if run is None:
            return False
        if alpha is None:
            alpha = _alphas(a_amax, b_amax, num_experts, a_per_expert, b_per_expert, inv_e)
        run(bases[0], bases[1], out, alpha, bases[3])
        return True
    items = products()
    runs = [_scaled_mm(a16, b16, o, bias) for a16, b16, o, _, bias in items]
    if any(r is None for r in runs):
        return False
    if alpha is None:
        alpha = _alphas(a_amax, b_amax, num_experts, a_per_expert, b_per_expert, inv_e)
    for r, (a16, b16, o, e, bias) in zip(runs, items):
        r(a16, b16, alpha, o, e, bias)
    return True


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


def expand_padded(op, k: int, config, decode: int, alpha=None) -> torch.Tensor:
    """One operand's q * s in BF16 and K order, (rows, roundup(k, config.block_k)), zeros past k (``alpha``: as
    :func:`.fused.expand`'s)."""
    decode = opt_flags.expand_decode(decode, config.block_k)
    return expand(op, k, config.block_k, decode, None, torch.bfloat16, natural=True, alpha=alpha)[0]


def expand_values(op, k: int, config, decode: int, alpha=None) -> torch.Tensor:
    """One operand's q * s in BF16 and K order, (rows, k) (a view of rows padded to the K tile): the values an
    :class:`~nvfp4lab.NVFP4Operand` holds."""
    return expand_padded(op, k, config, decode, alpha)[:, :k]


def _expand_both(a, b, k, config, decode, dtype=torch.float16, alpha=None):
    """q * s of all rows of A and of B (same K permutation) in ``dtype``, in one launch. Where one is given
    expanded already (BF16 in K order, :data:`.common.EXPANDED`), the other one is expanded to BF16 in K order
    (its zero padding past K left out of the view), or nothing is launched when both are. ``alpha`` (as
    :func:`.fused.expand`'s, where a launch runs): that launch also writes the alpha vector."""
    if not (a.expanded or b.expanded):
        return expand(a, k, config.block_k, opt_flags.expand_decode(decode, config.block_k), b, dtype, alpha=alpha)
    if a.expanded and b.expanded:
        return a.data, b.data
    values = expand_values(b if a.expanded else a, k, config, decode, alpha)
    return (a.data, values) if a.expanded else (values, b.data)


def _alpha_args(cublas: bool, a, b, num: int, a_per_expert: bool, b_per_expert: bool, inv_e: float) -> tuple:
    """(alpha, its :func:`.fused.expand` arguments): a new fp32 (num + 1,) alpha vector that the expansion launch of
    operands ``a``, ``b`` writes, where the product takes cuBLAS' epilogue and at least one operand is expanded here;
    (None, None) otherwise (no alpha needed, or :func:`alpha_kernel` writes it)."""
    if not cublas or (a.expanded and b.expanded):
        return None, None
    out = torch.empty(num + 1, dtype=torch.float32, device=a.amax.device)
    return out, (out, a.amax, b.amax, num, a_per_expert, b_per_expert, inv_e)


def _mm_f32(a16, b16, out=None):
    """a16 @ b16^T (FP16 or BF16) with fp32 accumulation and fp32 output (into ``out`` when given)."""
    if a16.is_cuda:
        return torch.mm(a16, b16.t(), out_dtype=torch.float32, out=out)
    # CPU (interpreter tests): fp32 products of the exact values, fp32 accumulation
    return torch.mm(a16.float(), b16.float().t(), out=out)


def _one_product(a16, b16, out, bias) -> list:
    """The dense product as :func:`_per_expert_scaled_mm` takes it."""
    return [(a16, b16, out, 0, bias)]


def _expert_weights(b16, e: int, n: int) -> torch.Tensor:
    """Expert e's (N, K) values of B given stacked (E, N, K) or as E*N rows."""
    return b16[e] if b16.dim() == 3 else b16[e * n:(e + 1) * n]


def _row_products(a16, b16, out, bias, bias_mode: int, parts: list, n: int) -> list:
    """The grouped GEMM's per-expert products ((expert, first row, row end) ``parts``) on rows of A and out."""
    return [(a16[r0:r1], _expert_weights(b16, e, n), out[r0:r1], e,
             None if bias_mode == 0 else (bias if bias_mode == 1 else bias[e])) for e, r0, r1 in parts]


def _split_k_products(a16, b16, out, splits, starts, block_k: int) -> list:
    """The weight gradients' per-expert products over each non-empty split's columns of A and B (from ``starts``)."""
    return [(a16[:, col:col + roundup(m_e, block_k)], b16[:, col:col + roundup(m_e, block_k)], out[e], e, None)
            for e, (m_e, col) in enumerate(zip(splits, starts)) if m_e != 0]


def gemm(a, b, bias, out, flags: dict, m: int, n: int, k: int, inv_e: float, config, decode: int) -> torch.Tensor:
    """Dense: both operands expanded (or given expanded), one matmul with cuBLAS' epilogue or an fp32-output one
    and the epilogue kernel. Writes ``out`` (M, N)."""
    cublas = _cublas_epilogue(flags, out)
    alpha, alpha_args = _alpha_args(cublas, a, b, 1, False, False, inv_e)
    a16, b16 = _expand_both(a, b, k, config, decode, torch.bfloat16 if cublas else torch.float16, alpha_args)
    bias16 = bias if flags["BIAS_MODE"] else None
    if cublas and _per_expert_scaled_mm(functools.partial(_one_product, a16, b16, out, bias16), a.amax, b.amax, 1,
                                        False, False, inv_e, (a16, b16, out, bias16), (), alpha):
        return out
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
                 inv_e: float, config, decode: int, pr3045: bool = False, a_per_expert: bool = False) -> torch.Tensor:
    """Grouped with host split sizes: A (all experts' rows) and B (all experts' weights) expanded once
    each, then per expert one matmul into its rows: with cuBLAS' epilogue (one alpha vector for all
    experts) where the flags allow, else with fp32 output into a shared buffer and one epilogue kernel
    over all rows, each with its expert's amax and bias (``offs``: the device row ends, the sizes
    ``splits`` holds); per element the dense path's arithmetic, expert by expert. B may be given expanded as
    (E, N, K) values (each expert's (N, K) row- or column-major)."""
    m = a.data.shape[0]
    flags = dict(A_AMAX_ROWS=a.amax.numel() != 1 and not a_per_expert, B_AMAX_MODE=b_mode, BIAS_MODE=bias_mode,
                 ACCUMULATE=accumulate, OUT_BF16=out.dtype == torch.bfloat16, SOFT_BF16=soft_bf16_loads(out.device),
                 EPI_PR3045=pr3045, A_AMAX_EXPERT=a_per_expert)
    cublas = _cublas_epilogue(flags, out)
    num = len(splits)
    alpha, alpha_args = _alpha_args(cublas, a, b, num, a_per_expert, b_mode == 1, inv_e)
    a16, b16 = _expand_both(a, b, k, config, decode, torch.bfloat16 if cublas else torch.float16, alpha_args)
    ends = list(itertools.accumulate(splits))
    parts = [(e, end - m_e, end) for e, (m_e, end) in enumerate(zip(splits, ends)) if m_e != 0]
    bias16 = bias if bias_mode else None
    if cublas and _per_expert_scaled_mm(functools.partial(_row_products, a16, b16, out, bias16, bias_mode, parts, n),
                                        a.amax, b.amax, num, a_per_expert, b_mode == 1, inv_e,
                                        (a16, b16, out, bias16), (tuple(splits), n, bias_mode), alpha):
        return out
    acc = torch.empty((m, n), dtype=torch.float32, device=a.data.device)
    for e, r0, r1 in parts:
        _mm_f32(a16[r0:r1], _expert_weights(b16, e, n), out=acc[r0:r1])
    del a16, b16
    bias_arg = bias if bias is not None else a.amax  # a stand-in pointer that BIAS_MODE=0 never reads
    _grouped_epilogue(acc, a.amax, b.amax, bias_arg, out, offs, m, n, len(splits), inv_e, flags)
    return out


def grouped_wgrad(a_data, a_scale, a_amax, b_data, b_scale, b_amax, offs, splits, a_mode: int, b_mode: int, out,
                  n_a: int, n_b: int, inv_e: float, config, decode: int, pr3045: bool = False) -> torch.Tensor:
    """Experts' products over their own contraction length (MoE weight gradients): ``out`` (E, n_a, n_b)
    gets out[e] = A_e @ B_e^T for the bulk copies split along K (split e: A_e (n_a, m_e), B_e (n_b, m_e);
    ``offs`` the device split offsets (E + 1,), ``splits`` the same sizes on the host). Both operands
    expanded in one launch (:func:`.fused.expand_split_k`), one cuBLAS GEMM per non-empty expert (zeros for
    empty ones): with cuBLAS' epilogue into out[e] when A's amax is per expert (``a_mode`` 1), else with fp32
    output into its rows of a shared buffer and one epilogue kernel over all rows (expert = row // n_a; A's amax
    per row, ``a_mode`` 2). B's amax per expert (``b_mode`` 1) or per (expert, row of B) (2)."""
    num = len(splits)
    out2 = out.view(num * n_a, n_b)
    flags = dict(A_AMAX_ROWS=a_mode == 2, B_AMAX_MODE=b_mode, BIAS_MODE=0, ACCUMULATE=False,
                 OUT_BF16=out.dtype == torch.bfloat16, SOFT_BF16=soft_bf16_loads(out.device), EPI_PR3045=pr3045,
                 A_AMAX_EXPERT=a_mode == 1, EXPERT_ROWS=n_a)
    cublas = _cublas_epilogue(flags, out2)
    a16, b16, starts = expand_split_k(a_data, a_scale, n_a, b_data, b_scale, n_b, offs, splits, config.block_k,
                                      opt_flags.expand_decode(decode, config.block_k),
                                      torch.bfloat16 if cublas else torch.float16)
    if cublas:  # one alpha per expert
        products = functools.partial(_split_k_products, a16, b16, out, splits, starts, config.block_k)
        if _per_expert_scaled_mm(products, a_amax, b_amax, num, True, True, inv_e, (a16, b16, out, None),
                                 (tuple(splits), tuple(starts), config.block_k)):
            for e, m_e in enumerate(splits):
                if m_e == 0:
                    out[e].zero_()
            return out
    acc = torch.empty((num * n_a, n_b), dtype=torch.float32, device=out.device)
    for e, (m_e, col) in enumerate(zip(splits, starts)):
        rows = acc[e * n_a:(e + 1) * n_a]
        if m_e == 0:
            rows.zero_()
        else:
            width = roundup(m_e, config.block_k)
            _mm_f32(a16[:, col:col + width], b16[:, col:col + width], out=rows)
    del a16, b16
    _grouped_epilogue(acc, a_amax, b_amax, a_amax, out2, a_amax, num * n_a, n_b, num, inv_e, flags)
    return out
