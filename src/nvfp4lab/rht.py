"""The 16-point random Hadamard transform (RHT) of NVFP4's wgrad operands, in plain PyTorch.

One definition shared by the reference (:mod:`nvfp4lab.ref.nvfp4`) and the kernels (the inverse
transform after a columnwise dequantize): T = diag(s) @ H16 / 4, with H16 Sylvester's Hadamard matrix
and s_i = -1 where bit i of the sign mask is set. Entries are +-0.25 (exact in bf16 and fp32), and T
is orthogonal (T @ T^T = I), so the inverse is a product with T^T.

Two roundings of the same transform: TE main's (:func:`apply_rht`: bf16 input, fp32 sums rounded once
to bf16) and PR 3045's per-token one (:func:`apply_rht_fp32`: fp32 throughout, the sums in the order
of a radix-2 butterfly, which the kernels repeat op for op).
"""
from __future__ import annotations

import torch

DEFAULT_RHT_SIGN_MASK = 0xD7E8  # TE's fixed wgrad sign vector, bit i set where s_i = -1
_F32 = torch.float32


def rht_matrix(sign_mask: int = DEFAULT_RHT_SIGN_MASK, device=None) -> torch.Tensor:
    """T = diag(s) @ H16 / 4 in fp32 (entries +-0.25, exact in bf16); H16 is Sylvester's matrix."""
    idx = torch.arange(16, device=device)
    parity = torch.zeros(16, 16, dtype=torch.int64, device=device)
    anded = idx.view(-1, 1) & idx.view(1, -1)
    for bit in range(4):
        parity ^= (anded >> bit) & 1
    hadamard = 1.0 - 2.0 * parity.to(_F32)
    signs = torch.tensor([-1.0 if (sign_mask >> i) & 1 else 1.0 for i in range(16)], dtype=_F32, device=device)
    return signs.view(-1, 1) * hadamard * 0.25


# The largest finite values of the output dtypes, as fp32 numbers (the saturation bounds)
DTYPE_MAX = {torch.float32: torch.finfo(torch.float32).max, torch.bfloat16: torch.finfo(torch.bfloat16).max,
             torch.float16: torch.finfo(torch.float16).max}
_SCALE_DOWN = 2.0**-4  # T / 16 has entries +-2^-6: a 16-term sum of bf16 values times them cannot overflow


def saturate_finite(v: torch.Tensor, dtype: torch.dtype, finite: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 ``v`` with every value beyond ``dtype``'s finite range set to +-its max where ``finite``
    (default: where ``v`` is finite), so that the cast to ``dtype`` keeps a finite value finite. The same
    bits as the plain cast wherever that cast is finite (values between the max and the first rounding
    step past it round to the max either way); NaN stays NaN."""
    limit = DTYPE_MAX[dtype]
    big = v.abs() > limit
    big = big & (v.isfinite() if finite is None else finite)
    return torch.where(big, torch.copysign(torch.full_like(v, limit), v), v)


def apply_rht(y: torch.Tensor, sign_mask: int = DEFAULT_RHT_SIGN_MASK) -> torch.Tensor:
    """Random Hadamard transform along the last dim, in chunks of 16: v -> bf16(v @ T).

    The input is taken as bf16 (TE defines the RHT on BF16 tensors; other dtypes are rounded to bf16
    first, finite values beyond bf16's range saturating to its max). The 16 products are accumulated in
    fp32 and the sum is rounded once to bf16. Finite input stays finite: the sum is taken with T / 16
    and multiplied by 16 afterwards (the same bits as v @ T wherever that is finite: every product and
    partial sum of bf16 values with +-2^-2 or +-2^-6 is the other one's times an exact power of two, no
    bit falling below fp32's subnormals), and a result beyond bf16's range saturates to its max.
    """
    rows, cols = y.shape
    if y.dtype != torch.bfloat16:
        y = saturate_finite(y.to(_F32), torch.bfloat16)
    v = y.to(torch.bfloat16).to(_F32).reshape(rows, cols // 16, 16)
    out = torch.matmul(v, rht_matrix(sign_mask, y.device) * _SCALE_DOWN) * (1.0 / _SCALE_DOWN)
    finite = v.isfinite().all(dim=-1, keepdim=True)  # an inf or NaN input makes its whole chunk non-finite
    out = saturate_finite(out, torch.bfloat16, finite)
    return out.reshape(rows, cols).to(torch.bfloat16)


def fwht16_fp32(v: torch.Tensor) -> torch.Tensor:
    """Unnormalized Walsh-Hadamard transform of the last dim (16) in fp32, as a radix-2 butterfly:
    stages on index bit 0, 1, 2, 3 in that order, each replacing the pair (a at bit 0, b at bit 1)
    by (a + b, a - b), one fp32 add per output. Result: v @ H16 with this fixed summation order."""
    lead = v.shape[:-1]
    v = v.to(_F32)
    for bit in (1, 2, 4, 8):
        pairs = v.reshape(*lead, 16 // (2 * bit), 2, bit)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        v = torch.stack((a + b, a - b), dim=-2).reshape(*lead, 16)
    return v


def apply_rht_fp32(y: torch.Tensor, sign_mask: int = DEFAULT_RHT_SIGN_MASK) -> torch.Tensor:
    """PR 3045's per-token RHT along the last dim, in chunks of 16, kept in fp32 (no bf16 rounding of
    input or output): flip the sign of element i where bit i of the mask is set (exact), the butterfly
    of :func:`fwht16_fp32`, then times 1/4 (exact; the PR folds the 1/4 into the block amax and the
    encode factor, which gives the same codes and scales outside the subnormal range)."""
    rows, cols = y.shape
    signs = torch.tensor([-1.0 if (sign_mask >> i) & 1 else 1.0 for i in range(16)], dtype=_F32, device=y.device)
    v = y.to(_F32).reshape(rows, cols // 16, 16) * signs
    return (fwht16_fp32(v) * 0.25).reshape(rows, cols)


def inverse_rht(y: torch.Tensor, sign_mask: int = DEFAULT_RHT_SIGN_MASK) -> torch.Tensor:
    """Inverse of the transform in fp32 (T is orthogonal: T @ T^T = I). The fp32 sum of 16 products
    depends on summation order: every caller uses this one matmul, so results agree on each device.

    Chunks of finite values whose sum overflows in that order are summed again with T^T / 16 and
    multiplied by 16 (fp32 inputs may be subnormal, so that order is used only where the plain one
    overflows), and a result beyond fp32's range saturates to +-FLT_MAX: finite input, finite output."""
    rows, cols = y.shape
    v = y.to(_F32).reshape(rows, cols // 16, 16)
    t_inv = rht_matrix(sign_mask, y.device).T
    out = torch.matmul(v, t_inv)
    finite = v.isfinite().all(dim=-1, keepdim=True)
    overflow = finite & ~out.isfinite().all(dim=-1, keepdim=True)
    rescaled = torch.matmul(v, t_inv * _SCALE_DOWN) * (1.0 / _SCALE_DOWN)
    out = torch.where(overflow, saturate_finite(rescaled, torch.float32, finite), out)
    return out.reshape(rows, cols)
