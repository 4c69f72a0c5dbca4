"""Public ops on the reference backend: shapes, empty tensors, non-contiguous and 3-D inputs, GEMM."""
import pytest
import torch

import nvfp4lab


def test_three_d_and_non_contiguous_inputs():
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    q = nvfp4lab.quantize_nvfp4(x, columnwise=True)
    assert q.shape == x.shape
    flat = nvfp4lab.quantize_nvfp4(x.reshape(32, 64), columnwise=True)
    assert torch.equal(q.rowwise_data, flat.rowwise_data)
    assert torch.equal(q.columnwise_data, flat.columnwise_data)
    assert q.dequantize().shape == x.shape
    xt = torch.randn(64, 32).t()  # non-contiguous (32, 64)
    assert torch.equal(nvfp4lab.quantize_nvfp4(xt).rowwise_data, nvfp4lab.quantize_nvfp4(xt.contiguous()).rowwise_data)


@pytest.mark.parametrize("shape", [(0, 32), (32, 0), (0, 0), (2, 0, 16)])
def test_empty_tensors(shape):
    x = torch.empty(shape, dtype=torch.bfloat16)
    q = nvfp4lab.quantize_nvfp4(x, columnwise=True)
    m = 1
    for d in shape[:-1]:
        m *= d
    k = shape[-1]
    assert q.rowwise_data.shape == (m, k // 2)
    assert q.columnwise_data.shape == (k, m // 2)
    assert q.dequantize().shape == x.shape
    assert q.dequantize(which="columnwise").shape == x.shape
    if m % 32 == 0 and k % 32 == 0:
        mx = nvfp4lab.quantize_mxfp8(x, columnwise=True)
        assert mx.dequantize().numel() == 0


def test_gemm_empty_and_values():
    a = nvfp4lab.quantize_nvfp4(torch.randn(0, 64))
    b = nvfp4lab.quantize_nvfp4(torch.randn(16, 64))
    assert nvfp4lab.nvfp4_gemm(a, b).shape == (0, 16)
    a = nvfp4lab.quantize_nvfp4(torch.randn(32, 64), per_token=True)
    out = nvfp4lab.nvfp4_gemm(a, b, out_dtype=torch.float32)
    want = a.dequantize(torch.float32) @ b.dequantize(torch.float32).t()
    assert torch.allclose(out, want, rtol=2**-7, atol=1e-5)


def test_gemm_bias_accumulate_and_swizzled_inputs():
    xa, xb = torch.randn(32, 64), torch.randn(48, 64)
    a = nvfp4lab.quantize_nvfp4(xa, scale_layout="swizzled")
    b = nvfp4lab.quantize_nvfp4(xb, four_over_six="mae")
    bias = torch.randn(48)
    base = a.dequantize(torch.float32) @ b.dequantize(torch.float32).t()
    out = torch.randn(32, 48)
    start = out.clone()
    nvfp4lab.nvfp4_gemm(a, b, bias=bias, out=out, accumulate=True)
    assert torch.allclose(out, start + base + bias, rtol=2**-7, atol=1e-4)
    bf = nvfp4lab.nvfp4_gemm(a, b, out_dtype=torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    assert torch.allclose(bf.float(), base, rtol=2**-7, atol=1e-4)


def test_mxfp8_round_trip_and_layouts():
    x = torch.randn(64, 96)
    for fmt, tol in (("e4m3", 0.07), ("e5m2", 0.14)):
        q = nvfp4lab.quantize_mxfp8(x, rowwise=True, columnwise=True, fp8_format=fmt)
        for which in ("rowwise", "columnwise"):
            rel = (q.dequantize(torch.float32, which=which) - x).norm() / x.norm()
            assert rel < tol, (fmt, which, rel)
    base = nvfp4lab.quantize_mxfp8(x, rowwise=True, columnwise=True)
    for layout in ("padded", "swizzled"):
        q = nvfp4lab.quantize_mxfp8(x, rowwise=True, columnwise=True, scale_layout=layout)
        for which in ("rowwise", "columnwise"):
            assert torch.equal(q.dequantize(torch.float32, which=which), base.dequantize(torch.float32, which=which))
    padded = nvfp4lab.quantize_mxfp8(x, rowwise=True, columnwise=True, scale_layout="padded")
    assert padded.rowwise_scale.shape == (128, 4)
    assert padded.columnwise_scale.shape == (4, 128)
    swz = nvfp4lab.quantize_mxfp8(x, rowwise=False, columnwise=True, scale_layout="swizzled")
    assert swz.columnwise_scale.shape == (128, 4)  # swizzle of the transposed (K, M/32) matrix


def test_backend_env_override(monkeypatch):
    monkeypatch.setenv("NVFP4LAB_BACKEND", "bogus")
    with pytest.raises(ValueError, match="backend must be one of"):
        nvfp4lab.quantize_nvfp4(torch.randn(16, 16))
    monkeypatch.setenv("NVFP4LAB_BACKEND", "ref")
    assert nvfp4lab.ops.resolve_backend(None, torch.device("cpu")) == "ref"


@pytest.mark.parametrize("per_token", [False, True], ids=["tensor", "token"])
def test_grouped_wgrad_matches_per_split_gemms_of_the_columnwise_copies(per_token):
    # dW[e] = dy_e^T x_e: each split's columnwise copies as rowwise operands (what the per-expert wgrad
    # of GroupedLinear multiplies), the Triton path (interpreter) within the GEMM tolerance of the reference
    gen = torch.Generator().manual_seed(3)
    sizes = [32, 0, 48, 16]
    m = sum(sizes)
    dy = torch.randn(m, 32, generator=gen)
    x = torch.randn(m, 64, generator=gen)
    options = dict(rowwise=False, columnwise=True, per_token=per_token, rht=not per_token)
    qdy = nvfp4lab.quantize_nvfp4_grouped_bulk(dy, sizes, backend="ref", **options)
    qx = nvfp4lab.quantize_nvfp4_grouped_bulk(x, sizes, backend="ref", **options)
    want = nvfp4lab.nvfp4_grouped_wgrad(qdy, qx, sizes, out_dtype=torch.float32, backend="ref")
    got = nvfp4lab.nvfp4_grouped_wgrad(qdy, qx, sizes, out_dtype=torch.float32, backend="triton")
    assert want.shape == got.shape == (4, 32, 64)
    assert torch.equal(want[1], torch.zeros(32, 64))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    for e, (dy_e, x_e) in enumerate(zip(qdy.split(sizes), qx.split(sizes))):
        if sizes[e]:
            # the split's own columnwise copy, as the per-expert path hands it to nvfp4_gemm
            ops_a = nvfp4lab.functional.transposed_operand(dy_e)
            ops_b = nvfp4lab.functional.transposed_operand(x_e)
            assert torch.equal(want[e], nvfp4lab.nvfp4_gemm(ops_a, ops_b, out_dtype=torch.float32, backend="ref"))


def test_grouped_wgrad_rejects_bad_inputs():
    x = torch.randn(48, 32)
    q = nvfp4lab.quantize_nvfp4_grouped_bulk(x, [16, 32], rowwise=True, columnwise=True, backend="ref")
    row_only = nvfp4lab.quantize_nvfp4_grouped_bulk(x, [16, 32], backend="ref")
    with pytest.raises(TypeError, match="dy must be a GroupedNVFP4Tensor"):
        nvfp4lab.nvfp4_grouped_wgrad(x, q, [16, 32])
    with pytest.raises(ValueError, match="x has no columnwise copy"):
        nvfp4lab.nvfp4_grouped_wgrad(q, row_only, [16, 32])
    with pytest.raises(ValueError, match="one size per split"):
        nvfp4lab.nvfp4_grouped_wgrad(q, q, [16, 16, 16])
    with pytest.raises(ValueError, match="summing|sum"):
        nvfp4lab.nvfp4_grouped_wgrad(q, q, [16, 16])
    q8 = nvfp4lab.quantize_nvfp4_grouped_bulk(torch.randn(16, 32), [8, 8], backend="ref")
    with pytest.raises(ValueError, match="columnwise"):
        nvfp4lab.nvfp4_grouped_wgrad(q8, q8, [8, 8])


BACKENDS = ["ref", pytest.param("triton", marks=pytest.mark.skipif(not nvfp4lab.ops.triton_available(), reason="triton"))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_seed_tensor_rounds_as_the_int_seed_of_its_value(backend):
    """An int64 one-element seed tensor on x's device (drawn on the device by a captured layer, read without a host
    sync) gives the SR bits of the int seed of its value: quantize_nvfp4, its operand cast and the grouped cast."""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    config = nvfp4lab.NVFP4QuantConfig(columnwise=True, rht=True, stochastic_rounding=True)
    for value in (5, 2**62 - 3):
        by_int = nvfp4lab.quantize_nvfp4(x, config=config, seed=value, backend=backend)
        for seed in (torch.tensor([value]), torch.tensor(value), torch.tensor([0, value])[1:]):  # last: a view 8 bytes in
            got = nvfp4lab.quantize_nvfp4(x, config=config, seed=seed, backend=backend)
            for field in ("rowwise_data", "columnwise_data"):
                assert torch.equal(getattr(got, field), getattr(by_int, field)), (value, field)
        _, row_int, col_int = nvfp4lab.quantize_nvfp4_operands(x, config=config, seed=value, backend=backend)
        _, row, col = nvfp4lab.quantize_nvfp4_operands(x, config=config, seed=torch.tensor([value]), backend=backend)
        assert torch.equal(row.values, row_int.values) and torch.equal(col.values, col_int.values), value
        grouped_int = nvfp4lab.quantize_nvfp4_grouped_bulk(x, [16, 16], config=config, seed=value, backend=backend)
        grouped = nvfp4lab.quantize_nvfp4_grouped_bulk(x, [16, 16], config=config, seed=torch.tensor([value]),
                                                       backend=backend)
        assert torch.equal(grouped.rowwise_data, grouped_int.rowwise_data), value
    other = nvfp4lab.quantize_nvfp4(x, config=config, seed=torch.tensor([6]), backend=backend)
    assert not torch.equal(other.rowwise_data, by_int.rowwise_data)


@pytest.mark.parametrize("backend", BACKENDS)
def test_quantize_nvfp4_dbias(backend):
    """The quantized tensor of quantize_nvfp4 with the same seed, and x's sum over its leading dims: torch's fp32 sum
    rounded once on the reference backend, within fp32 rounding of it on Triton (its own order); x's dtype by
    default; refused dtypes name the argument."""
    x = torch.randn(2, 48, 64, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    config = nvfp4lab.NVFP4QuantConfig(columnwise=True, rht=True, stochastic_rounding=True)
    q, db = nvfp4lab.quantize_nvfp4_dbias(x, config=config, seed=5, backend=backend)
    want = nvfp4lab.quantize_nvfp4(x, config=config, seed=5, backend=backend)
    assert q.shape == x.shape and torch.equal(q.rowwise_data, want.rowwise_data)
    assert torch.equal(q.columnwise_data, want.columnwise_data)
    assert db.shape == (64,) and db.dtype == torch.bfloat16
    exact = x.double().sum((0, 1))
    if backend == "ref":
        assert torch.equal(db, x.reshape(96, 64).sum(0, dtype=torch.float32).bfloat16())
    _, db32 = nvfp4lab.quantize_nvfp4_dbias(x, config=config, dbias_dtype=torch.float32, seed=5, backend=backend)
    torch.testing.assert_close(db32.double(), exact, rtol=0, atol=1e-5)
    with pytest.raises(TypeError, match="dbias_dtype must be one of"):
        nvfp4lab.quantize_nvfp4_dbias(x, config=config, dbias_dtype=torch.int32, backend=backend)
    with pytest.raises(TypeError, match="config must be an NVFP4QuantConfig"):
        nvfp4lab.quantize_nvfp4_dbias(x, config=None, backend=backend)
