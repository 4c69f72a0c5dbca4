"""Bad input gives a clear ValueError/TypeError naming the argument and the rule."""
import dataclasses

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
    # operands, bias and out on another device (meta stands in for a GPU on a CPU-only machine)
    b_meta = nvfp4lab.quantize_nvfp4(torch.empty(16, 64, device="meta"))
    with pytest.raises(ValueError, match="a and b must be on one device, got cpu and meta"):
        nvfp4lab.nvfp4_gemm(a, b_meta)
    with pytest.raises(ValueError, match="bias must be on a's device cpu, got meta"):
        nvfp4lab.nvfp4_gemm(a, b, bias=torch.zeros(16, device="meta"))
    with pytest.raises(ValueError, match="out must be on a's device cpu, got meta"):
        nvfp4lab.nvfp4_gemm(a, b, out=torch.zeros(32, 16, device="meta"))


@pytest.mark.parametrize("backend", ["ref", pytest.param("triton", marks=pytest.mark.skipif(
    not nvfp4lab.ops.triton_available(), reason="triton"))])
def test_gemm_refuses_malformed_containers(backend):
    """A container whose parts do not match its shape and config (built by hand, or a field replaced) is refused naming
    the operand and the part, by the GEMM and the operand expansion alike: the kernels would read it out of bounds."""
    import dataclasses

    a = nvfp4lab.quantize_nvfp4(torch.randn(32, 64))
    b = nvfp4lab.quantize_nvfp4(torch.randn(48, 64), block="16x16")
    cases = [
        (dataclasses.replace(a, rowwise_scale=a.rowwise_scale[:16]), ValueError, r"a: rowwise_scale must have shape \(32, 4\)"),
        (dataclasses.replace(a, rowwise_data=a.rowwise_data[:, :16]), ValueError, r"a: rowwise_data must have shape \(32, 32\)"),
        (dataclasses.replace(a, rowwise_scale=a.rowwise_scale.float()), TypeError, "a: rowwise_scale must be a uint8"),
        (dataclasses.replace(a, rowwise_amax=torch.ones(2)), ValueError, "a: rowwise_amax must have 1 elements"),
        (dataclasses.replace(a, rowwise_amax=torch.ones(1, dtype=torch.int32)), TypeError, "a: rowwise_amax must be a floating"),
    ]
    for bad, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            nvfp4lab.nvfp4_gemm(bad, b, backend=backend)
    with pytest.raises(ValueError, match=r"t: rowwise_scale must have shape \(48, 4\)"):
        nvfp4lab.nvfp4_operand(dataclasses.replace(b, rowwise_scale=b.rowwise_scale[:8]), backend=backend)
    op = nvfp4lab.nvfp4_operand(b, backend=backend)
    with pytest.raises(ValueError, match="b \\(an NVFP4Operand\\) must hold floating values"):
        nvfp4lab.nvfp4_gemm(a, dataclasses.replace(op, amax=torch.ones(3)), backend=backend)


def test_swizzle_rules():
    with pytest.raises(TypeError, match="scale must have dtype in"):
        nvfp4lab.swizzle_scales(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="swizzled must hold"):
        nvfp4lab.unswizzle_scales(torch.zeros(100, dtype=torch.uint8), 4, 4)


# ------------------------------------------------------------------ refused, naming the argument
BACKENDS = ["ref", pytest.param("triton", marks=pytest.mark.skipif(not nvfp4lab.ops.triton_available(), reason="triton"))]


