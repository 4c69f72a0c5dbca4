"""nn.Modules for training with NVFP4 / MXFP8 recipes."""
from .inference import InferenceLinear, freeze
from .linear import ConversionReport, GroupedLinear, Linear, convert

__all__ = ["ConversionReport", "GroupedLinear", "InferenceLinear", "Linear", "convert", "freeze"]
