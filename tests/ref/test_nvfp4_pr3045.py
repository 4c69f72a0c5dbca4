"""The reference's PR 3045 numerics (numerics="te_pr3045") beyond the golden vectors: its fp32 RHT and
stochastic rounding (the PR's reference has neither; nvfp4lab's rule is written from the seed and the
spec), the floor and zero-scale rules against TE main's, the raw-amax dequantize, the 2D weight, and the
GEMM epilogue order. Expected values are computed here independently (numpy fp32 / fp64), never by the
code under test."""
import numpy as np
import pytest
import torch

import nvfp4lab
from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.ref import codecs
from nvfp4lab.ref import gemm as ref_gemm
from nvfp4lab.ref import nvfp4 as ref_nvfp4
from nvfp4lab.rht import apply_rht, apply_rht_fp32, inverse_rht

PR = dict(per_token=True, numerics="te_pr3045")
GRID = np.array(codecs.E2M1_GRID, dtype=np.float64)


def _randn(m, k, dtype=torch.float32, seed=0, scale_rows=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    if scale_rows:
        x = x * 10.0 ** (torch.rand(m, 1, generator=g) * 6 - 3)
    return x.to(dtype)


def _butterfly_np(v) -> list:
    """The fp32 RHT butterfly as written in the docs, one np.float32 scalar op at a time: stages
    h = 1, 2, 4, 8; for every i with bit h clear, (v[i], v[i+h]) <- (v[i] + v[i+h], v[i] - v[i+h])."""
    v = [np.float32(t) for t in v]
    h = 1
    while h < 16:
        for i in range(16):
            if not i & h:
                a, b = v[i], v[i + h]
                v[i], v[i + h] = np.float32(a + b), np.float32(a - b)
        h *= 2
    return v


@pytest.mark.parametrize("mask", [0xD7E8, 0x0000, 0xACE1])
def test_fp32_rht_is_the_documented_butterfly(mask):
    y = _randn(3, 32, seed=1, scale_rows=True)  # random fp32: the 16-term sums round, so the order shows
    got = apply_rht_fp32(y, mask).numpy()
    for r in range(3):
        for c0 in range(0, 32, 16):
            signed = [np.float32(-t if (mask >> i) & 1 else t) for i, t in enumerate(y[r, c0:c0 + 16].numpy())]
            want = np.array([np.float32(t * np.float32(0.25)) for t in _butterfly_np(signed)], dtype=np.float32)
            assert np.array_equal(got[r, c0:c0 + 16].view(np.int32), want.view(np.int32)), (r, c0)


def test_fp32_rht_keeps_fp32_and_inverts_to_fp32_precision():
    x = _randn(8, 64, seed=2)
    y = apply_rht_fp32(x)
    assert y.dtype == torch.float32
    assert not torch.equal(y, y.bfloat16().float())  # not rounded to bf16 (TE main's RHT is)
    assert torch.allclose(inverse_rht(y), x, rtol=0, atol=1e-5)
    main = apply_rht(x).float()
    assert (main - y).abs().max() > 0 and torch.allclose(main, y, rtol=1e-2, atol=1e-2)


def _s_enc_pr3045(amax: np.ndarray) -> np.ndarray:
    """Step 2 of shared/golden_pr3045/README.md in numpy fp32."""
    floored = np.maximum(amax.astype(np.float32), np.float32(1e-12))
    s_enc = np.minimum(np.float32(2688.0) / floored, np.float32(np.finfo(np.float32).max))
    return np.where(s_enc == 0, np.float32(1.0), s_enc).astype(np.float32)


def _check_codes_rule(y: np.ndarray, amax: np.ndarray, codes: torch.Tensor, scale: torch.Tensor, sr: bool = False):
    """Each 1x16 block of y (R, C): s = 0 -> all codes 0; s > 0 -> code = nearest E2M1 value (RN, within
    the half-gap) or one of the two neighbours (SR) of the exact y * S_enc / s, clamped at 6, y's sign."""
    s_enc = _s_enc_pr3045(amax).astype(np.float64)[:, None]
    s = codecs.e4m3_decode(scale).double().repeat_interleave(16, 1).numpy()
    q = codecs.e2m1_decode(codecs.unpack_fp4(codes)).double().numpy()
    zero_block = s == 0
    assert (q[zero_block] == 0).all() and (codecs.unpack_fp4(codes).numpy()[zero_block] == 0).all()
    t = np.where(zero_block, 0.0, y.astype(np.float64) * s_enc / np.where(zero_block, 1.0, s))
    a = np.minimum(np.abs(t), 6.0)
    hi = GRID[np.clip(np.searchsorted(GRID, a - 1e-6), 0, 7)]
    lo = GRID[np.clip(np.searchsorted(GRID, a + 1e-6, side="right") - 1, 0, 7)]
    mag = np.abs(q)
    if sr:
        ok = (mag == lo) | (mag == hi)
    else:
        ok = np.abs(mag - a) <= (hi - lo) / 2 + 1e-5
    ok &= (q == 0) | (np.sign(q) == np.sign(t))
    assert ok[~zero_block].all(), f"{(~ok[~zero_block]).sum()} codes break the rule"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_token_fp32_rht_columnwise_copy_follows_the_rule(dtype):
    x = _randn(64, 48, dtype, seed=3, scale_rows=True)
    q = ref_nvfp4.quantize(x, NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True, **PR))
    y = apply_rht_fp32(x.t()).numpy()  # (K, M): rows of x^T transformed in fp32
    assert torch.equal(q.columnwise_amax, torch.from_numpy(np.abs(y).max(axis=1)))  # the raw post-RHT amax
    _check_codes_rule(y, q.columnwise_amax.numpy(), q.columnwise_data, q.columnwise_scale)
    _check_codes_rule(x.float().numpy(), q.rowwise_amax.numpy(), q.rowwise_data, q.rowwise_scale)  # rowwise: no RHT
    deq = q.dequantize(torch.float32, which="columnwise")  # the inverse RHT (fp32) undoes it
    assert (deq - x.float()).norm() / x.float().norm() < 0.15


