"""Inference form: :class:`InferenceLinear` keeps only a layer's quantized weight (the rowwise copy
that fprop reads) and :func:`freeze` swaps every :class:`~nvfp4lab.Linear` of a model for one.

A training-form Linear holds its high-precision weight plus cached quantized copies (rowwise and,
after a backward, columnwise). The inference form holds, per layer::

    weight_data   uint8 (N, K/2) NVFP4 codes (element 2j in the low nibble) | (N, K) MXFP8 bits
    weight_scale  uint8 E4M3 (NVFP4) | E8M0 (MXFP8) block scales, in the recipe's scale_layout
    weight_amax   fp32 (1,) per-tensor amax (NVFP4 only; kept fp32 by ``model.to(dtype)``)
    bias          the layer's bias Parameter, unchanged

and its forward is :func:`nvfp4lab.functional.linear` with that quantized weight: the same input
quantization and the same NVFP4 GEMM as the training form's forward, so for the same quantized weight
the outputs are bit-identical. There is no high-precision weight, hence no gradient to the input
except with ``recipe.backward == "dequantized"`` (dgrad then reads the rowwise copy); other recipes
raise a RuntimeError when the input needs a gradient (run under ``torch.no_grad()`` /
``torch.inference_mode()``).
"""
from __future__ import annotations

import torch
from torch import nn

from .. import functional as F
from .. import ops
from ..layout import roundup
from ..recipes import MXFP8Recipe, resolve_recipe
from ..tensors import MXFP8Tensor, NVFP4Tensor
from .linear import ConversionReport, GroupedLinear, Linear, check_features
from .state import RecipeStateMixin

WEIGHT_FIELDS = ("weight_data", "weight_scale", "weight_amax")


