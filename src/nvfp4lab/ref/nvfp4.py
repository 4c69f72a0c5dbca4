"""NVFP4 reference numerics (spec sections 3-7, 9-11): the single definition of every recipe's bits.

All arithmetic is fp32 and each step below is one IEEE operation, in the order TE's kernels and
TE's pure-PyTorch reference (``reference_nvfp4.py`` @ d0067d0da) perform it.

Quantization of a matrix Y (R, C) along its rows, with an outer amax per tensor or per row:

    S_enc = fl(6E / amax), clamped to FLT_MAX; 1 when amax == 0 or S_enc == 0     (E = 448 or 256)
    S_dec = fl(1 / S_enc)
    plain:   s = e4m3(min(fl(bamax * fl(S_enc * fl(1/6))), FLT_MAX))
    4over6:  base = fl(fl(bamax / 6) * S_enc); s6 = e4m3(min(base, 448)); s4 = e4m3(min(fl(1.5*base), 448))
    enc   = min(fl(1 / fl(float(s) * S_dec)), FLT_MAX)            (s == 0 -> FLT_MAX)
    code  = E2M1_RNE_satfinite(fl(y * enc))                        (or stochastic rounding)

Rowwise output quantizes x (M, K); columnwise output quantizes x^T (K, M) (after the RHT when enabled).

PR 3045's per-token numerics (``numerics="te_pr3045"``, shared/golden_pr3045/README.md), per row:

    S_enc = fl(2688 / max(amax, fl(1e-12))), clamped to FLT_MAX; 1 when the quotient is 0
    s     = e4m3(min(fl(bamax * fl(S_enc * fl(1/6))), FLT_MAX))      (as above)
    enc   = min(fl(S_enc / s), FLT_MAX); 0 where s == 0                (one correctly rounded division)
    code  = E2M1_RNE_satfinite(fl(y * enc))                           (or stochastic rounding)

The stored amax is the raw max |y|. Its RHT (``rht`` with these numerics) is the fp32 transform of
:func:`nvfp4lab.rht.apply_rht_fp32`; its 2D weight is TE main's per-tensor 16x16 cast with the scalar
amax copied into the (M,) and (K,) vectors. Its dequantize is ``fl(q * fl(s * fl(amax / 2688)))`` with the
raw stored amax (also where the encoder floored it: PR 3045's own inconsistency, kept).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..rht import DEFAULT_RHT_SIGN_MASK, apply_rht, apply_rht_fp32, inverse_rht, rht_matrix, saturate_finite  # noqa: F401  (the RHT lives in nvfp4lab.rht)
from ..tensors import GroupedNVFP4Tensor, NVFP4Tensor
from . import codecs
from .codecs import FLT_MAX
from .swizzle import apply_scale_layout, compact_scales

_F32 = torch.float32
_ONE_SIXTH = torch.tensor(1.0 / 6.0, dtype=_F32).item()  # fl(1/6) = 0.16666667163...
_PR3045_AMAX_FLOOR = torch.tensor(1e-12, dtype=_F32).item()  # fl(1e-12), PR 3045's floor of amax in S_enc


def _f32(v, device) -> torch.Tensor:
    return torch.tensor(v, dtype=_F32, device=device)


# ---------------------------------------------------------------------------------- global scale
def global_encode_scale(amax: torch.Tensor, e4m3_max: float = 448.0) -> torch.Tensor:
    """S_enc = min(fl(6E / amax), FLT_MAX); 1 where amax == 0 or the quotient is 0 (amax = inf)."""
    amax = amax.to(_F32)
    s_enc = _f32(6.0 * e4m3_max, amax.device) / amax
    s_enc = torch.clamp(s_enc, max=FLT_MAX)
    return torch.where((amax == 0) | (s_enc == 0), torch.ones_like(s_enc), s_enc)


def global_encode_scale_pr3045(amax: torch.Tensor) -> torch.Tensor:
    """PR 3045: S_enc = min(fl(2688 / max(amax, fl(1e-12))), FLT_MAX); 1 where the quotient is 0."""
    amax = amax.to(_F32)
    floored = torch.maximum(amax, _f32(_PR3045_AMAX_FLOOR, amax.device))
    s_enc = torch.clamp(_f32(6.0 * 448.0, amax.device) / floored, max=FLT_MAX)
    return torch.where(s_enc == 0, torch.ones_like(s_enc), s_enc)


# ------------------------------------------------------------------------------ rounding to E2M1
def stochastic_round_e2m1(y: torch.Tensor, rand_bytes: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding of fp32 ``y`` onto the E2M1 grid with 8 random bits per element.

    TE's software rule (spec section 7): a = |y|; step(a) = 0.5 below 2, 1 below 4, else 2;
    t = a + (r/256)*step(a); q = min(floor(t/step(t))*step(t), 6) with the step re-derived from t;
    the result carries y's sign. P(round up) = (a - lo)/step in 1/256 increments; NaN -> +6.
    Returns E2M1 codes.
    """
    def step(a):
        return torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(_F32)

    a = y.abs()
    u = rand_bytes.to(_F32) / 256.0
    t = a + u * step(a)
    st = step(t)
    q = torch.clamp(torch.floor(t / st) * st, max=6.0)
    q = torch.where(torch.isnan(y), torch.full_like(q, 6.0), torch.where(y < 0, -q, q))
    return codecs.e2m1_encode(q)


