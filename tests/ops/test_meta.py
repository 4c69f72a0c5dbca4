"""Meta tensors (no values, e.g. a model built on device="meta") give the outputs' shapes and dtypes, as any torch
op does, on both backends: each result is compared, field by field, with the same call on CPU values."""
import pytest
import torch

import nvfp4lab

BACKENDS = ["ref", pytest.param("triton", marks=pytest.mark.skipif(not nvfp4lab.ops.triton_available(), reason="triton"))]
FIELDS = ("rowwise_data", "rowwise_scale", "rowwise_amax", "columnwise_data", "columnwise_scale", "columnwise_amax")
RECIPES = {
    "1x16": dict(columnwise=True),
    "rht": dict(columnwise=True, rht=True),
    "16x16": dict(columnwise=True, block="16x16"),
    "per_token": dict(columnwise=True, per_token=True),
    "4over6": dict(columnwise=True, four_over_six="mae"),
    "sr_seed": dict(columnwise=True, rht=True, stochastic_rounding=True, seed=3),
    "sr": dict(stochastic_rounding=True),
    "swizzled": dict(columnwise=True, scale_layout="swizzled"),
    "pr3045": dict(columnwise=True, per_token=True, numerics="te_pr3045"),
}


def _meta(t):
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _assert_like(got, want, fields):
    for field in fields:
        g, w = getattr(got, field), getattr(want, field)
        assert (g is None) == (w is None), field
        if w is not None:
            assert g.device.type == "meta" and g.shape == w.shape and g.dtype == w.dtype, (field, g, w)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_quantize_on_meta(recipe, backend):
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    want = nvfp4lab.quantize_nvfp4(x, backend="ref", **RECIPES[recipe])
    got = nvfp4lab.quantize_nvfp4(_meta(x), backend=backend, **RECIPES[recipe])
    assert got.shape == want.shape
    _assert_like(got, want, FIELDS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantize_gemm_and_operands_on_meta(backend):
    x, w = torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(48, 64, dtype=torch.bfloat16)
    qa = nvfp4lab.quantize_nvfp4(_meta(x), columnwise=True, backend=backend)
    qb = nvfp4lab.quantize_nvfp4(_meta(w), block="16x16", backend=backend)
    for which in ("rowwise", "columnwise"):
        out = nvfp4lab.dequantize_nvfp4(qa, which=which, backend=backend)
        assert out.device.type == "meta" and out.shape == (32, 64) and out.dtype == torch.bfloat16
    y = nvfp4lab.nvfp4_gemm(qa, qb, bias=torch.empty(48, device="meta"), out_dtype=torch.float32, backend=backend)
    assert y.device.type == "meta" and y.shape == (32, 48) and y.dtype == torch.float32
    out = torch.empty(32, 48, device="meta", dtype=torch.bfloat16)
    assert nvfp4lab.nvfp4_gemm(qa, qb, out=out, accumulate=True, backend=backend) is out
    op = nvfp4lab.nvfp4_operand(qb, transposed=True, backend=backend)
    assert op.values.device.type == "meta" and op.values.shape == (64, 48)
    config = nvfp4lab.NVFP4QuantConfig(columnwise=True, rht=True, stochastic_rounding=True)
    packed, row, col = nvfp4lab.quantize_nvfp4_operands(_meta(x), config=config, rowwise_operand=True,
                                                        columnwise_operand=True, seed=5, backend=backend)
    assert packed is None and row.values.shape == (32, 64) and col.values.shape == (64, 32)
    assert row.values.device.type == col.values.device.type == "meta"


@pytest.mark.parametrize("backend", BACKENDS)
def test_mxfp8_and_swizzle_on_meta(backend):
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    want = nvfp4lab.quantize_mxfp8(x, columnwise=True, backend="ref")
    got = nvfp4lab.quantize_mxfp8(_meta(x), columnwise=True, backend=backend)
    _assert_like(got, want, ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"))
    out = nvfp4lab.dequantize_mxfp8(got, which="columnwise", backend=backend)
    assert out.device.type == "meta" and out.shape == (64, 64)
    scale = torch.randint(0, 255, (32, 4), dtype=torch.uint8)
    swizzled = nvfp4lab.swizzle_scales(_meta(scale), backend=backend)
    assert swizzled.device.type == "meta" and swizzled.shape == nvfp4lab.swizzle_scales(scale, backend="ref").shape
    back = nvfp4lab.unswizzle_scales(swizzled, 32, 4, backend=backend)
    assert back.device.type == "meta" and back.shape == (32, 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", [dict(columnwise=True), dict(columnwise=True, rht=True)], ids=["1x16", "rht"])
def test_grouped_quantize_on_meta(options, backend):
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    want = nvfp4lab.quantize_nvfp4_grouped_bulk(x, [16, 48], backend="ref", **options)
    got = nvfp4lab.quantize_nvfp4_grouped_bulk(_meta(x), [16, 48], backend=backend, **options)
    _assert_like(got, want, FIELDS)
    parts = nvfp4lab.quantize_nvfp4_grouped(_meta(x), [16, 48], backend=backend, **options)
    assert [p.shape for p in parts] == [(16, 64), (48, 64)]
