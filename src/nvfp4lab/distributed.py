"""Distributed helpers: NVFP4 weight all-gather (FP4 instead of BF16 over the wire).

A weight W (N, K) sharded by rows over a process group (FSDP2's dim-0 sharding) is quantized shard by
shard and the packed FP4 data and E4M3 scales are all-gathered, about 3.5x fewer bytes than BF16.
Bit-identity with quantizing the full weight on one device holds because:

* the per-tensor amax is all-reduced (MAX) first, so every shard uses the same global scale S_enc;
* rowwise 1x16 blocks lie inside one row; columnwise blocks (16 consecutive rows of W) and 16x16 tiles
  lie inside one shard when every shard boundary falls on a multiple of 16 rows (checked).

Per-token quantization is for activations and is rejected here (a weight has one amax).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from . import ops
from .config import NVFP4QuantConfig
from .tensors import NVFP4Tensor


def quantize_weight_shard(
    shard: torch.Tensor,
    config: NVFP4QuantConfig,
    group: Optional[dist.ProcessGroup] = None,
    backend: Optional[str] = None,
) -> NVFP4Tensor:
    """Quantize this rank's rows of a weight with the amax of the whole weight (MAX all-reduce)."""
    if config.per_token:
        raise ValueError("config.per_token: a sharded weight has one per-tensor amax; per-token is for activations")
    if config.stochastic_rounding:
        raise ValueError("config.stochastic_rounding: weights are quantized round-to-nearest so every rank agrees bit for bit")
    if shard.dim() != 2:
        raise ValueError(f"shard must be 2-D (rows of the weight, K), got shape {tuple(shard.shape)}")
    if (config.columnwise or config.block == "16x16") and shard.shape[0] % 16:
        raise ValueError("shard rows must be a multiple of 16 for columnwise or 16x16 blocks (blocks may not straddle shards), "
                         f"got {shard.shape[0]}")
    local_amax = shard.detach().abs().amax().float().reshape(1) if shard.numel() else torch.zeros(1, device=shard.device)
    if dist.is_initialized():
        dist.all_reduce(local_amax, op=dist.ReduceOp.MAX, group=group)
    return ops.quantize_nvfp4(shard, config=config, amax=local_amax, columnwise_amax=local_amax, backend=backend)


def all_gather_nvfp4(local: NVFP4Tensor, group: Optional[dist.ProcessGroup] = None) -> NVFP4Tensor:
    """All-gather the packed FP4 data and compact scales of row shards into the full weight's NVFP4Tensor.

    Every rank must hold the same number of rows (FSDP2 pads shards to equal size). Rowwise buffers are
    concatenated along rows; columnwise buffers (K, rows/2) along their second dim.
    """
    if local.scale_layout != "compact":
        raise ValueError("local.scale_layout: all-gather moves compact scales; swizzle after gathering")
    world = dist.get_world_size(group)
    full_rows = local.m * world
    def gather_rows(t: torch.Tensor) -> torch.Tensor:
        buf = torch.empty((world * t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        if dist.get_backend(group) == "nccl":
            dist.all_gather_into_tensor(buf, t.contiguous(), group=group)
        else:  # gloo: the list form works for every dtype and version
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous(), group=group)
            torch.cat(parts, dim=0, out=buf)
        return buf

    row = col = None
    if local.rowwise_data is not None:
        row = (gather_rows(local.rowwise_data), gather_rows(local.rowwise_scale), local.rowwise_amax.clone())
    if local.columnwise_data is not None:
        # (K, r/2) per rank -> gather as rows of the transposed layout, then put ranks side by side
        col_data = gather_rows(local.columnwise_data.t().contiguous())  # (world*r/2, K)
        col_scale = gather_rows(local.columnwise_scale.t().contiguous())
        col = (col_data.t().contiguous(), col_scale.t().contiguous(), local.columnwise_amax.clone())
    return NVFP4Tensor.from_parts(torch.Size((full_rows, local.k)), local.dtype, local.config, rowwise=row, columnwise=col)


def gathered_bytes(local: NVFP4Tensor, world: int) -> int:
    """Bytes every rank receives in :func:`all_gather_nvfp4` (data + scales + amax)."""
    total = 0
    for name in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        t = getattr(local, name)
        if t is not None:
            total += t.numel() * t.element_size() * world
    return total
