"""FSDP2 FP4 all-gather: shard weights in high precision, all-gather them as packed NVFP4.

Usage (before ``fully_shard`` and before building the optimizer)::

    nvfp4lab.fsdp.enable_fp4_all_gather(model)     # every NVFP4 Linear / GroupedLinear weight
    for block in model.blocks: fully_shard(block)
    fully_shard(model)

Without this call nvfp4lab modules still train under FSDP2: FSDP gathers the weights in their
(param) dtype and each module quantizes the full weight every forward.

How it works. Each weight parameter becomes an :class:`NVFP4ShardedWeight`, a thin wrapper that
behaves as its high-precision tensor for every op, so the optimizer, gradient reduce-scatter and
state dicts see ordinary values (state dicts hold plain tensors). When FSDP2 all-gathers it,
:meth:`NVFP4ShardedWeight.fsdp_pre_all_gather` all-reduces the per-tensor amax (MAX) over the shard
group, quantizes the local rows with the module's recipe (compact scales) and hands FSDP the packed
bytes; :meth:`~NVFP4ShardedWeight.fsdp_post_all_gather` assembles an :class:`NVFP4GatheredWeight`.
The modules pass its ``.quantized`` (rowwise copy for fprop, columnwise copy for dgrad) to
:func:`nvfp4lab.functional.linear`; the weight gradient comes back as a plain tensor that FSDP2
reduce-scatters as usual. The gathered weight is bit-identical to quantizing the full weight on one
device: the amax is global, and no quantization block straddles two shards.

What travels (bytes per element of the weight): with 16x16 weight blocks (``weight_2d``, the TE
default) only the rowwise copy is gathered, 0.5 + 1/16 = 0.5625 B against 2 B for BF16 (3.56x less):
the columnwise copy shares the 16x16 block scales and its codes are the transposed rowwise codes, so
it is rebuilt locally. With 1x16 weight blocks, or 4over6 on weights (whose 16x16 block choice sums
errors in a different order per copy), both copies travel (1.125 B, 1.78x less than BF16). With
``backward="dequantized"`` or ``"high_precision"`` only the rowwise copy is gathered (dgrad does not
read a columnwise copy).

Rules (ValueError / TypeError naming the rule):

* ``out_features`` must be a multiple of 16 x the shard group size: FSDP2 cuts dim 0 in equal
  chunks, and each chunk must hold whole 16-row blocks (16x16 tiles and columnwise blocks).
* Only modules with an :class:`~nvfp4lab.NVFP4Recipe` are wrapped; MXFP8 modules keep gathering in
  high precision.
* A weight shared with a module that is not an NVFP4 nvfp4lab layer (e.g. tied to an embedding) is
  left alone (gathered in high precision).

Mixed precision (``MixedPrecisionPolicy(param_dtype=...)``): the shard is cast to ``param_dtype``
before its amax and quantization, exactly the values a high-precision all-gather would hand the
module, so FP4 and BF16 all-gather train bit-identically. ``reduce_dtype`` acts on gradients as usual.

``backward="high_precision"``: no high-precision weight is gathered, so dgrad uses the *dequantized*
rowwise FP4 weight (``dy @ dequant(W_q)``) instead of the original W; wgrad (``dy^T x``) is unchanged.
Use BF16 all-gather where dgrad must see the high-precision weight.

The gathered buffers belong to FSDP2: it frees them after forward (``reshard_after_forward``) and
refills them before backward. Read ``.quantized`` only inside forward/backward (clone to keep it).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.utils import _pytree as pytree

from . import ops
from .config import NVFP4QuantConfig, with_copies
from .recipes import NVFP4Recipe
from .ref import codecs
from .ref.swizzle import pad_scales
from .tensors import NVFP4Tensor

aten = torch.ops.aten

# Ops FSDP2 applies to the sharded parameter (chunk/pad/copy/view/to); their results stay wrapped so
# that the shard FSDP keeps still carries the FSDP hooks. Every other op returns plain tensors.
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


def weight_config(recipe: NVFP4Recipe) -> NVFP4QuantConfig:
    """The config of the weight a module of ``recipe`` consumes: both copies its GEMMs read (roles
    ``weight_fprop`` rowwise and, with ``backward="quantized"``, ``weight_dgrad`` columnwise) in one
    quantization, with the recipe's scale layout. It is the config :func:`nvfp4lab.functional.linear`
    accepts for ``quantized_weight``."""
    if not isinstance(recipe, NVFP4Recipe):
        raise TypeError(f"recipe must be an NVFP4Recipe (FP4 all-gather), got {type(recipe).__name__}")
    return recipe.tensor_config("weight", rowwise=True, columnwise=recipe.backward == "quantized")


def _columnwise_is_transposed_rowwise(config: NVFP4QuantConfig) -> bool:
    # 16x16 tiles: one scale per tile for both copies and codes computed elementwise from the same
    # scale. 4over6 picks map-to-4/6 per tile from an error summed row-first for one copy and
    # column-first for the other, so its two copies may differ: gather both then.
    return config.block == "16x16" and config.four_over_six is None


def _apply_layout(scale: torch.Tensor, layout: str, backend: Optional[str]) -> torch.Tensor:
    if layout == "compact":
        return scale
    if layout == "padded":
        return pad_scales(scale)
    return ops.swizzle_scales(scale, backend=backend)


class NVFP4ShardedWeight(torch.Tensor):
    """A high-precision weight (shard) that FSDP2 all-gathers as NVFP4 (see the module docstring).

    Every op sees the wrapped tensor; chunk/pad/copy/view results stay wrapped (FSDP2 builds its shard
    with them), everything else returns plain tensors (optimizer states, gradients, state dicts)."""

    @staticmethod
    def __new__(cls, hp: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, hp.size(), strides=hp.stride(), storage_offset=hp.storage_offset(),
            dtype=hp.dtype, layout=hp.layout, device=hp.device, requires_grad=hp.requires_grad,
        )

    def __init__(self, hp: torch.Tensor):
        self._hp = hp

    def __repr__(self):
        return f"NVFP4ShardedWeight({self._hp!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is aten.detach.default:
            return cls(args[0]._hp.detach())
        args, kwargs = pytree.tree_map_only(cls, lambda t: t._hp, (args, kwargs or {}))
        out = func(*args, **kwargs)
        if func not in _PRESERVE:
            return out
        return pytree.tree_map_only(torch.Tensor, cls, out)

    def __tensor_flatten__(self):
        return ["_hp"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return NVFP4ShardedWeight(inner["_hp"])

    def __reduce_ex__(self, protocol):
        # torch.save / DCP write the high-precision values: checkpoints do not depend on FP4 all-gather
        return self._hp.__reduce_ex__(protocol)

    # ----------------------------------------------------------------------------- FSDP2 hooks
    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        recipe = getattr(module, "recipe", None)
        if not isinstance(recipe, NVFP4Recipe):
            raise TypeError(f"FP4 all-gather needs a module with an NVFP4Recipe, got {type(module).__name__} "
                            f"with recipe {type(recipe).__name__}")
        shard = self._hp
        world = mesh.size()
        if shard.dim() != 2:
            raise ValueError(f"FP4 all-gather needs 2-D weights, got shard shape {tuple(shard.shape)}")
        rows = outer_size[0]
        if rows % (16 * world):
            raise ValueError(f"out_features ({rows}) must be a multiple of 16 * shard group size ({16 * world}) "
                             "for FP4 all-gather: equal shards of whole 16-row blocks")
        if tuple(shard.shape) != (rows // world, outer_size[1]):
            raise ValueError(f"FP4 all-gather needs FSDP2's row (dim-0) sharding: shard shape {tuple(shard.shape)} "
                             f"is not ({rows // world}, {outer_size[1]}) (no shard_placement_fn other than Shard(0))")
        param_dtype = getattr(mp_policy, "param_dtype", None) or shard.dtype
        values = shard.detach().to(param_dtype)  # what a high-precision all-gather would hand the module
        amax = values.abs().amax().float().reshape(1)
        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=mesh.get_group())
        config = weight_config(recipe)
        if config.per_token:
            raise ValueError(f"FP4 all-gather of {type(module).__name__}: its recipe quantizes the weight per token "
                             "(PR 3045, numerics='te_pr3045'), whose column amaxes span the shards; use FSDP's "
                             "high-precision all-gather (do not call enable_fp4_all_gather)")
        gather_columnwise = config.columnwise and not _columnwise_is_transposed_rowwise(config)
        transport = replace(config, columnwise=gather_columnwise, scale_layout="compact")
        q = ops.quantize_nvfp4(values, config=transport, amax=amax, columnwise_amax=amax, backend=module.backend)
        inputs = [q.rowwise_data, q.rowwise_scale]
        if gather_columnwise:
            # (K, rows/2) per rank, concatenated along dim 1 in the full weight: gathered transposed
            # (dim 0 is the gather dim) and transposed back in NVFP4GatheredWeight.quantized
            inputs += [q.columnwise_data.t().contiguous(), q.columnwise_scale.t().contiguous()]
        return tuple(inputs), (amax, config, module.backend)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        amax, config, backend = metadata
        if out is not None:  # later all-gathers refill the same buffers; refresh the amax and config
            out._set(all_gather_outputs, amax, config, backend)
            return None
        weight = NVFP4GatheredWeight(all_gather_outputs, amax, config, backend, param_dtype)
        return weight, tuple(all_gather_outputs)


class NVFP4GatheredWeight(torch.Tensor):
    """The unsharded weight FSDP2 hands the module: logical (N, K) in the param dtype.

    ``.quantized`` is the full weight's :class:`NVFP4Tensor` in the module recipe's weight config
    (scale layout included), built on each access from the gathered bytes (scale layout conversion
    and, for 16x16 blocks, the columnwise copy rebuilt from the rowwise one): read it once per
    forward. Any other op sees the dequantized rowwise weight."""

    @staticmethod
    def __new__(cls, outputs, amax, config, backend, dtype):
        rows = outputs[0].shape[0]
        k = outputs[0].shape[1] * 2
        return torch.Tensor._make_wrapper_subclass(cls, (rows, k), dtype=dtype, device=outputs[0].device, requires_grad=False)

    def __init__(self, outputs, amax, config, backend, dtype):
        self._set(outputs, amax, config, backend)

    def _set(self, outputs, amax, config: NVFP4QuantConfig, backend) -> None:
        self._outputs = tuple(outputs)
        self._amax = amax
        self._config = config
        self._backend = backend

    def _compact(self) -> NVFP4Tensor:
        """The gathered copies as sent (compact scales; columnwise only when it travelled)."""
        out = self._outputs
        travelled = len(out) == 4
        config = with_copies(replace(self._config, scale_layout="compact"), True, travelled)
        col = (out[2].t().contiguous(), out[3].t().contiguous(), self._amax) if travelled else None
        return NVFP4Tensor.from_parts(self.shape, self.dtype, config, rowwise=(out[0], out[1], self._amax), columnwise=col)

    @property
    def quantized(self) -> NVFP4Tensor:
        config, backend = self._config, self._backend
        gathered = self._compact()
        row = (gathered.rowwise_data, _apply_layout(gathered.rowwise_scale, config.scale_layout, backend), self._amax)
        col = None
        if config.columnwise:
            if gathered.columnwise_data is not None:
                col_data, col_scale = gathered.columnwise_data, gathered.columnwise_scale
            else:  # 16x16 tiles: transposed codes, transposed tile grid (see _columnwise_is_transposed_rowwise)
                col_data = codecs.pack_fp4(codecs.unpack_fp4(gathered.rowwise_data).t())
                tile_grid = gathered.rowwise_scale[::16]  # (N/16, K/16): each tile's scale repeats on its 16 rows
                col_scale = tile_grid.t().repeat_interleave(16, dim=0).contiguous()  # (K, N/16)
            col = (col_data.contiguous(), _apply_layout(col_scale, config.scale_layout, backend), self._amax)
        return NVFP4Tensor.from_parts(self.shape, self.dtype, config, rowwise=row, columnwise=col)

    def __repr__(self):
        return f"NVFP4GatheredWeight(shape={tuple(self.shape)}, dtype={self.dtype}, block={self._config.block})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.detach.default, aten.alias.default) or (
            func in (aten.as_strided.default, aten.view.default, aten._unsafe_view.default)
            and tuple(args[1]) == tuple(args[0].shape)
        ):  # FSDP2 wraps the unsharded weight in as_strided + Parameter (detach): keep it gathered
            src = args[0]
            return cls(src._outputs, src._amax, src._config, src._backend, src.dtype)

        def dequant(t):
            return ops.dequantize_nvfp4(t._compact(), dtype=t.dtype, backend=t._backend)

        args, kwargs = pytree.tree_map_only(cls, dequant, (args, kwargs))
        return func(*args, **kwargs)


# ------------------------------------------------------------------------------------- enabling
def _weight_names(module) -> list:
    """The weight Parameters an nvfp4lab layer quantizes (its ``quantized_weight_names()``; the
    layers live above this module, which therefore asks them instead of importing them)."""
    names = getattr(module, "quantized_weight_names", None)
    return list(names()) if callable(names) else []


def enable_fp4_all_gather(model: nn.Module, *, shard_group_size: Optional[int] = None) -> list:
    """Make FSDP2 all-gather the weights of the NVFP4 :class:`~nvfp4lab.Linear` and
    :class:`~nvfp4lab.GroupedLinear` modules in ``model`` as NVFP4 (see the module docstring).

    Call it before ``fully_shard`` and before creating the optimizer (the weight Parameters are
    replaced). ``shard_group_size``: the FSDP shard group size (default: the world size when
    torch.distributed is initialized, else the 16-row check only); every wrapped weight's
    out_features must be a multiple of 16 x it (ValueError naming the layer otherwise).

    Returns the names of the wrapped parameters (as in ``model.named_parameters()``). Modules with an
    MXFP8 recipe, and weights shared with any module that is not an NVFP4 nvfp4lab layer, are left
    alone. Calling it again wraps nothing new.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if shard_group_size is None:
        shard_group_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if isinstance(shard_group_size, bool) or not isinstance(shard_group_size, int) or shard_group_size < 1:
        raise ValueError(f"shard_group_size must be a positive int, got {shard_group_size!r}")
    # every (module, name) holding each parameter, to find weights shared with other modules
    holders: dict = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, name))
    names = {id(p): n for n, p in model.named_parameters()}
    wrapped = []
    for module_name, module in model.named_modules():
        weight_names = _weight_names(module)
        if not weight_names or not isinstance(module.recipe, NVFP4Recipe):
            continue
        if getattr(module, "_is_fsdp_managed_module", False):
            raise ValueError(f"module {module_name or '<model>'} is already managed by FSDP: "
                             "call enable_fp4_all_gather before fully_shard")
        for weight_name in weight_names:
            param = module._parameters[weight_name]
            if isinstance(param, NVFP4ShardedWeight):
                continue
            if any(_weight_names(m) == [] or not isinstance(m.recipe, NVFP4Recipe) for m, _ in holders[id(param)]):
                continue  # shared with a layer that needs the high-precision weight
            rows = param.shape[0]
            if rows % (16 * shard_group_size):
                qualified = f"{module_name}.{weight_name}" if module_name else weight_name
                raise ValueError(f"{qualified}: out_features ({rows}) must be a multiple of 16 * shard group size "
                                 f"({16 * shard_group_size}) for FP4 all-gather (equal shards of whole 16-row blocks)")
            new = nn.Parameter(NVFP4ShardedWeight(param.data), requires_grad=param.requires_grad)
            for holder, holder_name in holders[id(param)]:
                holder._parameters[holder_name] = new
            wrapped.append(names[id(param)])
    return wrapped
