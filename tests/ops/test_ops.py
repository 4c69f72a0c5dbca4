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