def test_per_token_sr_follows_the_rule_and_is_unbiased():
    x = _randn(32, 64, seed=4, scale_rows=True)
    x[5, :16] = x[5, :16] * 1e-7  # a block whose scale underflows to 0 next to a large one
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True, **PR)
    rn = ref_nvfp4.quantize(x, NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True, **PR))
    draws = [nvfp4lab.quantize_nvfp4(x, config=config, seed=s, backend="ref") for s in range(40)]
    y_col = apply_rht_fp32(x.t()).numpy()
    for d in draws[:4]:
        for field in ("rowwise_scale", "rowwise_amax", "columnwise_scale", "columnwise_amax"):
            assert torch.equal(getattr(d, field), getattr(rn, field)), field
        _check_codes_rule(x.numpy(), d.rowwise_amax.numpy(), d.rowwise_data, d.rowwise_scale, sr=True)
        _check_codes_rule(y_col, d.columnwise_amax.numpy(), d.columnwise_data, d.columnwise_scale, sr=True)
    assert not torch.equal(draws[0].rowwise_data, draws[1].rowwise_data)
    for which in ("rowwise", "columnwise"):
        rn_err = (rn.dequantize(torch.float32, which) - x).pow(2).mean().sqrt()
        mean = torch.stack([d.dequantize(torch.float32, which) for d in draws]).mean(0)
        assert (mean - x).pow(2).mean().sqrt() < rn_err, which


def test_floor_and_zero_scale_blocks_differ_from_te_main():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(5))
    x[0] *= 1e-20  # amax < 1e-12: PR 3045 floors it, every block scale underflows to 0
    x[1] = torch.randn(32, generator=torch.Generator().manual_seed(6)).clamp(-3, 3) * 1e-4
    x[1, 20] = 1e3  # a spike: the other block of row 1 gets scale 0
    pr = nvfp4lab.quantize_nvfp4(x, per_token=True, numerics="te_pr3045", backend="ref")
    main = nvfp4lab.quantize_nvfp4(x, per_token=True, backend="ref")
    codes_pr, codes_main = codecs.unpack_fp4(pr.rowwise_data), codecs.unpack_fp4(main.rowwise_data)
    assert torch.equal(pr.rowwise_amax, x.abs().amax(1)) and torch.equal(pr.rowwise_amax, main.rowwise_amax)  # raw amax
    assert pr.rowwise_scale[0].eq(0).all() and codes_pr[0].eq(0).all()
    assert main.rowwise_scale[0].ne(0).all()  # TE main quantizes it at full resolution
    assert pr.rowwise_scale[1, 0] == 0 and main.rowwise_scale[1, 0] == 0
    assert codes_pr[1, :16].eq(0).all()  # PR 3045: code 0 in a zero-scale block
    assert ((codes_main[1, :16] & 7) == 7).all()  # TE main: enc = FLT_MAX saturates them to +-6
    for q in (pr, main):
        assert q.dequantize(torch.float32)[1, :16].eq(0).all()
    # S_enc from the floored amax: the scales of a row with amax in (0, 1e-12)
    row = torch.randn(1, 32) * 1e-14
    got = nvfp4lab.quantize_nvfp4(row, per_token=True, numerics="te_pr3045", backend="ref")
    s_enc = _s_enc_pr3045(np.array([1e-12], dtype=np.float32))[0]
    bamax = row.abs().reshape(2, 16).amax(1).numpy()
    want = codecs.e4m3_encode(torch.from_numpy(bamax * np.float32(s_enc * np.float32(1.0 / 6.0))))
    assert torch.equal(got.rowwise_scale[0], want)


