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


def apply_rht(y: torch.Tensor, sign_mask: int = DEFAULT_RHT_SIGN_MASK) -> torch.Tensor:
    """Random Hadamard transform along the last dim, in chunks of 16: v -> bf16(v @ T).

    The input is taken as bf16 (TE defines the RHT on BF16 tensors; other dtypes are rounded to bf16
    first). The 16 products are accumulated in fp32 and the sum is rounded once to bf16.
    """
    rows, cols = y.shape
    v = y.to(torch.bfloat16).to(_F32).reshape(rows, cols // 16, 16)
    out = torch.matmul(v, rht_matrix(sign_mask, y.device))
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
    depends on summation order: every caller uses this one matmul, so results agree on each device."""
    rows, cols = y.shape
    v = y.to(_F32).reshape(rows, cols // 16, 16)
    return torch.matmul(v, rht_matrix(sign_mask, y.device).T).reshape(rows, cols)
