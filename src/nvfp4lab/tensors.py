"""Plain containers for quantized tensors: data, scales, amax and the flags needed to read them.

No tensor-subclass magic: an :class:`NVFP4Tensor` is a dataclass of ordinary ``torch.Tensor`` fields.

NVFP4 layout of a logical (M, K) tensor (leading dims of the original shape are flattened into M)::

    rowwise_data     uint8 (M, K/2)   two E2M1 codes per byte, element 2j in the low nibble
    rowwise_scale    uint8            E4M3 bits; entry [r, b] scales x[r, 16b:16b+16]
                                      compact (M, K/16) | padded/swizzled (roundup(M,128), roundup(K/16,4))
    rowwise_amax     fp32 (1,)        or (M,) when per_token
    columnwise_data  uint8 (K, M/2)   quantization of x^T (of RHT(x^T) when rht_sign_mask is set)
    columnwise_scale uint8            entry [c, b] scales x[16b:16b+16, c]; (K, M/16) compact
    columnwise_amax  fp32 (1,)        or (K,) when per_token; post-RHT amax with RHT

A value is ``code_value * e4m3(scale) * amax / (6 * e4m3_max)``.

Build containers with ``from_parts`` (the one constructor path: it checks that the copies given are
the copies the config asks for). ``.dequantize()`` calls the public op of :mod:`nvfp4lab.ops`, which
registers itself here (:func:`register_dequantize`): this module imports nothing above it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .checks import check_split_sizes
from .config import MXFP8QuantConfig, NVFP4QuantConfig

# container class -> the public dequantize op (nvfp4lab.ops registers dequantize_nvfp4 / dequantize_mxfp8)
_DEQUANTIZE_OPS: dict = {}


def register_dequantize(cls: type, op: Callable) -> None:
    """Make ``cls.dequantize`` call ``op(t, dtype=, which=)`` (done once by :mod:`nvfp4lab.ops`)."""
    _DEQUANTIZE_OPS[cls] = op


def _check_copies(cls: type, config, rowwise, columnwise) -> None:
    if (rowwise is not None) != config.rowwise or (columnwise is not None) != config.columnwise:
        raise ValueError(f"{cls.__name__}.from_parts: the copies given (rowwise={rowwise is not None}, "
                         f"columnwise={columnwise is not None}) must be the copies the config asks for "
                         f"(rowwise={config.rowwise}, columnwise={config.columnwise})")


class _DeviceMoves:
    """Tensor-like moves of a quantized container: every tensor field (data, scales, amax, split
    offsets) moved, the other fields (shape, dtype, config) kept. The bits never change, so
    ``.to`` takes a device only (a dtype raises TypeError: use ``dequantize(dtype=...)``)."""

    def to(self, device=None, *, non_blocking: bool = False, copy: bool = False):
        """A container with every tensor on ``device`` (a copy of the fields that move, or all of
        them with ``copy=True``); ``self`` when nothing moves and no copy is asked for."""
        if isinstance(device, torch.dtype):
            raise TypeError(f"{type(self).__name__}.to takes a device, not a dtype ({device}): the quantized bits keep "
                            "their dtypes; use dequantize(dtype=...) for high precision")
        if device is None and not copy:
            return self
        target = None if device is None else torch.device(device)
        tensors = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}
        moved = {name: t.to(t.device if target is None else target, non_blocking=non_blocking, copy=copy)
                 for name, t in tensors.items()}
        if all(moved[name] is t for name, t in tensors.items()):
            return self
        return dataclasses.replace(self, **moved)

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None, non_blocking: bool = False):
        index = device.index if isinstance(device, torch.device) else device
        return self.to(torch.device("cuda", index) if index is not None else torch.device("cuda"), non_blocking=non_blocking)

    @property
    def device(self) -> Optional[torch.device]:
        """The device of the tensor fields (None when there are none)."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                return value.device
        return None


