"""Bad input gives a clear ValueError/TypeError naming the argument and the rule."""
import pytest
import torch

import nvfp4lab

X = torch.randn(32, 64, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        (dict(rht=True, four_over_six="mae"), ValueError, "rht and four_over_six"),
        (dict(rht=True, per_token=True), ValueError, "rht and per_token"),
        (dict(block="16x16", per_token=True), ValueError, "per_token and block"),
        (dict(stochastic_rounding=True, four_over_six="mse"), ValueError, "stochastic_rounding and four_over_six"),
        (dict(block="1x32"), ValueError, "block must be one of"),
        (dict(four_over_six="max"), ValueError, "four_over_six must be one of"),
        (dict(e4m3_max=300), ValueError, "e4m3_max must be 448 or 256"),
        (dict(rowwise=False, columnwise=False), ValueError, "at least one output"),
        (dict(scale_layout="tiled"), ValueError, "scale_layout must be one of"),
        (dict(rht=True, rht_sign_mask=1 << 16), ValueError, "rht_sign_mask must be a 16-bit"),
        (dict(backend="cuda"), ValueError, "backend must be one of"),
        (dict(amax=torch.ones(3)), ValueError, "amax must have 1 elements"),
        (dict(per_token=True, amax=torch.ones(1)), ValueError, "amax must have 32 elements"),
        (dict(amax=torch.ones(1, dtype=torch.int32)), TypeError, "amax must be a floating-point"),
        (dict(stochastic_rounding=True, seed=1, generator=torch.Generator()), ValueError, "seed and generator"),
    ],
)
def test_quantize_nvfp4_rejects(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        nvfp4lab.quantize_nvfp4(X, **kwargs)


def test_quantize_nvfp4_shape_and_dtype_rules():
    with pytest.raises(TypeError, match="x must have dtype in"):
        nvfp4lab.quantize_nvfp4(torch.ones(16, 16, dtype=torch.int32))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        nvfp4lab.quantize_nvfp4([[1.0] * 16])
    with pytest.raises(ValueError, match=r"K\) must be a multiple of 16"):
        nvfp4lab.quantize_nvfp4(torch.randn(16, 40))
    with pytest.raises(ValueError, match=r"M \(product of x's leading dims\) must be a multiple of 16"):
        nvfp4lab.quantize_nvfp4(torch.randn(20, 32), columnwise=True)
    with pytest.raises(ValueError, match=r"M \(product of x's leading dims\) must be a multiple of 16"):
        nvfp4lab.quantize_nvfp4(torch.randn(20, 32), block="16x16")
    with pytest.raises(ValueError, match="at least 2 dims"):
        nvfp4lab.quantize_nvfp4(torch.randn(32))
    # rowwise-only 1x16 takes any M
    assert nvfp4lab.quantize_nvfp4(torch.randn(20, 32)).rowwise_data.shape == (20, 16)


def test_mxfp8_rules():
    with pytest.raises(ValueError, match=r"K\) must be a multiple of 32"):
        nvfp4lab.quantize_mxfp8(torch.randn(32, 48))
    with pytest.raises(ValueError, match="must be a multiple of 32"):
        nvfp4lab.quantize_mxfp8(torch.randn(48, 64), rowwise=False, columnwise=True)
    with pytest.raises(ValueError, match="fp8_format must be one of"):
        nvfp4lab.quantize_mxfp8(torch.randn(32, 32), fp8_format="e3m4")


def test_dequantize_rules():
    q = nvfp4lab.quantize_nvfp4(X)
    with pytest.raises(ValueError, match="no columnwise copy"):
        q.dequantize(which="columnwise")
    with pytest.raises(ValueError, match="which must be"):
        q.dequantize(which="both")
    with pytest.raises(TypeError, match="dtype must be"):
        q.dequantize(torch.int8)
    with pytest.raises(TypeError, match="t must be an NVFP4Tensor"):
        nvfp4lab.dequantize_nvfp4(X)


def test_gemm_rules():
    a = nvfp4lab.quantize_nvfp4(torch.randn(32, 64))
    b = nvfp4lab.quantize_nvfp4(torch.randn(16, 64))
    b_k = nvfp4lab.quantize_nvfp4(torch.randn(16, 32))
    b_col = nvfp4lab.quantize_nvfp4(torch.randn(16, 64), rowwise=False, columnwise=True)
    with pytest.raises(ValueError, match="must share K"):
        nvfp4lab.nvfp4_gemm(a, b_k)
    with pytest.raises(ValueError, match="b has no rowwise copy"):
        nvfp4lab.nvfp4_gemm(a, b_col)
    with pytest.raises(ValueError, match=r"bias must have shape \(N,\)"):
        nvfp4lab.nvfp4_gemm(a, b, bias=torch.zeros(32))
    with pytest.raises(ValueError, match=r"out must have shape \(M, N\)"):
        nvfp4lab.nvfp4_gemm(a, b, out=torch.zeros(16, 32))
    with pytest.raises(ValueError, match="accumulate=True needs out"):
        nvfp4lab.nvfp4_gemm(a, b, accumulate=True)
    with pytest.raises(TypeError, match="a must be an NVFP4Tensor"):
        nvfp4lab.nvfp4_gemm(torch.zeros(2, 2), b)


def test_swizzle_rules():
    with pytest.raises(TypeError, match="scale must have dtype in"):
        nvfp4lab.swizzle_scales(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="swizzled must hold"):
        nvfp4lab.unswizzle_scales(torch.zeros(100, dtype=torch.uint8), 4, 4)
