"""Heuristics of the NVFP4 GEMM: tiles, K splits, decoder and the choice between its three paths.

Paths (:func:`resolve_config` picks one per call; an explicit ``config`` overrides it):

* M <= 64, dense: the weight-stream kernel (``GemmConfig.stream``). A decode GEMM is a read of B plus
  the decoding of every code; the stream kernel is built around B and splits K over programs until
  every SM streams (:func:`stream_splits`).
* large M (M >= ``dequant_min_m`` and M N K >= ``dequant_min_mnk``), dense: both operands expanded
  once, one cuBLAS GEMM with its epilogue or an epilogue kernel (``GemmConfig.dequant_mm``); grouped GEMMs
  whose split sizes are known on the host take it per expert when the average expert is that large.
* otherwise (and every grouped GEMM without host split sizes): the fused-decode kernel. Medium M decodes
  both operands per tile (decode work per FLOP falls as 1/BLOCK_M + 1/BLOCK_N); large M expands B to
  FP16 once (``b_predecode``: O(N K) against the GEMM's O(M N K)) so that B's tiles take Triton's
  pipelined path and the MMA overlaps A's decoding.

Table rows were chosen by timing on the GPU (``benchmarks/gemm.py --sweep``, ``tools/stream_probe.py
--splits``; figures in benchmarks/RESULTS.md). H100 and H200 share the SM (sm_90, 132 SMs), so they
share rows. The interpreter gets small tiles so that tests hit every edge mask.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from ...layout import cdiv
from ..launch import interpreting


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    maxnreg: Optional[int] = None  # cap registers (ptxas .maxnreg), e.g. for 2 CTAs per SM
    b_predecode: bool = False  # fused kernel: expand B to fp16 once (one extra pass), then decode only A per tile
    split_k: int = 1  # stream kernel only (see below)
    # Dense only: expand both operands to q * s (exact) with the expansion kernel (block_k = its tile), then
    # cuBLAS (see dequant_mm: its own epilogue, or fp32 output and the epilogue kernel). Temporary memory
    # 2MK + 2NK (+ 4MN) bytes.
    dequant_mm: bool = False
    # Dense only, the weight-stream kernel (M <= 64): block_k = 128 V; split_k = K splits over programs,
    # 0 lets the launcher split K for about ctas_per_sm programs per SM; a_pre decodes A once up front
    # (one more launch) instead of in every program's loop.
    stream: bool = False
    ctas_per_sm: int = 4
    a_pre: bool = False
    # Stream kernel, computed splits only: at most max_resident programs per SM in all (the programs of
    # this config that fit on an SM: more would start a second wave; 0 = no cap), and at least
    # split_min_k_tiles K tiles per split (each split adds a BLOCK_M x BLOCK_N fp32 partial to reduce).
    max_resident: int = 0
    split_min_k_tiles: int = 1


# Fused kernel, per GPU: (max M, config) rows, first match wins (M: rows per expert for grouped GEMMs).
HOPPER = (
    (16, GemmConfig(16, 64, 256, 8, 8, 4)),
    (32, GemmConfig(32, 64, 256, 8, 8, 4)),
    (64, GemmConfig(64, 64, 256, 8, 8, 4)),
    (256, GemmConfig(64, 128, 128, 8, 4, 4)),
    (1024, GemmConfig(128, 128, 128, 8, 8, 3)),
    (1 << 62, GemmConfig(128, 256, 64, 8, 8, 4, b_predecode=True)),
)
CONFIGS = {"H100": HOPPER, "H200": HOPPER, "default": HOPPER}
# Dense GEMMs only, checked before the rows above.
# * stream rows: 128-wide B tiles, 3 stages, A decoded up front. 16 rows: maxnreg=128 keeps 2 programs per
#   SM without spills (32 rows would spill under that cap). 32 and 64 rows: each split adds a BLOCK_M x
#   BLOCK_N fp32 partial that the tile's last program reads back, so splits keep >= 8 K tiles; 64 rows hold
#   217 registers (2 programs per SM), and a second wave of programs costs more than fewer splits
#   (max_resident=2).
# * dequant: from M = 128 and 2^30 multiply-adds on, the expansion's O((M + N) K) traffic is small against
#   cuBLAS' rate on the 16-bit operands.
HOPPER_DENSE = dict(
    stream=((16, GemmConfig(16, 128, 128, 8, 4, 3, maxnreg=128, stream=True, a_pre=True, split_k=0, ctas_per_sm=2)),
            (32, GemmConfig(32, 128, 128, 8, 4, 3, stream=True, a_pre=True, split_k=0, ctas_per_sm=2,
                            split_min_k_tiles=8)),
            (64, GemmConfig(64, 128, 128, 8, 4, 3, stream=True, a_pre=True, split_k=0, ctas_per_sm=2, max_resident=2,
                            split_min_k_tiles=8))),
    dequant_min_m=128,
    dequant_min_mnk=1 << 30,
    dequant=GemmConfig(128, 128, 128, 8, 4, 1, dequant_mm=True),
)
DENSE_RULES = {"H100": HOPPER_DENSE, "H200": HOPPER_DENSE, "default": HOPPER_DENSE}
# Interpreter: small tiles so that tests hit every edge mask; larger ones only for larger problems
# (numpy runs whole tiles, so fewer programs is what makes the interpreter fast).
INTERPRET_SMALL = GemmConfig(32, 32, 64, 4, 4, 1)
INTERPRET_LARGE = GemmConfig(64, 64, 128, 4, 4, 1)
# Rows per program of the expansion kernel.
EXPAND_ROWS = 64



@functools.lru_cache(maxsize=None)
def _gpu_key_cached(index: int) -> str:
    name = torch.cuda.get_device_name(index)
    for key in CONFIGS:
        if key in name:
            return key
    return "default"


def gpu_key(device: torch.device) -> str:
    if device.type != "cuda":
        return "default"
    return _gpu_key_cached(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _num_sms_cached(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """SMs of a CUDA device; 4 elsewhere (the interpreter), so that split rules still split."""
    if device.type != "cuda":
        return 4
    return _num_sms_cached(device.index if device.index is not None else torch.cuda.current_device())


def expand_rule(device: torch.device) -> Optional[tuple]:
    """The sizes from which GEMMs on ``device`` take the dequant_mm path (both operands expanded to BF16):
    (the dense stream kernel's largest M, the least M, the least M*N*K) of :data:`DENSE_RULES`; None where the
    path is never the default (not CUDA, the interpreter). :func:`takes_expanded_by_rule` applies it."""
    if device.type != "cuda" or interpreting():
        return None
    rules = DENSE_RULES[gpu_key(device)]
    stream_max_m = max((max_m for max_m, _ in rules.get("stream", ())), default=0)
    return stream_max_m, rules["dequant_min_m"], rules["dequant_min_mnk"]


def takes_expanded_by_rule(m, n, k, rule: Optional[tuple], num_experts: int = 0) -> bool:
    """Whether an (m, n, k) GEMM takes the dequant_mm path under ``rule`` (:func:`expand_rule`): a dense one past
    the stream kernel's rows, a grouped one with host split sizes (``num_experts`` > 0) by the dense rule for
    the average expert (M / E rows). Comparisons only: sizes traced symbolically by torch.compile take it too
    (the graph then guards on them)."""
    if rule is None:
        return False
    stream_max_m, min_m, min_mnk = rule
    if num_experts:
        m = m // num_experts
    elif m <= stream_max_m:
        return False
    return m >= min_m and m * n * k >= min_mnk


def grouped_dequant_applies(m: int, n: int, k: int, num_experts: int, device: torch.device) -> bool:
    """Whether a grouped GEMM whose split sizes are known on the host runs as per-expert dequantize +
    cuBLAS GEMMs: the dense rule for the average expert (M / E rows)."""
    return takes_expanded_by_rule(m, n, k, expand_rule(device), max(num_experts, 1))


def stream_block_m(m: int) -> int:
    """The stream kernel's BLOCK_M for M rows of A (a multiple of 16, at most 64)."""
    return 16 if m <= 16 else (32 if m <= 32 else 64)


def stream_splits(cfg: GemmConfig, m: int, n: int, k: int, num_sms: int) -> int:
    """K splits for the stream kernel: about ``ctas_per_sm`` programs per SM, within one wave of
    ``max_resident`` per SM and with ``split_min_k_tiles`` K tiles per split (``split_k`` when positive),
    every split non-empty."""
    k_tiles = cdiv(k, cfg.block_k)
    split = cfg.split_k
    if split <= 0:
        tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
        split = cdiv(cfg.ctas_per_sm * num_sms, tiles)
        if cfg.max_resident > 0:
            split = min(split, cfg.max_resident * num_sms // tiles)
        split = min(split, k_tiles // cfg.split_min_k_tiles)
    split = max(1, min(split, k_tiles))
    return cdiv(k_tiles, cdiv(k_tiles, split))


def choose_config(m: int, n: int, k: int, device: torch.device, grouped: bool = False) -> GemmConfig:
    """Block sizes and path for an (m, n, k) problem on ``device`` (m: rows per expert for grouped GEMMs)."""
    if device.type != "cuda" or interpreting():
        return INTERPRET_LARGE if min(m, n) >= 64 and k >= 128 else INTERPRET_SMALL
    if not grouped:
        rules = DENSE_RULES[gpu_key(device)]
        for max_m, cfg in rules.get("stream", ()):
            if m <= max_m:
                return cfg
        if takes_expanded_by_rule(m, n, k, expand_rule(device)):
            return rules["dequant"]
    for max_m, cfg in CONFIGS[gpu_key(device)]:
        if m <= max_m:
            return cfg
    return cfg


def resolve_config(config: Optional[GemmConfig], m: int, n: int, k: int, num_experts: int, grouped: bool,
                   host_splits: bool, device: torch.device) -> GemmConfig:
    """The config a call runs with: ``config`` when given, else :func:`choose_config`'s (grouped GEMMs:
    per-expert rows, and with host split sizes the dense dequant rule of :func:`grouped_dequant_applies`).
    Dense-only paths (stream; dequant_mm without host split sizes) asked of a grouped or empty problem
    fall back to the fused kernel's row."""
    empty = k == 0 or m == 0 or n == 0
    per_expert_m = max(1, m // max(num_experts, 1))
    if config is None:
        if grouped and host_splits and not empty and grouped_dequant_applies(m, n, k, num_experts, device):
            return DENSE_RULES[gpu_key(device)]["dequant"]
        config = choose_config(per_expert_m if grouped else m, n, k, device, grouped=grouped)
    if grouped and host_splits and not empty and config.dequant_mm:
        return config
    if (config.dequant_mm or config.stream) and (grouped or empty):
        config = choose_config(per_expert_m, n, k, device, grouped=True)
    return config


def dequant_config(device: torch.device) -> GemmConfig:
    """The dequant_mm path's config on ``device``: the one path that takes operands given expanded (BF16)."""
    return DENSE_RULES[gpu_key(device)]["dequant"]


def default_decode(device: torch.device) -> int:
    """1 (PTX decoder) on CUDA, 0 (portable) under the interpreter, which cannot run inline PTX."""
    if device.type != "cuda" or interpreting():
        return 0
    return 1


def asm_fits(rows: int, block_k: int, num_warps: int) -> bool:
    """The PTX decoder takes 4 bytes per invocation: Triton aborts the process (not an exception) when
    a thread holds a number of bytes that is not a multiple of 4, so only whole multiples are allowed."""
    return (rows * block_k // 2) % (4 * 32 * num_warps) == 0


def fused_decode(decode: int, config: GemmConfig) -> int:
    """The fused kernel's decoder: the PTX one only when the A, B and expansion tiles all fit it."""
    if decode == 1 and not all(asm_fits(r, config.block_k, w) for r, w in (
            (config.block_m, config.num_warps), (config.block_n, config.num_warps), (EXPAND_ROWS, 4))):
        return 0
    return decode


def expand_decode(decode: int, block_k: int) -> int:
    """The expansion kernel's decoder (EXPAND_ROWS rows, 4 warps)."""
    return 0 if decode == 1 and not asm_fits(EXPAND_ROWS, block_k, 4) else decode
