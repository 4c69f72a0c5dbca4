"""Execution context helpers shared by every layer: torch.compile tracing, CUDA graph capture, side
streams inside a capture, small host->device integer copies that stay capturable, and SR seeds drawn on
the device."""
from __future__ import annotations

import contextlib
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


SEED_BOUND = 2**62  # stochastic-rounding seeds are drawn in [0, SEED_BOUND)


def device_seed(device, generator=None) -> torch.Tensor:
    """A stochastic-rounding seed drawn on ``device`` (from ``generator``, else the device's default one): the int64
    (1,) tensor that a quantize call takes as its ``seed`` and its kernels read. Drawn inside a CUDA-graph capture,
    each replay draws anew."""
    return torch.randint(0, SEED_BOUND, (1,), dtype=torch.int64, device=device, generator=generator)


# ------------------------------------------------------------------------------------------ side streams
# Inside a CUDA-graph capture, work that does not wait for the current stream's next kernels runs on a side stream
# beside them: the graph keeps the two branches, and each replay runs them concurrently at no host cost. Eager calls
# keep one stream: there the fork and join cost the host more than the overlap saves on the GPU
# (benchmarks/RESULTS.md), and torch.compile traces one stream. Callers issue the side work first: a replay starts
# the branches in the order they were captured, and a branch captured after the main one ran after it.
_SIDE_STREAMS: dict = {}


def side_stream(device):
    """The side stream of ``device`` (one per device, made on first use) while the current stream is captured into
    a CUDA graph outside torch.compile's tracing; else None."""
    device = torch.device(device)
    if device.type != "cuda" or compiling() or not torch.cuda.is_current_stream_capturing():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _SIDE_STREAMS.get(index)
    if stream is None:
        stream = _SIDE_STREAMS[index] = torch.cuda.Stream(index)
    return stream


def fork(device):
    """:func:`side_stream`, made to wait for the work the current stream issued so far; None outside a capture."""
    stream = side_stream(device)
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream(stream.device))
    return stream


def on_stream(stream):
    """Work issued inside runs on ``stream`` (from :func:`fork`; a no-op context for None)."""
    return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)


def join(stream, *outputs: torch.Tensor) -> None:
    """The current stream waits for ``stream`` (from :func:`fork`), and ``outputs`` made there stay allocated until
    the current stream's work issued so far is done with them."""
    current = torch.cuda.current_stream(stream.device)
    current.wait_stream(stream)
    for t in outputs:
        t.record_stream(current)