def test_dequantize_uses_the_raw_amax_as_the_pr_does():
    """The flagged inconsistency, kept: the encoder floors the amax at 1e-12, PR 3045's dequantize uses the
    raw one, so rows with amax < 1e-12 decode too small by amax / 1e-12."""
    x = torch.randn(2, 64) * 3.0
    x[1] = torch.randn(64) * 1e-14  # amax ~ 3e-14 < 1e-12
    q = nvfp4lab.quantize_nvfp4(x, per_token=True, numerics="te_pr3045", backend="ref")
    deq = q.dequantize(torch.float32)
    assert (deq[0] - x[0]).norm() / x[0].norm() < 0.15
    amax = float(q.rowwise_amax[1])
    floored = np.float32(1e-12)
    assert amax < floored
    ratio = (deq[1] * x[1]).sum() / (x[1] * x[1]).sum()  # least-squares factor between decode and x
    assert abs(float(ratio) / (amax / float(floored)) - 1) < 0.15
    # the factor, per element, is fl(q * fl(s * fl(amax / 2688)))
    s = codecs.e4m3_decode(q.rowwise_scale[1]).numpy().astype(np.float32)
    qv = codecs.e2m1_decode(codecs.unpack_fp4(q.rowwise_data[1])).numpy().astype(np.float32)
    want = qv * np.repeat(s * np.float32(np.float32(amax) / np.float32(2688.0)), 16)
    assert np.array_equal(deq[1].numpy().view(np.int32), want.astype(np.float32).view(np.int32))


def test_2d_weight_is_te_mains_per_tensor_cast_with_the_amax_copied():
    w = _randn(48, 64, seed=5)
    pr = nvfp4lab.quantize_nvfp4(w, block="16x16", rowwise=True, columnwise=True, per_token=True,
                                 numerics="te_pr3045", backend="ref")
    main = nvfp4lab.quantize_nvfp4(w, block="16x16", rowwise=True, columnwise=True, backend="ref")
    for field in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        assert torch.equal(getattr(pr, field), getattr(main, field)), field
    amax = w.abs().max()
    assert torch.equal(pr.rowwise_amax, amax.expand(48)) and torch.equal(pr.columnwise_amax, amax.expand(64))
    given = nvfp4lab.quantize_nvfp4(w, block="16x16", per_token=True, numerics="te_pr3045", amax=2 * amax.reshape(1),
                                    backend="ref")
    assert torch.equal(given.rowwise_amax, (2 * amax).expand(48))
    with pytest.raises(ValueError, match="2D weight"):
        nvfp4lab.quantize_nvfp4_grouped_bulk(w, [16, 32], config=pr.config, backend="ref")


def _exact_operand(rows, k, amax, seed):
    """An NVFP4Tensor with small codes and power-of-two scales, so every dot product is exact in fp32
    whatever the order: the epilogue is then the GEMM's only rounding."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, k), generator=g, dtype=torch.uint8)
    scale = codecs.e4m3_encode(2.0 ** torch.randint(-3, 4, (rows, k // 16), generator=g).float())
    config = NVFP4QuantConfig(**PR)
    return nvfp4lab.NVFP4Tensor.from_parts(torch.Size((rows, k)), torch.bfloat16, config,
                                           rowwise=(codecs.pack_fp4(codes), scale, amax))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_gemm_takes_the_prs_epilogue_order(out_dtype):
    m, n, k = 16, 24, 64
    g = torch.Generator().manual_seed(6)
    amax_a = (torch.rand(m, generator=g) * 10 + 0.1).float()
    amax_b = (torch.rand(n, generator=g) * 10 + 0.1).float()
    a, b = _exact_operand(m, k, amax_a, 7), _exact_operand(n, k, amax_b, 8)
    acc = (ref_gemm.block_dequantized(a.rowwise_data, a.rowwise_scale).double()
           @ ref_gemm.block_dequantized(b.rowwise_data, b.rowwise_scale).double().t()).numpy().astype(np.float32)
    inv = np.float32(1.0 / 7225344.0)
    evt = ((acc * amax_a.numpy()[:, None]) * amax_b.numpy()[None, :]) * inv  # numpy fp32, op by op
    main_order = acc * ((amax_a.numpy()[:, None] * amax_b.numpy()[None, :]) * inv)
    assert not np.array_equal(evt, main_order)  # the two orders differ on this data
    got = nvfp4lab.nvfp4_gemm(a, b, out_dtype=out_dtype, backend="ref")
    assert torch.equal(got, torch.from_numpy(evt).to(out_dtype))
    bias = torch.randn(n, generator=g)
    got_b = nvfp4lab.nvfp4_gemm(a, b, out_dtype=out_dtype, bias=bias, backend="ref")
    assert torch.equal(got_b, torch.from_numpy(evt + bias.numpy()).to(out_dtype))  # bias in fp32, one cast


def test_gemm_refuses_mixed_numerics():
    a = nvfp4lab.quantize_nvfp4(_randn(16, 32), per_token=True, numerics="te_pr3045", backend="ref")
    b = nvfp4lab.quantize_nvfp4(_randn(16, 32), backend="ref")
    with pytest.raises(ValueError, match="must share numerics"):
        nvfp4lab.nvfp4_gemm(a, b, backend="ref")
