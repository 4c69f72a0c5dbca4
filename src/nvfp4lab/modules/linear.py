"""Training modules: :class:`Linear` (drop-in nn.Linear), :class:`GroupedLinear` (MoE) and :func:`convert`.

Weight cache: each module keeps the quantized copies of its weights (with GroupedLinear's split layouts,
the only state besides the parameters), keyed on the parameter's storage pointer, ``_version`` counter,
shape and dtype, so micro-batches between two optimizer steps quantize each weight once per direction.
An in-place update (optimizer step, ``copy_``) bumps ``_version`` and a ``.data`` swap changes the
pointer; both force a re-quantization. The cache is bypassed (quantize every call) while torch.compile
traces and while a CUDA graph is being captured, so a captured step always contains the weight
quantization. ``clear_weight_cache()`` drops it.

Recipe: a layer built with ``recipe=None`` has no recipe of its own and quantizes with the recipe of the
active :class:`nvfp4lab.autocast` context (TE's default NVFP4 recipe outside every context); its
``recipe`` attribute reads that recipe at the time of the call. Inside ``autocast(enabled=False)`` every
layer runs in high precision (``torch.nn.functional.linear`` on its weights). The state is read at
forward time: see :mod:`nvfp4lab.autocasting` for torch.compile and CUDA graphs.

Distributed: under FSDP (modules it manages carry ``_is_fsdp_managed_module``) the cache is bypassed:
FSDP refills the gathered weight in place with its version counter preserved, so the key cannot see
an optimizer step. Under DDP the parameters are the module's own and the cache stays on. With
:func:`nvfp4lab.fsdp.enable_fp4_all_gather` FSDP hands the module an already quantized weight
(:class:`~nvfp4lab.fsdp.NVFP4GatheredWeight`), which is used as is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import torch
from torch import nn

from .. import functional as F
from .. import ops
from ..autocasting import autocast_enabled, autocast_recipe
from ..fsdp import NVFP4GatheredWeight
from ..recipes import NVFP4Recipe, block_multiple, resolve_recipe
from .state import RecipeStateMixin


def check_features(in_features: int, out_features: int, recipe) -> None:
    mult = block_multiple(recipe)
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if value % mult != 0:
            raise ValueError(f"{name} must be a multiple of {mult} for {type(recipe).__name__} (block size), got {value}")


def _cache_bypassed(weight: torch.Tensor) -> bool:
    return ops.compiling() or ops.graph_capturing(weight.device)


class _AutocastRecipeMixin:
    """``recipe``: the layer's own (given at construction or set later), or, for a layer without one
    (``recipe=None``), the active :class:`nvfp4lab.autocast` context's."""

    @property
    def recipe(self):
        own = self.__dict__.get("_own_recipe")
        return own if own is not None else autocast_recipe()

    @recipe.setter
    def recipe(self, value) -> None:
        self.__dict__["_own_recipe"] = None if value is None else resolve_recipe(value)

    @property
    def follows_autocast(self) -> bool:
        """True for a layer built without a recipe (it takes the autocast context's)."""
        return self.__dict__.get("_own_recipe") is None


def _high_precision_weight(weight: torch.Tensor) -> torch.Tensor:
    # an FP4-gathered weight (FSDP2) carries no high-precision values: its dequantized rowwise copy
    return weight.quantized.dequantize() if isinstance(weight, NVFP4GatheredWeight) else weight


