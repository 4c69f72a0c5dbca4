"""Integer layout formulas shared by the reference and the launchers (plain Python: ints or tensors).

cuBLAS "128x4" block-scale layout (spec section 8): a compact scale matrix (R, C) is zero-padded to
(roundup(R, 128), roundup(C, 4)) and entry (i, j) moves to :func:`swizzled_offset`.
"""
from __future__ import annotations


def roundup(n: int, m: int) -> int:
    """The smallest multiple of ``m`` that is >= ``n``."""
    return (n + m - 1) // m * m


def cdiv(n: int, m: int) -> int:
    """ceil(n / m) of host ints (``triton.cdiv`` is a constexpr function, slower to call from Python)."""
    return -(n // -m)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n, for host ints n >= 1 (as ``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length()


def swizzled_offset(i, j, cols_padded: int):
    """Flat byte offset of scale (i, j) in the 128x4 layout of a (rows_padded, cols_padded) matrix:
    ``S.view(Rp/128, 4, 32, Cp/4, 4).permute(0, 3, 2, 1, 4)`` flattened. ``i`` and ``j`` may be ints or
    integer tensors (broadcast)."""
    return ((i // 128) * (cols_padded // 4) + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
