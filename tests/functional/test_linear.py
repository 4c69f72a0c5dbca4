"""fprop / dgrad / wgrad of nvfp4lab.functional.linear against a composition of reference steps:
quantize each operand with a config written out here by hand (TE's recipe tables), dequantize, and
multiply in float64 (the reference GEMM), within the GEMM tolerance (rtol 2^-7).

The expected side never calls the recipe's role mapping or the functional code. Stochastic rounding
is reproduced by re-seeding before the single gradient quantization (same backend, same bits).
"""
import contextlib
import itertools

import pytest
import torch

import nvfp4lab
from nvfp4lab import MXFP8QuantConfig, MXFP8Recipe, NVFP4QuantConfig, NVFP4Recipe
from nvfp4lab import functional as F

RTOL = 2.0**-7

DEVICES = [
    pytest.param(("cpu", "ref"), id="cpu-ref"),
    pytest.param(("cuda", "triton"), id="cuda-triton", marks=pytest.mark.gpu),
]

# Hand-written per-tensor options of each preset (TE NVFP4BlockScaling defaults; seeds 000/001/004).
SW = dict(scale_layout="swizzled")
EXPECTED = {
    "te_default": dict(input=dict(rht=True, **SW), weight=dict(block="16x16", **SW),
                       grad=dict(rht=True, stochastic_rounding=True, **SW)),
    "per_token": dict(input=dict(per_token=True, **SW), weight=dict(block="16x16", **SW),
                      grad=dict(stochastic_rounding=True, **SW)),
    "per_token_gradients": dict(input=dict(per_token=True, **SW), weight=dict(block="16x16", **SW),
                                grad=dict(per_token=True, stochastic_rounding=True, **SW)),
    "four_over_six": dict(input=dict(four_over_six="mae", e4m3_max=256.0, **SW),
                          weight=dict(block="16x16", four_over_six="mae", e4m3_max=256.0, **SW),
                          grad=dict(stochastic_rounding=True, **SW)),
    "four_over_six_weights_mse": dict(input=dict(rht=True, **SW),
                                      weight=dict(block="16x16", four_over_six="mse", e4m3_max=256.0, **SW),
                                      grad=dict(rht=True, stochastic_rounding=True, **SW)),
    "1d_weights_compact": dict(input=dict(rht=True), weight=dict(), grad=dict(rht=True, stochastic_rounding=True)),
}
RECIPES = {
    "te_default": NVFP4Recipe.te_default(),
    "per_token": NVFP4Recipe.per_token(),
    "per_token_gradients": NVFP4Recipe.per_token(gradients=True),
    "four_over_six": NVFP4Recipe.four_over_six(),
    "four_over_six_weights_mse": NVFP4Recipe.four_over_six("weights", "mse"),
    "1d_weights_compact": NVFP4Recipe(weight_2d=False, scale_layout="compact"),
}


def assert_gemm_close(actual, expected, what):
    expected = expected.to(torch.float64)
    actual = actual.to(torch.float64)
    atol = RTOL * 2.0**-3 * expected.abs().max().item()  # for outputs near cancellation
    bad = (actual - expected).abs() > atol + RTOL * expected.abs()
    assert not bad.any(), (f"{what}: {int(bad.sum())}/{bad.numel()} elements off, max abs err "
                           f"{(actual - expected).abs().max().item():.4g} (|expected| max {expected.abs().max().item():.4g})")


def q(x, backend, rowwise=True, columnwise=True, **options):
    return nvfp4lab.quantize_nvfp4(x, config=NVFP4QuantConfig(rowwise=rowwise, columnwise=columnwise, **options), backend=backend)


def deq64(t, which, backend):
    return nvfp4lab.dequantize_nvfp4(t, dtype=torch.float32, which=which, backend=backend).double()


