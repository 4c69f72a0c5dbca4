"""Bit-level codecs for E2M1 (FP4), E4M3, E5M2 and E8M0, in plain PyTorch.

Every encoder here works from fp32 values and returns integer codes (uint8), using comparisons and
integer bit operations only, never a float8 cast: the same formulas are used by the Triton kernels, so
the interpreter on CPU and the GPU give the same bits (spec section 2).
"""
from __future__ import annotations

import torch

FLT_MAX = 3.4028234663852886e38

# E2M1 magnitudes by 3-bit index; code = sign << 3 | index.
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E5M2_MAX = 57344.0


def _f32_bits(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)


def _bits_f32(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


# ----------------------------------------------------------------------------------------------- E2M1
def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> E2M1 code (uint8 in 0..15): round to nearest, ties to even mantissa, saturating to +-6.

    Written as TE's reference writes it (``cast_to_fp4x2``): bin edges on |v|, closed where the tie
    goes to the even code (0, 1, 2, 4 have even mantissa), open where it goes away from it:
    [0,.25]->0, (.25,.75)->.5, [.75,1.25]->1, (1.25,1.75)->1.5, [1.75,2.5]->2, (2.5,3.5)->3,
    [3.5,5]->4, (5,inf)->6. The sign bit is set for v < 0 only, so -0.0 encodes as code 0 and small
    negatives in [-0.25, 0) as code 8 (-0). NaN encodes as code 0 (the reference's behaviour).
    """
    v = v.to(torch.float32)
    a = v.abs()
    idx = (
        (a > 0.25).to(torch.uint8)
        + (a >= 0.75).to(torch.uint8)
        + (a > 1.25).to(torch.uint8)
        + (a >= 1.75).to(torch.uint8)
        + (a > 2.5).to(torch.uint8)
        + (a >= 3.5).to(torch.uint8)
        + (a > 5.0).to(torch.uint8)
    )
    sign = (v < 0).to(torch.uint8) << 3
    code = sign | idx
    return torch.where(torch.isnan(v), torch.zeros_like(code), code)


def e2m1_decode(code: torch.Tensor) -> torch.Tensor:
    """E2M1 code (0..15, any integer dtype) -> fp32 value."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=code.device)
    c = code.to(torch.int64)
    mag = grid[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """(..., 2n) codes -> (..., n) bytes; element 2j in the low nibble, 2j+1 in the high nibble."""
    c = codes.to(torch.uint8)
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """(..., n) bytes -> (..., 2n) codes (uint8)."""
    lo = packed & 0x0F
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)


# ----------------------------------------------------------------------------------- E4M3 and E5M2
def _fp8_encode(v: torch.Tensor, mant_bits: int, bias: int, max_code: int) -> torch.Tensor:
    """fp32 -> fp8 code with round-to-nearest-even and saturation to the largest finite code.

    Normal range: round the fp32 bit pattern to ``mant_bits`` mantissa bits with the integer RNE trick
    ``(b + half - 1 + lsb) >> shift`` (a mantissa carry correctly bumps the exponent), then rebias.
    Subnormal range (|v| < 2^(1-bias)): the code is the integer RNE of |v| / 2^(1-bias-mant_bits),
    which reaches the smallest normal code exactly when it rounds up. NaN -> all-ones code (0x7F/0x7F
    with sign).
    """
    bits = _f32_bits(v)
    sign = (bits >> 31) & 1
    abits = bits & 0x7FFFFFFF
    shift = 23 - mant_bits
    # normal: rounded fp32 pattern, rebias exponent from 127 to `bias`
    rounded = (abits + ((1 << (shift - 1)) - 1) + ((abits >> shift) & 1)) >> shift
    normal_code = rounded - ((127 - bias) << mant_bits)
    # subnormal: |v| * 2^(bias - 1 + mant_bits) is exact (power of two), then RNE to integer
    min_normal_exp = 1 - bias
    a = _bits_f32(abits)
    scaled = a * float(2.0 ** (-(min_normal_exp - mant_bits)))
    sub_code = torch.round(scaled).to(torch.int64)  # torch.round is half-to-even
    is_sub = abits < ((min_normal_exp + 127) << 23)
    code = torch.where(is_sub, sub_code, normal_code)
    code = torch.clamp(code, max=max_code)
    is_nan = abits > 0x7F800000
    code = torch.where(is_nan, torch.full_like(code, 0x7F), code)
    return ((sign << 7) | code).to(torch.uint8)


def e4m3_encode(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> E4M3 (fn) bits: RNE, saturating at +-448 (code 0x7E), NaN -> 0x7F/0xFF.

    Values <= 2^-10 (half the smallest subnormal 2^-9) round to zero; the tie at 2^-10 goes to even (0).
    This is ``cvt.rn.satfinite.e4m3x2.f32`` / TE's clamp-then-cast.
    """
    return _fp8_encode(v, mant_bits=3, bias=7, max_code=0x7E)


def e5m2_encode(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> E5M2 bits: RNE, saturating at +-57344 (code 0x7B), NaN -> 0x7F/0xFF."""
    return _fp8_encode(v, mant_bits=2, bias=15, max_code=0x7B)


def e4m3_decode(code: torch.Tensor) -> torch.Tensor:
    """E4M3 (fn) bits (uint8) -> fp32. 0x7F/0xFF decode to NaN."""
    return code.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def e5m2_decode(code: torch.Tensor) -> torch.Tensor:
    """E5M2 bits (uint8) -> fp32."""
    return code.to(torch.uint8).view(torch.float8_e5m2).to(torch.float32)


# ----------------------------------------------------------------------------------------------- E8M0
def e8m0_encode_round_up(v: torch.Tensor) -> torch.Tensor:
    """fp32 -> E8M0 code rounding toward +inf (``cvt.rp.satfinite.ue8m0x2.f32``; TE's software path).

    NaN -> 0xFF, +-inf -> 0xFE, 0 -> 0x00. Otherwise the biased fp32 exponent, plus one when the
    mantissa is non-zero, except when the exponent is already 0xFE (saturate) or when the exponent is 0
    and the mantissa <= 0x400000 (the value is <= 2^-127, which code 0 already represents).
    The sign is ignored (scales are computed from magnitudes).
    """
    bits = _f32_bits(v)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    bump = (mant != 0) & (exp != 0xFE) & ~((exp == 0) & (mant <= 0x400000))
    code = exp + bump.to(torch.int64)
    code = torch.where((exp == 0xFF) & (mant == 0), torch.full_like(code, 0xFE), code)
    code = torch.where((exp == 0xFF) & (mant != 0), torch.full_like(code, 0xFF), code)
    return code.to(torch.uint8)


def e8m0_decode(code: torch.Tensor) -> torch.Tensor:
    """E8M0 code -> fp32 2^(code-127); code 0 is 2^-127 (an fp32 denormal), 0xFF is NaN."""
    c = code.to(torch.int64)
    normal = _bits_f32(c << 23)
    out = torch.where(c == 0, _bits_f32(torch.full_like(c, 0x00400000)), normal)
    return torch.where(c == 0xFF, torch.full_like(out, float("nan")), out)


def e8m0_quant_multiplier(code: torch.Tensor) -> torch.Tensor:
    """2^(127 - code) built from bits (TE's ``exp2f_rcp``): code 254 -> 2^-127, 255 -> NaN."""
    c = code.to(torch.int64)
    e = 254 - c  # biased exponent of 2^(127-c)
    normal = _bits_f32(e.clamp(min=0) << 23)
    out = torch.where(c == 254, _bits_f32(torch.full_like(c, 0x00400000)), normal)
    return torch.where(c == 255, torch.full_like(out, float("nan")), out)
