"""FSDP2 FP4 all-gather: shard weights in high precision, all-gather them as packed NVFP4.

Usage (before ``fully_shard``)::

    nvfp4lab.fsdp.enable_fp4_all_gather(model)     # every nvfp4lab.Linear weight
    for layer in model.layers: fully_shard(layer)
    fully_shard(model)

Each weight parameter becomes a :class:`NVFP4ShardedWeight` (a thin wrapper that behaves as its
high-precision shard for every op: the optimizer, gradient reduction and state_dict see ordinary
values). When FSDP2 all-gathers it, :meth:`NVFP4ShardedWeight.fsdp_pre_all_gather` all-reduces the amax
(MAX) over the shard group, quantizes the local rows (rowwise + columnwise copies, compact scales) and
hands FSDP the packed bytes; :meth:`~NVFP4ShardedWeight.fsdp_post_all_gather` reassembles an
:class:`NVFP4GatheredWeight` that the modules consume directly: no high-precision weight is gathered,
and the gathered NVFP4 weight is bit-identical to quantizing the full weight on one device.

Constraints: the weight's rows divide evenly over the shard group, each shard a multiple of 16 rows
(columnwise 16-row blocks and 16x16 tiles may not straddle shards). The weight config is the recipe's
(per-tensor; no per-token, no stochastic rounding for weights).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree

from . import ops
from .config import NVFP4QuantConfig
from .tensors import NVFP4Tensor

aten = torch.ops.aten

# Ops FSDP2 applies to the sharded parameter (chunk/pad/copy/view/to); their results stay wrapped.
_PRESERVE = {
    aten.empty_like.default,
    aten.new_zeros.default,
    aten.slice.Tensor,
    aten.copy_.default,
    aten.view.default,
    aten.as_strided.default,
    aten._to_copy.default,
    aten._pin_memory.default,
    aten.split.Tensor,
    aten.clone.default,
}


class NVFP4ShardedWeight(torch.Tensor):
    """A high-precision weight (shard) that FSDP2 all-gathers as NVFP4 (see module docstring)."""

    @staticmethod
    def __new__(cls, hp: torch.Tensor, config: NVFP4QuantConfig):
        return torch.Tensor._make_wrapper_subclass(
            cls, hp.size(), strides=hp.stride(), storage_offset=hp.storage_offset(),
            dtype=hp.dtype, layout=hp.layout, device=hp.device, requires_grad=hp.requires_grad,
        )

    def __init__(self, hp: torch.Tensor, config: NVFP4QuantConfig):
        self._hp = hp
        self._config = config

    def __repr__(self):
        return f"NVFP4ShardedWeight({self._hp!r}, block={self._config.block})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.detach.default:
            return cls(args[0]._hp.detach(), args[0]._config)
        config = None

        def unwrap(t):
            nonlocal config
            config = t._config
            return t._hp

        args, kwargs = pytree.tree_map_only(cls, unwrap, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func not in _PRESERVE:
            return out
        return pytree.tree_map_only(torch.Tensor, lambda t: cls(t, config), out)

    def __tensor_flatten__(self):
        return ["_hp"], self._config

    @staticmethod
    def __tensor_unflatten__(inner, config, outer_size, outer_stride):
        return NVFP4ShardedWeight(inner["_hp"], config)

    # ----------------------------------------------------------------------------- FSDP2 hooks
    def fsdp_pre_all_gather(self, mesh, outer_size=None, outer_stride=None, module=None, mp_policy=None):
        shard = self._hp
        if shard.dim() != 2:
            raise ValueError(f"FP4 all-gather needs 2-D weights, got shape {tuple(shard.shape)}")
        if shard.shape[0] % 16:
            raise ValueError(
                f"weight shard rows must be a multiple of 16 (got {shard.shape[0]}): make out_features a multiple of 16 * world size"
            )
        if outer_size is not None and shard.shape[0] * mesh.size() != outer_size[0]:
            raise ValueError(f"weight rows {outer_size[0]} must divide evenly over {mesh.size()} ranks for FP4 all-gather")
        amax = shard.detach().abs().amax().float().reshape(1)
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=mesh.get_group())
        q = ops.quantize_nvfp4(shard.detach(), config=self._config, amax=amax, columnwise_amax=amax)
        inputs = [q.rowwise_data, q.rowwise_scale]
        if self._config.columnwise:
            # gathered rank-major along dim 0, transposed back after the gather
            inputs += [q.columnwise_data.t().contiguous(), q.columnwise_scale.t().contiguous()]
        return tuple(inputs), (amax, shard.dtype)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        amax, _ = metadata
        rows = all_gather_outputs[0].shape[0]
        k = all_gather_outputs[0].shape[1] * 2
        quantized = NVFP4Tensor(shape=torch.Size((rows, k)), dtype=param_dtype, config=self._config)
        quantized.rowwise_data, quantized.rowwise_scale = all_gather_outputs[0], all_gather_outputs[1]
        quantized.rowwise_amax = amax
        if self._config.columnwise:
            quantized.columnwise_data = all_gather_outputs[2].t()
            quantized.columnwise_scale = all_gather_outputs[3].t()
            quantized.columnwise_amax = amax
        if out is not None:
            out._quantized = quantized
            return
        return NVFP4GatheredWeight(quantized, param_dtype), tuple(all_gather_outputs)


class NVFP4GatheredWeight(torch.Tensor):
    """The unsharded weight FSDP2 hands the module: logical (N, K) in ``dtype``, holding the gathered
    :class:`NVFP4Tensor` as ``.quantized``. nvfp4lab modules use ``.quantized`` directly; any other op
    sees the dequantized weight."""

    @staticmethod
    def __new__(cls, quantized: NVFP4Tensor, dtype: torch.dtype):
        device = quantized.rowwise_data.device
        return torch.Tensor._make_wrapper_subclass(cls, quantized.shape, dtype=dtype, device=device, requires_grad=False)

    def __init__(self, quantized: NVFP4Tensor, dtype: torch.dtype):
        self._quantized = quantized

    @property
    def quantized(self) -> NVFP4Tensor:
        return self._quantized

    def __repr__(self):
        return f"NVFP4GatheredWeight(shape={tuple(self.shape)}, dtype={self.dtype})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.detach.default, aten.alias.default):
            return cls(args[0]._quantized, args[0].dtype)
        if func in (aten.as_strided.default, aten.view.default, aten._unsafe_view.default) and tuple(args[1]) == tuple(args[0].shape):
            return cls(args[0]._quantized, args[0].dtype)

        def dequant(t):
            return t._quantized.dequantize(t.dtype)

        args, kwargs = pytree.tree_map_only(cls, dequant, (args, kwargs))
        return func(*args, **kwargs)

    def __tensor_flatten__(self):
        return [], (self._quantized, self.dtype)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return NVFP4GatheredWeight(*meta)


def weight_config(recipe) -> NVFP4QuantConfig:
    """The per-tensor weight config of a recipe, with both copies (fprop rowwise, dgrad columnwise)."""
    from dataclasses import replace

    cfg = recipe.config_for("weight") if hasattr(recipe, "config_for") else recipe
    return replace(cfg, rowwise=True, columnwise=True, scale_layout="compact")


def enable_fp4_all_gather(model: torch.nn.Module, config: Optional[NVFP4QuantConfig] = None) -> int:
    """Wrap the weight of every nvfp4lab NVFP4 Linear in ``model`` for FP4 all-gather; call before
    ``fully_shard``. Returns how many weights were wrapped. ``config`` overrides each module's
    recipe weight config."""
    from .modules import Linear

    count = 0
    for module in model.modules():
        if isinstance(module, Linear) and getattr(module, "recipe", None) is not None and hasattr(module.recipe, "config_for"):
            cfg = config or weight_config(module.recipe)
            module.weight = torch.nn.Parameter(NVFP4ShardedWeight(module.weight.data, cfg), requires_grad=module.weight.requires_grad)
            count += 1
    return count
