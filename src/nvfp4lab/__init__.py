"""nvfp4lab: NVFP4 and MXFP8 low-precision training for PyTorch, bit-exact with TransformerEngine."""
from .config import MXFP8QuantConfig, NVFP4QuantConfig
from .ops import (
    dequantize_mxfp8,
    dequantize_nvfp4,
    nvfp4_gemm,
    nvfp4_grouped_gemm,
    quantize_mxfp8,
    quantize_nvfp4,
    swizzle_scales,
    unswizzle_scales,
)
from .tensors import MXFP8Tensor, NVFP4Tensor

__version__ = "0.1.0"

__all__ = [
    "MXFP8QuantConfig", "MXFP8Tensor", "NVFP4QuantConfig", "NVFP4Tensor",
    "dequantize_mxfp8", "dequantize_nvfp4", "nvfp4_gemm", "nvfp4_grouped_gemm", "quantize_mxfp8", "quantize_nvfp4",
    "swizzle_scales", "unswizzle_scales",
]