def weight_buffer_shapes(recipe, out_features: int, in_features: int) -> dict:
    """Shapes of an InferenceLinear's weight buffers (scales in the recipe's scale_layout)."""
    n, k = out_features, in_features
    if isinstance(recipe, MXFP8Recipe):
        cols = k // 32
        scale = (n, cols) if recipe.scale_layout == "compact" else (roundup(n, 128), roundup(cols, 4))
        return {"weight_data": (n, k), "weight_scale": scale}
    cols = k // 16
    scale = (n, cols) if recipe.scale_layout == "compact" else (roundup(n, 128), roundup(cols, 4))
    per_row = recipe.tensor_config("weight").per_token  # PR 3045's weights: one amax per row
    return {"weight_data": (n, k // 2), "weight_scale": scale, "weight_amax": (n,) if per_row else (1,)}


class InferenceLinear(RecipeStateMixin, nn.Module):
    """A linear layer that holds only its quantized weight (see the module docstring).

    Build one from a training-form layer with :meth:`from_linear` (or for a whole model with
    :func:`freeze`), or empty with the constructor and fill it with ``load_state_dict`` or
    :func:`nvfp4lab.load_quantized`. ``weight_dtype`` is the dtype of the weight it came from (the
    default dtype of :meth:`dequantized_weight`).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None, *,
                 recipe=None, weight_dtype: torch.dtype = torch.float32, backend: str | None = None):
        super().__init__()
        recipe = resolve_recipe(recipe)
        check_features(in_features, out_features, recipe)
        self.in_features, self.out_features = in_features, out_features
        self.recipe, self.backend, self.weight_dtype = recipe, backend, weight_dtype
        for name, shape in weight_buffer_shapes(recipe, out_features, in_features).items():
            buf_dtype = torch.float32 if name == "weight_amax" else torch.uint8
            self.register_buffer(name, torch.zeros(shape, dtype=buf_dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype or weight_dtype)) if bias else None

    @classmethod
    def from_quantized(cls, quantized, bias: torch.Tensor | None, recipe, *, backend: str | None = None) -> InferenceLinear:
        """An InferenceLinear around the rowwise copy of ``quantized`` (an NVFP4Tensor or MXFP8Tensor
        of logical shape (out_features, in_features) quantized with ``recipe``'s weight config);
        ``bias`` (a Parameter or tensor, or None) is kept as is."""
        recipe = resolve_recipe(recipe)
        expected = MXFP8Tensor if isinstance(recipe, MXFP8Recipe) else NVFP4Tensor
        if not isinstance(quantized, expected) or quantized.rowwise_data is None:
            raise TypeError(f"quantized must be an {expected.__name__} with a rowwise copy, got {type(quantized).__name__}")
        if quantized.config != recipe.tensor_config("weight", rowwise=True, columnwise=quantized.config.columnwise):
            raise ValueError(f"quantized was made with {quantized.config}, not with the recipe's weight config")
        n, k = quantized.shape
        new = cls(k, n, bias=False, device="meta", recipe=recipe, weight_dtype=quantized.dtype, backend=backend)
        new.weight_data = quantized.rowwise_data
        new.weight_scale = quantized.rowwise_scale
        if expected is NVFP4Tensor:
            new.weight_amax = quantized.rowwise_amax.to(torch.float32).reshape(-1)
        for name, shape in weight_buffer_shapes(recipe, n, k).items():
            if tuple(getattr(new, name).shape) != shape:
                raise ValueError(f"quantized.{name} has shape {tuple(getattr(new, name).shape)}, expected {shape}")
        if bias is not None:
            new.bias = bias if isinstance(bias, nn.Parameter) else nn.Parameter(bias.detach(), requires_grad=False)
        return new

    @classmethod
    def from_linear(cls, linear: Linear) -> InferenceLinear:
        """The inference form of a training-form :class:`~nvfp4lab.Linear`: its weight quantized with
        its recipe (rowwise copy only; the same bits as the copy its forward uses), its bias shared."""
        if not isinstance(linear, Linear):
            raise TypeError(f"linear must be an nvfp4lab.Linear, got {type(linear).__name__}")
        quantized = F.quantize_weight(linear.weight.detach(), linear.recipe, columnwise=False, backend=linear.backend)
        return cls.from_quantized(quantized, linear.bias, linear.recipe, backend=linear.backend)

    def quantized_weight(self):
        """The weight as an NVFP4Tensor / MXFP8Tensor (a view of the buffers, rowwise copy only)."""
        config = self.recipe.tensor_config("weight", rowwise=True, columnwise=False)
        shape = torch.Size((self.out_features, self.in_features))
        if isinstance(self.recipe, MXFP8Recipe):
            return MXFP8Tensor(shape=shape, dtype=self.weight_dtype, config=config, rowwise_data=self.weight_data,
                               rowwise_scale=self.weight_scale)
        return NVFP4Tensor(shape=shape, dtype=self.weight_dtype, config=config, rowwise_data=self.weight_data,
                           rowwise_scale=self.weight_scale, rowwise_amax=self.weight_amax)

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight the GEMM multiplies by, in high precision (default ``weight_dtype``)."""
        q = self.quantized_weight()
        dtype = dtype or self.weight_dtype
        if isinstance(q, MXFP8Tensor):
            return ops.dequantize_mxfp8(q, dtype=dtype, backend=self.backend)
        return ops.dequantize_nvfp4(q, dtype=dtype, backend=self.backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad and self.recipe.backward != "dequantized":
            raise RuntimeError(f"InferenceLinear holds no high-precision weight: no gradient to its input with "
                               f"backward={self.recipe.backward!r}; run it under torch.no_grad() or torch.inference_mode()")
        # F.linear reads only the shape and dtype of the high-precision weight when given the quantized one
        weight_shape = torch.empty((self.out_features, self.in_features), dtype=self.weight_dtype, device="meta")
        return F.linear(x, weight_shape, self.bias, recipe=self.recipe, quantized_weight=self.quantized_weight(),
                        backend=self.backend)

    def _apply(self, fn, recurse=True):
        # model.to(dtype) / .half() cast floating buffers; the amax stays fp32 (the GEMM's alpha reads it)
        amax = self._buffers.get("weight_amax")
        out = super()._apply(fn, recurse)
        moved = self._buffers.get("weight_amax")
        if amax is not None and moved is not None and moved.dtype != amax.dtype:
            self._buffers["weight_amax"] = amax.to(device=moved.device)
        return out

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.recipe}")


def freeze(model: nn.Module) -> ConversionReport:
    """Replace, in place, every :class:`~nvfp4lab.Linear` inside ``model`` by its
    :class:`InferenceLinear` (quantized weight only; the high-precision weight is dropped from the
    model). A layer shared by several parents is frozen once. GroupedLinear layers stay as they are
    (listed as skipped). ``model`` itself may not be a Linear (freeze its parent, or use
    :meth:`InferenceLinear.from_linear`)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    report = ConversionReport()
    if isinstance(model, Linear):
        report.skipped.append(("", "the model itself is an nvfp4lab.Linear (use InferenceLinear.from_linear)"))
        return report
    done: dict = {}
    with torch.no_grad():
        for parent_name, parent in list(model.named_modules()):
            for child_name, child in list(parent._modules.items()):
                name = f"{parent_name}.{child_name}" if parent_name else child_name
                if isinstance(child, GroupedLinear):
                    report.skipped.append((name, "GroupedLinear has no inference form"))
                    continue
                if not isinstance(child, Linear):
                    continue
                if id(child) not in done:
                    done[id(child)] = InferenceLinear.from_linear(child)
                    done[id(child)].train(child.training)
                    report.converted.append(name)
                setattr(parent, child_name, done[id(child)])
    return report