def make_inputs(device, m=48, k=64, n=32, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(device=device, dtype=dtype)
    b = torch.randn(n, generator=g).to(device=device, dtype=dtype)
    dy = torch.randn(m, n, generator=g).to(device=device, dtype=dtype)
    return x, w, b, dy


def run_linear(x, w, b, dy, recipe, backend, seed=1234):
    x = x.clone().requires_grad_(True)
    w = w.clone().requires_grad_(True)
    b = b.clone().requires_grad_(True)
    y = F.linear(x, w, b, recipe=recipe, backend=backend)
    torch.manual_seed(seed)
    y.backward(dy)
    return y.detach(), x.grad, w.grad, b.grad


def expected_nvfp4(x, w, b, dy, opts, backend, seed=1234, m_pad=None):
    """fprop/dgrad/wgrad from reference steps; tokens zero-padded to m_pad for the columnwise copies."""
    m = x.shape[0]
    m_pad = m if m_pad is None else m_pad
    pad = lambda t: torch.cat([t, t.new_zeros(m_pad - m, t.shape[1])]) if m_pad != m else t  # noqa: E731
    qx = q(pad(x), backend, **opts["input"])
    qw = q(w, backend, **opts["weight"])
    torch.manual_seed(seed)
    qdy = q(pad(dy), backend, **opts["grad"])
    y = deq64(qx, "rowwise", backend)[:m] @ deq64(qw, "rowwise", backend).T + b.double()
    dx = deq64(qdy, "rowwise", backend)[:m] @ deq64(qw, "columnwise", backend)
    dw = deq64(qdy, "columnwise", backend).T @ deq64(qx, "columnwise", backend)
    return y, dx, dw, dy.double().sum(0)


@pytest.mark.parametrize("device_backend", DEVICES)
@pytest.mark.parametrize("preset", list(RECIPES))
def test_linear_matches_reference_composition(preset, device_backend):
    device, backend = device_backend
    x, w, b, dy = make_inputs(device)
    y, dx, dw, db = run_linear(x, w, b, dy, RECIPES[preset], backend)
    y_e, dx_e, dw_e, db_e = expected_nvfp4(x, w, b, dy, EXPECTED[preset], backend)
    assert y.dtype == dx.dtype == dw.dtype == torch.bfloat16
    assert_gemm_close(y, y_e, "fprop")
    assert_gemm_close(dx, dx_e, "dgrad")
    assert_gemm_close(dw, dw_e, "wgrad")
    assert_gemm_close(db, db_e, "bgrad")


@pytest.mark.parametrize("device_backend", DEVICES)
def test_tokens_not_multiple_of_16_are_zero_padded_for_columnwise_copies(device_backend):
    device, backend = device_backend
    x, w, b, dy = make_inputs(device, m=40)
    y, dx, dw, _ = run_linear(x, w, b, dy, RECIPES["te_default"], backend)
    y_e, dx_e, dw_e, _ = expected_nvfp4(x, w, b, dy, EXPECTED["te_default"], backend, m_pad=48)
    assert y.shape == (40, 32) and dx.shape == (40, 64)
    assert_gemm_close(y, y_e, "fprop")
    assert_gemm_close(dx, dx_e, "dgrad")
    assert_gemm_close(dw, dw_e, "wgrad")


@pytest.mark.parametrize("device_backend", DEVICES)
@pytest.mark.parametrize("fmt", ["e4m3", "hybrid"])
def test_mxfp8_matches_reference_composition(fmt, device_backend):
    device, backend = device_backend
    x, w, b, dy = make_inputs(device, m=64, k=64, n=32)
    y, dx, dw, db = run_linear(x, w, b, dy, MXFP8Recipe(fp8_format=fmt), backend)

    def mq(t, fp8_format="e4m3"):
        return nvfp4lab.quantize_mxfp8(t, config=MXFP8QuantConfig(rowwise=True, columnwise=True, fp8_format=fp8_format), backend=backend)

    def d(t, which):
        return nvfp4lab.dequantize_mxfp8(t, dtype=torch.float32, which=which, backend=backend).double()

    qx, qw, qdy = mq(x), mq(w), mq(dy, "e5m2" if fmt == "hybrid" else "e4m3")
    assert_gemm_close(y, d(qx, "rowwise") @ d(qw, "rowwise").T + b.double(), "fprop")
    assert_gemm_close(dx, d(qdy, "rowwise") @ d(qw, "columnwise"), "dgrad")
    assert_gemm_close(dw, d(qdy, "columnwise").T @ d(qx, "columnwise"), "wgrad")
    assert_gemm_close(db, dy.double().sum(0), "bgrad")


@pytest.mark.parametrize("device_backend", DEVICES)
@pytest.mark.parametrize("mode", ["dequantized", "high_precision"])
def test_backward_override_modes(mode, device_backend):
    device, backend = device_backend
    x, w, b, dy = make_inputs(device)
    y, dx, dw, _ = run_linear(x, w, b, dy, NVFP4Recipe(backward=mode), backend)
    qx = q(x, backend, columnwise=False)
    qw = q(w, backend, columnwise=False, block="16x16", scale_layout="swizzled")
    x_hat, w_hat = deq64(qx, "rowwise", backend), deq64(qw, "rowwise", backend)
    assert_gemm_close(y, x_hat @ w_hat.T + b.double(), "fprop")
    if mode == "high_precision":
        x_hat, w_hat = x.double(), w.double()
    else:  # the backward GEMMs read the forward copies dequantized to the compute dtype (bf16)
        x_hat, w_hat = x_hat.to(torch.bfloat16).double(), w_hat.to(torch.bfloat16).double()
    assert_gemm_close(dx, dy.double() @ w_hat, "dgrad")
    assert_gemm_close(dw, dy.double().T @ x_hat, "wgrad")


@pytest.mark.parametrize("device_backend", DEVICES)
def test_leading_dims_and_frozen_weight(device_backend):
    """(B, S, K) input; a frozen weight gets no grad and dx is still right."""
    device, backend = device_backend
    x, w, b, dy = make_inputs(device, m=48)
    recipe = RECIPES["per_token"]
    x3 = x.reshape(3, 16, 64).clone().requires_grad_(True)
    y = F.linear(x3, w, None, recipe=recipe, backend=backend)
    torch.manual_seed(7)
    y.backward(dy.reshape(3, 16, 32))
    opts = EXPECTED["per_token"]
    qx, qw = q(x, backend, columnwise=False, **opts["input"]), q(w, backend, **opts["weight"])
    torch.manual_seed(7)
    qdy = q(dy, backend, columnwise=False, **opts["grad"])  # no wgrad: only dy's rowwise copy
    assert y.shape == (3, 16, 32) and x3.grad.shape == (3, 16, 64)
    assert_gemm_close(y.reshape(48, 32), deq64(qx, "rowwise", backend) @ deq64(qw, "rowwise", backend).T, "fprop")
    assert_gemm_close(x3.grad.reshape(48, 64), deq64(qdy, "rowwise", backend) @ deq64(qw, "columnwise", backend), "dgrad")


def test_quantized_weight_is_used_and_checked():
    x, w, b, _ = make_inputs("cpu")
    recipe = NVFP4Recipe.te_default()
    qw = F.quantize_weight(w, recipe, columnwise=False)
    y_cached = F.linear(x, w, b, recipe=recipe, quantized_weight=qw)
    assert torch.equal(y_cached, F.linear(x, w, b, recipe=recipe))
    # a cached weight quantized with another recipe's config is rejected
    other = F.quantize_weight(w, NVFP4Recipe(weight_2d=False), columnwise=False)
    with pytest.raises(ValueError, match="quantized_weight"):
        F.linear(x, w, b, recipe=recipe, quantized_weight=other)
    with pytest.raises(TypeError, match="quantized_weight"):
        F.linear(x, w, b, recipe=recipe, quantized_weight=w)


def test_columnwise_weight_copy_added_when_dgrad_needs_it():
    x, w, b, dy = make_inputs("cpu")
    recipe = NVFP4Recipe.te_default()
    rowwise_only = F.quantize_weight(w, recipe, columnwise=False)
    xr, xr2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y = F.linear(xr, w, b, recipe=recipe, quantized_weight=rowwise_only)
    torch.manual_seed(5)  # same stochastic-rounding bits for dy in both runs
    y.backward(dy)
    y2 = F.linear(xr2, w, b, recipe=recipe)
    torch.manual_seed(5)
    y2.backward(dy)
    assert torch.equal(xr.grad, xr2.grad)


@pytest.mark.parametrize("backend", ["ref", "triton"])
@pytest.mark.parametrize("preset", ["te_default", "per_token", "four_over_six", "1d_weights_compact"])
def test_dgrad_from_the_rowwise_weight_copy(preset, backend, dgrad_from_rowwise):
    """Where dgrad reads W's rowwise copy transposed (16x16 weights), the step still matches the reference
    composition (which dequantizes W's columnwise copy), and a module quantizes no columnwise weight copy."""
    recipe = RECIPES[preset]
    takes = F.dgrad_reads_rowwise(recipe, 48, 32, 64, "cpu", backend)
    assert takes == (preset != "1d_weights_compact")
    x, w, b, dy = make_inputs("cpu")
    y, dx, dw, db = run_linear(x, w, b, dy, recipe, backend)
    y_e, dx_e, dw_e, db_e = expected_nvfp4(x, w, b, dy, EXPECTED[preset], backend)
    for got, want, what in ((y, y_e, "fprop"), (dx, dx_e, "dgrad"), (dw, dw_e, "wgrad"), (db, db_e, "bgrad")):
        assert_gemm_close(got, want, what)
    layer = nvfp4lab.Linear(64, 32, recipe=recipe, backend=backend, dtype=torch.bfloat16)
    layer(x.clone().requires_grad_(True)).sum().backward()
    ((_, has_columnwise, cached),) = layer._quantized_weights.values()
    assert has_columnwise == (not takes) and (cached.columnwise_data is None) == takes


@pytest.mark.parametrize("operand_casts", ["packed", "operands", "fprop_operand", "dy_row_operand"])
def test_side_stream_takes_the_work_that_does_not_wait(operand_casts, dgrad_from_rowwise, monkeypatch):
    """In a captured graph (the side stream stood in for on the CPU) a Linear step issues first, on the side stream:
    dy's SR seed and W's cast in the forward; W^T's and x^T's operands in the backward; x's and dy's casts (dy's with
    the bias gradient) and every GEMM stay on the current stream. Where those casts write BF16 operands (forced here)
    only the seed goes to the side stream, dy's cast still summing the bias gradient; where only x's fprop operand
    comes from its cast, below the general operand size ("fprop_operand"), W's cast still runs beside it, and where
    only dgrad's dy operand comes from dy's SR cast ("dy_row_operand", the rule's ``sr_rows``), the backward's side
    stream still runs beside that cast. The
    results are the same either way (the seed drawn ahead is the first draw from the same generator state, as the
    backward's own)."""
    import sys

    from nvfp4lab import ops
    from nvfp4lab.kernels.nvfp4_quantize_details import opt_flags

    fl = sys.modules["nvfp4lab.functional.linear"]
    if operand_casts == "operands":
        monkeypatch.setattr(ops, "takes_operands_by_rule", lambda *args, **kwargs: True)
        monkeypatch.setattr(opt_flags, "OPERAND_CAST_MIN_ELEMENTS", 0)
    if operand_casts == "fprop_operand":
        monkeypatch.setattr(opt_flags, "FPROP_OPERAND_CAST_MIN_ELEMENTS", 0)
    if operand_casts == "dy_row_operand":
        monkeypatch.setattr(ops, "takes_operands_by_rule", lambda m, n, k, rule, fprop=False, sr_rows=False: sr_rows)
    fl._clear_path_caches()
    recipe = RECIPES["te_default"]
    x, w, b, dy = make_inputs("cpu")
    want = run_linear(x, w, b, dy, recipe, "triton")  # dy's seed drawn after torch.manual_seed(1234)
    events, inside = [], []

    class Side:
        def __enter__(self):
            inside.append(True)

        def __exit__(self, *exc):
            inside.pop()

    def record(name, fn):
        def wrapped(*args, **kwargs):
            events.append((name, bool(inside)))
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(fl, "fork", lambda device: events.append(("fork", False)) or "side")
    monkeypatch.setattr(fl, "on_stream", lambda stream: Side() if stream == "side" else contextlib.nullcontext())
    monkeypatch.setattr(fl, "join", lambda stream, *outputs: events.append(("join", bool(inside))))
    for name in ("quantize_nvfp4", "quantize_nvfp4_dbias", "quantize_nvfp4_operands", "nvfp4_operand", "nvfp4_gemm"):
        monkeypatch.setattr(ops, name, record(name, getattr(ops, name)))
    monkeypatch.setattr(torch.Tensor, "sum", record("sum", torch.Tensor.sum))
    monkeypatch.setattr(fl, "device_seed", record("device_seed", fl.device_seed))
    torch.manual_seed(1234)  # the forward draws dy's seed
    got = run_linear(x, w, b, dy, recipe, "triton")
    for g, e in zip(got, want):
        assert torch.equal(g, e)
    if operand_casts == "operands":
        assert [event for event in events if event[1] or event[0] == "fork"] == [("fork", False), ("device_seed", True)]
        assert ("quantize_nvfp4_operands", False) in events and ("sum", False) not in events  # db from dy's cast
        return
    x_cast = "quantize_nvfp4_operands" if operand_casts == "fprop_operand" else "quantize_nvfp4"
    dy_cast = "quantize_nvfp4_operands" if operand_casts == "dy_row_operand" else "quantize_nvfp4_dbias"
    assert events == [
        ("fork", False), ("device_seed", True), ("quantize_nvfp4", True), (x_cast, False), ("join", False),  # forward
        ("nvfp4_gemm", False),
        ("fork", False), ("nvfp4_operand", True), ("nvfp4_operand", True),  # W^T, x^T
        (dy_cast, False), ("join", False), ("nvfp4_gemm", False), ("nvfp4_gemm", False),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["te_default", "four_over_six"])
def test_gpu_dgrad_from_the_rowwise_weight_copy_by_default(preset):
    """On the GPU a Linear large enough for the dequant_mm path reads its 16x16 weight's rowwise copy for dgrad by
    itself; the step matches the reference composition."""
    recipe = RECIPES[preset]
    assert F.dgrad_reads_rowwise(recipe, 4096, 1024, 2048, "cuda") and not F.dgrad_reads_rowwise(recipe, 48, 32, 64, "cuda")
    x, w, b, dy = make_inputs("cuda", m=4096, k=2048, n=1024)
    got = run_linear(x, w, b, dy, recipe, "triton")
    want = expected_nvfp4(x, w, b, dy, EXPECTED[preset], "triton")
    for g, e, what in zip(got, want, ("fprop", "dgrad", "wgrad", "bgrad")):
        assert_gemm_close(g, e, what)


def test_transposed_operand_holds_the_columnwise_copy():
    x, _, _, _ = make_inputs("cpu")
    t = q(x, "ref", block="16x16")
    view = F.transposed_operand(t)
    assert view.shape == (64, 48) and view.rowwise_data is t.columnwise_data
    # 16x16 blocks are transposition invariant (spec section 5): the view dequantizes to x_hat^T
    assert torch.equal(view.dequantize(torch.float32), t.dequantize(torch.float32).T)
    with pytest.raises(ValueError, match="columnwise"):
        F.transposed_operand(q(x, "ref", columnwise=False))


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda x, w: F.linear(x.double(), w), TypeError, "x must have dtype in"),
        (lambda x, w: F.linear(x, w[:, :32]), ValueError, r"x.shape\[-1\]"),
        (lambda x, w: F.linear(x[:, :8], w[:, :8]), ValueError, "in_features of weight must be a multiple of 16"),
        (lambda x, w: F.linear(x, w, torch.zeros(5)), ValueError, "bias must have shape"),
        (lambda x, w: F.linear(x, w, recipe="te_default"), TypeError, "recipe must be"),
        (lambda x, w: F.linear(x, torch.zeros(48, 64), recipe=MXFP8Recipe()), ValueError,
         "out_features of weight must be a multiple of 32"),
    ],
)
def test_bad_arguments(call, exc, match):
    x, w, _, _ = make_inputs("cpu", dtype=torch.float32)
    with pytest.raises(exc, match=match):
        call(x, w)