def _block_amax(y: torch.Tensor, block_rows: int) -> torch.Tensor:
    """max |y| over (block_rows x 16) blocks, repeated on each of the block's rows: (R, C/16)."""
    rows, cols = y.shape
    bamax = y.abs().reshape(rows // block_rows, block_rows, cols // 16, 16).amax(dim=(1, 3))
    return bamax.repeat_interleave(block_rows, dim=0)


def _expand(per_block: torch.Tensor) -> torch.Tensor:
    return per_block.repeat_interleave(16, dim=1)


def _encode_scale_factor(scale_f32: torch.Tensor, s_dec: torch.Tensor) -> torch.Tensor:
    """enc = min(fl(1 / fl(s * S_dec)), FLT_MAX); a zero scale gives FLT_MAX."""
    return torch.clamp(1.0 / (scale_f32 * s_dec), max=FLT_MAX)


def _four_over_six_error(y, codes, scale_f32, amax, e4m3_max, err_mode, block_rows):
    """Per-block error of one 4over6 candidate: (R/block_rows, C/16) fp32.

    Each element's dequantized value is fl(fl(fl(q*s) * amax) / (6E)); the 16 |d| (MAE) or d*d (MSE)
    terms of a block row are summed sequentially in fp32; for 16x16 blocks the 16 row sums are then
    tree-summed as a warp shuffle-down reduction (offsets 8, 4, 2, 1).
    """
    rows, cols = y.shape
    q = codecs.e2m1_decode(codes)
    val = ((q * _expand(scale_f32)) * amax) / _f32(6.0 * e4m3_max, y.device)
    d = val - y
    term = d.abs() if err_mode == "mae" else d * d
    term = term.reshape(rows, cols // 16, 16)
    row_err = torch.zeros(rows, cols // 16, dtype=_F32, device=y.device)
    for i in range(16):
        row_err = row_err + term[:, :, i]
    if block_rows == 1:
        return row_err
    parts = row_err.reshape(rows // 16, 16, cols // 16)
    width = 16
    while width > 1:
        width //= 2
        parts = parts[:, :width] + parts[:, width : 2 * width]
    return parts[:, 0]


def quantize_rows(
    y: torch.Tensor,
    amax: torch.Tensor,
    *,
    block_rows: int = 1,
    e4m3_max: float = 448.0,
    four_over_six: Optional[str] = None,
    rand_bytes: Optional[torch.Tensor] = None,
    numerics: str = "te_main",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``y`` (R, C) along rows in blocks of ``block_rows`` x 16.

    ``amax`` is the outer amax: shape (1,) per tensor or (R,) per row. Returns (codes (R, C) uint8,
    scale (R, C/16) uint8 E4M3 bits). ``rand_bytes`` (R, C) enables stochastic rounding.
    ``numerics="te_pr3045"``: PR 3045's global scale and encode factor (module docstring; E = 448).
    """
    y = y.to(_F32)
    amax_col = amax.to(_F32).reshape(-1, 1)
    pr3045 = numerics == "te_pr3045"
    s_enc = global_encode_scale_pr3045(amax_col) if pr3045 else global_encode_scale(amax_col, e4m3_max)
    s_dec = 1.0 / s_enc
    bamax = _block_amax(y, block_rows)

    if four_over_six is None:
        mult = s_enc * _ONE_SIXTH
        scale = codecs.e4m3_encode(torch.clamp(bamax * mult, max=FLT_MAX))
        scale_f32 = codecs.e4m3_decode(scale)
        if pr3045:  # one correctly rounded division; a zero scale encodes its block as zeros
            enc = torch.where(scale_f32 == 0, torch.zeros_like(scale_f32), torch.clamp(s_enc / scale_f32, max=FLT_MAX))
        else:
            enc = _encode_scale_factor(scale_f32, s_dec)
        scaled = y * _expand(enc)
        if rand_bytes is not None:
            return stochastic_round_e2m1(scaled, rand_bytes), scale
        return codecs.e2m1_encode(scaled), scale

    # fl(bamax / 6): a true division. A Python-float divisor would let CUDA torch multiply by fl(1/6)
    # instead (its CPU-scalar shortcut), which rounds differently.
    base = torch.div(bamax, torch.full_like(bamax, 6.0)) * s_enc
    candidates = []
    for expansion in (1.0, 1.5):  # map-to-6 first: it wins ties
        cand = base if expansion == 1.0 else base * 1.5
        scale = codecs.e4m3_encode(torch.clamp(cand, max=codecs.E4M3_MAX))
        scale_f32 = codecs.e4m3_decode(scale)
        codes = codecs.e2m1_encode(y * _expand(_encode_scale_factor(scale_f32, s_dec)))
        err = _four_over_six_error(y, codes, scale_f32, amax_col, e4m3_max, four_over_six, block_rows)
        candidates.append((codes, scale, err))
    (codes6, scale6, err6), (codes4, scale4, err4) = candidates
    pick4_block = err4 < err6
    pick4 = pick4_block.repeat_interleave(block_rows, dim=0)
    scale = torch.where(pick4, scale4, scale6)
    codes = torch.where(_expand(pick4), codes4, codes6)
    return codes, scale


# ------------------------------------------------------------------------------------ dequantize
_RESCALE = 2.0**32  # dequantize factors of amax > FLT_MAX / 448: amax / 2^32 first, the factor times 2^32 after


def dequantize_factor(scale_f32: torch.Tensor, amax: torch.Tensor, e4m3_max: float) -> torch.Tensor:
    """Per-block factor fl(fl(float(s) * amax) * fl(1/(6E))) (``amax`` broadcast against the scales).

    Where fl(s * amax) overflows for a finite amax (amax > FLT_MAX / 448; the factor itself is at most
    amax / 6), the same two roundings run on amax / 2^32 and the factor is multiplied back by 2^32: the
    value TE's order gives with an unbounded exponent range. Everywhere else it is TE's order.
    """
    rcp = _f32(1.0 / (6.0 * e4m3_max), scale_f32.device)
    prod = scale_f32 * amax
    overflow = torch.isinf(prod) & torch.isfinite(amax)
    rescaled = ((scale_f32 * (amax * (1.0 / _RESCALE))) * rcp) * _RESCALE
    return torch.where(overflow, rescaled, prod * rcp)


def dequantize_rows(
    codes_packed: torch.Tensor,
    scale: torch.Tensor,
    amax: torch.Tensor,
    *,
    e4m3_max: float = 448.0,
    out_dtype: torch.dtype = torch.float32,
    numerics: str = "te_main",
) -> torch.Tensor:
    """(R, C/2) packed codes + compact (R, C/16) scales -> (R, C).

    Per block: final = fl(fl(float(s) * amax) * fl(1/(6E))) (:func:`dequantize_factor`);
    out = out_dtype(fl(q * final)). ``amax`` is (1,) or (R,) (per row). With a finite amax, values past
    out_dtype's range saturate to its max (the plain cast would give inf); NaN scales stay NaN and a
    non-finite amax gives TE's inf / NaN. ``numerics="te_pr3045"``: PR 3045's
    ``dequantize_nvfp4_per_token``, final = fl(float(s) * fl(amax / 2688)) with the raw amax.
    """
    q = codecs.e2m1_decode(codecs.unpack_fp4(codes_packed))
    amax_col = amax.to(_F32).reshape(-1, 1)
    if numerics == "te_pr3045":
        factor = codecs.e4m3_decode(scale) * (amax_col / _f32(6.0 * 448.0, q.device))
    else:
        factor = dequantize_factor(codecs.e4m3_decode(scale), amax_col, e4m3_max)
    out = saturate_finite(q * _expand(factor), out_dtype, torch.isfinite(amax_col))
    return out.to(out_dtype)


# ------------------------------------------------------------------------------ whole-tensor ops
def _sr_bytes(shape, generator: Optional[torch.Generator], device) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.int32, generator=generator, device=device)


def quantize(
    x: torch.Tensor,
    config,
    *,
    amax: Optional[torch.Tensor] = None,
    columnwise_amax: Optional[torch.Tensor] = None,
    generator: Optional[torch.Generator] = None,
):
    """Reference NVFP4 quantization of a 2-D tensor ``x`` (M, K) with a :class:`NVFP4QuantConfig`.

    amax: optional precomputed outer amax for the rowwise output ((1,) or (M,) per token); without
    RHT and per tensor it also serves the columnwise output. columnwise_amax: optional precomputed
    amax for the columnwise output ((1,), (K,) per token, or the post-RHT amax). Stochastic rounding
    draws rowwise bits first, then columnwise bits, from ``generator``.
    """
    if config.broadcast_2d:
        return _quantize_broadcast_2d(x, config, amax=amax, columnwise_amax=columnwise_amax, generator=generator)
    m, k = x.shape
    xf = x.to(_F32)
    rowwise = columnwise = None
    kwargs = dict(block_rows=config.block_rows, e4m3_max=config.e4m3_max, four_over_six=config.four_over_six,
                  numerics=config.numerics)

    def outer_amax(mat: torch.Tensor) -> torch.Tensor:
        if mat.numel() == 0:
            return torch.zeros(mat.shape[0] if config.per_token else 1, dtype=_F32, device=x.device)
        return mat.abs().amax(dim=1) if config.per_token else mat.abs().amax().reshape(1)

    if config.rowwise:
        row_amax = amax.to(_F32).reshape(-1) if amax is not None else outer_amax(xf)
        rand = _sr_bytes((m, k), generator, x.device) if config.stochastic_rounding else None
        codes, scale = quantize_rows(xf, row_amax, rand_bytes=rand, **kwargs)
        rowwise = (codecs.pack_fp4(codes), apply_scale_layout(scale, config.scale_layout), row_amax.clone())
    if config.columnwise:
        if not config.rht:
            xt = xf.t()
        elif config.numerics == "te_pr3045":
            xt = apply_rht_fp32(x.t(), config.rht_sign_mask)
        else:
            xt = apply_rht(x.t(), config.rht_sign_mask).to(_F32)
        if columnwise_amax is not None:
            col_amax = columnwise_amax.to(_F32).reshape(-1)
        elif amax is not None and not config.rht and not config.per_token:
            col_amax = amax.to(_F32).reshape(-1)
        else:
            col_amax = outer_amax(xt)
        rand = _sr_bytes((k, m), generator, x.device) if config.stochastic_rounding else None
        codes, scale = quantize_rows(xt.contiguous(), col_amax, rand_bytes=rand, **kwargs)
        columnwise = (codecs.pack_fp4(codes), apply_scale_layout(scale, config.scale_layout), col_amax.clone())
    return NVFP4Tensor.from_parts(x.shape, x.dtype, config, rowwise=rowwise, columnwise=columnwise)


def dbias(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The bias gradient of a layer whose output gradient is x (M, K): x's column sums, accumulated in fp32 and
    rounded once to ``dtype`` (TE's dbias; the Triton pass fixes its own summation order)."""
    return x.sum(0, dtype=torch.float32).to(dtype)


def broadcast_amax(t: NVFP4Tensor, config) -> NVFP4Tensor:
    """A per-tensor quantization ``t`` as PR 3045's 2D weight of ``config``: the same codes and scales,
    each copy's scalar amax copied into its per-token vector ((M,) rowwise, (K,) columnwise)."""
    m, k = t.m, t.k
    row = col = None
    if config.rowwise:
        row = (t.rowwise_data, t.rowwise_scale, t.rowwise_amax.reshape(1).expand(m).contiguous())
    if config.columnwise:
        col = (t.columnwise_data, t.columnwise_scale, t.columnwise_amax.reshape(1).expand(k).contiguous())
    return NVFP4Tensor.from_parts(t.shape, t.dtype, config, rowwise=row, columnwise=col)


def _quantize_broadcast_2d(x, config, *, amax, columnwise_amax, generator):
    """PR 3045's 2D weight: TE main's per-tensor 16x16 cast, amax copied into the vectors."""
    inner = quantize(x, config.per_tensor_2d(), amax=amax, columnwise_amax=columnwise_amax, generator=generator)
    return broadcast_amax(inner, config)


def dequantize(t, dtype: torch.dtype, which: str = "rowwise") -> torch.Tensor:
    """Reference NVFP4 dequantize of an :class:`NVFP4Tensor` to its original shape.

    ``which="columnwise"`` dequantizes the columnwise copy, undoes the RHT (in fp32) when it was
    applied, and transposes back, so both copies return x's orientation.
    """
    m, k = t.m, t.k
    if which == "rowwise":
        scale = compact_scales(t.rowwise_scale, t.scale_layout, m, k // 16)
        out = dequantize_rows(t.rowwise_data, scale, t.rowwise_amax, e4m3_max=t.e4m3_max, out_dtype=dtype,
                              numerics=t.config.numerics)
    else:
        scale = compact_scales(t.columnwise_scale, t.scale_layout, k, m // 16)
        if t.config.rht:
            out_t = dequantize_rows(t.columnwise_data, scale, t.columnwise_amax, e4m3_max=t.e4m3_max, out_dtype=_F32,
                                    numerics=t.config.numerics)
            out_t = saturate_finite(inverse_rht(out_t, t.config.rht_sign_mask), dtype).to(dtype)
        else:
            out_t = dequantize_rows(t.columnwise_data, scale, t.columnwise_amax, e4m3_max=t.e4m3_max, out_dtype=dtype,
                                    numerics=t.config.numerics)
        out = out_t.t()
    return out.reshape(t.shape)


def quantize_grouped(x: torch.Tensor, split_offsets: torch.Tensor, config, *, generator=None):
    """Reference grouped quantize: each split of rows quantized alone (the definition), written into
    the bulk buffers of a :class:`GroupedNVFP4Tensor`."""
    m, k = x.shape
    n = split_offsets.numel() - 1
    dev = x.device
    rowwise = columnwise = None
    if config.rowwise:
        rowwise = (torch.zeros(m, k // 2, dtype=torch.uint8, device=dev), torch.zeros(m, k // 16, dtype=torch.uint8, device=dev),
                   torch.zeros(m if config.per_token else n, dtype=_F32, device=dev))
    if config.columnwise:
        columnwise = (torch.zeros(k * m // 2, dtype=torch.uint8, device=dev),
                      torch.zeros(k * m // 16, dtype=torch.uint8, device=dev),
                      torch.zeros((n, k) if config.per_token else (n,), dtype=_F32, device=dev))
    out = GroupedNVFP4Tensor.from_parts(x.shape, x.dtype, config, split_offsets, rowwise=rowwise, columnwise=columnwise)
    if x.is_meta:  # no values: the bulk buffers' shapes are the result
        return out
    offsets = [int(v) for v in split_offsets.tolist()]
    for i, view in enumerate(out.split([offsets[j + 1] - offsets[j] for j in range(n)])):
        lo, hi = offsets[i], offsets[i + 1]
        if hi == lo:
            continue
        q = quantize(x[lo:hi], config, generator=generator)
        for side in ("rowwise", "columnwise"):
            if getattr(config, side):
                for part in ("data", "scale", "amax"):
                    getattr(view, f"{side}_{part}").copy_(getattr(q, f"{side}_{part}").reshape(getattr(view, f"{side}_{part}").shape))
    return out
