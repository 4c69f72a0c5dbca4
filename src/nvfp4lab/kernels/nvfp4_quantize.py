"""NVFP4 quantize kernels: rowwise and columnwise outputs of every recipe from one read of x.

Passes over x (M, K). Environment overrides, for tuning and comparison only: NVFP4LAB_QUANT_TILE=
"BMxBKxWARPS" (amax and generic cast tiles), NVFP4LAB_CAST16_TILE="BKxWARPS", NVFP4LAB_CAST16_MAXNREG
(``cast16_launch_options``), NVFP4LAB_AMAX_STEPS (tiles per amax program), NVFP4LAB_QUANT_KERNEL=generic
(no ``_cast16_kernel``), NVFP4LAB_CAST16_RHT=0 (RHT recipes on the generic kernel, see ``use_cast16``),
NVFP4LAB_SR_VARIANT (``sr_variant``), NVFP4LAB_PT_PRECOMPUTE=0 (per-token global scales computed in every
tile instead of precomputed, see ``pt_precompute``; default 1).

1. ``_amax_kernel``, only for outer amaxes the caller did not supply: per tensor, per row (M,), per
   column (K,), or per tensor of the bf16 RHT output; folded into zeroed fp32 buffers by ``atomic_max``
   on their int32 view (|x| >= 0, so int order is float order; NaN bits beat inf as torch.amax's NaN).
   The atomics are relaxed: only the next launch reads the maxima, and the default acq_rel ordering
   puts a memory barrier around each one (the per-token pass issues one per row and column).
2. The cast, one read of x for both outputs, by one of two kernels (``use_cast16``):
   * ``_cast16_kernel`` (every recipe without 4over6 or 16x16 RHT): one 16-row group x 128 columns per
     one-warp program, laid out so that each thread holds 8 rows of 8 columns, i.e. half of a
     rowwise and half of a columnwise block, each packing one word of each; the cheaper encoders
     ``e2m1_scale_encode`` and ``_scale_and_factor_fast``. About 42 SASS instructions per element
     for row+col (the generic kernel: 91; ``tools/sass_stats.py`` counts them without a GPU).
     Per token it computes S_enc, S_dec (two correct divisions) per row and column of each tile:
     48.0 instructions per element on the normal path (sm_90; H200 8192^2 row+col cast 219 us vs
     191 per tensor). By default (NVFP4LAB_PT_PRECOMPUTE=1, read at every launch; 40.8 instructions
     per element; H200 8192^2 row+col cast 196.7 us vs 220.0 us, same run) it computes them once per row and column
     instead, ``_pt_scales_kernel`` (a tiny launch over the (M,) and (K,) amaxes, grouped (n, K)
     included) writing (3, N) tables [amax, fl(S_enc * fl(1/6)), S_dec] that the cast loads (PT_PRE),
     bit for bit the same values; S_dec -1 marks an amax outside the normal range, so the tile's
     ``_normal_range`` decision is the same one, and EXACT tiles still recompute from the amax.
   * ``_quantize_kernel`` (generic, all recipes): loads a [BLOCK_M, BLOCK_K] tile and quantizes its
     rows (view [BLOCK_M, BLOCK_K/16, 16]) and its columns (view [BLOCK_M/16, BLOCK_K, 16] permuted
     from [BLOCK_M/16, 16, BLOCK_K]); RHT as a block-diagonal dot, 4over6.

Layout (:mod:`nvfp4lab.tensors`): data (M, K/2) and (K, M/2) is stored as two int32 words per 16-element
block (code i in bits 4(i%8).. of word i//8 = element 2j in the low nibble of byte j, little-endian).
Scales are E4M3 bytes, compact (R, C/16), padded (roundup(R,128), roundup(C/16,4)) or swizzled 128x4
(``ref.swizzle``); padded buffers are zero-filled first only when padding exists.

Numerics: those of :mod:`nvfp4lab.ref.nvfp4`, op for op in fp32.
* Launches pass ``enable_fp_fusion=False`` (an FMA would merge the 4over6 ``err + d*d``).
* Divisions are correctly rounded (``_div``). Tiles whose outer amaxes are all 0 or in
  [2^-100, 2^100] (``_normal_range``) use ``div_rn`` (Triton's ``/`` is approximate): there no
  operand or quotient that matters is subnormal, so it is exact even where Triton lowers it to the
  flushing ``div.rn.ftz.f32``. Other tiles take the EXACT path: fp64 divisions rounded once.
* No per-element division in normal-range tiles: 4over6 dequantizes a candidate with three divisions
  per block (``_dequant_4over6_fast``); EXACT tiles divide per element. Error sums run in index order
  (``_seq_sum16``), 2D errors as TE's shuffle tree (``_tree_sum16``).
* Block amax is an integer max of |x| bits; E2M1/E4M3 come from ``_codecs`` (``e2m1_encode_fast``: the
  codes of ``e2m1_encode`` for all 2^32 inputs in half the instructions; Hopper has no E2M1 convert,
  so the encoder bounds the kernel's instruction count).
* RHT: ``tl.dot`` of blockdiag(T^T) [BLOCK_M, BLOCK_M] (entries +-0.25) with the tile rounded to bf16,
  fp32 accumulation, result rounded to bf16 by integer RNE. (The interpreter truncates casts to bf16
  and its bf16 ``tl.dot`` is wrong, so there the same exact values go through an fp32 dot.)
  The default for 1x16 RHT recipes is ``_cast16_kernel`` with the RHT as butterflies in registers
  (``_rht16_cast16``): 57.6 SASS instructions per element for RHT(col)+row at 137 registers, against
  108.6 at 76 for the generic kernel (sm_90, ``tools/sass_stats.py``); H200, 8192^2 cast: RHT+row 245 us
  against 300 us, RHT+SR 609 against 632 (NVFP4LAB_CAST16_RHT=0 selects the generic kernel).
* Stochastic rounding: Philox4x32-10 (``tl.philox``), 8 random bits per element, stream 0 rowwise / 1
  columnwise (counter word 2), the seed an int or an int64 device tensor read by the kernel. Which
  bits feed which element (TE's own mapping differs per kernel; only statistics are specified):
  ``_cast16_kernel``, which runs every SR recipe by default, uses "pairs" (``SR_VARIANT``,
  NVFP4LAB_SR_VARIANT read at every launch): one Philox block per unit of 2 rows x 8 columns of the
  quantized matrix (x rowwise, x^T or RHT(x^T) columnwise), counter (r // 2) * (cols / 8) + c // 8,
  byte 8 (r % 2) + c % 8 (word byte // 4, byte byte % 4), so a thread computes each of its blocks
  once. "blocks" (the generic kernel's mapping): one Philox block per 16-element block, counter =
  block index, word w feeding elements 4w..4w+3, byte b element 4w+b; in ``_cast16_kernel`` each block
  is then computed by both threads holding half of it. sm_90, normal path: RHT+SR 93.1 -> 83.2 SASS
  instructions per element, SR row+col 78.8 -> 68.0 (255 registers with spills -> 208); H200 8192^2
  RHT+SR cast 325.6 us (blocks) -> 303.4 us (pairs), same run. Tests check both mappings bit for bit
  against a host Philox.
  SR rounding: ``_sr_e2m1`` (integer rounding for |y| >= 1, the fp32 rule's codes).

Constraints: x contiguous (M, K) bf16/fp16/fp32; K % 16 == 0; M % 16 == 0 when a columnwise or 16x16
output is asked (rowwise 1x16 takes any M). 64-bit offsets. Empty inputs launch nothing.
Launchers are ``torch.library`` custom ops (``nvfp4lab::nvfp4_amax``, ``nvfp4lab::nvfp4_quantize_cast``)
with fake implementations: ``torch.compile(fullgraph=True)`` and CUDA-graph capture work (no host sync).
"""
from __future__ import annotations

import os
from typing import Optional

import numpy as np
import torch
import triton
import triton.language as tl

from ..config import NVFP4QuantConfig
from ..ref.swizzle import roundup
from ..tensors import NVFP4Tensor
from ._codecs import e2m1_decode, e2m1_encode_fast, e2m1_scale_encode, e4m3_decode, e4m3_encode, e4m3_encode_fast

FLT_MAX = tl.constexpr(3.4028234663852886e38)
ONE_SIXTH = tl.constexpr(float(np.float32(1.0 / 6.0)))  # fl(1/6), folded into S_enc first (spec 3.1)
E4M3_MAX = tl.constexpr(448.0)

_LAYOUT_CODES = {"compact": 0, "padded": 1, "swizzled": 2}
_FOUR_OVER_SIX_CODES = {None: 0, "mae": 1, "mse": 2}
# amax modes of the two outputs (see nvfp4_amax)
AMAX_NONE, AMAX_TENSOR, AMAX_PER_TOKEN, AMAX_TENSOR_RHT = 0, 1, 2, 3


# ------------------------------------------------------------------------------ device helpers
@triton.jit
def _abs_bits(v):
    return v.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _clamp_flt_max(v):
    # not tl.minimum: on the GPU it returns the non-NaN operand, torch.clamp keeps the NaN
    return tl.where(v > FLT_MAX, FLT_MAX, v)


@triton.jit
def _bf16_rne(v):
    """fp32 -> the fp32 value of its round-to-nearest-even bf16 (bit arithmetic, same on every backend)."""
    bits = v.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    rounded = tl.where(v != v, 0x7FC00000, rounded)
    return rounded.to(tl.float32, bitcast=True)


@triton.jit
def _div(a, b, F64: tl.constexpr):
    """Correctly rounded fp32 a / b (a, b fp32 tensors of one shape).

    F64: divide in fp64 and round once to fp32 (exact: 53 >= 2*24 + 2 bits), for tiles where an
    operand or the quotient can be subnormal; ``div_rn`` flushes those on some Triton versions
    (div.rn.ftz.f32). In normal-range tiles (``_normal_range``) ``div_rn`` is exact.
    """
    if F64:
        q = (a.to(tl.float64) / b.to(tl.float64)).to(tl.float32)
    else:
        q = tl.math.div_rn(a, b)
    return q


@triton.jit
def _global_scales(amax, E6: tl.constexpr, F64: tl.constexpr):
    """S_enc = clamp(6E / amax) (1 for amax 0 or inf), S_dec = 1 / S_enc."""
    s_enc = _clamp_flt_max(_div(tl.zeros_like(amax) + E6, amax, F64))
    s_enc = tl.where((amax == 0.0) | (s_enc == 0.0), 1.0, s_enc)
    s_dec = _div(tl.zeros_like(s_enc) + 1.0, s_enc, F64)
    return s_enc, s_dec


@triton.jit
def _encode_factor(scale_f, s_dec, F64: tl.constexpr):
    """min(1 / (s * S_dec), FLT_MAX); a zero scale gives FLT_MAX."""
    prod = scale_f * s_dec
    return _clamp_flt_max(_div(tl.zeros_like(prod) + 1.0, prod, F64))


