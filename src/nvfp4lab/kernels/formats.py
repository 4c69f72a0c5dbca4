"""Triton device functions for the number formats: E2M1 / E4M3 / E5M2 / E8M0 encoders and decoders, bf16
rounding and the bf16 loads of the interpreter (``to_f32``, ``soft_bf16_loads``). One definition of each
formula for every kernel family.

Encoders use comparisons and integer bit operations, mirroring :mod:`nvfp4lab.ref.codecs` exactly (the
interpreter's float8 casts are not round-to-nearest-even, so no kernel uses them). Decoders place the
code's bits in an fp32 word so that it reads as ``value * 2^-k`` for every code (subnormals included)
and finish with one exact power-of-two multiply: no conversion instructions.
"""
import triton
import triton.language as tl


@triton.jit
def e2m1_encode(v):
    """fp32 -> E2M1 code (int32 0..15): RNE, saturating; -0.0 -> 0, NaN -> 0 (ref.codecs.e2m1_encode)."""
    a = tl.abs(v)
    idx = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
        + (a > 2.5).to(tl.int32)
        + (a >= 3.5).to(tl.int32)
        + (a > 5.0).to(tl.int32)
    )
    code = ((v < 0).to(tl.int32) << 3) | idx
    return tl.where(v != v, 0, code)


