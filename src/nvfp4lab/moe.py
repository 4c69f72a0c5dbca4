"""Containers for grouped (MoE) GEMMs: per-expert NVFP4Tensors into the one-launch layout.

:func:`nvfp4lab.nvfp4_grouped_gemm` takes the tokens as one (M, K) NVFP4Tensor plus cumulative row
ends, and the weights as one NVFP4Tensor of logical shape (E, N, K). These helpers build both from
per-expert tensors (each copies the codes and scales once; stack weights once, not per call).
:mod:`nvfp4lab.ops` uses them, so this module sits below it and imports nothing above it.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

import torch

from .checks import check_rowwise_parts
from .layout import roundup
from .ref.swizzle import compact_scales
from .runtime import host_ints_on_device
from .tensors import GroupedNVFP4Tensor, NVFP4Tensor, cumulative_offsets


def check_rowwise(name: str, t, amax_rule: bool = True) -> None:
    """An NVFP4Tensor with a rowwise copy whose parts match its shape (:func:`~nvfp4lab.checks.check_rowwise_parts`)."""
    if not isinstance(t, NVFP4Tensor):
        raise TypeError(f"{name} must be an NVFP4Tensor, got {type(t).__name__}")
    if t.rowwise_data is None:
        raise ValueError(f"{name} has no rowwise copy: the GEMM reads rowwise data (quantize with rowwise=True)")
    check_rowwise_parts(name, t, amax_rule)


_TOKEN_CONFIGS: dict = {}


def token_operand(bulk: GroupedNVFP4Tensor, amax: torch.Tensor) -> NVFP4Tensor:
    """The rowwise copy of a grouped tensor (M, K) as one GEMM operand with ``amax`` as its rowwise amax: per row
    (M,), or per split (E,) for GEMMs told so (``a_per_expert`` of the grouped GEMM kernel). No copy of codes or
    scales; the config is the bulk's, rowwise only, per-token, 1x16, compact scales."""
    config = bulk.config
    token_config = _TOKEN_CONFIGS.get(config)
    if token_config is None:
        token_config = replace(config, rowwise=True, columnwise=False, per_token=True, rht=False, block="1x16",
                               scale_layout="compact")
        if not torch.compiler.is_compiling():
            _TOKEN_CONFIGS[config] = token_config
    m, k = int(bulk.shape[0]), int(bulk.shape[-1])
    return NVFP4Tensor.from_parts(torch.Size((m, k)), bulk.dtype, token_config,
                                  rowwise=(bulk.rowwise_data, bulk.rowwise_scale, amax))


def per_row_amax(bulk: GroupedNVFP4Tensor) -> torch.Tensor:
    """A grouped tensor's rowwise amax per row (M,): each split's repeated over its rows (no host sync)."""
    if bulk.config.per_token:
        return bulk.rowwise_amax
    return torch.repeat_interleave(bulk.rowwise_amax, bulk.split_offsets.diff(), output_size=int(bulk.shape[0]))


def _check_list(name: str, ts, same_rows: bool) -> None:
    if not isinstance(ts, (list, tuple)) or len(ts) == 0:
        raise TypeError(f"{name} must be an NVFP4Tensor or a non-empty list of NVFP4Tensors, got {type(ts).__name__}")
    for i, t in enumerate(ts):
        check_rowwise(f"{name}[{i}]", t)
        if t.k != ts[0].k or (same_rows and t.m != ts[0].m):
            what = "(N, K)" if same_rows else "K"
            raise ValueError(f"{name}[{i}] is ({t.m}, {t.k}), {name}[0] is ({ts[0].m}, {ts[0].k}): all need the same {what}")
        if t.e4m3_max != ts[0].e4m3_max:
            raise ValueError(f"{name}[{i}] has e4m3_max {t.e4m3_max}, {name}[0] {ts[0].e4m3_max}: all need the same E")


def _use_kernel(backend: Optional[str], scale: torch.Tensor) -> bool:
    if backend is None:  # the ops' default choice (a pure layout permutation: both give the same bytes)
        if not scale.is_cuda:
            return False
        try:
            import triton  # noqa: F401
        except ImportError:
            return False
        return True
    if backend not in ("ref", "triton"):
        raise ValueError(f"backend must be 'ref', 'triton' or None, got {backend!r}")
    return backend == "triton"