@triton.jit
def _block_amax(v3):
    """[A, B, 16] -> [A, B]: max |v| by integer max of the magnitude bits (NaN propagates)."""
    return tl.max(_abs_bits(v3), axis=2).to(tl.float32, bitcast=True)


@triton.jit
def _split_last(t, A: tl.constexpr, B: tl.constexpr, L: tl.constexpr):
    """[A, B, L] -> (even, odd) elements of the last axis, each [A, B, L/2] ([A, B] when L == 2)."""
    if L == 2:
        pair = t
    else:
        pair = tl.reshape(t, [A, B, L // 2, 2])
    return tl.split(pair)


@triton.jit
def _halves_last(t, A: tl.constexpr, B: tl.constexpr, L: tl.constexpr):
    """[A, B, L] -> (first half, second half) of the last axis, each [A, B, L/2]."""
    return tl.split(tl.permute(tl.reshape(t, [A, B, 2, L // 2]), (0, 1, 3, 2)))


@triton.jit
def _seq_sum16(t, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 16] -> [A, B]: fp32 sum of the last axis in index order, (((t0 + t1) + t2) + ...)."""
    ev, od = _split_last(t, A, B, 16)  # 0,2,..,14 | 1,3,..,15
    e0, e2 = _split_last(ev, A, B, 8)  # 0,4,8,12 | 2,6,10,14
    o1, o3 = _split_last(od, A, B, 8)  # 1,5,9,13 | 3,7,11,15
    a0, a4 = _split_last(e0, A, B, 4)  # 0,8 | 4,12
    a2, a6 = _split_last(e2, A, B, 4)  # 2,10 | 6,14
    a1, a5 = _split_last(o1, A, B, 4)  # 1,9 | 5,13
    a3, a7 = _split_last(o3, A, B, 4)  # 3,11 | 7,15
    t0, t8 = _split_last(a0, A, B, 2)
    t4, t12 = _split_last(a4, A, B, 2)
    t2, t10 = _split_last(a2, A, B, 2)
    t6, t14 = _split_last(a6, A, B, 2)
    t1, t9 = _split_last(a1, A, B, 2)
    t5, t13 = _split_last(a5, A, B, 2)
    t3, t11 = _split_last(a3, A, B, 2)
    t7, t15 = _split_last(a7, A, B, 2)
    s = t0 + t1
    s = s + t2
    s = s + t3
    s = s + t4
    s = s + t5
    s = s + t6
    s = s + t7
    s = s + t8
    s = s + t9
    s = s + t10
    s = s + t11
    s = s + t12
    s = s + t13
    s = s + t14
    s = s + t15
    return s


@triton.jit
def _tree_sum16(t, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 16] -> [A, B]: shuffle-down tree (offsets 8, 4, 2, 1) as TE reduces 2D 4over6 errors."""
    lo, hi = _halves_last(t, A, B, 16)
    t8 = lo + hi
    lo, hi = _halves_last(t8, A, B, 8)
    t4 = lo + hi
    lo, hi = _halves_last(t4, A, B, 4)
    t2 = lo + hi
    lo, hi = _split_last(t2, A, B, 2)
    return lo + hi


@triton.jit
def _random_bytes(seed, counter, STREAM: tl.constexpr):
    """[A, B] int64 block counters -> [A, B, 16] int32 random bytes from one Philox block per block."""
    return _philox_bytes(seed, counter[:, :, None], STREAM, tl.arange(0, 16)[None, None, :])


@triton.jit
def _philox_bytes(seed, counter, STREAM: tl.constexpr, jj):
    """Byte jj (0..15, broadcastable against counter) of the Philox block of each block counter
    (key = seed, counter = (lo, hi, STREAM, 0)): word jj // 4, byte jj % 4 (TE's mapping)."""
    lo = (counter & 0xFFFFFFFF).to(tl.uint32)
    hi = (counter >> 32).to(tl.uint32)
    w0, w1, w2, w3 = tl.philox(seed, lo, hi, tl.zeros_like(lo) + STREAM, tl.zeros_like(lo))
    w = tl.where(jj < 4, w0, tl.where(jj < 8, w1, tl.where(jj < 12, w2, w3))).to(tl.int32, bitcast=True)
    return (w >> ((jj % 4) * 8)) & 0xFF


@triton.jit
def _pair_bytes_rows(seed, g, pid_k, k_blocks, KB: tl.constexpr):
    """SR_PAIRS random bytes of a ``_cast16_kernel`` tile's rowwise blocks, [16 (tile rows), KB, 16].

    Unit = 2 rows x 8 columns of x: rows 2p, 2p + 1, columns 8q..8q+7, counter p * (K / 8) + q
    (stream 0); byte 8 (row % 2) + (column % 8) of its Philox block (word byte // 4, byte byte % 4).
    A thread holds 8 whole units (rows 8h + 2jp + jl, columns 16b + 8s + e), so each Philox block
    is computed once, by one thread (the block mapping computes each twice)."""
    jp = tl.arange(0, 4)[:, None, None, None, None, None]
    jl = tl.arange(0, 2)[None, :, None, None, None, None]
    h = tl.arange(0, 2)[None, None, :, None, None, None]
    b = tl.arange(0, KB)[None, None, None, :, None, None]
    s = tl.arange(0, 2)[None, None, None, None, :, None]
    e = tl.arange(0, 8)[None, None, None, None, None, :]
    unit = (g * 8 + h * 4 + jp) * (k_blocks * 2) + (pid_k * KB + b) * 2 + s  # [4, 1, 2, KB, 2, 1]
    rb = _philox_bytes(seed, unit, 0, jl * 8 + e)  # [4 (jp), 2 (jl), 2 (h), KB, 2 (s), 8 (e)]
    # tile row i = 2 j + h with j = 2 jp + jl (row 8 h + j); column 16 b + 8 s + e
    return tl.reshape(rb, [16, KB, 16])


@triton.jit
def _pair_bytes_cols(seed, unit_base, unit_stride, pid_k, BLOCK_K: tl.constexpr):
    """SR_PAIRS random bytes of a ``_cast16_kernel`` tile's columnwise blocks, [16 (tile rows), BLOCK_K].

    The rowwise units on the quantized matrix x^T (or RHT(x^T)): columns 2p, 2p + 1 of x, rows
    8q..8q+7, counter p * (M / 8) + q (stream 1; grouped: the split's bulk block offset + its own
    units), byte 8 (column % 2) + (row % 8). A thread holds rows 8h..8h+7 of 8 columns: 4 whole units."""
    j = tl.arange(0, 8)[:, None, None, None]
    h = tl.arange(0, 2)[None, :, None, None]
    cp = tl.arange(0, BLOCK_K // 2)[None, None, :, None]
    cl = tl.arange(0, 2)[None, None, None, :]
    unit = unit_base + h + (pid_k * (BLOCK_K // 2) + cp).to(tl.int64) * unit_stride  # [1, 2, BK/2, 1]
    cb = _philox_bytes(seed, unit, 1, cl * 8 + j)  # [8 (j), 2 (h), BK/2, 2 (cl)]
    return tl.reshape(cb, [16, BLOCK_K])


@triton.jit
def _sr_seed(seed_ptr, seed_value, SR: tl.constexpr, SEED_FROM_PTR: tl.constexpr):
    """The SR key: read from the int64 device tensor, or the int argument (0 without SR)."""
    seed = 0
    if SR:
        if SEED_FROM_PTR:
            seed = tl.load(seed_ptr)
        else:
            seed = seed_value
    return seed


@triton.jit
def _sr_e2m1(y, rbytes):
    """Stochastic rounding onto the E2M1 grid: the codes of ref.nvfp4.stochastic_round_e2m1 (the spec's
    fp32 rule) for every fp32 y and byte 0..255 (NaN -> +6), in about half the instructions of that rule.

    |y| >= 1 (inf, NaN included): the grid step is the fp32 ulp of a 1-bit mantissa (bit 22), so
    t = |y| + u * step is bits(|y|) + (byte << 14) as integers, exact (fp32 would round only when t
    enters the next binade, and never across a grid point there: t < 2^(e+1) + step / 2 and the next
    point is 2^(e+1) + 2 step), and the code is the exponent and bit 22: (bits >> 22) - 252, saturated
    at 7 (uint32: NaN bits do not wrap). |y| < 1: step 0.5, the code is floor(fl(2|y| + byte / 256)),
    = floor(2 fl(|y| + byte / 512)) (2|y| and byte / 256 are exact). The sign goes on nonzero codes
    of y < 0 (the float path's -0.0 encodes as 0; NaN fails y < 0)."""
    a = tl.abs(y)
    big = (a.to(tl.uint32, bitcast=True) + (rbytes.to(tl.uint32) << 14)) >> 22
    hi = tl.minimum(big.to(tl.int32) - 252, 7)
    lo = ((a + a) + rbytes.to(tl.float32) * 0.00390625).to(tl.int32)
    mag = tl.where(a < 1.0, lo, hi)
    return tl.where((y < 0.0) & (mag != 0), mag | 8, mag)


@triton.jit
def _pack_codes(codes, A: tl.constexpr, B: tl.constexpr):
    """[A, B, 16] E2M1 codes -> [A, B, 2] int32 words, code i in bits 4(i%8).. of word i//8."""
    shift = ((tl.arange(0, 16) % 8) * 4)[None, None, :]
    return tl.sum(tl.reshape(codes << shift, [A, B, 2, 8]), axis=3)


@triton.jit
def _dequant_4over6_fast(codes, scale_f, outer, E6: tl.constexpr):
    """fl(fl(fl(q * s) * amax) / 6E) for every code, with three divisions per block instead of one per
    element (the division dominates the 4over6 cost).

    q = +-2^e * m with m in {1, 1.5} and e in {-1, 0, 1, 2}; q * s and m * s are exact (at most 5
    significant bits), and scaling by 2^e commutes with fp32 rounding while every intermediate is a
    normal number, so the value is +-2^e * fl(fl(fl(m * s) * amax) / 6E). The caller guarantees that
    range (outer amax 0 or in [2^-100, 2^100]); zero codes take fl(fl(0 * s) * amax) / 6E.
    """
    e6 = tl.zeros_like(scale_f) + E6
    v_one = tl.math.div_rn(scale_f * outer, e6)  # all normal in the caller's range: no FTZ exposure
    v_three_halves = tl.math.div_rn((scale_f * 1.5) * outer, e6)
    v_zero = tl.math.div_rn((scale_f * 0.0) * outer, e6)
    idx = codes & 7  # magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6
    pow2 = ((((idx - 2) >> 1) + 127) << 23).to(tl.float32, bitcast=True)  # 2^e for idx 1..7
    three_halves = ((idx & 1) == 1) & (idx >= 3)
    mag = tl.where(three_halves, v_three_halves[:, :, None], v_one[:, :, None]) * pow2
    mag = tl.where(idx == 0, v_zero[:, :, None], mag)
    return tl.where((codes & 8) != 0, -mag, mag)


@triton.jit
def _candidate_4over6(y3, base, s_dec, outer, EXPAND: tl.constexpr, E6: tl.constexpr, MSE: tl.constexpr,
                      EXACT: tl.constexpr, A: tl.constexpr, B: tl.constexpr):
    """One 4over6 candidate: codes [A, B, 16], scale bits [A, B], per-block-row error [A, B].

    outer: the outer amax, broadcastable to [A, B]. EXACT: per-element fp64 division (any range);
    otherwise _dequant_4over6_fast (normal-range tiles).
    """
    if EXPAND:
        cand = base * 1.5
    else:
        cand = base
    scale = e4m3_encode(tl.where(cand > E4M3_MAX, E4M3_MAX, cand))
    scale_f = e4m3_decode(scale)
    enc = _encode_factor(scale_f, s_dec, EXACT)
    codes = e2m1_encode_fast(y3 * enc[:, :, None])
    if EXACT:
        val = _div((e2m1_decode(codes) * scale_f[:, :, None]) * outer[:, :, None], tl.zeros_like(y3) + E6, True)
    else:
        val = _dequant_4over6_fast(codes, scale_f, outer, E6)
    d = val - y3
    if MSE:
        term = d * d
    else:
        term = tl.abs(d)
    return codes, scale, _seq_sum16(term, A, B)


@triton.jit
def _normal_range(outer):
    """Scalar: every outer amax of the tile is 0 or in [2^-100, 2^100] (not NaN).

    Then every fp32 division meets normal operands and quotients (or only changes values that round
    to a zero scale anyway), so ``div_rn`` is exact even where it flushes subnormals, and
    _dequant_4over6_fast is exact. Other tiles (tiny, huge or NaN amax) take the EXACT path: fp64
    divisions, per-element 4over6 dequantization.
    """
    return tl.min(_in_normal_range(outer).to(tl.int32)) == 1


@triton.jit
def _in_normal_range(outer):
    """Elementwise: outer amax 0 or in [2^-100, 2^100] (NaN fails), the test ``_normal_range`` reduces."""
    return (outer == 0.0) | ((outer >= 7.888609052210118e-31) & (outer <= 1.2676506002282294e30))


@triton.jit
def _normal_range_pt(s_dec):
    """``_normal_range`` of a tile read from per-token tables (``_pt_scales_kernel``): there S_dec is
    stored negated (-1) for an outer amax outside the normal range, and is > 0 for every other one
    (S_enc in (0, FLT_MAX] for amax 0 or in [2^-100, 2^100]); masked rows/columns load 1."""
    return tl.min((s_dec > 0.0).to(tl.int32)) == 1


@triton.jit
def _pt_table_load(table_ptr, idx, n, ok):
    """(fl(S_enc * fl(1/6)), S_dec, normal range?) of entries ``idx`` of a per-token table of length n
    (planes 1 and 2; plane 0, the amax, only EXACT tiles read). Masked entries load S_dec 1, in
    range, as ``_normal_range`` counts them (their amax loads as 0)."""
    enc6 = tl.load(table_ptr + (idx + n), mask=ok, other=0.0)
    s_dec = tl.load(table_ptr + ((idx + n) + n), mask=ok, other=1.0)
    return enc6, s_dec, _normal_range_pt(s_dec)


@triton.jit
def _split_of(r, offsets_ptr, num_splits, STEPS: tl.constexpr):
    """Split of global row r (int64 tensor): the largest s < num_splits with offsets[s] <= r (so a
    zero-row split never owns a row), by binary lifting over the device offsets (2^STEPS >= num_splits)."""
    pos = tl.zeros_like(r)
    for i in tl.static_range(STEPS):
        cand = pos + (1 << (STEPS - 1 - i))
        inside = cand < num_splits
        start = tl.load(offsets_ptr + cand, mask=inside, other=0)
        pos = tl.where(inside & (start <= r), cand, pos)
    return pos


@triton.jit
def _scale_offsets(i, j, ncols, LAYOUT: tl.constexpr):
    """Offset of scale (i, j) of an (R, ncols) matrix in the compact / padded / swizzled buffer."""
    if LAYOUT == 0:
        off = i * ncols + j
    else:
        cols_p = (ncols + 3) // 4 * 4
        if LAYOUT == 1:
            off = i * cols_p + j
        else:
            off = ((i // 128) * (cols_p // 4) + j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
    return off


@triton.jit
def _rht_tile(xf, BLOCK_M: tl.constexpr, RHT_MASK: tl.constexpr, IS_BF16: tl.constexpr, DOT_BF16: tl.constexpr):
    """bf16(v @ T) for every 16-row group v of each column of the tile (the RHT of x^T's rows), fp32 out.

    Done as D @ X with D = blockdiag(T^T): D[16g+j, 16g+i] = T[i, j] = s_i * H[i, j] / 4.
    """
    r = tl.arange(0, BLOCK_M)[:, None]
    c = tl.arange(0, BLOCK_M)[None, :]
    i = c % 16
    p = i & (r % 16)
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    negative = ((p ^ (RHT_MASK >> i)) & 1) != 0
    d = tl.where((r // 16) == (c // 16), tl.where(negative, -0.25, 0.25), 0.0)
    if IS_BF16:
        xb = xf
    else:
        xb = _bf16_rne(xf)
    if DOT_BF16:
        y = tl.dot(d.to(tl.bfloat16), xb.to(tl.bfloat16), out_dtype=tl.float32)
    else:
        y = tl.dot(d, xb, out_dtype=tl.float32)
    return _bf16_rne(y)


@triton.jit
def _butterfly_pairs(t):
    """[..., 2] -> (a + b, a - b) of each pair on the last axis: one stage of a Hadamard transform."""
    a, b = tl.split(t)
    return tl.join(a + b, a - b)


@triton.jit
def _rht16_cast16(xb, RHT_MASK: tl.constexpr, BLOCK_K: tl.constexpr):
    """bf16(v @ T) for the 16 rows v of each column of a ``_cast16_kernel`` tile (fp32 values of bf16
    x; tile row i holds row 8 (i % 2) + i // 2), fp32 out: the RHT of x^T's rows, as ``_rht_tile``.

    Done in registers, no dot: with row r = 8 h + j, Sylvester's H16 = H2 x H8 and each thread holds
    the 8 rows j of one half h of a column, so T = diag(s) H16 / 4 is the sign flip and 1/4 (exact),
    H8 over j as three butterfly stages inside the thread, then H2 across the two threads of the
    column (one exchange). fp32 sums, rounded to bf16 once; the summation order differs from an MMA's,
    which only matters where a 16-term sum is inexact (spec: unspecified order).
    """
    i = tl.arange(0, 16)
    sign = tl.where(((RHT_MASK >> ((i % 2) * 8 + i // 2)) & 1) != 0, -0.25, 0.25)
    # [16, BK] -> [8 (j), 2 (h), BK] -> [2 (h), BK, 8 (j)]: a thread's 8 rows on the last axis
    t = tl.permute(tl.reshape(xb * sign[:, None], [8, 2, BLOCK_K]), (1, 2, 0))
    PAIRS: tl.constexpr = 2 * BLOCK_K * 4
    # one stage per bit of j: bit 0, bit 1, bit 2 (each pairs j with j ^ bit, the pair on the last axis)
    t = tl.reshape(_butterfly_pairs(tl.reshape(t, [PAIRS, 2])), [2, BLOCK_K, 2, 2, 2])       # (h, c, b2, b1, b0)
    t = tl.permute(t, (0, 1, 2, 4, 3))                                                      # (h, c, b2, b0, b1)
    t = tl.reshape(_butterfly_pairs(tl.reshape(t, [PAIRS, 2])), [2, BLOCK_K, 2, 2, 2])
    t = tl.permute(t, (0, 1, 3, 4, 2))                                                      # (h, c, b0, b1, b2)
    t = tl.reshape(_butterfly_pairs(tl.reshape(t, [PAIRS, 2])), [2, BLOCK_K, 2, 2, 2])
    t = tl.reshape(tl.permute(t, (0, 1, 4, 3, 2)), [2, BLOCK_K, 8])                          # (h, c, j')
    # H2 across h: y_h' = u_0 + (-1)^h' u_1
    first = (tl.arange(0, 2) == 0)[:, None, None]
    total = tl.sum(t, axis=0)
    diff = tl.sum(tl.where(first, t, -t), axis=0)
    y = tl.where(first, total[None, :, :], diff[None, :, :])
    return _bf16_rne(tl.reshape(tl.permute(y, (2, 0, 1)), [16, BLOCK_K]))


@triton.jit
def _program_columns(K, BLOCK_K: tl.constexpr):
    """(pid_m, pid_k, cols, col_ok) of this program over tiles ordered K-fastest (int64 columns)."""
    pid = tl.program_id(0)
    n_k = tl.cdiv(K, BLOCK_K)
    pid_m = pid // n_k
    pid_k = pid % n_k
    cols = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
    return pid_m, pid_k, cols, cols < K


@triton.jit
def _load_rows(x_ptr, rows, cols, col_ok, M, K):
    """(row_ok, fp32 tile) of x (M, K) at int64 rows x cols, zeros outside."""
    row_ok = rows < M
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    return row_ok, x.to(tl.float32)


@triton.jit
def _load_tile(x_ptr, M, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's [BLOCK_M, BLOCK_K] tile of x (M, K) as fp32 (zeros outside), programs ordered
    K-fastest; returns (rows, cols, row_ok, col_ok, pid_m, pid_k, xf) with int64 row/column indices."""
    pid_m, pid_k, cols, col_ok = _program_columns(K, BLOCK_K)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok, xf = _load_rows(x_ptr, rows, cols, col_ok, M, K)
    return rows, cols, row_ok, col_ok, pid_m, pid_k, xf


# ------------------------------------------------------------------------------------ kernels
@triton.jit
def _amax_kernel(
    x_ptr, row_amax_ptr, col_amax_ptr, M, K,
    ROW_MODE: tl.constexpr, COL_MODE: tl.constexpr, TENSOR_AMAX: tl.constexpr, RHT_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT_BF16: tl.constexpr, STEPS_M: tl.constexpr = 1,
):
    """Folds max |x| of STEPS_M tiles (consecutive along M) into the int32 views of the amax buffers
    (zeroed by the caller). Per-tensor and per-column maxima are carried across the steps in
    registers, so one program issues one atomic per output (same-address atomics serialize in L2)."""
    pid_m, pid_k, cols, col_ok = _program_columns(K, BLOCK_K)
    # maxima are carried elementwise across the steps and reduced once at the end (a reduction along
    # M crosses warps through shared memory)
    t = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
    t_rht = tl.zeros([BLOCK_M, BLOCK_K], tl.int32)
    for step in tl.static_range(STEPS_M):
        rows = ((pid_m * STEPS_M + step) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        row_ok, xf = _load_rows(x_ptr, rows, cols, col_ok, M, K)
        abs_bits = _abs_bits(xf)
        if TENSOR_AMAX or COL_MODE == 2:
            t = tl.maximum(t, abs_bits)
        if ROW_MODE == 2:
            r = tl.max(abs_bits, axis=1)
            r = tl.where(r > 0x7F800000, 0x7FC00000, r)
            tl.atomic_max(row_amax_ptr + rows, r, mask=row_ok, sem="relaxed")
        if COL_MODE == 3:
            y = _rht_tile(xf, BLOCK_M, RHT_MASK, x_ptr.dtype.element_ty == tl.bfloat16, DOT_BF16)
            t_rht = tl.maximum(t_rht, _abs_bits(y))
    if TENSOR_AMAX:
        tt = tl.max(tl.max(t, axis=1), axis=0)
        tt = tl.where(tt > 0x7F800000, 0x7FC00000, tt)
        if ROW_MODE == 1:
            tl.atomic_max(row_amax_ptr, tt, sem="relaxed")
        if COL_MODE == 1:
            tl.atomic_max(col_amax_ptr, tt, sem="relaxed")
    if COL_MODE == 3:
        tr = tl.max(tl.max(t_rht, axis=1), axis=0)
        tl.atomic_max(col_amax_ptr, tl.where(tr > 0x7F800000, 0x7FC00000, tr), sem="relaxed")
    if COL_MODE == 2:
        c = tl.max(t, axis=0)
        c = tl.where(c > 0x7F800000, 0x7FC00000, c)
        tl.atomic_max(col_amax_ptr + cols, c, mask=col_ok, sem="relaxed")


@triton.jit
def _pt_scales_kernel(amax_ptr, table_ptr, N, E6: tl.constexpr, BLOCK: tl.constexpr):
    """Per-token global scales, once per row or column instead of once per block (``_cast16_kernel``
    with PT_PRE): amax (N,) -> table (3, N) = [amax, fl(S_enc * fl(1/6)), S_dec], with S_dec replaced
    by -1 where the amax is outside the normal range (``_in_normal_range``), which ``_normal_range_pt``
    reads as the tile's EXACT flag. S_enc and S_dec are those of ``_scale_and_factor_fast``: the same
    ``_global_scales`` (div_rn) and product, op for op, hence the same bits; EXACT tiles recompute
    theirs in fp64 from the amax (plane 0), so their out-of-range values here are never read."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    outer = tl.load(amax_ptr + offs, mask=ok, other=0.0)
    s_enc, s_dec = _global_scales(outer, E6, False)
    tl.store(table_ptr + offs, outer, mask=ok)
    tl.store(table_ptr + (offs + N), s_enc * ONE_SIXTH, mask=ok)
    tl.store(table_ptr + ((offs + N) + N), tl.where(_in_normal_range(outer), s_dec, -1.0), mask=ok)


@triton.jit
def _quantize_blocks(
    v3, bamax, outer, seed, counter,
    STREAM: tl.constexpr, SR: tl.constexpr, FOUR_OVER_SIX: tl.constexpr, E6: tl.constexpr, EXACT: tl.constexpr,
    TREE_2D: tl.constexpr, A: tl.constexpr, B: tl.constexpr, G: tl.constexpr, KB: tl.constexpr,
):
    """Quantize [A, B] blocks of 16 (v3: [A, B, 16] fp32, block amax [A, B], outer amax broadcastable
    to [A, B]); returns (codes [A, B, 16], scale bits [A, B]).

    EXACT: fp64 divisions and per-element 4over6 dequantization (see _normal_range).
    TREE_2D: 0 for 1x16 blocks; 1 when the [A, B] = [BLOCK_M, BLOCK_K/16] rows of 16x16 blocks are
    rowwise (error rows [G, 16, KB]); 2 when [A, B] = [BLOCK_M/16, BLOCK_K] are columnwise ([G, KB, 16]).
    """
    s_enc, s_dec = _global_scales(outer, E6, EXACT)
    if FOUR_OVER_SIX == 0:
        scale = e4m3_encode(_clamp_flt_max(bamax * (s_enc * ONE_SIXTH)))
        enc = _encode_factor(e4m3_decode(scale), s_dec, EXACT)
        scaled = v3 * enc[:, :, None]
        if SR:
            codes = _sr_e2m1(scaled, _random_bytes(seed, counter, STREAM))
        else:
            codes = e2m1_encode_fast(scaled)
    else:
        base = _div(bamax, tl.zeros_like(bamax) + 6.0, EXACT) * s_enc
        MSE: tl.constexpr = FOUR_OVER_SIX == 2
        codes6, scale6, err6 = _candidate_4over6(v3, base, s_dec, outer, False, E6, MSE, EXACT, A, B)
        codes4, scale4, err4 = _candidate_4over6(v3, base, s_dec, outer, True, E6, MSE, EXACT, A, B)
        if TREE_2D == 1:
            # the 16 row errors of a 16x16 block, [G, 16, KB] -> tree over the 16 rows
            e6 = _tree_sum16(tl.permute(tl.reshape(err6, [G, 16, KB]), (0, 2, 1)), G, KB)
            e4 = _tree_sum16(tl.permute(tl.reshape(err4, [G, 16, KB]), (0, 2, 1)), G, KB)
            pick4 = tl.reshape(tl.broadcast_to((e4 < e6)[:, None, :], [G, 16, KB]), [A, B])
        elif TREE_2D == 2:
            # the 16 column errors of a 16x16 block, [G, KB, 16] -> tree over the 16 columns
            e6 = _tree_sum16(tl.reshape(err6, [G, KB, 16]), G, KB)
            e4 = _tree_sum16(tl.reshape(err4, [G, KB, 16]), G, KB)
            pick4 = tl.reshape(tl.broadcast_to((e4 < e6)[:, :, None], [G, KB, 16]), [A, B])
        else:
            pick4 = err4 < err6
        scale = tl.where(pick4, scale4, scale6)
        codes = tl.where(pick4[:, :, None], codes4, codes6)
    return codes, scale


@triton.jit
def _quantize_kernel(
    x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr,
    row_amax_ptr, col_amax_ptr, seed_ptr, seed_value, M, K, offsets_ptr, group_split_ptr, num_splits,
    ROWWISE: tl.constexpr, COLWISE: tl.constexpr, BLOCK_2D: tl.constexpr, PER_TOKEN: tl.constexpr,
    RHT: tl.constexpr, RHT_MASK: tl.constexpr, FOUR_OVER_SIX: tl.constexpr, E6: tl.constexpr,
    SR: tl.constexpr, SEED_FROM_PTR: tl.constexpr, LAYOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT_BF16: tl.constexpr,
    GROUPED: tl.constexpr = False, SPLIT_STEPS: tl.constexpr = 0,
):
    """One [BLOCK_M, BLOCK_K] tile -> its rowwise and columnwise blocks.

    GROUPED (kernels/grouped_quantize.py): x is the concatenation of splits of rows, int64 offsets
    (num_splits + 1,) at offsets_ptr (2^SPLIT_STEPS >= num_splits), each split quantized alone: outer
    amaxes per split (row_amax (num_splits,) or per row; col_amax (num_splits,) or (num_splits, K)),
    columnwise blocks in the bulk layout (split s at K * off_s / 16 blocks, viewed (K, m_s / 16)).
    Block counters (SR) are bulk block indices. Compact scales only. Splits are multiples of 16 rows
    when columnwise or 16x16 output is asked, so no 16-row group straddles two splits, and the split
    of a row is read from group_split (int32, split of each 16-row group, from the amax pass);
    rowwise-only splits have any size and each row searches the offsets (``_split_of``).
    """
    G: tl.constexpr = BLOCK_M // 16  # 16-row groups (columnwise blocks) per tile
    KB: tl.constexpr = BLOCK_K // 16  # 16-column groups (rowwise blocks) per tile
    rows, cols, row_ok, col_ok, pid_m, pid_k, xf = _load_tile(x_ptr, M, K, BLOCK_M, BLOCK_K)
    k_blocks = K // 16
    blks = pid_k * KB + tl.arange(0, KB).to(tl.int64)  # rowwise block index along K
    blk_ok = blks < k_blocks
    groups = pid_m * G + tl.arange(0, G).to(tl.int64)  # columnwise block index along M
    m_blocks = M // 16
    group_ok = groups < m_blocks
    seed = _sr_seed(seed_ptr, seed_value, SR, SEED_FROM_PTR)
    if BLOCK_2D:
        x4 = tl.reshape(xf, [G, 16, KB, 16])
        bamax_2d = tl.max(tl.max(_abs_bits(x4), axis=3), axis=1).to(tl.float32, bitcast=True)  # [G, KB]

    # ---------------------------------------------------------------- rowwise: blocks along K
    if ROWWISE:
        x3 = tl.reshape(xf, [BLOCK_M, KB, 16])
        if BLOCK_2D:
            bamax = tl.reshape(tl.broadcast_to(bamax_2d[:, None, :], [G, 16, KB]), [BLOCK_M, KB])
        else:
            bamax = _block_amax(x3)
        if PER_TOKEN:
            outer = tl.load(row_amax_ptr + rows, mask=row_ok, other=0.0)[:, None]  # [BLOCK_M, 1]
        elif GROUPED:
            if COLWISE or BLOCK_2D:
                row_split = tl.load(group_split_ptr + rows // 16, mask=row_ok, other=0)
            else:
                row_split = _split_of(rows, offsets_ptr, num_splits, SPLIT_STEPS)
            outer = tl.load(row_amax_ptr + row_split)[:, None]
        else:
            outer = tl.zeros([1, 1], tl.float32) + tl.load(row_amax_ptr)
        counter = rows[:, None] * k_blocks + blks[None, :]
        TREE_R: tl.constexpr = BLOCK_2D * 1  # 1: 16x16 row errors are tree-summed
        # Triton 3.6 rejects a runtime `if` that rebinds a name already bound to another shape, so the
        # two directions' results have distinct names (row_*, col_*)
        if _normal_range(outer):
            row_codes, row_scale = _quantize_blocks(x3, bamax, outer, seed, counter, 0, SR, FOUR_OVER_SIX, E6, False, TREE_R, BLOCK_M, KB, G, KB)
        else:
            row_codes, row_scale = _quantize_blocks(x3, bamax, outer, seed, counter, 0, SR, FOUR_OVER_SIX, E6, True, TREE_R, BLOCK_M, KB, G, KB)
        ok = row_ok[:, None] & blk_ok[None, :]
        half = tl.arange(0, 2)[None, None, :]
        word = (rows[:, None] * k_blocks + blks[None, :]) * 2
        tl.store(row_data_ptr + word[:, :, None] + half, _pack_codes(row_codes, BLOCK_M, KB), mask=ok[:, :, None])
        soff = _scale_offsets(rows[:, None], blks[None, :], k_blocks, LAYOUT)
        tl.store(row_scale_ptr + soff, row_scale.to(tl.uint8), mask=ok)

    # ---------------------------------------------------------- columnwise: blocks along M (x^T rows)
    if COLWISE:
        if RHT:
            yf = _rht_tile(xf, BLOCK_M, RHT_MASK, x_ptr.dtype.element_ty == tl.bfloat16, DOT_BF16)
        else:
            yf = xf
        y3 = tl.permute(tl.reshape(yf, [G, 16, BLOCK_K]), (0, 2, 1))  # [G, BLOCK_K, 16]
        if BLOCK_2D:
            bamax = tl.reshape(tl.broadcast_to(bamax_2d[:, :, None], [G, KB, 16]), [G, BLOCK_K])
        else:
            bamax = _block_amax(y3)
        if GROUPED:
            split = tl.load(group_split_ptr + groups, mask=group_ok, other=0)  # [G]
            start = tl.load(offsets_ptr + split)
            split_blocks = (tl.load(offsets_ptr + split + 1) - start) // 16
            # bulk block index: split base K * start / 16, then (column, 16-row group within the split)
            blk2 = (start // 16 * K)[:, None] + cols[None, :] * split_blocks[:, None] + (groups - start // 16)[:, None]
            if PER_TOKEN:
                outer = tl.load(col_amax_ptr + split[:, None] * K + cols[None, :], mask=col_ok[None, :], other=0.0)
            else:
                outer = tl.load(col_amax_ptr + split)[:, None]  # [G, 1]
        else:
            blk2 = cols[None, :] * m_blocks + groups[:, None]
            if PER_TOKEN:
                outer = tl.load(col_amax_ptr + cols, mask=col_ok, other=0.0)[None, :]  # [1, BLOCK_K]
            else:
                outer = tl.zeros([1, 1], tl.float32) + tl.load(col_amax_ptr)
        counter = blk2
        TREE_C: tl.constexpr = BLOCK_2D * 2
        if _normal_range(outer):
            col_codes, col_scale = _quantize_blocks(y3, bamax, outer, seed, counter, 1, SR, FOUR_OVER_SIX, E6, False, TREE_C, G, BLOCK_K, G, KB)
        else:
            col_codes, col_scale = _quantize_blocks(y3, bamax, outer, seed, counter, 1, SR, FOUR_OVER_SIX, E6, True, TREE_C, G, BLOCK_K, G, KB)
        ok = group_ok[:, None] & col_ok[None, :]
        half = tl.arange(0, 2)[None, None, :]
        word = blk2 * 2
        tl.store(col_data_ptr + word[:, :, None] + half, _pack_codes(col_codes, G, BLOCK_K), mask=ok[:, :, None])
        if GROUPED:
            soff = blk2  # compact
        else:
            soff = _scale_offsets(cols[None, :], groups[:, None], m_blocks, LAYOUT)
        tl.store(col_scale_ptr + soff, col_scale.to(tl.uint8), mask=ok)


@triton.jit
def _scale_and_factor(bamax, outer, E6: tl.constexpr, EXACT: tl.constexpr):
    """Block scale (E4M3 bits) and encode factor fl(1 / fl(s * S_dec)) of every block (spec 3.1)."""
    s_enc, s_dec = _global_scales(outer, E6, EXACT)
    scale = e4m3_encode(_clamp_flt_max(bamax * (s_enc * ONE_SIXTH)))
    return scale, _encode_factor(e4m3_decode(scale), s_dec, EXACT)


@triton.jit
def _scale_and_factor_fast(bamax, outer, E6: tl.constexpr):
    """``_scale_and_factor`` for normal-range tiles (``_normal_range``), in about half the instructions
    (this per-block work is a third of the cast kernel's): the E4M3 scale by ``e4m3_encode_fast``
    (bamax * S_enc / 6 >= 0; inf saturates like the clamp; NaN blocks get 0x7F), decoded exactly as
    bits(code << 20) * 2^120 (the 7 magnitude bits at fp32 bits 26..20 read as value * 2^-120;
    multiplication keeps subnormals: no FTZ), and the factor by one correctly rounded division."""
    s_enc, s_dec = _global_scales(outer, E6, False)
    return _scale_and_factor_pre(bamax, s_enc * ONE_SIXTH, s_dec)


@triton.jit
def _scale_and_factor_pre(bamax, s_enc_sixth, s_dec):
    """The per-block part of ``_scale_and_factor_fast`` from the outer amax's fl(S_enc * fl(1/6)) and
    S_dec (computed per block there, read from ``_pt_scales_kernel``'s tables with PT_PRE)."""
    code = e4m3_encode_fast(bamax * s_enc_sixth, 448.0) & 0xFF
    scale = tl.where(bamax != bamax, 0x7F, code)
    scale_f = (code << 20).to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^120
    enc = tl.math.div_rn(tl.full(scale_f.shape, 1.0, tl.float32), scale_f * s_dec)
    return scale, tl.minimum(enc, FLT_MAX)


@triton.jit
def _e2m1_codes(x, enc, rbytes, SR: tl.constexpr, EXACT: tl.constexpr):
    """Codes of x scaled by enc (broadcast): stochastic, NaN-safe (EXACT tiles), or the fast encoder
    (normal-range tiles; the caller zeroes the words of blocks whose factor is NaN)."""
    if SR:
        codes = _sr_e2m1(x * enc, rbytes)
    elif EXACT:
        codes = e2m1_encode_fast(x * enc)
    else:
        codes = e2m1_scale_encode(x, enc)
    return codes


@triton.jit
def _cast16_kernel(
    x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr,
    row_amax_ptr, col_amax_ptr, seed_ptr, seed_value, M, K, offsets_ptr, group_split_ptr, num_splits,
    ROWWISE: tl.constexpr, COLWISE: tl.constexpr, BLOCK_2D: tl.constexpr, PER_TOKEN: tl.constexpr,
    E6: tl.constexpr, SR: tl.constexpr, SEED_FROM_PTR: tl.constexpr, LAYOUT: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUPED: tl.constexpr = False, SPLIT_STEPS: tl.constexpr = 0, RHT: tl.constexpr = False, RHT_MASK: tl.constexpr = 0,
    SR_PAIRS: tl.constexpr = False, REUSE_2D: tl.constexpr = False, PT_PRE: tl.constexpr = False,
):
    """One 16-row group x BLOCK_K columns -> its rowwise and columnwise blocks (recipes without
    4over6; RHT only where ``use_cast16`` says so: ``_rht16_cast16`` on the columnwise side).

    PT_PRE (per-token only, NVFP4LAB_PT_PRECOMPUTE=1): row_amax_ptr / col_amax_ptr point at the
    (3, N) tables of ``_pt_scales_kernel`` (amax, fl(S_enc * fl(1/6)), S_dec or -1 outside the normal
    range) instead of the (N,) amaxes, N = M for rows, K (grouped: num_splits * K) for columns, so
    normal-range tiles load their global scales instead of dividing for them per row and column.

    The same results as ``_quantize_kernel`` (same arguments), laid out for the instruction count:
    with bf16 input, BLOCK_K = 128 and one warp, each thread loads 16 bytes of 8 of the 16 rows (see
    ``r16``): a rowwise block spans two threads, and so does a columnwise block, each thread packing
    one of its two words (one shuffle per block amax; scale math duplicated in the pair).
    """
    KB: tl.constexpr = BLOCK_K // 16
    pid = tl.program_id(0)
    n_k = tl.cdiv(K, BLOCK_K)
    g = (pid // n_k).to(tl.int64)  # 16-row group = columnwise block index along M
    pid_k = pid % n_k
    # tile row i holds row 8 * (i % 2) + i // 2 of the group: with bf16 (16-byte loads of 8 columns,
    # 16 threads along a 128-column tile) the two threads that share a column hold rows 0-7 and 8-15,
    # i.e. exactly one packed word of its columnwise block each
    r16 = (tl.arange(0, 16) % 2) * 8 + tl.arange(0, 16) // 2
    rows = g * 16 + r16.to(tl.int64)
    cols = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
    row_ok = rows < M
    col_ok = cols < K
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    xf = x.to(tl.float32)
    ab = _abs_bits(xf)
    k_blocks = K // 16
    m_blocks = M // 16
    seed = _sr_seed(seed_ptr, seed_value, SR, SEED_FROM_PTR)
    if BLOCK_2D:
        bamax_2d = tl.max(tl.max(tl.reshape(ab, [16, KB, 16]), axis=2), axis=0).to(tl.float32, bitcast=True)  # [KB]

    # ---------------------------------------------------------------- rowwise: blocks along K
    if ROWWISE:
        blks = pid_k * KB + tl.arange(0, KB).to(tl.int64)
        blk_ok = blks < k_blocks
        x3 = tl.reshape(xf, [16, KB, 16])
        if BLOCK_2D:
            bamax = tl.broadcast_to(bamax_2d[None, :], [16, KB])
        else:
            bamax = tl.max(tl.reshape(ab, [16, KB, 16]), axis=2).to(tl.float32, bitcast=True)
        if PER_TOKEN:
            if not PT_PRE:  # PT_PRE: only EXACT tiles read the amax, below
                outer = tl.load(row_amax_ptr + rows, mask=row_ok, other=0.0)[:, None]  # [16, 1]
        elif GROUPED:
            if COLWISE or BLOCK_2D:  # splits of whole 16-row groups: one split for the tile
                outer = tl.zeros([1, 1], tl.float32) + tl.load(row_amax_ptr + tl.load(group_split_ptr + g))
            else:
                outer = tl.load(row_amax_ptr + _split_of(rows, offsets_ptr, num_splits, SPLIT_STEPS))[:, None]
        else:
            outer = tl.zeros([1, 1], tl.float32) + tl.load(row_amax_ptr)
        jj = tl.arange(0, 16)[None, None, :]
        if SR:
            if SR_PAIRS:
                rbytes = _pair_bytes_rows(seed, g, pid_k, k_blocks, KB)
            else:
                counter = rows[:, None] * k_blocks + blks[None, :]
                rbytes = _philox_bytes(seed, counter[:, :, None], 0, jj)
        else:
            rbytes = jj
        if PT_PRE:
            row_enc6, row_sdec, row_normal = _pt_table_load(row_amax_ptr, rows, M, row_ok)
            row_enc6 = row_enc6[:, None]
            row_sdec = row_sdec[:, None]
        else:
            row_normal = _normal_range(outer)
        if row_normal:
            if PT_PRE:
                row_scale, row_enc = _scale_and_factor_pre(bamax, row_enc6, row_sdec)
            else:
                row_scale, row_enc = _scale_and_factor_fast(bamax, outer, E6)
            row_codes = _e2m1_codes(x3, row_enc[:, :, None], rbytes, SR, False)
            row_words = _pack_codes(row_codes, 16, KB)
            if not SR:
                row_words = tl.where((bamax != bamax)[:, :, None], 0, row_words)
        else:
            # (a new name: Triton types a name assigned in a runtime branch by every assignment in it)
            if PT_PRE:
                outer_x = tl.load(row_amax_ptr + rows, mask=row_ok, other=0.0)[:, None]
            else:
                outer_x = outer
            row_scale_x, row_enc_x = _scale_and_factor(bamax, outer_x, E6, True)
            row_codes = _e2m1_codes(x3, row_enc_x[:, :, None], rbytes, SR, True)
            row_words = _pack_codes(row_codes, 16, KB)
            row_scale = row_scale_x
        ok = row_ok[:, None] & blk_ok[None, :]
        word = (rows[:, None] * k_blocks + blks[None, :]) * 2
        tl.store(row_data_ptr + word[:, :, None] + tl.arange(0, 2)[None, None, :], row_words, mask=ok[:, :, None])
        tl.store(row_scale_ptr + _scale_offsets(rows[:, None], blks[None, :], k_blocks, LAYOUT), row_scale.to(tl.uint8), mask=ok)

    # ---------------------------------------------------- columnwise: the 16 rows are one block per column
    if COLWISE:
        if RHT:  # columnwise blocks of bf16(RHT(x^T)) (no 16x16 blocks with RHT: see use_cast16)
            if x_ptr.dtype.element_ty == tl.bfloat16:
                xf = _rht16_cast16(xf, RHT_MASK, BLOCK_K)
            else:
                xf = _rht16_cast16(_bf16_rne(xf), RHT_MASK, BLOCK_K)
            ab = _abs_bits(xf)
        if BLOCK_2D:
            cbamax = tl.reshape(tl.broadcast_to(bamax_2d[:, None], [KB, 16]), [BLOCK_K])
        else:
            cbamax = tl.max(ab, axis=0).to(tl.float32, bitcast=True)  # [BLOCK_K]
        if GROUPED:
            split = tl.load(group_split_ptr + g)
            start = tl.load(offsets_ptr + split)
            split_blocks = (tl.load(offsets_ptr + split + 1) - start) // 16
            blk2 = start // 16 * K + cols * split_blocks + (g - start // 16)  # bulk layout, [BLOCK_K]
            unit_base = start // 16 * K + (g - start // 16) * 2  # SR_PAIRS: the same, in 2x8 units
            unit_stride = split_blocks * 2
            if PER_TOKEN:
                if not PT_PRE:
                    couter = tl.load(col_amax_ptr + split * K + cols, mask=col_ok, other=0.0)
            else:
                couter = tl.zeros([1], tl.float32) + tl.load(col_amax_ptr + split)
        else:
            blk2 = cols * m_blocks + g
            unit_base = g * 2
            unit_stride = m_blocks * 2
            if PER_TOKEN:
                if not PT_PRE:
                    couter = tl.load(col_amax_ptr + cols, mask=col_ok, other=0.0)
            else:
                couter = tl.zeros([1], tl.float32) + tl.load(col_amax_ptr)
        if SR:
            if SR_PAIRS:
                cbytes = _pair_bytes_cols(seed, unit_base, unit_stride, pid_k, BLOCK_K)
            else:
                cbytes = _philox_bytes(seed, blk2[None, :], 1, r16[:, None])
        else:
            cbytes = r16[:, None]
        shift = tl.reshape((r16 % 8) * 4, [8, 2])[:, :, None]
        # 16x16 blocks without SR: an element's columnwise block is its rowwise block, so with the same
        # outer amax (per-tensor weights: always) its code is the rowwise one, already in registers
        # in this very layout ([16, KB, 16] is a view of [16, BLOCK_K]): skip the second encoding.
        # NVFP4LAB_2D_REUSE=0 encodes twice (comparison). (REUSE_2D excludes per-token.)
        if REUSE_2D:
            same_outer = tl.max(tl.reshape(outer, [1]), axis=0) == tl.max(couter, axis=0)
        else:
            same_outer = False
        if PT_PRE:
            if GROUPED:
                col_plane = num_splits * K
                col_idx = split * K + cols
            else:
                col_plane = K
                col_idx = cols
            col_enc6, col_sdec, col_normal = _pt_table_load(col_amax_ptr, col_idx, col_plane, col_ok)
        else:
            col_normal = _normal_range(couter)
        if col_normal:
            if PT_PRE:
                col_scale, col_enc = _scale_and_factor_pre(cbamax, col_enc6, col_sdec)
            else:
                col_scale, col_enc = _scale_and_factor_fast(cbamax, couter, E6)
            if REUSE_2D:
                if same_outer:
                    col_codes = tl.reshape(row_codes, [16, BLOCK_K])
                else:
                    col_codes = _e2m1_codes(xf, col_enc[None, :], cbytes, SR, False)
            else:
                col_codes = _e2m1_codes(xf, col_enc[None, :], cbytes, SR, False)
            col_words = tl.sum(tl.reshape(col_codes, [8, 2, BLOCK_K]) << shift, axis=0)  # [2, BLOCK_K]: word h = rows 8h..8h+7
            if not SR:
                col_words = tl.where((cbamax != cbamax)[None, :], 0, col_words)
        else:
            if PT_PRE:
                couter_x = tl.load(col_amax_ptr + col_idx, mask=col_ok, other=0.0)
            else:
                couter_x = couter
            col_scale_x, col_enc_x = _scale_and_factor(cbamax, couter_x, E6, True)
            if REUSE_2D:
                if same_outer:
                    col_codes_x = tl.reshape(row_codes, [16, BLOCK_K])
                else:
                    col_codes_x = _e2m1_codes(xf, col_enc_x[None, :], cbytes, SR, True)
            else:
                col_codes_x = _e2m1_codes(xf, col_enc_x[None, :], cbytes, SR, True)
            col_words = tl.sum(tl.reshape(col_codes_x, [8, 2, BLOCK_K]) << shift, axis=0)
            col_scale = col_scale_x
        cok = col_ok & ((tl.zeros_like(cols) + g) < m_blocks)
        tl.store(col_data_ptr + blk2[None, :] * 2 + tl.arange(0, 2)[:, None], col_words, mask=cok[None, :])
        if GROUPED:
            csoff = blk2  # compact
        else:
            csoff = _scale_offsets(cols, g, m_blocks, LAYOUT)
        tl.store(col_scale_ptr + csoff, col_scale.to(tl.uint8), mask=cok)


# --------------------------------------------------------------------------------- host side
def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Default tiles (BLOCK_M, BLOCK_K, num_warps) per kernel kind, from `benchmarks/quantize.py --quick
# --tile-sweep` at 8192x8192 bf16 on an H200 (Triton 3.6). Register pressure, not memory, decides:
# smaller per-thread footprints win for every kernel that produces columnwise blocks.
_TILES = {
    "amax": (64, 128, 8), "amax-pertoken": (32, 64, 2), "amax-rht": (32, 128, 4),
    "row": (32, 128, 4), "rowcol": (32, 64, 2), "2d": (32, 64, 2), "pertoken": (32, 64, 2),
    "rht": (16, 128, 4), "rht-sr": (16, 128, 4), "sr": (32, 64, 2), "4over6": (16, 128, 4),
    "cast16": (16, 128, 1),
}
_CAST16_ROW_MAXNREG = 128


def use_cast16(rht: bool, four_over_six, block_2d: bool = False) -> bool:
    """Whether the cast runs ``_cast16_kernel`` rather than the generic ``_quantize_kernel``: recipes
    without 4over6, RHT recipes with 1x16 blocks included (NVFP4LAB_CAST16_RHT=0 sends RHT recipes to
    the generic kernel). NVFP4LAB_QUANT_KERNEL=generic forces the generic kernel (comparison).

    RHT in ``_cast16_kernel`` is ``_rht16_cast16`` (butterflies in registers: 21.6 SASS instructions
    per element for load + RHT + bf16 rounding + store in a probe kernel, no shared memory): on an H200
    at 8192^2 the RHT+row cast takes 245 us against 300 us generic, RHT+SR 609 against 632. An earlier version with the RHT as a [16, 16] x [16, BLOCK_K] dot measured
    slower than the generic kernel on an H200 at 8192^2 (RHT+row cast 357 us against 300 us generic,
    RHT+SR 1200 against 632: the dot's result layout turns the columnwise reductions into shuffles)."""
    if four_over_six or os.environ.get("NVFP4LAB_QUANT_KERNEL", "auto") == "generic":
        return False
    return not rht or (not block_2d and os.environ.get("NVFP4LAB_CAST16_RHT", "1") != "0")


def cast16_tile(k: int, kind: str = "cast16") -> tuple[int, int]:
    """(BLOCK_K, num_warps) of ``_cast16_kernel``; NVFP4LAB_CAST16_TILE="BKxWARPS" overrides (tuning)."""
    env = os.environ.get("NVFP4LAB_CAST16_TILE")
    if env:
        bk, warps = (int(v) for v in env.lower().split("x"))
    else:
        _, bk, warps = _TILES[kind]
    return max(16, min(bk, triton.next_power_of_2(max(k, 1)))), warps


def cast16_launch_options(rowwise: bool, columnwise: bool) -> dict:
    """Launch options of ``_cast16_kernel``: a ptxas register cap (``maxnreg``) for rowwise-only casts.

    Uncapped, ptxas gives the one-warp programs 137-255 registers, i.e. 8-14 warps per SM, too few
    to hide the load latency. A rowwise-only cast fits 128 registers without spilling on its
    normal-range path (the rare EXACT path spills): H200, 8192^2 bf16, cast 99 -> 75 us. Casts with a
    columnwise output spill at any cap below ~180 and ran slower capped (193 -> 217-320 us), so they
    stay uncapped. NVFP4LAB_CAST16_MAXNREG overrides (0: no cap)."""
    env = os.environ.get("NVFP4LAB_CAST16_MAXNREG")
    cap = int(env) if env is not None else (_CAST16_ROW_MAXNREG if rowwise and not columnwise else 0)
    return {"maxnreg": cap} if cap and not _interpreting() else {}


def cast16_meta(rowwise, columnwise, block_2d, per_token, e4m3_max, stochastic_rounding, seed_from_ptr,
                scale_layout, bk, rht_sign_mask: int = -1) -> dict:
    """The constexpr arguments of ``_cast16_kernel`` (rht_sign_mask < 0: no RHT). REUSE_2D (16x16
    row+col without SR; NVFP4LAB_2D_REUSE=0 turns it off): the columnwise copy takes the rowwise codes
    when both outer amaxes are equal, instead of encoding every element a second time."""
    return dict(
        ROWWISE=rowwise, COLWISE=columnwise, BLOCK_2D=block_2d, PER_TOKEN=per_token, E6=6.0 * e4m3_max,
        SR=stochastic_rounding, SEED_FROM_PTR=seed_from_ptr, LAYOUT=_LAYOUT_CODES[scale_layout], BLOCK_K=bk,
        GROUPED=False, SPLIT_STEPS=0, RHT=rht_sign_mask >= 0 and columnwise, RHT_MASK=max(rht_sign_mask, 0),
        SR_PAIRS=stochastic_rounding and sr_variant() == "pairs", PT_PRE=per_token and pt_precompute(),
        REUSE_2D=(block_2d and rowwise and columnwise and not stochastic_rounding and not per_token
                  and rht_sign_mask < 0 and os.environ.get("NVFP4LAB_2D_REUSE", "1") != "0"),
    )


# Per-token global scales of _cast16_kernel: "0" computes S_enc, S_dec from the row / column amax in
# every program (two correctly rounded divisions per row and per column of each tile, the per-token
# recipe's extra cost over per tensor); "1" has the launcher compute them once per row and column
# (``_pt_scales_kernel``) for the cast to load (PT_PRE). Same bits either way. H200, 8192^2 bf16 row+col,
# same run (benchmarks/quantize.py --variants): cast 220.0 -> 196.7 us, full op 267.4 -> 242.2 us (per
# tensor: 235.7), so "1" is the default. NVFP4LAB_PT_PRECOMPUTE overrides, read at every launch.
PT_PRECOMPUTE = "1"


def pt_precompute() -> bool:
    """Whether per-token casts on ``_cast16_kernel`` load precomputed global scales (PT_PRE):
    NVFP4LAB_PT_PRECOMPUTE, else ``PT_PRECOMPUTE``."""
    v = os.environ.get("NVFP4LAB_PT_PRECOMPUTE", "") or PT_PRECOMPUTE
    if v not in ("0", "1"):
        raise ValueError(f"NVFP4LAB_PT_PRECOMPUTE={v!r}: expected '0' or '1'")
    return v == "1"


_PT_SCALES_BLOCK = 1024


def pt_scales_table(amax: torch.Tensor, n: int, e6: float) -> torch.Tensor:
    """The (3, n) fp32 table [amax, fl(S_enc * fl(1/6)), S_dec or -1] of per-token amaxes (n,) that
    ``_cast16_kernel`` reads with PT_PRE (``_pt_scales_kernel``; one tiny launch, no host sync)."""
    if amax.numel() != n:
        raise ValueError(f"per-token amax has {amax.numel()} values, expected {n}")
    table = torch.empty((3, n), dtype=torch.float32, device=amax.device)
    if n:
        _pt_scales_kernel[(triton.cdiv(n, _PT_SCALES_BLOCK),)](
            amax, table, n, E6=e6, BLOCK=_PT_SCALES_BLOCK, num_warps=4, enable_fp_fusion=False)
    return table


# SR bit mapping of _cast16_kernel: "pairs" (one Philox block per 2x8 unit, see _pair_bytes_rows; timed
# 1.07x faster on an H200) or "blocks" (one per 16-element block, as the generic kernel); NVFP4LAB_SR_VARIANT
# overrides, read at every launch.
SR_VARIANT = "pairs"
_SR_VARIANTS = ("blocks", "pairs")


def sr_variant() -> str:
    """The SR bit mapping ``_cast16_kernel`` uses now: NVFP4LAB_SR_VARIANT, else ``SR_VARIANT``."""
    v = os.environ.get("NVFP4LAB_SR_VARIANT", "") or SR_VARIANT
    if v not in _SR_VARIANTS:
        raise ValueError(f"NVFP4LAB_SR_VARIANT={v!r}: expected one of {_SR_VARIANTS}")
    return v


def cast_kind(rowwise, columnwise, block_2d, per_token, rht, sr, four_over_six) -> str:
    """Key of _TILES for a cast kernel."""
    if four_over_six:
        return "4over6"
    if not columnwise:
        return "row"
    if rht:
        return "rht-sr" if sr else "rht"
    if sr:
        return "sr"
    if block_2d:
        return "2d"
    return "pertoken" if per_token else "rowcol"


def _tile(m: int, k: int, *, rht: bool, four_over_six: bool, kind: Optional[str] = None) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_K, num_warps). NVFP4LAB_QUANT_TILE="BMxBKxWARPS" overrides (tuning)."""
    env = os.environ.get("NVFP4LAB_QUANT_TILE")
    if env:
        bm, bk, warps = (int(v) for v in env.lower().split("x"))
    elif kind is not None:
        bm, bk, warps = _TILES[kind]
    elif four_over_six:
        bm, bk, warps = _TILES["4over6"]
    else:
        bm, bk, warps = _TILES["rowcol"]
    if rht:
        bm = min(bm, 64)  # the block-diagonal RHT dot costs BLOCK_M MACs per element
    bm = max(16, min(bm, triton.next_power_of_2(max(m, 1))))
    bk = max(16, min(bk, triton.next_power_of_2(max(k, 1))))
    return bm, bk, warps


# Tests set this so that every byte the kernel should write but does not shows up as 0xFF.
POISON_OUTPUTS = False


def _uninitialized(shape, device) -> torch.Tensor:
    out = torch.empty(shape, dtype=torch.uint8, device=device)
    return out.fill_(0xFF) if POISON_OUTPUTS else out


def _scale_buffer(rows: int, cols: int, layout: str, device) -> torch.Tensor:
    """Scale output for an (rows, cols) compact matrix; zero-filled only where padding exists."""
    shape = _scale_shape(rows, cols, layout)
    if shape == (rows, cols):
        return _uninitialized(shape, device)
    return torch.zeros(shape, dtype=torch.uint8, device=device)


def _scale_shape(rows: int, cols: int, layout: str) -> tuple[int, int]:
    return (rows, cols) if layout == "compact" else (roundup(rows, 128), roundup(cols, 4))


def amax_steps(m: int, block_m: int, *, per_token: bool) -> int:
    """Tiles (consecutive along M) per program of the amax passes. 4 for per-tensor amaxes, 1 with
    per-token (H200, 8192^2: 49.5 vs 51.5 us per tensor; 87 vs 70 us per token).
    NVFP4LAB_AMAX_STEPS overrides (tuning)."""
    steps = int(os.environ.get("NVFP4LAB_AMAX_STEPS", 1 if per_token else 4))
    return max(1, min(steps, triton.cdiv(m, block_m)))


@torch.library.custom_op("nvfp4lab::nvfp4_amax", mutates_args=())
def nvfp4_amax(x: torch.Tensor, row_mode: int, col_mode: int, rht_sign_mask: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Outer amax of x (M, K) for the two outputs, as fp32 device tensors (no host sync).

    row_mode: 0 none (returns a (0,) tensor), 1 per tensor (1,), 2 per row (M,).
    col_mode: 0 none, 1 per tensor (1,), 2 per column (K,), 3 per tensor of bf16(RHT(x^T)) (1,).
    """
    m, k = x.shape
    sizes = {AMAX_NONE: 0, AMAX_TENSOR: 1, AMAX_TENSOR_RHT: 1}
    row_amax = torch.zeros(m if row_mode == AMAX_PER_TOKEN else sizes[row_mode], dtype=torch.float32, device=x.device)
    col_amax = torch.zeros(k if col_mode == AMAX_PER_TOKEN else sizes[col_mode], dtype=torch.float32, device=x.device)
    if x.numel() == 0 or (row_mode == AMAX_NONE and col_mode == AMAX_NONE):
        return row_amax, col_amax
    amax_kind = "amax-rht" if col_mode == AMAX_TENSOR_RHT else ("amax-pertoken" if AMAX_PER_TOKEN in (row_mode, col_mode) else "amax")
    bm, bk, warps = _tile(m, k, rht=col_mode == AMAX_TENSOR_RHT, four_over_six=False, kind=amax_kind)
    steps = amax_steps(m, bm, per_token=AMAX_PER_TOKEN in (row_mode, col_mode))
    grid = (triton.cdiv(m, bm * steps) * triton.cdiv(k, bk),)
    # absent buffers get a valid int32 pointer that is never touched
    row_view = row_amax.view(torch.int32) if row_mode else col_amax.view(torch.int32)
    col_view = col_amax.view(torch.int32) if col_mode else row_amax.view(torch.int32)
    _amax_kernel[grid](
        x, row_view, col_view, m, k,
        ROW_MODE=row_mode, COL_MODE=col_mode, TENSOR_AMAX=AMAX_TENSOR in (row_mode, col_mode), RHT_MASK=rht_sign_mask,
        BLOCK_M=bm, BLOCK_K=bk, DOT_BF16=not _interpreting(), STEPS_M=steps,
        num_warps=warps, enable_fp_fusion=False,
    )
    return row_amax, col_amax


@nvfp4_amax.register_fake
def _nvfp4_amax_fake(x, row_mode, col_mode, rht_sign_mask):
    m, k = x.shape
    sizes = {AMAX_NONE: 0, AMAX_TENSOR: 1, AMAX_TENSOR_RHT: 1}
    row = x.new_empty(m if row_mode == AMAX_PER_TOKEN else sizes[row_mode], dtype=torch.float32)
    col = x.new_empty(k if col_mode == AMAX_PER_TOKEN else sizes[col_mode], dtype=torch.float32)
    return row, col


def _cast_shapes(m, k, rowwise, columnwise, layout):
    shapes = []
    shapes.append((m, k // 2) if rowwise else (0,))
    shapes.append(_scale_shape(m, k // 16, layout) if rowwise else (0,))
    shapes.append((k, m // 2) if columnwise else (0,))
    shapes.append(_scale_shape(k, m // 16, layout) if columnwise else (0,))
    return shapes


def _cast_meta(rowwise, columnwise, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max,
               stochastic_rounding, seed_from_ptr, scale_layout, bm, bk) -> dict:
    """The constexpr arguments of ``_quantize_kernel`` (shared with the sm_90 compile test)."""
    return dict(
        ROWWISE=rowwise, COLWISE=columnwise, BLOCK_2D=block_2d, PER_TOKEN=per_token,
        RHT=rht_sign_mask >= 0, RHT_MASK=max(rht_sign_mask, 0), FOUR_OVER_SIX=four_over_six, E6=6.0 * e4m3_max,
        SR=stochastic_rounding, SEED_FROM_PTR=seed_from_ptr, LAYOUT=_LAYOUT_CODES[scale_layout],
        BLOCK_M=bm, BLOCK_K=bk, DOT_BF16=not _interpreting(), GROUPED=False, SPLIT_STEPS=0,
    )


def config_meta(config: NVFP4QuantConfig, m: int = 8192, k: int = 8192) -> dict:
    """_cast_meta for a recipe at an (m, k) input with the default tile (seed read from memory)."""
    kind = cast_kind(config.rowwise, config.columnwise, config.block == "16x16", config.per_token, config.rht,
                     config.stochastic_rounding, config.four_over_six is not None)
    bm, bk, _ = _tile(m, k, rht=config.rht and config.columnwise, four_over_six=config.four_over_six is not None, kind=kind)
    return _cast_meta(config.rowwise, config.columnwise, config.block == "16x16", config.per_token,
                      config.rht_sign_mask if config.rht else -1, _FOUR_OVER_SIX_CODES[config.four_over_six],
                      config.e4m3_max, config.stochastic_rounding, config.stochastic_rounding, config.scale_layout, bm, bk)


def split_cast(rowwise: bool, columnwise: bool, block_2d: bool, rht: bool, stochastic_rounding: bool,
               four_over_six, grouped: bool) -> bool:
    """Whether a row+col cast on ``_cast16_kernel`` runs as two launches (rowwise only, then columnwise
    only) instead of one: same bits (each output's codes and random bytes depend only on its own
    position), and with SR or RHT the two lighter kernels are faster than the one that does both:
    H200, 8192^2 bf16, cast alone: SR grad 235.2 -> 205.4 us, RHT + SR grad 340.7 -> 316.5, RHT input
    283.1 -> 274.5 (those two with the RHT amax pass), while plain 1x16 per-token (175.2 vs 175.7) and
    16x16 (123.9 vs 162.5: the columnwise copy reuses the rowwise codes) keep one launch.
    NVFP4LAB_CAST_SPLIT=0 never splits, =1 splits every row+col cast16 cast (comparison)."""
    if not (rowwise and columnwise) or grouped or not use_cast16(rht, four_over_six, block_2d):
        return False
    env = os.environ.get("NVFP4LAB_CAST_SPLIT", "auto")
    if env in ("0", "1"):
        return env == "1"
    return (stochastic_rounding or rht) and not block_2d


def launch_cast(x, outputs, row_amax, col_amax, seed_tensor, seed, rowwise, columnwise, block_2d, per_token,
                rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding, scale_layout,
                offsets=None, num_splits=0, split_steps=0, group_split=None) -> None:
    """Launch the cast kernel of a recipe (``use_cast16`` picks which) into ``outputs`` = (row_data,
    row_scale, col_data, col_scale); ``offsets`` (int64 split row offsets) with ``group_split`` (the grouped
    amax pass's int32 split of each 16-row group) makes it the grouped cast."""
    m, k = x.shape
    rht = rht_sign_mask >= 0
    if split_cast(rowwise, columnwise, block_2d, rht, stochastic_rounding, four_over_six, offsets is not None):
        for row_only in (True, False):
            launch_cast(x, outputs, row_amax if row_only else None, None if row_only else col_amax, seed_tensor,
                        seed, row_only, not row_only, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max,
                        stochastic_rounding, scale_layout)
        return
    if use_cast16(rht, four_over_six, block_2d):
        bk, warps = cast16_tile(k)
        kernel, grid = _cast16_kernel, (triton.cdiv(m, 16) * triton.cdiv(k, bk),)
        meta = cast16_meta(rowwise, columnwise, block_2d, per_token, e4m3_max, stochastic_rounding,
                           seed_tensor is not None, scale_layout, bk, rht_sign_mask)
        meta.update(cast16_launch_options(rowwise, columnwise))
        if meta["PT_PRE"]:  # the kernel then reads the tables through the amax pointers
            if rowwise:
                row_amax = pt_scales_table(row_amax, m, meta["E6"])
            if columnwise:
                col_amax = pt_scales_table(col_amax, k * num_splits if offsets is not None else k, meta["E6"])
    else:
        bm, bk, warps = _tile(m, k, rht=rht and columnwise, four_over_six=four_over_six != 0,
                              kind=cast_kind(rowwise, columnwise, block_2d, per_token, rht, stochastic_rounding, four_over_six))
        kernel, grid = _quantize_kernel, (triton.cdiv(m, bm) * triton.cdiv(k, bk),)
        meta = _cast_meta(rowwise, columnwise, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max,
                          stochastic_rounding, seed_tensor is not None, scale_layout, bm, bk)
    if offsets is not None:
        meta.update(GROUPED=True, SPLIT_STEPS=split_steps)
    row_data, row_scale, col_data, col_scale = outputs
    any_f32 = row_amax if row_amax is not None else col_amax
    kernel[grid](
        x,
        row_data.view(torch.int32) if rowwise else col_data.view(torch.int32),
        row_scale if rowwise else col_scale,
        col_data.view(torch.int32) if columnwise else row_data.view(torch.int32),
        col_scale if columnwise else row_scale,
        row_amax if row_amax is not None else any_f32,
        col_amax if col_amax is not None else any_f32,
        seed_tensor if seed_tensor is not None else x,
        seed,
        m, k, offsets if offsets is not None else x, group_split if group_split is not None else x, num_splits, **meta, num_warps=warps, enable_fp_fusion=False,
    )


@torch.library.custom_op("nvfp4lab::nvfp4_quantize_cast", mutates_args=())
def nvfp4_quantize_cast(
    x: torch.Tensor,
    row_amax: Optional[torch.Tensor],
    col_amax: Optional[torch.Tensor],
    seed_tensor: Optional[torch.Tensor],
    seed: int,
    rowwise: bool,
    columnwise: bool,
    block_2d: bool,
    per_token: bool,
    rht_sign_mask: int,
    four_over_six: int,
    e4m3_max: float,
    stochastic_rounding: bool,
    scale_layout: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize x (M, K) with the given outer amaxes; returns (row_data, row_scale, col_data, col_scale).

    Absent outputs are (0,) uint8 tensors. rht_sign_mask < 0 means no RHT. four_over_six: 0 off,
    1 MAE, 2 MSE. stochastic_rounding takes ``seed_tensor`` (int64 (1,) on x.device, read inside the
    kernel) when given, else the int ``seed``.
    """
    m, k = x.shape
    dev = x.device
    absent = torch.empty(0, dtype=torch.uint8, device=dev)
    row_data = _uninitialized((m, k // 2), dev) if rowwise else absent
    row_scale = _scale_buffer(m, k // 16, scale_layout, dev) if rowwise else absent.clone()
    col_data = _uninitialized((k, m // 2), dev) if columnwise else absent.clone()
    col_scale = _scale_buffer(k, m // 16, scale_layout, dev) if columnwise else absent.clone()
    if x.numel() == 0:
        return row_data, row_scale, col_data, col_scale
    launch_cast(x, (row_data, row_scale, col_data, col_scale), row_amax, col_amax, seed_tensor, seed, rowwise,
                columnwise, block_2d, per_token, rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding,
                scale_layout)
    return row_data, row_scale, col_data, col_scale


@nvfp4_quantize_cast.register_fake
def _nvfp4_quantize_cast_fake(x, row_amax, col_amax, seed_tensor, seed, rowwise, columnwise, block_2d, per_token,
                              rht_sign_mask, four_over_six, e4m3_max, stochastic_rounding, scale_layout):
    m, k = x.shape
    return tuple(x.new_empty(shape, dtype=torch.uint8) for shape in _cast_shapes(m, k, rowwise, columnwise, scale_layout))


# ------------------------------------------------------------------------------- entry point
def _amax_modes(config: NVFP4QuantConfig, amax, columnwise_amax) -> tuple[int, int]:
    """Which outer amaxes the amax pass must compute (the reference's rules in ref.nvfp4.quantize)."""
    row_mode = col_mode = AMAX_NONE
    if config.rowwise and amax is None:
        row_mode = AMAX_PER_TOKEN if config.per_token else AMAX_TENSOR
    if config.columnwise and columnwise_amax is None:
        if amax is not None and not config.rht and not config.per_token:
            col_mode = AMAX_NONE  # the supplied per-tensor amax serves both outputs
        elif config.rht:
            col_mode = AMAX_TENSOR_RHT
        else:
            col_mode = AMAX_PER_TOKEN if config.per_token else AMAX_TENSOR
    return row_mode, col_mode


def draw_seed(device, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """An int64 (1,) seed on ``device`` from torch's RNG (graph-safe: drawn by a kernel, never read on the host)."""
    if generator is None:
        return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device, generator=generator)


def quantize(
    x2d: torch.Tensor,
    config: NVFP4QuantConfig,
    *,
    amax: Optional[torch.Tensor] = None,
    columnwise_amax: Optional[torch.Tensor] = None,
    seed: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
) -> NVFP4Tensor:
    """Triton NVFP4 quantization of a contiguous (M, K) tensor; the same fields as ``ref.nvfp4.quantize``.

    Stochastic rounding uses ``seed`` (an int) when given, else an int64 seed drawn on x.device from
    ``generator`` (torch's default generator when None), which the kernel reads from device memory.
    """
    m, k = x2d.shape
    row_mode, col_mode = _amax_modes(config, amax, columnwise_amax)
    row_computed, col_computed = nvfp4_amax(x2d, row_mode, col_mode, config.rht_sign_mask if config.rht else 0)

    row_amax = None
    if config.rowwise:
        row_amax = amax.clone() if amax is not None else row_computed
    col_amax = None
    if config.columnwise:
        if columnwise_amax is not None:
            col_amax = columnwise_amax.clone()
        elif col_mode == AMAX_NONE:
            col_amax = amax.clone()
        else:
            col_amax = col_computed

    seed_tensor, seed_int = None, 0
    if config.stochastic_rounding:
        if seed is not None:
            seed_int = int(seed) % (1 << 63)
        else:
            seed_tensor = draw_seed(x2d.device, generator)
    row_data, row_scale, col_data, col_scale = nvfp4_quantize_cast(
        x2d, row_amax, col_amax, seed_tensor, seed_int,
        config.rowwise, config.columnwise, config.block == "16x16", config.per_token,
        config.rht_sign_mask if config.rht else -1, _FOUR_OVER_SIX_CODES[config.four_over_six],
        config.e4m3_max, config.stochastic_rounding, config.scale_layout,
    )
    out = NVFP4Tensor(shape=x2d.shape, dtype=x2d.dtype, config=config)
    if config.rowwise:
        out.rowwise_data, out.rowwise_scale, out.rowwise_amax = row_data, row_scale, row_amax
    if config.columnwise:
        out.columnwise_data, out.columnwise_scale, out.columnwise_amax = col_data, col_scale, col_amax
    return out