class _WeightCacheMixin:
    """Quantized-weight cache stored on the module (``self._quantized_weights``: name -> entry)."""

    def _init_weight_cache(self) -> None:
        self._quantized_weights: dict = {}

    def clear_weight_cache(self) -> None:
        """Drop the cached quantized weights."""
        self._quantized_weights.clear()

    def _quantized_weight(self, name: str, weight: torch.Tensor, need_columnwise: bool):
        if isinstance(weight, NVFP4GatheredWeight):  # FSDP2 FP4 all-gather: quantized on the way in
            quantized = weight.quantized
            if need_columnwise and quantized.columnwise_data is None:
                raise ValueError(f"{name}: the FP4-gathered weight has no columnwise copy for dgrad; "
                                 "recipe.backward changed after the all-gather")
            return quantized
        if _cache_bypassed(weight) or getattr(self, "_is_fsdp_managed_module", False):
            return None
        try:
            version = weight._version
        except RuntimeError:  # inference tensors have no version counter
            return None
        key = (weight.data_ptr(), version, tuple(weight.shape), weight.dtype, weight.device, self.recipe, self.backend)
        entry = self._quantized_weights.get(name)
        if entry is not None and entry[0] == key and (entry[1] or not need_columnwise):
            return entry[2]
        quantized = F.quantize_weight(weight.detach(), self.recipe, columnwise=need_columnwise, backend=self.backend)
        self._quantized_weights[name] = (key, need_columnwise, quantized)
        return quantized

    def _needs_weight_columnwise(self, x: torch.Tensor) -> bool:
        # dgrad reads W's columnwise copy: only with quantized backward and an input needing grad (and, for a
        # Linear, not where it reads the rowwise copy transposed: F.dgrad_reads_rowwise)
        # (getattr: a non-tensor x reaches the functional layer's check, which names it)
        return self.recipe.backward == "quantized" and torch.is_grad_enabled() and getattr(x, "requires_grad", False)