@pytest.mark.parametrize(
    "kwargs,exc,pattern",
    [
        (dict(e4m3_max="448"), TypeError, "e4m3_max must be a number"),
        (dict(e4m3_max=True), TypeError, "e4m3_max must be a number"),
        (dict(rowwise="yes"), TypeError, "rowwise must be a bool"),
        (dict(columnwise=1), TypeError, "columnwise must be a bool"),
        (dict(per_token=1), TypeError, "per_token must be a bool"),
        (dict(rht=1), TypeError, "rht must be a bool"),
        (dict(stochastic_rounding="on"), TypeError, "stochastic_rounding must be a bool"),
        (dict(columnwise=True, rht=True, rht_sign_mask=True), TypeError, "rht_sign_mask must be an int"),
        (dict(stochastic_rounding=True, seed=1.5), TypeError, "seed must be an int"),
        (dict(stochastic_rounding=True, seed=True), TypeError, "seed must be an int"),
        (dict(stochastic_rounding=True, seed=2**70), ValueError, r"seed must be in \[-2\*\*63, 2\*\*64\)"),
        (dict(stochastic_rounding=True, seed=-(2**63) - 1), ValueError, r"seed must be in"),
        (dict(stochastic_rounding=True, seed=torch.tensor([7], dtype=torch.int32)), ValueError,
         "seed as a tensor must be int64 with one element, got int32"),
        (dict(stochastic_rounding=True, seed=torch.tensor([7, 8])), ValueError, r"one element, got int64 of shape \(2,\)"),
        (dict(stochastic_rounding=True, seed=torch.tensor([7], device="meta")), ValueError,
         "seed as a tensor must be on the input's device cpu, got meta"),
        (dict(stochastic_rounding=True, seed=torch.tensor([7]), generator=torch.Generator()), ValueError,
         "seed and generator"),
        (dict(amax=torch.tensor([-1.0])), ValueError, "amax must be >= 0 and not NaN"),
        (dict(amax=torch.tensor([float("nan")])), ValueError, "amax must be >= 0 and not NaN"),
        (dict(per_token=True, amax=torch.ones(32).index_fill_(0, torch.tensor([5]), -2.0)), ValueError, "amax must be >= 0"),
        (dict(columnwise=True, columnwise_amax=torch.tensor([float("nan")])), ValueError, "columnwise_amax must be >= 0"),
    ],
)
@pytest.mark.parametrize("backend", BACKENDS)
def test_quantize_nvfp4_refuses_wrong_types_and_values(kwargs, exc, pattern, backend):
    with pytest.raises(exc, match=pattern):
        nvfp4lab.quantize_nvfp4(X, backend=backend, **kwargs)


def test_mxfp8_config_with_option_arguments_is_refused():
    cfg = nvfp4lab.MXFP8QuantConfig()
    with pytest.raises(ValueError, match="pass either config= or individual options"):
        nvfp4lab.quantize_mxfp8(torch.randn(32, 32), config=cfg, columnwise=True)


def test_mxfp8_config_refuses_non_bools():
    with pytest.raises(TypeError, match="rowwise must be a bool"):
        nvfp4lab.quantize_mxfp8(torch.randn(32, 32), rowwise=1)
    with pytest.raises(TypeError, match="columnwise must be a bool"):
        nvfp4lab.MXFP8QuantConfig(columnwise="yes")


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeds_in_range_are_taken_on_both_backends(backend):
    for seed in (0, -(2**63), 2**64 - 1):
        q = nvfp4lab.quantize_nvfp4(X, stochastic_rounding=True, seed=seed, backend=backend)
        assert q.rowwise_data.shape == (32, 32)
    # an infinite amax is the spec's own case (S_enc = 1), not an error
    assert nvfp4lab.quantize_nvfp4(X, amax=torch.tensor([float("inf")]), backend=backend).rowwise_amax.isinf().all()


def test_config_with_option_arguments_is_refused():
    cfg = nvfp4lab.NVFP4QuantConfig()
    with pytest.raises(ValueError, match=r"pass either config= or individual options.*columnwise=True, per_token=True"):
        nvfp4lab.quantize_nvfp4(X, config=cfg, columnwise=True, per_token=True)
    with pytest.raises(ValueError, match="rowwise=1"):
        nvfp4lab.quantize_nvfp4(X, config=cfg, rowwise=1)
    # options left at their defaults are the config's own business
    assert nvfp4lab.quantize_nvfp4(X, config=nvfp4lab.NVFP4QuantConfig(columnwise=True)).columnwise_data is not None


@pytest.mark.parametrize("rows, cols, exc, pattern", [(100.5, 4, TypeError, "rows must be an int"),
                                                       ("128", 4, TypeError, "rows must be an int"),
                                                       (4, True, TypeError, "cols must be an int"),
                                                       (-1, 4, ValueError, "rows must be >= 0")])
def test_unswizzle_scales_refuses_non_int_sizes(rows, cols, exc, pattern):
    with pytest.raises(exc, match=pattern):
        nvfp4lab.unswizzle_scales(torch.zeros(512, dtype=torch.uint8), rows, cols)


