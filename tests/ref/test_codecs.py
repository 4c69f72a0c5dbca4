"""Exhaustive codec tests against slow scalar oracles written from the spec (section 2)."""
import bisect
import math

import torch

from nvfp4lab.ref import codecs

E2M1_MAGS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e4m3_value(code: int) -> float:
    exp, mant = (code >> 3) & 0xF, code & 7
    return mant * 2.0**-9 if exp == 0 else (1 + mant / 8) * 2.0 ** (exp - 7)


E4M3_POS = [(_e4m3_value(c), c) for c in range(0x7F)]  # 0x00..0x7E, increasing


def _nearest_even(value: float, table):
    """Index of the nearest table value to |value|; ties go to the even code."""
    vals = [v for v, _ in table]
    a = abs(value)
    i = bisect.bisect_left(vals, a)
    if i == len(vals):
        return table[-1][1]
    if vals[i] == a or i == 0:
        return table[i][1]
    lo, hi = table[i - 1], table[i]
    dlo, dhi = a - lo[0], hi[0] - a
    if dlo < dhi:
        return lo[1]
    if dhi < dlo:
        return hi[1]
    return lo[1] if lo[1] % 2 == 0 else hi[1]


def oracle_e4m3(value: float) -> int:
    if math.isnan(value):
        return 0x7F | (0x80 if math.copysign(1, value) < 0 else 0)
    code = _nearest_even(min(abs(value), 1e30), E4M3_POS)
    return code | (0x80 if math.copysign(1, value) < 0 else 0)


def oracle_e2m1(value: float) -> int:
    if math.isnan(value):
        return 0
    idx = _nearest_even(abs(value), [(v, i) for i, v in enumerate(E2M1_MAGS)])
    return idx | (8 if value < 0 else 0)


def oracle_e8m0_round_up(value: float) -> int:
    if math.isnan(value):
        return 0xFF
    a = abs(value)
    if math.isinf(a):
        return 0xFE
    for e in range(-127, 128):
        if 2.0**e >= a:
            return e + 127
    return 0xFE


def all_bf16_as_f32() -> torch.Tensor:
    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).to(torch.float32)


def assert_encodes_all_bf16_like(encode, oracle):
    vals = all_bf16_as_f32()
    got = encode(vals)
    want = torch.tensor([oracle(v) for v in vals.tolist()], dtype=torch.uint8)
    assert torch.equal(got, want)


def test_e4m3_encode_all_bf16_patterns():
    assert_encodes_all_bf16_like(codecs.e4m3_encode, oracle_e4m3)


def test_e2m1_encode_all_bf16_patterns():
    assert_encodes_all_bf16_like(codecs.e2m1_encode, oracle_e2m1)


def test_e8m0_round_up_all_bf16_patterns():
    assert_encodes_all_bf16_like(codecs.e8m0_encode_round_up, oracle_e8m0_round_up)


def test_e8m0_fp32_edge_patterns():
    # fp32 bit patterns where bf16 cannot reach: mantissa around 0x400000 at exponent 0, and 0xFE.
    pats = [0x00400000, 0x00400001, 0x003FFFFF, 0x00000001, 0x7F000001, 0x7F7FFFFF, 0x3F800001, 0x3F800000]
    vals = torch.tensor(pats, dtype=torch.int32).view(torch.float32)
    got = codecs.e8m0_encode_round_up(vals).tolist()
    want = [0, 1, 0, 0, 0xFE, 0xFE, 128, 127]
    assert got == want


def test_e4m3_all_codes_round_trip():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = codecs.e4m3_decode(codes)
    finite = ~torch.isnan(vals)
    again = codecs.e4m3_encode(vals)
    # -0.0 (0x80) re-encodes as 0x80: the sign of zero is kept by E4M3
    assert torch.equal(again[finite], codes[finite])
    assert finite.sum() == 254
    assert (codecs.e4m3_encode(vals[~finite]) & 0x7F).eq(0x7F).all()


def assert_encodes_random_fp32_like_torch(encode, fp8_dtype, seed, exponents, max_finite):
    # torch 2.13 CPU casts fp32 -> fp8 with RNE; inside the finite range they must agree.
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(200000, generator=g) * torch.exp2(torch.randint(*exponents, (200000,), generator=g).float())
    v = v.clamp(-max_finite, max_finite)
    want = v.to(fp8_dtype).view(torch.uint8)
    assert torch.equal(encode(v), want)


def test_e4m3_against_torch_cast_on_random_fp32():
    assert_encodes_random_fp32_like_torch(codecs.e4m3_encode, torch.float8_e4m3fn, seed=0, exponents=(-14, 10), max_finite=448)


def test_e5m2_against_torch_cast_on_random_fp32():
    assert_encodes_random_fp32_like_torch(codecs.e5m2_encode, torch.float8_e5m2, seed=1, exponents=(-20, 16), max_finite=57344)


def test_e2m1_decode_all_codes():
    got = codecs.e2m1_decode(torch.arange(16)).tolist()
    assert got[:8] == E2M1_MAGS
    assert got[8:] == [-v for v in E2M1_MAGS]


def test_fp4_pack_unpack_round_trip():
    codes = torch.randint(0, 16, (7, 32), dtype=torch.uint8)
    packed = codecs.pack_fp4(codes)
    assert packed.shape == (7, 16)
    assert torch.equal(packed[:, 0] & 0xF, codes[:, 0])  # element 2j in the low nibble
    assert torch.equal(packed[:, 0] >> 4, codes[:, 1])
    assert torch.equal(codecs.unpack_fp4(packed), codes)


def test_e8m0_decode_and_multiplier():
    codes = torch.arange(256)
    dec = codecs.e8m0_decode(codes)
    mult = codecs.e8m0_quant_multiplier(codes)
    for c in (0, 1, 100, 127, 200, 254):
        assert dec[c].item() == 2.0 ** (c - 127)
        assert mult[c].item() == 2.0 ** (127 - c)
    assert math.isnan(dec[255].item()) and math.isnan(mult[255].item())


def test_negative_zero_and_nan_decisions():
    v = torch.tensor([-0.0, -0.1, float("nan"), -float("nan"), 7.0, -100.0])
    assert codecs.e2m1_encode(v).tolist() == [0, 8, 0, 0, 7, 15]
    e = codecs.e4m3_encode(torch.tensor([-0.0, float("inf"), -float("inf"), 1000.0]))
    assert e.tolist() == [0x80, 0x7E, 0xFE, 0x7E]
