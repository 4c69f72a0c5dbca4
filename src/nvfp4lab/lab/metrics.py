"""What the lab measures: SQNR of each quantized tensor copy and of each GEMM, per layer, and the
end-to-end cosine similarity of sentence embeddings with a fake-quantized forward pass.

SQNR (dB) = 10 log10(sum x^2 / sum (x - deq)^2), summed in fp64 against the FP32 tensor. Each GEMM is
computed in FP32 from the dequantized operands of the copies the real GEMM reads (spec section 4):

    fprop  y  = x W^T    x rowwise,  W rowwise
    dgrad  dx = dy W     dy rowwise, W columnwise
    wgrad  dW = dy^T x   dy columnwise, x columnwise

RHT: the columnwise copies of x and dy hold Q(x^T H) and Q(dy^T H), H = blockdiag(T) along the token
axis M, T orthogonal. The hardware multiplies the transformed copies directly:
Q(dy^T H) Q(x^T H)^T ~ dy^T H H^T x = dy^T x. ``dequantize(which="columnwise")`` returns Q(x^T H) H^T
(the RHT undone in fp32), and the product of two such copies is Q(dy^T H) H^T H Q(x^T H)^T, which is
the same matrix because H^T H = I (T's entries are +-1/4, exact; only fp32 summation order differs).
So the lab dequantizes columnwise copies with the RHT undone, which also gives each copy's own SQNR in
x's orientation; tests/lab check that both products agree.
"""
from __future__ import annotations

import math
import zlib
from typing import Optional

import torch

from .. import ops
from ..config import MXFP8QuantConfig, NVFP4QuantConfig
from .capture import LayerCapture, sentence_embeddings
from .recipes import BF16Format, LabRecipe, TensorFormat

COPIES = ("rowwise", "columnwise")
TENSOR_METRICS = tuple(f"{role}_{copy}" for role in ("weight", "activation", "gradient") for copy in COPIES)
GEMM_METRICS = ("fprop", "dgrad", "wgrad")
METRICS = TENSOR_METRICS + GEMM_METRICS


def sqnr_db(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """10 log10(sum ref^2 / sum (ref - approx)^2) in fp64; +inf when exact, -inf when ref is 0 and approx is not."""
    ref = reference.double()
    signal = float(ref.square().sum())
    noise = float((ref - approx.double()).square().sum())
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def fake_quantize(x: torch.Tensor, fmt: TensorFormat, *, seed: int = 0, backend: Optional[str] = None) -> dict:
    """Quantize the 2-D ``x`` once with ``fmt`` and dequantize each copy it holds to fp32 in x's
    orientation: {"rowwise": ..., "columnwise": ...} (only the copies ``fmt`` asks for)."""
    wanted = [c for c in COPIES if getattr(fmt, c)]
    if isinstance(fmt, BF16Format):
        rounded = x.to(torch.bfloat16).to(torch.float32)
        return {c: rounded for c in wanted}
    if isinstance(fmt, NVFP4QuantConfig):
        seed = seed if fmt.stochastic_rounding else None
        q = ops.quantize_nvfp4(x, config=fmt, seed=seed, backend=backend)
        return {c: ops.dequantize_nvfp4(q, dtype=torch.float32, which=c, backend=backend) for c in wanted}
    if isinstance(fmt, MXFP8QuantConfig):
        q = ops.quantize_mxfp8(x, config=fmt, backend=backend)
        return {c: ops.dequantize_mxfp8(q, dtype=torch.float32, which=c, backend=backend) for c in wanted}
    raise TypeError(f"unsupported tensor format {type(fmt).__name__}")


def layer_seed(seed: int, layer: str, role: str) -> int:
    """Stable per (run seed, layer, role) seed for stochastic rounding (crc32: same across processes)."""
    return (seed * 1_000_003 + zlib.crc32(f"{layer}/{role}".encode())) % (2**31)


def analyze_layer(layer: LayerCapture, recipe: LabRecipe, *, seed: int = 0, backend: Optional[str] = None,
                  cache: Optional[dict] = None):
    """SQNR of every tensor copy and GEMM of one layer under ``recipe``.

    ``cache`` (one dict per recipe) reuses the quantized activations of layers that share their input
    tensor (q/k/v); activations are never stochastically rounded, so the result is the same.
    Returns (metrics {name: dB}, rowwise dequantized weight for the end-to-end pass)."""
    w = fake_quantize(layer.weight, recipe.weight, seed=layer_seed(seed, layer.name, "weight"), backend=backend)
    key = id(layer.inputs)
    if cache is not None and key in cache and cache[key][0] is layer.inputs:
        x = cache[key][1]
    else:
        x = fake_quantize(layer.inputs, recipe.activation, seed=layer_seed(seed, layer.name, "activation"), backend=backend)
        if cache is not None and not getattr(recipe.activation, "stochastic_rounding", False):
            cache[key] = (layer.inputs, x)
    dy = fake_quantize(layer.grad_outputs, recipe.gradient, seed=layer_seed(seed, layer.name, "gradient"), backend=backend)
    metrics = {}
    for role, ref, deq in (("weight", layer.weight, w), ("activation", layer.inputs, x), ("gradient", layer.grad_outputs, dy)):
        for copy in COPIES:
            metrics[f"{role}_{copy}"] = sqnr_db(ref, deq[copy])
    metrics["fprop"] = sqnr_db(layer.fprop, x["rowwise"] @ w["rowwise"].t())
    metrics["dgrad"] = sqnr_db(layer.dgrad, dy["rowwise"] @ w["columnwise"])
    metrics["wgrad"] = sqnr_db(layer.wgrad, dy["columnwise"].t() @ x["columnwise"])
    return metrics, w["rowwise"]


@torch.no_grad()
def quantized_embeddings(model, batch: dict, recipe: LabRecipe, weights: dict, *, backend: Optional[str] = None) -> torch.Tensor:
    """Sentence embeddings with every listed Linear fake-quantized in the forward pass: its input by the
    recipe's rowwise activation format, its weight replaced by ``weights[name]`` (the dequantized
    rowwise weight). Other ops (attention, norms, embeddings) stay FP32."""
    act_fmt, _ = recipe.fprop_formats()
    modules = dict(model.named_modules())
    handles, saved = [], {}

    last = {}  # the previous hook's input and result: q/k/v projections read the same hidden states

    def pre_hook(mod, args):
        x = args[0]
        if last.get("input") is x:
            return (last["output"], *args[1:])
        shape = x.shape
        deq = fake_quantize(x.reshape(-1, shape[-1]).float(), act_fmt, backend=backend)["rowwise"]
        last["input"], last["output"] = x, deq.reshape(shape).to(x.dtype)
        return (last["output"], *args[1:])

    try:
        for name, deq_weight in weights.items():
            mod = modules[name]
            saved[name] = mod.weight.data
            mod.weight.data = deq_weight.to(mod.weight.dtype)
            handles.append(mod.register_forward_pre_hook(pre_hook))
        return sentence_embeddings(model, batch).float()
    finally:
        for h in handles:
            h.remove()
        for name, data in saved.items():
            modules[name].weight.data = data


def cosine_per_sentence(reference: torch.Tensor, approx: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(reference.double(), approx.double(), dim=-1)