@dataclass
class NVFP4Tensor(_DeviceMoves):
    shape: torch.Size  # logical shape of the original tensor
    dtype: torch.dtype  # dtype of the original tensor (default dequantize dtype)
    config: NVFP4QuantConfig
    rowwise_data: Optional[torch.Tensor] = None
    rowwise_scale: Optional[torch.Tensor] = None
    rowwise_amax: Optional[torch.Tensor] = None
    columnwise_data: Optional[torch.Tensor] = None
    columnwise_scale: Optional[torch.Tensor] = None
    columnwise_amax: Optional[torch.Tensor] = None

    # Recipe flags, read from the config (kept as properties so they cannot disagree with it).
    @property
    def per_token(self) -> bool:
        return self.config.per_token

    @property
    def e4m3_max(self) -> float:
        return self.config.e4m3_max

    @property
    def block(self) -> str:
        return self.config.block

    @property
    def rht_sign_mask(self) -> Optional[int]:
        return self.config.rht_sign_mask if self.config.rht else None

    @property
    def scale_layout(self) -> str:
        return self.config.scale_layout

    @property
    def m(self) -> int:
        shape = self.shape
        if len(shape) == 2:
            return int(shape[0])
        return int(torch.Size(shape[:-1]).numel()) if len(shape) > 1 else 1

    @property
    def k(self) -> int:
        return int(self.shape[-1])

    @classmethod
    def from_parts(cls, shape, dtype: torch.dtype, config: NVFP4QuantConfig, rowwise: Optional[tuple] = None,
                   columnwise: Optional[tuple] = None) -> "NVFP4Tensor":
        """The container of ``shape`` / ``dtype`` quantized with ``config``; ``rowwise`` and
        ``columnwise`` are the (data, scale, amax) of each copy, given exactly when ``config`` asks
        for that copy (ValueError otherwise)."""
        _check_copies(cls, config, rowwise, columnwise)
        t = cls(shape, dtype, config)
        if rowwise is not None:
            t.rowwise_data, t.rowwise_scale, t.rowwise_amax = rowwise
        if columnwise is not None:
            t.columnwise_data, t.columnwise_scale, t.columnwise_amax = columnwise
        return t

    def dequantize(self, dtype: Optional[torch.dtype] = None, which: str = "rowwise") -> torch.Tensor:
        """Back to high precision in the original shape (:func:`nvfp4lab.dequantize_nvfp4`).
        ``which="columnwise"`` reads the columnwise copy (undoing the RHT in fp32 when it was applied)
        and also returns x's orientation."""
        return _DEQUANTIZE_OPS[NVFP4Tensor](self, dtype=dtype, which=which)


@dataclass
class NVFP4Operand(_DeviceMoves):
    """One NVFP4 copy in the form the Hopper GEMM consumes: ``values`` (rows, K) BF16 (or (E, N, K): the stacked
    weights of a grouped GEMM, amax (E,) or (1,)), the exact products
    q * s of its E2M1 codes and E4M3 block scales (K in natural order; every product has at most 5
    significant bits), with the copy's outer ``amax`` (fp32 (1,) or (rows,)) and ``config`` (that of the copy
    as a rowwise GEMM operand, see :func:`nvfp4lab.functional.transposed_operand`). A value of the copy is
    ``values * amax / (6 * e4m3_max)``. Made by :func:`nvfp4lab.ops.quantize_nvfp4_operands`, taken by
    :func:`nvfp4lab.ops.nvfp4_gemm` for either operand; 16 bits per element, so a transient of a pass,
    not a storage format (save :class:`NVFP4Tensor` copies)."""

    values: torch.Tensor
    amax: torch.Tensor
    config: NVFP4QuantConfig

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def m(self) -> int:
        """Rows of the 2-D operand; of all experts for a stack (E, N, K)."""
        return int(self.values.shape[:-1].numel())

    @property
    def k(self) -> int:
        return int(self.values.shape[-1])

    @property
    def e4m3_max(self) -> float:
        return self.config.e4m3_max


@dataclass
class MXFP8Tensor(_DeviceMoves):
    """MXFP8: E4M3/E5M2 bits (uint8) with E8M0 scales, one per 32 elements.

    rowwise_data (M, K), rowwise_scale compact (M, K/32); columnwise_data (M, K) (not transposed),
    columnwise_scale compact (M/32, K). Padded rowwise scales are (roundup(M,128), roundup(K/32,4)),
    padded columnwise (roundup(M/32,4), roundup(K,128)); swizzled columnwise scales are the swizzle of
    the transposed matrix, shape (roundup(K,128), roundup(M/32,4)).
    """

    shape: torch.Size
    dtype: torch.dtype
    config: MXFP8QuantConfig
    rowwise_data: Optional[torch.Tensor] = None
    rowwise_scale: Optional[torch.Tensor] = None
    columnwise_data: Optional[torch.Tensor] = None
    columnwise_scale: Optional[torch.Tensor] = None

    @property
    def fp8_format(self) -> str:
        return self.config.fp8_format

    @property
    def scale_layout(self) -> str:
        return self.config.scale_layout

    @classmethod
    def from_parts(cls, shape, dtype: torch.dtype, config: MXFP8QuantConfig, rowwise: Optional[tuple] = None,
                   columnwise: Optional[tuple] = None) -> "MXFP8Tensor":
        """As :meth:`NVFP4Tensor.from_parts`, with (data, scale) pairs (MXFP8 has no amax)."""
        _check_copies(cls, config, rowwise, columnwise)
        t = cls(shape, dtype, config)
        if rowwise is not None:
            t.rowwise_data, t.rowwise_scale = rowwise
        if columnwise is not None:
            t.columnwise_data, t.columnwise_scale = columnwise
        return t

    def dequantize(self, dtype: Optional[torch.dtype] = None, which: str = "rowwise") -> torch.Tensor:
        """Back to high precision (M, K) (:func:`nvfp4lab.dequantize_mxfp8`)."""
        return _DEQUANTIZE_OPS[MXFP8Tensor](self, dtype=dtype, which=which)