def _nvfp4_parts(q):
    return dict(rowwise_data=q.rowwise_data[:16], rowwise_scale=q.rowwise_scale[:16], rowwise_amax=torch.ones(3),
                columnwise_scale=q.columnwise_scale[:, :1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("field, which, exc, pattern", [
    ("rowwise_data", "rowwise", ValueError, r"rowwise_data must have shape \(32, 32\)"),
    ("rowwise_scale", "rowwise", ValueError, r"rowwise_scale must have shape \(32, 4\)"),
    ("rowwise_amax", "rowwise", ValueError, "rowwise_amax must have 1 elements"),
    ("columnwise_scale", "columnwise", ValueError, r"columnwise_scale must have shape \(64, 2\)"),
])
def test_dequantize_nvfp4_refuses_parts_that_disagree(field, which, exc, pattern, backend):
    q = nvfp4lab.quantize_nvfp4(X, columnwise=True, backend="ref")
    bad = dataclasses.replace(q, **{field: _nvfp4_parts(q)[field]})
    with pytest.raises(exc, match=pattern):
        nvfp4lab.dequantize_nvfp4(bad, which=which, backend=backend)
    with pytest.raises(TypeError, match="rowwise_data must be a uint8 tensor"):
        nvfp4lab.dequantize_nvfp4(dataclasses.replace(q, rowwise_data=q.rowwise_data.float()), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dequantize_mxfp8_refuses_parts_that_disagree(backend):
    q = nvfp4lab.quantize_mxfp8(torch.randn(64, 64), columnwise=True, backend="ref")
    with pytest.raises(ValueError, match=r"rowwise_scale must have shape \(64, 2\)"):
        nvfp4lab.dequantize_mxfp8(dataclasses.replace(q, rowwise_scale=q.rowwise_scale[:, :1]), backend=backend)
    with pytest.raises(ValueError, match=r"columnwise_data must have shape \(64, 64\)"):
        nvfp4lab.dequantize_mxfp8(dataclasses.replace(q, columnwise_data=q.columnwise_data[:32]), which="columnwise",
                                  backend=backend)
    with pytest.raises(TypeError, match="rowwise_data must be a uint8 tensor"):
        nvfp4lab.dequantize_mxfp8(dataclasses.replace(q, rowwise_data=q.rowwise_data.float()), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("offs, m_splits, pattern", [
    ([32, 16, 48], None, "offs must be nondecreasing"),        # decreasing
    ([16, 32, 40], None, r"offs\[-1\] == M = 48"),              # does not end at M
    ([-16, 16, 48], None, "offs must be nondecreasing"),       # starts below 0
    ([16, 32, 48], [16, 16, 16], r"m_splits must be the sizes offs holds, \[16, 16, 16\]"),  # m_splits agree: taken
    ([16, 32, 48], [32, 0, 16], r"m_splits must be the sizes offs holds, \[16, 16, 16\]"),
])
def test_grouped_gemm_refuses_host_offs_that_do_not_split_m(offs, m_splits, pattern, backend):
    a = nvfp4lab.quantize_nvfp4(torch.randn(48, 32))
    b = nvfp4lab.quantize_nvfp4(torch.randn(3, 16, 32))
    offs = torch.tensor(offs)
    if m_splits == [16, 16, 16]:
        assert nvfp4lab.nvfp4_grouped_gemm(a, b, offs, m_splits=m_splits, backend=backend).shape == (48, 16)
        return
    with pytest.raises(ValueError, match=pattern):
        nvfp4lab.nvfp4_grouped_gemm(a, b, offs, m_splits=m_splits, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_gemm_and_wgrad_refuse_malformed_containers(backend):
    """Grouped tensors and per-expert lists whose buffers do not match their shape and config are refused naming the
    operand and the buffer (a per-split amax of the wrong length crashed the process in the wgrad)."""
    import dataclasses

    g = nvfp4lab.quantize_nvfp4_grouped_bulk(torch.randn(64, 64), [32, 32], columnwise=True, backend=backend)
    dy = nvfp4lab.quantize_nvfp4_grouped_bulk(torch.randn(64, 48), [32, 32], columnwise=True, backend=backend)
    w = nvfp4lab.quantize_nvfp4(torch.randn(48, 64), backend=backend)
    for field, value, exc, pattern in [
        ("columnwise_amax", torch.ones(5), ValueError, "x: columnwise_amax must have 2 elements"),
        ("columnwise_scale", g.columnwise_scale[:10], ValueError, "x: columnwise_scale must hold M.K/16 = 256"),
        ("columnwise_data", g.columnwise_data.float(), TypeError, "x: columnwise_data must be a uint8 tensor"),
    ]:
        with pytest.raises(exc, match=pattern):
            nvfp4lab.nvfp4_grouped_wgrad(dy, dataclasses.replace(g, **{field: value}), [32, 32], backend=backend)
    for field, value, exc, pattern in [
        ("rowwise_scale", g.rowwise_scale[:10], ValueError, "a: rowwise_scale must hold M.K/16 = 256"),
        ("rowwise_scale", g.rowwise_scale.float(), TypeError, "a: rowwise_scale must be a uint8 tensor"),
        ("rowwise_amax", torch.ones(5), ValueError, "a: rowwise_amax must have 2 elements"),
    ]:
        with pytest.raises(exc, match=pattern):
            nvfp4lab.nvfp4_grouped_gemm(dataclasses.replace(g, **{field: value}), [w, w], backend=backend)
    short = dataclasses.replace(w, rowwise_data=w.rowwise_data[:4])
    with pytest.raises(ValueError, match=r"b\[1\]: rowwise_data must have shape \(48, 32\)"):
        nvfp4lab.nvfp4_grouped_gemm(g, [w, short], backend=backend)
    a = nvfp4lab.quantize_nvfp4(torch.randn(32, 64), backend=backend)
    with pytest.raises(ValueError, match=r"a\[1\]: rowwise_scale must have shape \(32, 4\)"):
        nvfp4lab.nvfp4_grouped_gemm([a, dataclasses.replace(a, rowwise_scale=a.rowwise_scale[:3])], [w, w],
                                    backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_containers_with_parts_on_another_device_are_refused(backend):
    """A copy's scale or amax on another device than its data (meta stands in for a GPU on a CPU-only machine) is
    refused naming the part, by dequantize and the GEMMs; a meta amax for a real x by quantize (kernels would read
    them from the data's device)."""
    import dataclasses

    q = nvfp4lab.quantize_nvfp4(torch.randn(32, 64), columnwise=True, backend=backend)
    w = nvfp4lab.quantize_nvfp4(torch.randn(48, 64), backend=backend)
    amax_meta = dataclasses.replace(q, rowwise_amax=q.rowwise_amax.to("meta"))
    scale_meta = dataclasses.replace(q, columnwise_scale=q.columnwise_scale.to("meta"))
    with pytest.raises(ValueError, match="rowwise_amax must be on rowwise_data's device cpu, got meta"):
        nvfp4lab.dequantize_nvfp4(amax_meta, backend=backend)
    with pytest.raises(ValueError, match="columnwise_scale must be on columnwise_data's device cpu, got meta"):
        nvfp4lab.dequantize_nvfp4(scale_meta, which="columnwise", backend=backend)
    with pytest.raises(ValueError, match="a: rowwise_amax must be on rowwise_data's device cpu, got meta"):
        nvfp4lab.nvfp4_gemm(amax_meta, w, backend=backend)
    mx = nvfp4lab.quantize_mxfp8(torch.randn(64, 64), backend=backend)
    with pytest.raises(ValueError, match="rowwise_scale must be on rowwise_data's device cpu, got meta"):
        nvfp4lab.dequantize_mxfp8(dataclasses.replace(mx, rowwise_scale=mx.rowwise_scale.to("meta")), backend=backend)
    g = nvfp4lab.quantize_nvfp4_grouped_bulk(torch.randn(64, 64), [32, 32], columnwise=True, backend=backend)
    with pytest.raises(ValueError, match="x: columnwise_amax must be on columnwise_data's device cpu, got meta"):
        nvfp4lab.nvfp4_grouped_wgrad(g, dataclasses.replace(g, columnwise_amax=g.columnwise_amax.to("meta")), [32, 32],
                                     backend=backend)
    with pytest.raises(ValueError, match="amax is a meta tensor .* while x is on cpu"):
        nvfp4lab.quantize_nvfp4(torch.randn(32, 64), amax=torch.ones(1, device="meta"), backend=backend)