def _compact_scales(scale: torch.Tensor, layout: str, m: int, k16: int, backend: Optional[str]) -> torch.Tensor:
    """An (m, k16) matrix of rowwise scales in ``layout`` as a compact matrix. Swizzled scales go
    through the Triton unswizzle kernel with the triton backend (one launch; the reference's gather
    builds its int64 offsets in five full-size elementwise passes and about 20 launches)."""
    if layout == "swizzled" and scale.numel() > 0 and _use_kernel(backend, scale):
        from .kernels import swizzle as swizzle_kernels

        return swizzle_kernels.unswizzle_scales(scale, m, k16)
    return compact_scales(scale, layout, m, k16)


def _concat_scales(ts, backend: Optional[str]) -> torch.Tensor:
    """The tensors' rowwise scales, compact and stacked along rows ((sum M, K/16)). Swizzled buffers
    whose row counts are all multiples of 128 hold whole 128-row bands, so their concatenation is the
    swizzled buffer of the stacked matrix: one unswizzle for all of them instead of one per tensor."""
    k16 = ts[0].k // 16
    if len(ts) > 1 and all(t.scale_layout == "swizzled" and t.m % 128 == 0 for t in ts):
        bands = torch.cat([t.rowwise_scale.reshape(t.m, roundup(k16, 4)) for t in ts])
        return _compact_scales(bands, "swizzled", bands.shape[0], k16, backend)
    return torch.cat([_compact_scales(t.rowwise_scale, t.scale_layout, t.m, k16, backend) for t in ts])


def _concat_rows(ts, amax: torch.Tensor, shape, per_token: bool, backend: Optional[str]) -> NVFP4Tensor:
    t0 = ts[0]
    config = replace(t0.config, scale_layout="compact", columnwise=False, rowwise=True)
    if per_token:
        config = replace(config, per_token=True, rht=False, block="1x16")
    return NVFP4Tensor.from_parts(torch.Size(shape), t0.dtype, config,
                                  rowwise=(torch.cat([t.rowwise_data for t in ts]), _concat_scales(ts, backend), amax))


def concat_tokens(tensors: Sequence[NVFP4Tensor], *, backend: Optional[str] = None) -> tuple[NVFP4Tensor, torch.Tensor]:
    """Per-expert token splits (M_e, K), each with its own amax ((1,) or (M_e,)) -> one (M, K) tensor
    with per-row amax (each split's amax repeated over its rows) and ``offs`` (E,) int32 row ends
    (built from the host sizes: one small host->device copy, fill kernels during CUDA graph capture).
    ``backend`` ("ref", "triton", None: Triton for CUDA tensors when installed) unswizzles scales."""
    _check_list("a", tensors, same_rows=False)
    amax = torch.cat([t.rowwise_amax.reshape(-1).float().expand(t.m) for t in tensors])
    device = tensors[0].rowwise_data.device
    offs = host_ints_on_device(cumulative_offsets([t.m for t in tensors])[1:], device, dtype=torch.int32)
    m = sum(t.m for t in tensors)
    return _concat_rows(tensors, amax, (m, tensors[0].k), True, backend), offs


def stack_weights(tensors: Sequence[NVFP4Tensor], *, backend: Optional[str] = None) -> NVFP4Tensor:
    """E per-expert weights (N, K) -> one NVFP4Tensor of logical shape (E, N, K), compact scales, amax
    (E,) (one per expert) or (E*N,) when any expert has per-row amax. ``backend`` as in
    :func:`concat_tokens`."""
    _check_list("b", tensors, same_rows=True)
    per_row = any(t.rowwise_amax.numel() != 1 for t in tensors)
    amax = torch.cat([t.rowwise_amax.reshape(-1).float().expand(t.m if per_row else 1) for t in tensors])
    return _concat_rows(tensors, amax, (len(tensors), tensors[0].m, tensors[0].k), False, backend)
