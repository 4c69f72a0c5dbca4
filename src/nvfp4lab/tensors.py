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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .config import MXFP8QuantConfig, NVFP4QuantConfig


@dataclass
class NVFP4Tensor:
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
        return int(torch.Size(self.shape[:-1]).numel()) if len(self.shape) > 1 else 1

    @property
    def k(self) -> int:
        return int(self.shape[-1])

    def dequantize(self, dtype: Optional[torch.dtype] = None, which: str = "rowwise") -> torch.Tensor:
        """Back to high precision in the original shape. ``which="columnwise"`` reads the columnwise
        copy (undoing the RHT in fp32 when it was applied) and also returns x's orientation."""
        from .ops import dequantize_nvfp4

        return dequantize_nvfp4(self, dtype=dtype, which=which)


@dataclass
class MXFP8Tensor:
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

    def dequantize(self, dtype: Optional[torch.dtype] = None, which: str = "rowwise") -> torch.Tensor:
        from .ops import dequantize_mxfp8

        return dequantize_mxfp8(self, dtype=dtype, which=which)


@dataclass
class GroupedNVFP4Tensor:
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

    @property
    def num_splits(self) -> int:
        return self.split_offsets.numel() - 1

    def split(self, sections: Optional[list] = None) -> list:
        """Per-split :class:`NVFP4Tensor` views into the bulk buffers (compact scales)."""
        offsets = [int(v) for v in self.split_offsets.tolist()] if sections is None else cumulative_offsets(sections)
        k = int(self.shape[-1])
        cfg = self.config
        out = []
        for i in range(len(offsets) - 1):
            lo, hi = offsets[i], offsets[i + 1]
            t = NVFP4Tensor(shape=torch.Size((hi - lo, k)), dtype=self.dtype, config=cfg)
            if cfg.rowwise:
                t.rowwise_data = self.rowwise_data[lo:hi]
                t.rowwise_scale = self.rowwise_scale[lo:hi]
                t.rowwise_amax = self.rowwise_amax[lo:hi] if cfg.per_token else self.rowwise_amax[i : i + 1]
            if cfg.columnwise:
                t.columnwise_data = self.columnwise_data[k * lo // 2 : k * hi // 2].view(k, (hi - lo) // 2)
                t.columnwise_scale = self.columnwise_scale[k * lo // 16 : k * hi // 16].view(k, (hi - lo) // 16)
                t.columnwise_amax = self.columnwise_amax[i] if cfg.per_token else self.columnwise_amax[i : i + 1]
            out.append(t)
        return out


def cumulative_offsets(sizes) -> list:
    """Host split sizes -> their row offsets [0, s0, s0 + s1, ...] (n + 1 ints)."""
    offsets = [0]
    for s in sizes:
        offsets.append(offsets[-1] + int(s))
    return offsets
