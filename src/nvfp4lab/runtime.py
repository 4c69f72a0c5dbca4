"""Execution context helpers shared by every layer: torch.compile tracing, CUDA graph capture, and
small host->device integer copies that stay capturable."""
from __future__ import annotations

from typing import Sequence

import torch


def compiling() -> bool:
    """True while torch.compile traces (values built then become part of the compiled graph)."""
    compiler = getattr(torch, "compiler", None)
    return compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling()


def graph_capturing(device) -> bool:
    """True while the current CUDA stream is being captured into a CUDA graph (always False when
    ``device`` is not a CUDA device)."""
    return torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()


def host_ints_on_device(values: Sequence[int], device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A small 1-D integer tensor holding the host ``values`` on ``device``.

    Outside CUDA graph capture this is one host->device copy. A copy from pageable memory cannot be
    captured, so during capture each entry is written by its own fill kernel instead: the values become
    constants of the graph, which is right because the shapes captured with them are constants too.
    Callers that repeat the same values keep the result (see :class:`nvfp4lab.functional.SplitLayoutCache`)
    so that nothing is copied per call.
    """
    values = [int(v) for v in values]
    if not compiling() and graph_capturing(device):
        out = torch.empty(len(values), dtype=dtype, device=device)
        for i, v in enumerate(values):
            out[i].fill_(v)
        return out
    return torch.tensor(values, dtype=dtype, device=device)