@dataclass
class GroupedNVFP4Tensor(_DeviceMoves):
    """One token tensor (total_M, K) quantized split by split (MoE experts), in contiguous bulk buffers.

    Split i covers rows [split_offsets[i], split_offsets[i+1]) and is quantized exactly as if it were
    alone (its own amax). Buffers (compact scales only)::

        rowwise_data      (total_M, K/2)      split i = rows of the split
        rowwise_scale     (total_M, K/16)
        rowwise_amax      (num_splits,) per tensor, or (total_M,) per token
        columnwise_data   flat (K * total_M / 2,)   split i = [K*off_i/2, K*off_{i+1}/2) viewed (K, m_i/2)
        columnwise_scale  flat (K * total_M / 16,)  split i = [K*off_i/16, ...) viewed (K, m_i/16)
        columnwise_amax   (num_splits,) per tensor, or (num_splits, K) per token

    ``split_offsets`` is an int64 tensor (num_splits + 1,) on the data's device, so a kernel can read
    the split sizes without a host sync. :meth:`split` makes the per-split views (from the host split
    sizes when given, else by reading the offsets back: a sync).
    """

    shape: torch.Size
    dtype: torch.dtype
    config: NVFP4QuantConfig
    split_offsets: torch.Tensor
    rowwise_data: Optional[torch.Tensor] = None
    rowwise_scale: Optional[torch.Tensor] = None
    rowwise_amax: Optional[torch.Tensor] = None
    columnwise_data: Optional[torch.Tensor] = None
    columnwise_scale: Optional[torch.Tensor] = None
    columnwise_amax: Optional[torch.Tensor] = None

    @classmethod
    def from_parts(cls, shape, dtype: torch.dtype, config: NVFP4QuantConfig, split_offsets: torch.Tensor,
                   rowwise: Optional[tuple] = None, columnwise: Optional[tuple] = None) -> "GroupedNVFP4Tensor":
        """As :meth:`NVFP4Tensor.from_parts`, with the bulk buffers and the split offsets."""
        _check_copies(cls, config, rowwise, columnwise)
        t = cls(shape, dtype, config, split_offsets)
        if rowwise is not None:
            t.rowwise_data, t.rowwise_scale, t.rowwise_amax = rowwise
        if columnwise is not None:
            t.columnwise_data, t.columnwise_scale, t.columnwise_amax = columnwise
        return t

    @property
    def num_splits(self) -> int:
        return self.split_offsets.numel() - 1

    def split(self, sections: Optional[list] = None) -> list:
        """Per-split :class:`NVFP4Tensor` views into the bulk buffers (compact scales). ``sections``: the split
        sizes on the host (no read of device offsets): one int per split, summing to M, multiples of 16 with a
        columnwise copy, and equal to the offsets where those are on the host (ValueError otherwise: views of
        other row ranges would take other splits' amaxes)."""
        if sections is None:
            offsets = [int(v) for v in self.split_offsets.tolist()]
        else:
            check_split_sizes("sections", sections, int(self.shape[0]), count=self.num_splits)
            if self.config.columnwise and any(s % 16 for s in sections):
                raise ValueError(f"sections must be multiples of 16 (the columnwise copy blocks 16 rows), got {list(sections)}")
            offsets = cumulative_offsets(sections)
            if self.split_offsets.device.type == "cpu" and self.split_offsets.tolist() != offsets:
                raise ValueError(f"sections must be this tensor's split sizes (offsets {self.split_offsets.tolist()}), "
                                 f"got {list(sections)}")
        k = int(self.shape[-1])
        cfg = self.config
        out = []
        for i in range(len(offsets) - 1):
            lo, hi = offsets[i], offsets[i + 1]
            row = col = None
            if cfg.rowwise:
                row = (self.rowwise_data[lo:hi], self.rowwise_scale[lo:hi],
                       self.rowwise_amax[lo:hi] if cfg.per_token else self.rowwise_amax[i : i + 1])
            if cfg.columnwise:
                col = (self.columnwise_data[k * lo // 2 : k * hi // 2].view(k, (hi - lo) // 2),
                       self.columnwise_scale[k * lo // 16 : k * hi // 16].view(k, (hi - lo) // 16),
                       self.columnwise_amax[i] if cfg.per_token else self.columnwise_amax[i : i + 1])
            out.append(NVFP4Tensor.from_parts(torch.Size((hi - lo, k)), self.dtype, cfg, rowwise=row, columnwise=col))
        return out


def cumulative_offsets(sizes) -> list:
    """Host split sizes -> their row offsets [0, s0, s0 + s1, ...] (n + 1 ints)."""
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + int(s))
    return offsets


# torch.load(weights_only=True) rebuilds these containers (and their configs) from a torch.save file
torch.serialization.add_safe_globals([NVFP4Tensor, MXFP8Tensor, GroupedNVFP4Tensor, NVFP4Operand, NVFP4QuantConfig,
                                      MXFP8QuantConfig])
