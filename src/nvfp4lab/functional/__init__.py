"""Autograd functions: the differentiable layer math, built on :mod:`nvfp4lab.ops`."""
from .linear import (
    SplitLayout,
    SplitLayoutCache,
    compute_dtype,
    dgrad_reads_rowwise,
    grouped_linear,
    grouped_linear_high_precision,
    linear,
    packed_weights,
    quantize_grouped_weights,
    quantize_weight,
    stack_grouped_weights,
    transposed_operand,
)

__all__ = ["SplitLayout", "SplitLayoutCache", "compute_dtype", "dgrad_reads_rowwise", "grouped_linear",
           "grouped_linear_high_precision", "linear", "packed_weights", "quantize_grouped_weights", "quantize_weight",
           "stack_grouped_weights", "transposed_operand"]
