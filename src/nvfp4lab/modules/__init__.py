"""nn.Modules for training with NVFP4 / MXFP8 recipes."""
from .linear import ConversionReport, GroupedLinear, Linear, convert

__all__ = ["ConversionReport", "GroupedLinear", "Linear", "convert"]