def test_zero_tokens():
    w = torch.randn(32, 64, requires_grad=True)
    x = torch.zeros(0, 64, requires_grad=True)
    y = F.linear(x, w)
    assert y.shape == (0, 32)
    y.sum().backward()
    assert x.grad.shape == (0, 64) and torch.equal(w.grad, torch.zeros_like(w))


# ------------------------------------------------------------------- grouped: split layouts
def _offsets(sizes):
    return [0, *itertools.accumulate(sizes)]


@pytest.mark.parametrize("splits", [[16, 0, 40, 8], [32, 16], [5], [0, 0, 3]])
def test_split_layout_holds_offsets_and_the_padded_row_index(splits):
    layout = F.SplitLayout(splits, "cpu")
    padded = [(s + 15) // 16 * 16 for s in splits]
    assert layout.m_splits == tuple(splits) and layout.padded_sizes == tuple(padded)
    assert layout.offsets.dtype == torch.int64 and layout.offsets.tolist() == _offsets(splits)
    assert layout.padded_offsets.tolist() == _offsets(padded)
    assert layout.needs_padding == (padded != splits)
    if not layout.needs_padding:
        assert layout.pad_index is None and layout.padded_offsets is layout.offsets
        return
    want_index = torch.cat([torch.arange(lo, lo + s) for lo, s in zip(_offsets(padded), splits)])
    assert torch.equal(layout.pad_index, want_index)
    x = torch.randn(sum(splits), 32)
    x_padded = layout.pad(x)
    assert x_padded.shape == (sum(padded), 32)
    for lo, lo_padded, s, p in zip(_offsets(splits), _offsets(padded), splits, padded):
        assert torch.equal(x_padded[lo_padded:lo_padded + s], x[lo:lo + s])
        assert not x_padded[lo_padded + s:lo_padded + p].any()
    assert torch.equal(layout.unpad(x_padded), x)


def test_split_layout_cache_reuses_layouts_and_drops_the_least_recently_used():
    cache = F.SplitLayoutCache(max_entries=2)
    first = cache.get([16, 8], "cpu")
    assert cache.get((16, 8), torch.device("cpu")) is first  # list or tuple, str or device: one key
    second = cache.get([8, 16], "cpu")
    assert cache.get([16, 8], "cpu") is first  # now the most recently used
    third = cache.get([24], "cpu")  # drops [8, 16]
    assert len(cache) == 2
    assert cache.get([16, 8], "cpu") is first and cache.get([24], "cpu") is third
    assert cache.get([8, 16], "cpu") is not second
    cache.clear()
    assert len(cache) == 0
    with pytest.raises(ValueError, match="max_entries must be a positive int"):
        F.SplitLayoutCache(max_entries=0)


@pytest.mark.parametrize("state", ["capturing", "compiling"])
def test_split_layout_cache_keeps_no_layout_built_during_capture_or_compile(state, monkeypatch):
    # capture: the tensors would live in the graph's private pool; compile: the traced graph holds them
    from nvfp4lab import ops

    monkeypatch.setattr(ops, "graph_capturing" if state == "capturing" else "compiling", lambda *a: True)
    cache = F.SplitLayoutCache()
    layout = cache.get([16, 8], "cpu")
    assert layout.offsets.tolist() == [0, 16, 24] and len(cache) == 0
    assert cache.get([16, 8], "cpu") is not layout


def test_grouped_linear_rejects_a_bad_split_cache():
    x, w = torch.randn(32, 64), torch.randn(32, 64)
    with pytest.raises(TypeError, match="split_cache must be a SplitLayoutCache"):
        F.grouped_linear(x, [16, 16], [w, w], split_cache={})


@pytest.mark.parametrize(
    "m_splits, exc, match",
    [([16, -8], ValueError, "must be >= 0"), ([], ValueError, "at least one split"), ([16.0, 8.0], TypeError, "list or tuple of ints"),
     (torch.tensor([16, 8]), TypeError, "list or tuple of ints")],
)
def test_split_layouts_reject_bad_splits(m_splits, exc, match):
    with pytest.raises(exc, match=match):
        F.SplitLayout(m_splits, "cpu")
    with pytest.raises(exc, match=match):
        F.SplitLayoutCache().get(m_splits, "cpu")


_WEIGHT_RECIPES = {
    "te_default": NVFP4Recipe.te_default(),
    "per_token": NVFP4Recipe.per_token(),
    "four_over_six": NVFP4Recipe.four_over_six(),
    "pr3045": NVFP4Recipe.pr3045(),  # per-token 1x16 weights
    "pr3045_2d": NVFP4Recipe.pr3045(weight_2d=True),  # broadcast amax: the per-expert path
}


def _assert_same_stack(got, want):
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is None:
            continue
        assert g.shape == w.shape and g.config == w.config
        for field in ("rowwise_data", "rowwise_scale", "rowwise_amax"):
            a, b = getattr(g, field), getattr(w, field)
            assert a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b), field