class Linear(_AutocastRecipeMixin, RecipeStateMixin, nn.Linear, _WeightCacheMixin):
    """Drop-in :class:`torch.nn.Linear` (same parameters ``weight`` (out, in) and ``bias``, same
    init) whose three GEMMs run quantized per ``recipe``. Its state_dict adds ``_extra_state``, the
    recipe (:mod:`nvfp4lab.modules.state`): loading refuses a different recipe, and a plain
    nn.Linear takes the state_dict with ``strict=False`` or without that entry.

    recipe: :class:`NVFP4Recipe`, :class:`MXFP8Recipe`, TE's :class:`~nvfp4lab.NVFP4BlockScaling` /
        :class:`~nvfp4lab.NVFP4PerTokenBlockScaling`, or None: the :class:`nvfp4lab.autocast`
        context's recipe at each call (TE's default NVFP4 recipe outside every context).
    backend: forwarded to :mod:`nvfp4lab.ops` (None: Triton on CUDA tensors, the reference otherwise).
    in_features and out_features must be multiples of 16 (32 for MXFP8). Inputs of any leading shape;
    the output dtype follows autocast (see :func:`nvfp4lab.functional.linear`).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 recipe=None, backend: Optional[str] = None):
        own = None if recipe is None else resolve_recipe(recipe)
        check_features(in_features, out_features, resolve_recipe(own))
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.recipe = own
        self.backend = backend
        self._init_weight_cache()

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe=None, *, backend: Optional[str] = None) -> "Linear":
        """A :class:`Linear` sharing ``linear``'s Parameter objects (optimizers holding them keep
        working), with its training flag; ``recipe=None`` follows the autocast context."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta",
                  recipe=recipe, backend=backend)
        new.weight = linear.weight
        if linear.bias is not None:
            new.bias = linear.bias
        new.train(linear.training)
        return new

    def quantized_weight_names(self) -> list:
        """The weight Parameters this layer quantizes (what :mod:`nvfp4lab.fsdp` may gather as FP4)."""
        return ["weight"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not autocast_enabled():
            return torch.nn.functional.linear(x, _high_precision_weight(self.weight), self.bias)
        need_columnwise = self._needs_weight_columnwise(x) and not F.dgrad_reads_rowwise(
            self.recipe, x.numel() // max(x.shape[-1], 1), self.out_features, self.in_features, x.device, self.backend)
        quantized = self._quantized_weight("weight", self.weight, need_columnwise)
        return F.linear(x, self.weight, self.bias, recipe=self.recipe, quantized_weight=quantized, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={'autocast' if self.follows_autocast else self.recipe}"


SPLIT_CACHE_ENTRIES = 64  # split patterns a GroupedLinear keeps device offsets for


class GroupedLinear(_AutocastRecipeMixin, RecipeStateMixin, nn.Module, _WeightCacheMixin):
    """MoE grouped linear: ``num_gemms`` experts, each an (out_features, in_features) weight.

    Parameters are separate, TE-style: ``weight0`` .. ``weight{num_gemms-1}`` and (with bias)
    ``bias0`` .. ``bias{num_gemms-1}``, each initialized like nn.Linear's. The weights are consecutive
    slices of one (E, N, K) storage (kept so across ``.to()``, see :meth:`pack_weights`), so a step
    quantizes all experts in one grouped call reading them in place; weights that are not (replaced
    Parameters, FSDP2 shards) are stacked first (one copy), with the same bits. ``forward(x, m_splits)``
    takes tokens x (M, in_features) already sorted by expert and the per-expert token counts
    (a list of ints, or a CPU or device integer tensor; a device tensor costs one synchronization and
    cannot be read during CUDA graph capture). Each split is quantized on its own (its own amax) and
    multiplied by its expert's weight: with an NVFP4 recipe and backward="quantized" through the
    grouped quantize and grouped GEMM ops (the stacked expert weights are cached next to the
    per-expert ones), otherwise a loop of per-split quantize + GEMM calls of :mod:`nvfp4lab.ops`.

    The grouped kernels read the split offsets from device memory; the module keeps them per
    ``m_splits`` (a :class:`~nvfp4lab.functional.SplitLayoutCache` of the last 64 split patterns,
    not cleared by :meth:`clear_weight_cache`), so a step with splits seen before copies nothing from
    the host and can be captured in a CUDA graph (after a warm-up step with the same splits).

    recipe: as :class:`Linear`'s (None: the :class:`nvfp4lab.autocast` context's).
    save_weight_operand: as :func:`nvfp4lab.functional.grouped_linear`'s: where the grouped GEMMs run on BF16
    operands (Hopper) and dgrad reads the weights' rowwise copy, a training forward casts the weights straight
    into that operand and saves it for dgrad (2 bytes per weight element until backward; no weight cache for
    such steps). False: the packed copy is cached and saved, and expanded in each pass.
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 recipe=None, backend: Optional[str] = None, save_weight_operand: bool = True):
        super().__init__()
        if not isinstance(num_gemms, int) or num_gemms < 1:
            raise ValueError(f"num_gemms must be a positive int, got {num_gemms!r}")
        own = None if recipe is None else resolve_recipe(recipe)
        check_features(in_features, out_features, resolve_recipe(own))
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.recipe, self.backend = own, backend
        if not isinstance(save_weight_operand, bool):
            raise TypeError(f"save_weight_operand must be a bool, got {type(save_weight_operand).__name__}")
        self.save_weight_operand = save_weight_operand
        self.use_bias = bias
        packed = torch.empty(num_gemms, out_features, in_features, device=device, dtype=dtype)
        for i in range(num_gemms):
            self.register_parameter(f"weight{i}", nn.Parameter(packed[i]))
            b = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
            self.register_parameter(f"bias{i}", b)
        self._init_weight_cache()
        self._split_layouts = F.SplitLayoutCache(max_entries=SPLIT_CACHE_ENTRIES)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for i in range(self.num_gemms):
            w = getattr(self, f"weight{i}")
            if w.is_meta:
                continue
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
            b = getattr(self, f"bias{i}")
            if b is not None:
                bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
                nn.init.uniform_(b, -bound, bound)

    def quantized_weight_names(self) -> list:
        """The weight Parameters this layer quantizes (what :mod:`nvfp4lab.fsdp` may gather as FP4)."""
        return [f"weight{i}" for i in range(self.num_gemms)]

    def _apply(self, fn, recurse=True):
        # a move or cast gives each weight its own storage: put them back into one (see pack_weights)
        module = super()._apply(fn, recurse)
        self.pack_weights()
        return module

    def pack_weights(self) -> bool:
        """Keep the expert weights as consecutive slices of one (E, N, K) storage (the Parameter objects
        stay the same; their ``.data`` moves), so the grouped path quantizes them all in place in one call
        (:func:`nvfp4lab.functional.quantize_grouped_weights`). Done at construction and after every
        ``.to()`` / ``.cuda()`` / ``.half()``; returns False (and changes nothing) for weights that
        are not plain tensors of one device and dtype (e.g. FSDP2's DTensors) or on the meta device."""
        weights = self.weights
        if any(type(w) is not nn.Parameter or type(w.data) is not torch.Tensor or w.is_meta for w in weights):
            return False
        if F.packed_weights(weights) is not None:
            return True
        w0 = weights[0]
        if any(w.device != w0.device or w.dtype != w0.dtype or w.shape != w0.shape for w in weights):
            return False
        with torch.no_grad():
            packed = torch.stack([w.detach() for w in weights])
            for w, part in zip(weights, packed):
                w.data = part
        self.clear_weight_cache()
        return True

    @property
    def weights(self) -> list:
        return [getattr(self, f"weight{i}") for i in range(self.num_gemms)]

    @property
    def biases(self) -> list:
        return [getattr(self, f"bias{i}") for i in range(self.num_gemms)]

    def forward(self, x: torch.Tensor, m_splits: Union[Sequence[int], torch.Tensor]) -> torch.Tensor:
        if not autocast_enabled():
            return F.grouped_linear_high_precision(x, m_splits, [_high_precision_weight(w) for w in self.weights],
                                                   self.biases)
        need_columnwise = self._needs_weight_columnwise(x)
        weights = self.weights
        recipe = self.recipe
        stacked = quantized = None
        biases = self.biases
        if (isinstance(recipe, NVFP4Recipe) and recipe.backward == "quantized"
                and not any(isinstance(w, NVFP4GatheredWeight) for w in weights)
                and (biases[0] is None or all(b is not None and b.dtype == biases[0].dtype for b in biases))):
            rowwise_t = need_columnwise and F.dgrad_reads_rowwise(
                recipe, x.numel() // max(x.shape[-1], 1), self.out_features, self.in_features, x.device, self.backend,
                num_experts=self.num_gemms)
            # a step that saves W's operand makes it from the weights in the functional layer (no packed cache)
            if not (self.save_weight_operand and rowwise_t):
                stacked = self._grouped_weights(weights, need_columnwise and not rowwise_t)
        else:
            quantized = [self._quantized_weight(f"weight{i}", w, need_columnwise) for i, w in enumerate(weights)]
            if any(q is None for q in quantized):
                quantized = None
            elif isinstance(recipe, NVFP4Recipe) and recipe.backward == "quantized":
                stacked = self._stacked_weights(quantized, need_columnwise)
        return F.grouped_linear(x, m_splits, weights, biases, recipe=recipe, quantized_weights=quantized,
                                stacked_weights=stacked, split_cache=self._split_layouts, backend=self.backend,
                                save_weight_operand=self.save_weight_operand)

    def _grouped_weights(self, weights: list, need_columnwise: bool) -> Optional[tuple]:
        """The stacked quantized weights of all experts (:func:`nvfp4lab.functional.quantize_grouped_weights`),
        cached while no weight changed; None where the cache is bypassed (the functional layer then
        quantizes them inside the traced or captured call)."""
        w0 = weights[0]
        if _cache_bypassed(w0) or getattr(self, "_is_fsdp_managed_module", False):
            return None
        try:
            versions = tuple((w.data_ptr(), w._version) for w in weights)
        except RuntimeError:  # inference tensors have no version counter
            return None
        key = (versions, tuple(w0.shape), w0.dtype, w0.device, self.recipe, self.backend)
        entry = self._quantized_weights.get("grouped")
        if entry is not None and entry[0] == key and (entry[1][1] is not None or not need_columnwise):
            return entry[1]
        stacked = F.quantize_grouped_weights(weights, self.recipe, columnwise=need_columnwise, backend=self.backend)
        self._quantized_weights["grouped"] = (key, stacked)
        return stacked

    def _stacked_weights(self, quantized: list, need_columnwise: bool) -> tuple:
        """The experts' cached quantized weights stacked for the grouped GEMMs ((E, N, K) rowwise,
        (E, K, N) columnwise), cached while every per-expert entry is the same object."""
        entry = self._quantized_weights.get("stacked")
        if (entry is not None and len(entry[0]) == len(quantized) and all(a is b for a, b in zip(entry[0], quantized))
                and (entry[1][1] is not None or not need_columnwise)):
            return entry[1]
        stacked = F.stack_grouped_weights(quantized, columnwise=need_columnwise, backend=self.backend)
        self._quantized_weights["stacked"] = (tuple(quantized), stacked)
        return stacked

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}, recipe={'autocast' if self.follows_autocast else self.recipe}")


# ------------------------------------------------------------------------------------ convert
@dataclass
class ConversionReport:
    """What :func:`convert` did: module names converted, and (name, reason) for those left as is."""

    converted: list = field(default_factory=list)
    skipped: list = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"converted {len(self.converted)} nn.Linear, skipped {len(self.skipped)}"]
        lines += [f"  converted  {name}" for name in self.converted]
        lines += [f"  skipped    {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


# parents that read a child Linear's weight directly instead of calling it: a converted child would
# never run quantized (type -> why)
DIRECT_WEIGHT_READERS = {
    nn.MultiheadAttention: "nn.MultiheadAttention reads out_proj.weight directly (F.multi_head_attention_forward), "
                           "so the layer would never run quantized",
}


def _direct_weight_reader(parent: nn.Module) -> Optional[str]:
    for cls, why in DIRECT_WEIGHT_READERS.items():
        if isinstance(parent, cls):
            return why
    return None


def convert(model: nn.Module, recipe=None, filter: Optional[Callable[[str, nn.Linear], bool]] = None, *,
            backend: Optional[str] = None) -> ConversionReport:
    """Replace, in place, every ``nn.Linear`` inside ``model`` by :class:`Linear` with ``recipe``
    (sharing its Parameters; None: the layers follow the :class:`nvfp4lab.autocast` context).
    ``filter(name, module) -> bool`` selects layers (None: all). Layers whose in/out features are not
    multiples of 16 (32 for MXFP8), layers whose parent reads their weight directly
    (:data:`DIRECT_WEIGHT_READERS`: nn.MultiheadAttention's out_proj), layers the filter rejects, and a
    model that is itself an nn.Linear (convert its parent, or use :meth:`Linear.from_linear`) are
    skipped and listed with the reason. A layer shared by several parents is converted once."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    own = None if recipe is None else resolve_recipe(recipe)
    recipe = resolve_recipe(own)
    if filter is not None and not callable(filter):
        raise TypeError(f"filter must be a callable (name, module) -> bool or None, got {type(filter).__name__}")
    report = ConversionReport()
    if isinstance(model, nn.Linear) and not isinstance(model, Linear):
        report.skipped.append(("", "the model itself is an nn.Linear (use nvfp4lab.Linear.from_linear)"))
        return report
    mult = block_multiple(recipe)
    done: dict = {}
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent._modules.items()):  # named_children() hides repeats
            if not isinstance(child, nn.Linear) or isinstance(child, Linear):
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            if id(child) in done:
                setattr(parent, child_name, done[id(child)])
                continue
            reader = _direct_weight_reader(parent)
            if reader is not None:
                report.skipped.append((name, reader))
                continue
            if filter is not None and not filter(name, child):
                report.skipped.append((name, "rejected by filter"))
                continue
            bad = [f"{n}={v}" for n, v in (("in_features", child.in_features), ("out_features", child.out_features)) if v % mult]
            if bad:
                report.skipped.append((name, f"{', '.join(bad)} not a multiple of {mult}"))
                continue
            new = Linear.from_linear(child, own, backend=backend)
            done[id(child)] = new
            setattr(parent, child_name, new)
            report.converted.append(name)
    return report
