"""cuBLAS "128x4" block-scale layout (spec section 8), shared by NVFP4 and MXFP8.

A compact scale matrix S (R, C) is zero-padded to (Rp, Cp) = (roundup(R,128), roundup(C,4)) and entry
(i, j) moves to flat offset

    off(i, j) = ((i // 128) * (Cp // 4) + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4

i.e. ``S.view(Rp/128, 4, 32, Cp/4, 4).permute(0, 3, 2, 1, 4)`` flattened. The swizzled buffer is
returned with shape (Rp, Cp) so that it can stand where a padded scale tensor stands; its
``.flatten()`` is the byte order cuBLAS reads.
"""
from __future__ import annotations

import torch

from ..layout import roundup, swizzled_offset


def pad_scales(scale: torch.Tensor) -> torch.Tensor:
    """(R, C) -> (roundup(R,128), roundup(C,4)) with the padding zeroed."""
    rows, cols = scale.shape
    out = torch.zeros(roundup(rows, 128), roundup(cols, 4), dtype=scale.dtype, device=scale.device)
    out[:rows, :cols] = scale
    return out


def swizzled_offsets(rows_padded: int, cols_padded: int, device=None) -> torch.Tensor:
    """Flat swizzled offset of every (i, j) of a padded (rows_padded, cols_padded) scale matrix."""
    i = torch.arange(rows_padded, device=device).view(-1, 1)
    j = torch.arange(cols_padded, device=device).view(1, -1)
    return swizzled_offset(i, j, cols_padded)


def swizzle_scales(scale: torch.Tensor) -> torch.Tensor:
    """Compact (R, C) scales -> swizzled (roundup(R,128), roundup(C,4)) buffer, padding zeroed."""
    padded = pad_scales(scale)
    rows_p, cols_p = padded.shape
    out = torch.empty(rows_p * cols_p, dtype=scale.dtype, device=scale.device)
    out[swizzled_offsets(rows_p, cols_p, scale.device).flatten()] = padded.flatten()
    return out.view(rows_p, cols_p)


def unswizzle_scales(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_scales`: swizzled buffer (flat or 2-D) -> compact (rows, cols)."""
    rows_p, cols_p = roundup(rows, 128), roundup(cols, 4)
    flat = swizzled.reshape(-1)
    offs = swizzled_offsets(rows_p, cols_p, swizzled.device)
    return flat[offs[:rows, :cols].flatten()].view(rows, cols)


def apply_scale_layout(scale: torch.Tensor, layout: str) -> torch.Tensor:
    """Compact (R, C) scales -> the requested layout ("compact", "padded" or "swizzled")."""
    if layout == "compact":
        return scale
    if layout == "padded":
        return pad_scales(scale)
    return swizzle_scales(scale)


def compact_scales(scale: torch.Tensor, layout: str, rows: int, cols: int) -> torch.Tensor:
    """Any layout -> compact (rows, cols): the inverse of :func:`apply_scale_layout`."""
    if layout == "compact":
        return scale
    if layout == "padded":
        return scale[:rows, :cols]
    return unswizzle_scales(scale, rows, cols)