@pytest.mark.parametrize("backend", ["ref", "triton"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
@pytest.mark.parametrize("columnwise", [True, False], ids=["rowcol", "row"])
@pytest.mark.parametrize("preset", list(_WEIGHT_RECIPES))
def test_quantize_grouped_weights_equals_per_expert_quantize_and_stack(preset, columnwise, packed, backend):
    recipe = _WEIGHT_RECIPES[preset]
    g = torch.Generator().manual_seed(5)
    scales = torch.tensor([1.0, 1e-3, 30.0])[:, None, None]  # experts with their own amax
    block = (torch.randn(3, 32, 48, generator=g) * scales).to(torch.bfloat16)
    weights = [torch.nn.Parameter(block[i]) if packed else torch.nn.Parameter(block[i].clone()) for i in range(3)]
    assert (F.packed_weights(weights) is not None) == packed
    got = F.quantize_grouped_weights(weights, recipe, columnwise=columnwise, backend=backend)
    want = F.stack_grouped_weights([F.quantize_weight(w, recipe, columnwise=columnwise, backend=backend) for w in weights],
                                   columnwise=columnwise, backend=backend)
    _assert_same_stack(got, want)


def test_packed_weights_needs_consecutive_slices_of_one_storage():
    block = torch.randn(4, 16, 32)
    assert F.packed_weights(list(block)).data_ptr() == block.data_ptr()
    assert F.packed_weights(list(block)[:3]).shape == (3, 16, 32)
    assert F.packed_weights([block[0], block[2]]) is None  # a gap
    assert F.packed_weights([block[1], block[0]]) is None  # out of order
    assert F.packed_weights([block[0], block[1].to(torch.float64)]) is None
    assert F.packed_weights([block[0].t(), block[1].t()]) is None  # not contiguous
    assert F.packed_weights([w.clone() for w in block]) is None  # separate storages