@triton.jit
def e2m1_decode(code):
    """E2M1 code (int32, 0..15) -> fp32 from bits: the magnitude bits placed at fp32 bits 24..22 read as
    exactly value * 2^-126 for all 8 magnitudes (0.5 lands on the fp32 subnormal 2^-127), so one exact
    multiply by 2^126 finishes it (4 integer ops + 1 multiply, no conversion instruction)."""
    bits = ((code & 7) << 22) | ((code & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37


@triton.jit
def _fp8_encode(v, MANT_BITS: tl.constexpr, BIAS: tl.constexpr, MAX_CODE: tl.constexpr):
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 31) & 1
    abits = bits & 0x7FFFFFFF
    SHIFT: tl.constexpr = 23 - MANT_BITS
    rounded = (abits + ((1 << (SHIFT - 1)) - 1) + ((abits >> SHIFT) & 1)) >> SHIFT
    normal_code = rounded - ((127 - BIAS) << MANT_BITS)
    # subnormal: integer RNE of |v| * 2^(BIAS - 1 + MANT_BITS) via the 2^23 magic-number trick
    a = abits.to(tl.float32, bitcast=True)
    SUB_SCALE: tl.constexpr = float(2 ** (BIAS - 1 + MANT_BITS))
    scaled = a * SUB_SCALE
    magic = scaled + 8388608.0  # 2^23: the fp32 add rounds to an integer, ties to even
    sub_code = magic.to(tl.int32, bitcast=True) - 0x4B000000
    MIN_NORMAL_BITS: tl.constexpr = (128 - BIAS) << 23
    code = tl.where(abits < MIN_NORMAL_BITS, sub_code, normal_code)
    code = tl.minimum(code, MAX_CODE)
    code = tl.where(abits > 0x7F800000, 0x7F, code)
    return (sign << 7) | code


@triton.jit
def e4m3_encode(v):
    """fp32 -> E4M3 bits (int32 0..255): RNE, saturating at 448, NaN -> 0x7F."""
    return _fp8_encode(v, 3, 7, 0x7E)


@triton.jit
def e5m2_encode(v):
    """fp32 -> E5M2 bits (int32 0..255): RNE, saturating at 57344, NaN -> 0x7F."""
    return _fp8_encode(v, 2, 15, 0x7B)


@triton.jit
def e4m3_decode(code):
    """E4M3 bits (int32, 0..255) -> fp32 the same way: the 7 magnitude bits at fp32 bits 26..20 read as
    exactly value * 2^-120 (subnormals included), times 2^120 exactly; 0x7F / 0xFF -> NaN."""
    bits = ((code & 0x7F) << 20) | ((code & 0x80) << 24)
    val = bits.to(tl.float32, bitcast=True) * 1.329227995784916e36
    return tl.where((code & 0x7F) == 0x7F, float("nan"), val)


@triton.jit
def e8m0_encode_round_up(v):
    """fp32 -> E8M0 code (int32) rounding toward +inf; NaN -> 0xFF, inf -> 0xFE, 0 -> 0."""
    bits = v.to(tl.int32, bitcast=True)
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    bump = (mant != 0) & (exp != 0xFE) & ~((exp == 0) & (mant <= 0x400000))
    code = exp + bump.to(tl.int32)
    code = tl.where((exp == 0xFF) & (mant == 0), 0xFE, code)
    code = tl.where((exp == 0xFF) & (mant != 0), 0xFF, code)
    return code


@triton.jit
def e8m0_decode(code):
    """E8M0 code (int32) -> fp32 2^(code-127); 0 -> 2^-127, 0xFF -> NaN."""
    val = (code << 23).to(tl.float32, bitcast=True)
    val = tl.where(code == 0, tl.full(code.shape, 0x00400000, tl.int32).to(tl.float32, bitcast=True), val)
    return tl.where(code == 0xFF, float("nan"), val)


@triton.jit
def e8m0_quant_multiplier(code):
    """2^(127 - code) from bits: 254 -> 2^-127 (denormal), 255 -> NaN."""
    e = tl.maximum(254 - code, 0)
    val = (e << 23).to(tl.float32, bitcast=True)
    val = tl.where(code == 254, tl.full(code.shape, 0x00400000, tl.int32).to(tl.float32, bitcast=True), val)
    return tl.where(code == 255, float("nan"), val)


@triton.jit
def e5m2_decode(code):
    """E5M2 bits (int32, 0..255) -> fp32. The 7 magnitude bits placed at fp32 bits 27..21 read as
    exactly value * 2^-112 (subnormals land on fp32 subnormals), so one exact multiply by 2^112
    finishes it; exponent 31 is +-inf (mantissa 0) or NaN."""
    sign_bit = (code & 0x80) << 24
    val = (((code & 0x7F) << 21) | sign_bit).to(tl.float32, bitcast=True) * 5.192296858534828e33
    inf = (sign_bit | 0x7F800000).to(tl.float32, bitcast=True)
    val = tl.where((code & 0x7F) == 0x7C, inf, val)
    return tl.where((code & 0x7F) > 0x7C, float("nan"), val)


@triton.jit
def bf16_rne(v):
    """fp32 -> the fp32 value of its round-to-nearest-even bf16 (bit arithmetic, same on every backend)."""
    bits = v.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    rounded = tl.where(v != v, 0x7FC00000, rounded)
    return rounded.to(tl.float32, bitcast=True)


@triton.jit
def f32_to_bf16_rne(v):
    """fp32 -> bf16, round to nearest even, in integer ops (NaN -> 0x7FC0, as torch's CPU cast).

    The interpreter's own fp32 -> bf16 cast truncates, so kernels that must run under it round here;
    on the GPU the hardware cast (cvt.rn.bf16.f32) gives the same bits for non-NaN values.
    """
    bits = v.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(v != v, 0x7FC0, rounded)
    return rounded.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def e2m1_encode_fast(v):
    """Same codes as :func:`e2m1_encode` for every fp32 input, in about half the instructions.

    |v| is scaled onto an integer grid per binade range (x2 below 2, x1 below 4, x0.5 above; exact
    powers of two), rounded to an integer with ties to even by adding 1.5 * 2^23, and offset to the
    E2M1 index (the grid's even codes are its even integers, so RNE ties match); then saturated at 7.
    """
    a = tl.abs(v)
    below2 = a < 2.0
    below4 = a < 4.0
    t = a * tl.where(below2, 2.0, tl.where(below4, 1.0, 0.5))
    # bits(1.5 * 2^23 + n) = 0x4B400000 + n; the region offsets 0, 2, 4 are folded into the base
    base = tl.where(below2, 0x4B400000, tl.where(below4, 0x4B400000 - 2, 0x4B400000 - 4))
    idx = tl.minimum((t + 12582912.0).to(tl.int32, bitcast=True) - base, 7)
    code = tl.where(v < 0, idx | 8, idx)
    return tl.where(v != v, 0, code)


@triton.jit
def _fp8_encode_fast(v, clamp, MANT_BITS: tl.constexpr, BIAS: tl.constexpr, DELTA: tl.constexpr):
    """fp32 -> fp8 bits, low 8 bits of the int32 result (the caller truncates to uint8).

    Same codes as :func:`_fp8_encode` (ref.codecs) for every non-NaN v when ``clamp`` is the format's
    max finite value, with about half the integer instructions (the integer ALU pipe is half as wide
    as the fp32 pipe on sm_90, and it is what bounds the quantize kernels):

    * a = min(|v|, clamp): saturation (everything >= max rounds to max anyway; inf -> max). The MXFP8
      kernels pass clamp = the all-ones code's value (480 / 114688) for a NaN block instead, whose
      elements are all NaN (x * NaN multiplier): min(NaN, clamp) = clamp (non-NaN operand), so NaN
      encodes as 0x7F, and no per-element NaN test is needed.
    * E = max(exponent of a, 1 - BIAS) (subnormals use the smallest normal binade's grid); the magic
      M = 2^(E + SHIFT) * (1.5 + DELTA * 2^-23) has ulp 2^(E - MANT_BITS), the fp8 grid spacing in
      binade E. s = a + M rounds a to that grid with ties to even (one fp32 add; DELTA is even, so
      the parity of s's mantissa is that of the grid index n), and s stays in M's binade.
    * bits(s) = ((E + 127 + SHIFT) << 23) + 0x400000 + DELTA + n, so bits(s) + (bits(s) >> SHIFT)
      holds n + 2^MANT_BITS * (E + const) in its low bits; DELTA is chosen so that the constant
      vanishes mod 256, leaving code = 2^MANT_BITS * (E + BIAS - 1) + n (a mantissa carry, n = 2^(MANT+1),
      lands exactly on the next binade's first code). The shift is an umulhi, on the fp32/IMAD pipe.
    """
    SHIFT: tl.constexpr = 23 - MANT_BITS
    MIN_NORMAL: tl.constexpr = 2.0 ** (1 - BIAS)
    # 2^SHIFT * (1.5 + DELTA * 2^-23): exact in fp32, and exact times a power of two
    MAGIC: tl.constexpr = float(2**SHIFT) * (1.5 + DELTA * 2.0**-23)
    a = tl.minimum(tl.abs(v), clamp)
    binade = (tl.maximum(a, MIN_NORMAL).to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    s = a + binade * MAGIC
    sb = s.to(tl.int32, bitcast=True)
    code = sb + tl.umulhi(sb, 1 << (32 - SHIFT))
    return code | ((v.to(tl.int32, bitcast=True) >> 24) & 0x80)


@triton.jit
def e4m3_encode_fast(v, clamp):
    """:func:`e4m3_encode` for non-NaN v with clamp = 448.0 (low 8 bits valid); a NaN v with
    clamp = 480.0 gives 0x7F | sign. See :func:`_fp8_encode_fast`."""
    # DELTA = -(8 * 141 + 4) mod 256 = 148
    return _fp8_encode_fast(v, clamp, 3, 7, 148)


@triton.jit
def e5m2_encode_fast(v, clamp):
    """:func:`e5m2_encode` for non-NaN v with clamp = 57344.0 (low 8 bits valid); a NaN v with
    clamp = 114688.0 gives 0x7F | sign."""
    # DELTA = -(4 * 134 + 2) mod 256 = 230
    return _fp8_encode_fast(v, clamp, 2, 15, 230)


@triton.jit
def e2m1_scale_encode(x, enc):
    """E2M1 code (low 4 bits of the int32 result) of fl(x * enc): the codes of ``e2m1_encode(x * enc)``
    whenever the product is not NaN (a NaN product gives an unspecified code: callers zero NaN blocks).

    About 10 instructions, against ~14 for :func:`e2m1_encode_fast` (the quantize kernels are bound by
    instruction issue on Hopper, which has no E2M1 convert):

    * v = fl(x * enc); the sign is the reference's ``v < 0`` test (a select, as cheap as moving the
      sign bit, and -0.0, also from a product that underflows, gets code 0 like the reference).
    * a = min(|v|, 6) saturates; the E2M1 grid spacing in binade 2^E (E = max(exponent(a), 0)) is
      2^(E-1), and s = 2^E * MAGIC + a with MAGIC = 2^22 * 1.25 + 3 has exactly that ulp, so the one
      fp32 add rounds a onto the grid, ties to even (the constant's part in s's mantissa, 0x200006, is
      even). The mantissa of s is then 0x200006 + n with n = a / 2^(E-1) on the grid, and
      bits(s) + (bits(s) >> 22) = n + 2E + 304 (mod 16) = the E2M1 magnitude code 2E + n.
    """
    v = x * enc
    a = tl.minimum(tl.abs(v), 6.0)
    binade = (tl.maximum(a, 1.0).to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    sb = tl.fma(binade, 5242883.0, a).to(tl.int32, bitcast=True)
    return ((sb + (sb >> 22)) & 7) | tl.where(v < 0, 8, 0)


@triton.jit
def _fp8_encode_finite(a, sign_bits, MANT_BITS: tl.constexpr, BIAS: tl.constexpr, DELTA: tl.constexpr):
    """fp8 bits, in bits 31..24 of the int32 result, of the value with magnitude ``a`` (fp32, finite,
    0 <= a <= the format's max) and the sign bit 31 of ``sign_bits`` (int32).

    :func:`_fp8_encode_fast`'s rounding (one fp32 fma onto the fp8 grid of a's binade) without its
    saturation (MXFP8's power-of-two scale keeps every finite block in range, so callers that checked
    their block maxima are finite need none), and with the code read by one integer multiply (the
    multiply-add pipe, not the integer ALU pipe that bounds these kernels on sm_90): the code is
    bits(s) + (bits(s) >> SHIFT) mod 256, and bits(s) * (2^24 + 2^(24 - SHIFT)) mod 2^32 holds exactly
    that in its top byte, because the low SHIFT bits of bits(s) are DELTA + n < 2^SHIFT / 16, so the
    lower product term never carries into it. The sign bit is added in the same multiply-add (the
    magnitude code's top bit is 0).
    """
    SHIFT: tl.constexpr = 23 - MANT_BITS
    MIN_NORMAL: tl.constexpr = 2.0 ** (1 - BIAS)
    MAGIC: tl.constexpr = float(2**SHIFT) * (1.5 + DELTA * 2.0**-23)
    binade = (tl.maximum(a, MIN_NORMAL).to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    sb = tl.fma(binade, MAGIC, a).to(tl.int32, bitcast=True)
    return sb * ((1 << 24) + (1 << (24 - SHIFT))) + (sign_bits & -(2**31))


@triton.jit
def e4m3_encode_finite(a, sign_bits):
    """:func:`e4m3_encode` of the value with magnitude ``a`` <= 448 (finite) and sign bit 31 of
    ``sign_bits``, in bits 31..24 of the result. See :func:`_fp8_encode_finite`."""
    return _fp8_encode_finite(a, sign_bits, 3, 7, 148)


@triton.jit
def e5m2_encode_finite(a, sign_bits):
    """:func:`e5m2_encode` of the value with magnitude ``a`` <= 57344 (finite) and sign bit 31 of
    ``sign_bits``, in bits 31..24 of the result."""
    return _fp8_encode_finite(a, sign_bits, 2, 15, 230)


@triton.jit
def e8m0_scale_finite(amax, max_rcp):
    """(E8M0 code, quantization multiplier 2^(127 - code)) of a finite block maximum, as
    :func:`e8m0_encode_round_up` (of fl(amax * max_rcp)) and :func:`e8m0_quant_multiplier` give them,
    in ~6 instructions instead of ~17.

    With b = bits(y), y = fl(amax * max_rcp) >= 0: bits(2y) = b + min(b, 2^23) (a denormal doubles
    its mantissa, a normal float adds one to its exponent; y <= 2^120 for finite amax), computed in
    integers so no fp contraction can touch it. Rounding the exponent of 2y up is rounding y's up
    plus one, i.e. floor((bits(2y) - 1) / 2^23) + 1 for y > 0, so code = max((bits(2y) - 1) >> 23, 0)
    (arithmetic shift), which also gives y = 0 -> 0 and every denormal y <= 2^-127 -> 0 and
    y in (2^-127, 2^-126) -> 1, as the reference. code <= 247 for finite amax, so the multiplier is
    the normal float (254 - code) << 23.
    """
    b = (amax * max_rcp).to(tl.int32, bitcast=True)
    code = tl.maximum((b + tl.minimum(b, 0x800000) - 1) >> 23, 0)
    mult = (code * -8388608 + 0x7F000000).to(tl.float32, bitcast=True)
    return code, mult


@triton.jit
def to_f32(v, SOFT_BF16: tl.constexpr):
    """A loaded tensor as fp32. SOFT_BF16 (the interpreter's launches, ``soft_bf16_loads``): bf16 by its
    bits, shifted into the high half of an fp32 word (exact, subnormals included; the interpreter's own
    bf16 -> fp32 conversion gets subnormals wrong). Other dtypes, and every GPU launch: the plain cast."""
    out = v.to(tl.float32)
    if SOFT_BF16:
        if v.dtype == tl.bfloat16:
            out = ((v.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
    return out


def soft_bf16_loads(device) -> bool:
    """Whether kernels launched for ``device`` convert loaded bf16 values by bits (``to_f32``): tensors off
    the GPU run under the Triton interpreter."""
    return device.type != "cuda"
