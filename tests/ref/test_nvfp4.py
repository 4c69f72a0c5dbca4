"""Properties of the NVFP4 reference that hold independently of the golden vectors."""
import numpy as np
import pytest
import torch

import nvfp4lab
from nvfp4lab.ref import codecs
from nvfp4lab.ref import nvfp4 as ref_nvfp4
from nvfp4lab.ref.nvfp4 import apply_rht, inverse_rht, rht_matrix


def _randn(m, k, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(dtype)


def test_2d_blocks_are_transposition_invariant():
    x = _randn(64, 96)
    q = nvfp4lab.quantize_nvfp4(x, block="16x16", rowwise=True, columnwise=True, backend="ref")
    codes_row = codecs.unpack_fp4(q.rowwise_data)
    codes_col = codecs.unpack_fp4(q.columnwise_data)
    assert torch.equal(codes_col, codes_row.t())
    # one scale per 16x16 tile, repeated on each row of the tile
    assert torch.equal(q.rowwise_scale[::16].repeat_interleave(16, 0), q.rowwise_scale)
    assert torch.equal(q.columnwise_scale[::16], q.rowwise_scale[::16].t())


def test_per_token_single_row_equals_per_tensor():
    x = _randn(16, 64, torch.float32)
    per_token = nvfp4lab.quantize_nvfp4(x, per_token=True, backend="ref")
    for r in (0, 5, 15):
        per_tensor = nvfp4lab.quantize_nvfp4(x[r : r + 1], backend="ref")
        assert torch.equal(per_token.rowwise_data[r], per_tensor.rowwise_data[0])
        assert torch.equal(per_token.rowwise_scale[r], per_tensor.rowwise_scale[0])
    assert torch.equal(per_token.rowwise_amax, x.abs().amax(dim=1))


def test_provided_amax_equals_computed():
    x = _randn(32, 64)
    q0 = nvfp4lab.quantize_nvfp4(x, rowwise=True, columnwise=True, backend="ref")
    q1 = nvfp4lab.quantize_nvfp4(x, rowwise=True, columnwise=True, amax=x.abs().amax().float(), backend="ref")
    for name in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        assert torch.equal(getattr(q0, name), getattr(q1, name))
    q2 = nvfp4lab.quantize_nvfp4(x, amax=torch.tensor([2.0 * float(x.abs().max())]), backend="ref")
    assert not torch.equal(q0.rowwise_scale, q2.rowwise_scale)


@pytest.mark.parametrize("layout", ["padded", "swizzled"])
def test_scale_layouts_hold_the_compact_scales(layout):
    x = _randn(48, 80)
    base = nvfp4lab.quantize_nvfp4(x, rowwise=True, columnwise=True, backend="ref")
    other = nvfp4lab.quantize_nvfp4(x, rowwise=True, columnwise=True, scale_layout=layout, backend="ref")
    assert other.rowwise_scale.shape == (128, 8)
    assert other.columnwise_scale.shape == (128, 4)
    if layout == "padded":
        assert torch.equal(other.rowwise_scale[:48, :5], base.rowwise_scale)
        assert other.rowwise_scale[48:].eq(0).all() and other.rowwise_scale[:, 5:].eq(0).all()
    else:
        assert torch.equal(nvfp4lab.unswizzle_scales(other.rowwise_scale, 48, 5), base.rowwise_scale)
    assert torch.equal(other.dequantize(torch.float32), base.dequantize(torch.float32))


def test_rht_matrix_is_orthogonal_and_mask_flips_rows():
    t = rht_matrix(0xD7E8)
    assert torch.allclose(t @ t.t(), torch.eye(16))
    t0 = rht_matrix(0)
    signs = torch.tensor([-1.0 if (0xD7E8 >> i) & 1 else 1.0 for i in range(16)])
    assert torch.equal(t, signs.view(-1, 1) * t0)
    x = _randn(4, 32, torch.float32)
    assert torch.allclose(inverse_rht(apply_rht(x).float()), x.bfloat16().float(), rtol=2e-2, atol=2e-2)


def test_dequantize_error_is_small_and_columnwise_undoes_rht():
    x = _randn(64, 128, torch.float32, seed=3)
    q = nvfp4lab.quantize_nvfp4(x, rowwise=True, columnwise=True, rht=True, backend="ref")
    for which in ("rowwise", "columnwise"):
        deq = q.dequantize(torch.float32, which=which)
        rel = (deq - x).norm() / x.norm()
        assert rel < 0.15, (which, rel)


def test_zero_block_dequantizes_to_zero_and_tiny_block_underflows():
    x = torch.zeros(16, 32)
    x[0, :16] = torch.randn(16)
    x[1, 16:] = 1e-9  # scale underflows to 0 -> dequantizes to exactly 0
    x[2, 0] = 1e6
    q = nvfp4lab.quantize_nvfp4(x, backend="ref")
    deq = q.dequantize(torch.float32)
    assert deq[1].eq(0).all()
    assert deq[3:].eq(0).all()
    assert deq[2, 0] == 1e6


def _grid_neighbours(y: torch.Tensor):
    grid = torch.tensor(codecs.E2M1_GRID)
    a = y.abs().clamp(max=6.0)
    lo = grid[(grid.view(1, -1) <= a.view(-1, 1) * (1 + 1e-6)).sum(1) - 1].view(y.shape)
    hi = grid[torch.clamp(8 - (grid.view(1, -1) >= a.view(-1, 1) * (1 - 1e-6)).sum(1), max=7)].view(y.shape)
    return lo, hi


def test_stochastic_rounding_statistics():
    x = _randn(64, 128, torch.float32, seed=7)
    rn = nvfp4lab.quantize_nvfp4(x, backend="ref")
    rn_deq = rn.dequantize(torch.float32)
    draws = [nvfp4lab.quantize_nvfp4(x, stochastic_rounding=True, seed=s, backend="ref") for s in range(50)]
    sr_deqs = torch.stack([d.dequantize(torch.float32) for d in draws])
    rmse_rn = (rn_deq - x).pow(2).mean().sqrt()
    rmse_sr_mean = (sr_deqs.mean(0) - x).pow(2).mean().sqrt()
    assert rmse_sr_mean < rmse_rn
    # scales do not depend on the rounding mode; every SR value is one of the two grid neighbours of x/f
    assert all(torch.equal(d.rowwise_scale, rn.rowwise_scale) for d in draws)
    factor = (codecs.e4m3_decode(rn.rowwise_scale) * rn.rowwise_amax / (6 * 448.0)).repeat_interleave(16, 1)
    y = torch.where(factor > 0, x / factor, torch.zeros_like(x))
    lo, hi = _grid_neighbours(y)
    for d in draws[:5]:
        mag = codecs.e2m1_decode(codecs.unpack_fp4(d.rowwise_data)).abs()
        assert ((mag == lo) | (mag == hi)).all()
    assert not torch.equal(draws[0].rowwise_data, draws[1].rowwise_data)
    again = nvfp4lab.quantize_nvfp4(x, stochastic_rounding=True, seed=0, backend="ref")
    assert torch.equal(again.rowwise_data, draws[0].rowwise_data)
    # unbiased: the mean over draws tracks x much closer than RN's error
    assert (sr_deqs.mean(0) - x).abs().mean() < 0.5 * (rn_deq - x).abs().mean()


def test_four_over_six_never_worse_than_map6_per_block():
    x = _randn(64, 128, torch.float32, seed=11)
    q6 = nvfp4lab.quantize_nvfp4(x, e4m3_max=256, backend="ref")
    q46 = nvfp4lab.quantize_nvfp4(x, four_over_six="mse", e4m3_max=256, backend="ref")
    e6 = (q6.dequantize(torch.float32) - x).pow(2).reshape(64, 8, 16).sum(-1)
    e46 = (q46.dequantize(torch.float32) - x).pow(2).reshape(64, 8, 16).sum(-1)
    assert (e46 <= e6 * (1 + 1e-5) + 1e-12).all()
    assert (e46 < e6).any()


# ------------------------------------------------------- extreme magnitudes: finite where TE's order is not
FLT_MAX = torch.finfo(torch.float32).max


def _fp32_unbounded(v: np.ndarray) -> np.ndarray:
    """Round float64 values to fp32's 24-bit significand, RNE, with no exponent limit (the value an fp32
    operation would have with an unbounded exponent range; normal-range inputs only)."""
    mant, exp = np.frexp(v)
    return np.ldexp(np.round(np.ldexp(mant, 24)), exp - 24)


def test_dequantize_factor_is_te_order_or_its_unbounded_value():
    """factor = fl(fl(s * amax) * fl(1/(6E))) for every finite E4M3 scale and amaxes over the whole fp32
    range: TE's bits wherever fl(s * amax) is finite, and for amax > FLT_MAX / 448 (where TE's product
    overflows) the value of TE's order with an unbounded exponent, which fits (factor <= amax / 6)."""
    scales = codecs.e4m3_decode(torch.arange(0x7F, dtype=torch.uint8)).double()  # 0 .. 448
    g = torch.Generator().manual_seed(0)
    amax = torch.cat([torch.exp2(torch.rand(200, generator=g, dtype=torch.float64) * 247 - 120),
                      torch.tensor([FLT_MAX, FLT_MAX / 448, 1e36, 7.6e35, 1.0], dtype=torch.float64)]).float()
    for e4m3_max in (448.0, 256.0):
        got = ref_nvfp4.dequantize_factor(scales.float().view(-1, 1), amax.view(1, -1), e4m3_max).double().numpy()
        rcp = float(np.float32(1.0 / (6.0 * e4m3_max)))
        prod = scales.view(-1, 1).numpy() * amax.double().view(1, -1).numpy()  # exact in float64
        want = _fp32_unbounded(_fp32_unbounded(prod) * rcp)
        normal = want >= 2.0**-126  # the oracle models normal results only
        assert np.array_equal(got[normal], want[normal])
        te = ((scales.float().view(-1, 1) * amax.view(1, -1)) * rcp).double().numpy()
        finite = np.isfinite(_fp32_unbounded(prod)) & (_fp32_unbounded(prod) <= FLT_MAX)
        assert np.array_equal(got[finite], te[finite]) and (~finite).any()
        assert np.isfinite(got).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_of_huge_amax_is_the_unbounded_value_saturated(dtype):
    """NVFP4 is exact under power-of-two scaling (same codes and scales, values scaled exactly), so
    dequantize(quantize(x)) must equal dequantize(quantize(x / 2^64)) * 2^64 -- TE's order with an
    unbounded exponent -- saturated to the output dtype's max: no inf from finite x near FLT_MAX."""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)) * 1e37
    x[0, 0] = FLT_MAX
    limit = torch.finfo(dtype).max
    for kwargs in (dict(), dict(per_token=True), dict(block="16x16")):
        q = nvfp4lab.quantize_nvfp4(x, columnwise=True, backend="ref", **kwargs)
        small = nvfp4lab.quantize_nvfp4(x * 2.0**-64, columnwise=True, backend="ref", **kwargs)
        for which in ("rowwise", "columnwise"):
            d = q.dequantize(dtype, which=which)
            unbounded = small.dequantize(torch.float32, which=which).double() * 2.0**64
            want = torch.where(unbounded.abs() > limit, unbounded.sign() * limit, unbounded).to(dtype)
            assert d.isfinite().all()
            assert torch.equal(d.view(torch.int32 if dtype == torch.float32 else torch.int16),
                               want.view(torch.int32 if dtype == torch.float32 else torch.int16)), (kwargs, which)
    # a non-finite amax keeps TE's inf / NaN (only finite parts are promised finite results)
    q = nvfp4lab.quantize_nvfp4(x, amax=torch.tensor([float("inf")]), backend="ref")
    assert not q.dequantize(torch.float32).isfinite().all()


