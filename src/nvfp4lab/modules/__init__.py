"""nn.Modules for training with NVFP4 / MXFP8 recipes."""
from .linear import ConversionReport, GroupedLinear, Linear, convert
from .inference import InferenceLinear, freeze

__all__ = ["ConversionReport", "GroupedLinear", "InferenceLinear", "Linear", "convert", "freeze"]
