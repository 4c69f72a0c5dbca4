"""nvfp4lab: NVFP4 and MXFP8 low-precision training for PyTorch, bit-exact with TransformerEngine."""
from .autocasting import autocast
from .checkpoint import export_modelopt, load_quantized, save_quantized
from .config import MXFP8QuantConfig, NVFP4QuantConfig
from .modules import GroupedLinear, InferenceLinear, Linear, convert, freeze
from .ops import (
    dequantize_mxfp8,
    dequantize_nvfp4,
    nvfp4_gemm,
    nvfp4_grouped_gemm,
    nvfp4_grouped_wgrad,
    nvfp4_operand,
    quantize_mxfp8,
    quantize_nvfp4,
    quantize_nvfp4_dbias,
    quantize_nvfp4_grouped,
    quantize_nvfp4_grouped_bulk,
    quantize_nvfp4_grouped_operands,
    quantize_nvfp4_operands,
    swizzle_scales,
    unswizzle_scales,
)
from .recipes import MXFP8Recipe, NVFP4Recipe
from .te_recipes import NVFP4BlockScaling, NVFP4PerTokenBlockScaling
from .tensors import GroupedNVFP4Tensor, MXFP8Tensor, NVFP4Operand, NVFP4Tensor
from .version import __version__

__all__ = [
    "MXFP8QuantConfig", "MXFP8Tensor", "NVFP4QuantConfig", "NVFP4Tensor",
    "dequantize_mxfp8", "dequantize_nvfp4", "nvfp4_gemm", "nvfp4_grouped_gemm", "nvfp4_grouped_wgrad",
    "quantize_mxfp8", "quantize_nvfp4",
    "quantize_nvfp4_grouped", "quantize_nvfp4_grouped_bulk", "quantize_nvfp4_grouped_operands", "GroupedNVFP4Tensor",
    "quantize_nvfp4_dbias", "quantize_nvfp4_operands", "nvfp4_operand", "NVFP4Operand",
    "swizzle_scales", "unswizzle_scales",
    "NVFP4Recipe", "MXFP8Recipe", "NVFP4BlockScaling", "NVFP4PerTokenBlockScaling", "autocast",
    "Linear", "GroupedLinear", "convert",
    "InferenceLinear", "freeze", "save_quantized", "load_quantized", "export_modelopt", "__version__",
]