def _bf16_wide(m, k, seed):
    """bf16 values over the whole exponent range, subnormals and zeros included (finite)."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 0x7F80, (m, k), generator=g, dtype=torch.int32)  # finite magnitudes
    bits = bits | (torch.randint(0, 2, (m, k), generator=g, dtype=torch.int32) << 15)
    x = bits.to(torch.int16).view(torch.bfloat16)
    x[torch.rand(m, k, generator=g) < 0.2] = 0.0
    return x


def test_rht_rescaled_sums_give_the_plain_bits_wherever_those_are_finite():
    """apply_rht sums with T / 16 and scales back: bit-identical to the plain bf16(v @ T) (the same
    matmul, TE's formula) wherever that is finite, including subnormal inputs and mixed magnitudes; and
    finite for every finite input (saturating past bf16's range)."""
    overflowed = 0
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        x = _bf16_wide(64, 256, seed)
        # narrow chunks (magnitudes within a few binades) and chunks near bf16's max (sums that overflow)
        x[:32] = (torch.randn(32, 256, generator=g) * 2.0 ** (seed * 30 - 60)).bfloat16()
        x[32:48] = (torch.randn(16, 256, generator=g).sign() * 2.0**127 * (1 + 0.99 * torch.rand(16, 256, generator=g))).bfloat16()
        for mask in (0xD7E8, 0):
            got = apply_rht(x, mask)
            plain = torch.matmul(x.float().view(64, 16, 16), rht_matrix(mask)).view(64, 256).to(torch.bfloat16)
            finite = plain.isfinite()
            assert torch.equal(got[finite].view(torch.int16), plain[finite].view(torch.int16))
            assert got.isfinite().all()
            overflowed += int((~finite).sum())
    assert overflowed > 0
    # the exact transform of near-max values that cancel is small; TE's order overflowed there
    big = torch.finfo(torch.bfloat16).max
    x = torch.full((2, 16), big, dtype=torch.bfloat16)
    x[:, 1::2] = -big
    y = apply_rht(x, 0)
    assert y.isfinite().all() and (y.float().abs() <= big).all()
    assert torch.equal(y[:, 0], torch.zeros(2, dtype=torch.bfloat16))  # Hadamard row 0: sum of +-big pairs


def test_inverse_rht_rescales_only_where_the_plain_sum_overflows():
    g = torch.Generator().manual_seed(5)
    y = torch.randn(64, 64, generator=g) * torch.exp2(torch.randint(-140, 128, (64, 64), generator=g).float())
    y[:16] = torch.randn(16, 64, generator=g).sign() * 2.0**127 * (1 + 0.99 * torch.rand(16, 64, generator=g))
    y = y.clamp(-FLT_MAX, FLT_MAX)
    plain = torch.matmul(y.view(64, 4, 16), rht_matrix(0xD7E8).T).view(64, 64)
    got = inverse_rht(y)
    finite = plain.view(64, 4, 16).isfinite().all(dim=-1, keepdim=True).expand(64, 4, 16).reshape(64, 64)
    assert torch.equal(got[finite].view(torch.int32), plain[finite].view(torch.int32))
    assert (~finite).any() and got.isfinite().all()
