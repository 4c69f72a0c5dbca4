"""Scale swizzle kernels: compact (R, C) uint8 scales <-> cuBLAS' "128x4" block-scale layout.

Layout (spec section 8, :mod:`nvfp4lab.ref.swizzle`): the compact matrix is zero-padded to
(Rp, Cp) = (roundup(R,128), roundup(C,4)) and entry (i, j) moves to flat byte offset

    off(i, j) = ((i // 128) * (Cp // 4) + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4

:func:`swizzle_offset` is that formula as a device function; the dequantize and MXFP8 kernels use it
to read and write swizzled scales in place, without a separate swizzle pass.

Kernels: one program owns one 128-row band of the padded matrix and ``BLOCK_COLS`` of its columns
(a multiple of 4, so whole 512-byte tiles). ``swizzle_scales`` writes every byte of its tiles, padding
included (zeros), so its output needs no memset; ``unswizzle_scales`` gathers the (rows, cols) entries.
Offsets: the band's base is a 64-bit scalar; offsets inside a band are 32-bit (a band holds
128 * Cp bytes, checked against 2^31 by the launcher).

Public launchers are ``torch.library`` custom ops (``nvfp4lab::swizzle_scales``,
``nvfp4lab::unswizzle_scales``) with fake implementations, so they trace under torch.compile and
replay in CUDA graphs (no host sync). Empty inputs return at once, with no launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..layout import cdiv, next_power_of_2, roundup
from .launch import Launch, custom_op, launch
from .pdl import wait_prior_grid

_INT32_LIMIT = 2**31


@triton.jit
def swizzle_offset(row, col, col_tiles):
    """Byte offset of scale (row, col) in the swizzled buffer; col_tiles = roundup(C, 4) // 4."""
    tile = (row // 128) * col_tiles + col // 4
    return tile * 512 + (row % 32) * 16 + ((row % 128) // 32) * 4 + col % 4


@triton.jit
def _swizzle_kernel(src_ptr, dst_ptr, rows, cols, col_tiles, BLOCK_COLS: tl.constexpr, PDL: tl.constexpr = False):
    wait_prior_grid(PDL)
    band = tl.program_id(0)
    col0 = tl.program_id(1) * BLOCK_COLS
    r = tl.arange(0, 128)
    c = col0 + tl.arange(0, BLOCK_COLS)
    row = band.to(tl.int64) * 128  # first row of this band
    src = src_ptr + row * cols
    dst = dst_ptr + row * (col_tiles * 4)
    rows_left = rows - row
    # padding rows/cols read as 0: the swizzled padding must be zero and this writes all of it
    val = tl.load(src + r[:, None] * cols + c[None, :], mask=(r[:, None] < rows_left) & (c[None, :] < cols), other=0)
    tl.store(dst + swizzle_offset(r[:, None], c[None, :], col_tiles), val, mask=c[None, :] < col_tiles * 4)


@triton.jit
def _unswizzle_kernel(src_ptr, dst_ptr, rows, cols, col_tiles, BLOCK_COLS: tl.constexpr, PDL: tl.constexpr = False):
    wait_prior_grid(PDL)
    band = tl.program_id(0)
    col0 = tl.program_id(1) * BLOCK_COLS
    r = tl.arange(0, 128)
    c = col0 + tl.arange(0, BLOCK_COLS)
    row = band.to(tl.int64) * 128
    src = src_ptr + row * (col_tiles * 4)
    dst = dst_ptr + row * cols
    mask = (r[:, None] < rows - row) & (c[None, :] < cols)
    val = tl.load(src + swizzle_offset(r[:, None], c[None, :], col_tiles), mask=mask)
    tl.store(dst + r[:, None] * cols + c[None, :], val, mask=mask)


def _block_cols(cols_padded: int) -> int:
    return max(4, min(64, next_power_of_2(cols_padded)))


def _check_band(cols_padded: int) -> None:
    if 128 * cols_padded >= _INT32_LIMIT:
        raise ValueError(f"scale matrices wider than {_INT32_LIMIT // 128 - 1} columns are not supported, got {cols_padded}")


def _swizzle_grid_meta(rows: int, cols: int) -> tuple[tuple[int, int], dict]:
    """Grid and constexprs of ``_swizzle_kernel`` for compact (rows, cols) scales (rows * cols > 0)."""
    cols_p = roundup(cols, 4)
    _check_band(cols_p)
    block_cols = _block_cols(cols_p)
    return (roundup(rows, 128) // 128, cdiv(cols_p, block_cols)), dict(BLOCK_COLS=block_cols, num_warps=4)


def launch_swizzle(scale: torch.Tensor, out: torch.Tensor) -> None:
    """Write swizzle(scale) into ``out`` (roundup(R,128) * roundup(C,4) uint8 bytes, any shape)."""
    rows, cols = scale.shape
    if rows * cols == 0:
        return
    grid, meta = _swizzle_grid_meta(rows, cols)
    launch(_swizzle_kernel, grid, (scale, out, rows, cols, roundup(cols, 4) // 4), meta)


def swizzle_launch(rows: int, cols: int) -> Launch:
    """A :class:`~nvfp4lab.kernels.launch.Launch` of the swizzle of compact (rows, cols) scales, called with
    (scale, out, rows, cols, roundup(cols, 4) // 4); rows * cols > 0."""
    return Launch(_swizzle_kernel, *_swizzle_grid_meta(rows, cols))


def launch_unswizzle(buf: torch.Tensor, rows: int, cols: int, out: torch.Tensor) -> None:
    """Write unswizzle(buf) into the compact (rows, cols) ``out``."""
    if rows * cols == 0:
        return
    cols_p = roundup(cols, 4)
    _check_band(cols_p)
    block_cols = _block_cols(cols_p)
    grid = (roundup(rows, 128) // 128, cdiv(cols, block_cols))
    launch(_unswizzle_kernel, grid, (buf, out, rows, cols, cols_p // 4), dict(BLOCK_COLS=block_cols, num_warps=4))


@custom_op("nvfp4lab::swizzle_scales", mutates_args=())
def _swizzle_op(scale: torch.Tensor) -> torch.Tensor:
    rows, cols = scale.shape
    out = torch.empty(roundup(rows, 128), roundup(cols, 4), dtype=torch.uint8, device=scale.device)
    launch_swizzle(scale.contiguous(), out)
    return out


@_swizzle_op.register_fake
def _(scale):
    rows, cols = scale.shape
    return scale.new_empty(roundup(rows, 128), roundup(cols, 4), dtype=torch.uint8)


@custom_op("nvfp4lab::unswizzle_scales", mutates_args=())
def _unswizzle_op(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    out = torch.empty(rows, cols, dtype=torch.uint8, device=buf.device)
    launch_unswizzle(buf.contiguous(), rows, cols, out)
    return out


@_unswizzle_op.register_fake
def _(buf, rows, cols):
    return buf.new_empty(rows, cols, dtype=torch.uint8)


def _check_uint8_2d(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.uint8:
        raise TypeError(f"{name} must be uint8 (E4M3 or E8M0 scale bits), got {t.dtype}")


def swizzle_scales(scale: torch.Tensor) -> torch.Tensor:
    """Compact (R, C) uint8 -> swizzled (roundup(R,128), roundup(C,4)) uint8, padding zeroed."""
    _check_uint8_2d("scale", scale)
    if scale.dim() != 2:
        raise ValueError(f"scale must be 2-D (R, C), got shape {tuple(scale.shape)}")
    return _swizzle_op(scale)


def unswizzle_scales(buf: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Swizzled buffer (flat or 2-D, roundup(rows,128)*roundup(cols,4) bytes) -> compact (rows, cols)."""
    _check_uint8_2d("buf", buf)
    if rows < 0 or cols < 0:
        raise ValueError(f"rows and cols must be >= 0, got {rows}, {cols}")
    need = roundup(rows, 128) * roundup(cols, 4)
    if buf.numel() != need:
        raise ValueError(f"buf must hold roundup(rows,128)*roundup(cols,4) = {need} bytes, got {buf.numel()}")
    return _unswizzle_op(buf, rows, cols)
