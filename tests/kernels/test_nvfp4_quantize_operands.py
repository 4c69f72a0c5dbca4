"""Casts with BF16 GEMM-operand outputs (``quantize_operands`` / ``ops.quantize_nvfp4_operands``) and the GEMM
taking them (``ops.nvfp4_gemm`` with :class:`~nvfp4lab.NVFP4Operand`).

Expected values come from the reference: ``ref.nvfp4.quantize`` (or, for stochastic rounding, the packed Triton
cast with the same seed, itself checked against the reference elsewhere) and ``ref.gemm.block_dequantized``.
Operand outputs are NaN-poisoned before the kernels write them, packed ones 0xFF-poisoned.
"""
import sys

import pytest
import torch

import nvfp4lab
from nvfp4lab import NVFP4QuantConfig, ops
from nvfp4lab.functional import transposed_operand
from nvfp4lab.kernels import grouped_quantize
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.recipes import NVFP4Recipe
from nvfp4lab.ref import gemm as ref_gemm
from nvfp4lab.ref import nvfp4 as ref_nvfp4

from .kernel_checks import record_launches, rht_exact_input, sums_in_row_order

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

DEV = "cuda" if torch.cuda.is_available() else "cpu"
RECIPES = {
    "tensor": dict(),
    "rht": dict(rht=True),
    "sr": dict(stochastic_rounding=True),
    "rht-sr": dict(rht=True, stochastic_rounding=True),
    "per-token": dict(per_token=True),
    "16x16": dict(block="16x16"),
    "pr3045-rht": dict(per_token=True, rht=True, numerics="te_pr3045"),
}
SIDES = {"row": (True, False), "col": (False, True), "both": (True, True)}


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.element_size() == 1:  # codes and scales
        return t
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _input(shape, dtype, device, seed=0, special=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3
    x[0, :16] = 0.0  # an all-zero block (zero scale)
    x[5, 7] = -1e-30  # a value that underflows its block (-0.0)
    x[3, 10] = -0.0  # a negative zero (code 0: +0.0)
    x[9, 20:36] = 1e-12  # a tiny block
    if special:  # NaN / inf amaxes (all-NaN per-tensor outputs, NaN rows and columns per token)
        x[1, 3] = float("nan")
        x[2, 5] = float("inf")
    return x.to(dtype).to(device)


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit, except that any NaN matches any NaN (payloads are not part of the numerics)."""
    nan = torch.isnan(got)
    return torch.equal(nan, torch.isnan(want)) and torch.equal(_bits(got)[~nan], _bits(want)[~nan])


def _expected(x, config, seed):
    """(row values, row amax, col values, col amax, packed tensor) from the reference (SR: the packed cast)."""
    if config.stochastic_rounding:
        q = kq.quantize(x, config, seed=seed, poison=True)
    else:
        q = ref_nvfp4.quantize(x, config)
    _, row, col = ref_gemm.expanded_operands(q, True, True)
    return row, col, q


def _check_case(x, config, sides, seed=7):
    row_op, col_op = sides
    packed, row, col = kq.quantize_operands(x, config, row_operand=row_op, col_operand=col_op, seed=seed, poison=True)
    want_row, want_col, q = _expected(x, config, seed)
    for got, want, asked in ((row, want_row, row_op), (col, want_col, col_op)):
        if not asked:
            assert got is None
            continue
        assert got.values.dtype == torch.bfloat16 and got.values.shape == want.values.shape
        assert _same(got.values, want.values)
        assert _same(got.amax, want.amax)
        assert not got.config.columnwise and got.config.rowwise and not (got.config.rht and got is col)
    if row_op and col_op:
        assert packed is None
        return
    copy = "columnwise" if row_op else "rowwise"
    for part in ("data", "scale", "amax"):
        assert torch.equal(_bits(getattr(packed, f"{copy}_{part}")) if part == "amax" else getattr(packed, f"{copy}_{part}"),
                           _bits(getattr(q, f"{copy}_{part}")) if part == "amax" else getattr(q, f"{copy}_{part}"))


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("sides", list(SIDES))
def test_operands_match_reference(recipe, sides):
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, **RECIPES[recipe])
    _check_case(_input((48, 80), torch.bfloat16, DEV), config, SIDES[sides])


@pytest.mark.parametrize("recipe", ["tensor", "per-token", "rht-sr"])
def test_operands_special_values(recipe):
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, **RECIPES[recipe])
    _check_case(_input((48, 80), torch.bfloat16, DEV, special=True), config, (True, True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_operands_other_input_dtypes(dtype):
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True)
    _check_case(_input((32, 64), dtype, DEV, seed=3), config, (True, True))


def test_operands_public_op_and_reference_backend():
    x = _input((32, 64), torch.bfloat16, DEV)
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, per_token=True)
    packed_t, row_t, col_t = ops.quantize_nvfp4_operands(x, config=config, columnwise_operand=False, backend="triton")
    packed_r, row_r, col_r = ops.quantize_nvfp4_operands(x, config=config, columnwise_operand=False, backend="ref")
    assert col_t is None and col_r is None
    assert torch.equal(_bits(row_t.values), _bits(row_r.values))
    assert torch.equal(packed_t.columnwise_data, packed_r.columnwise_data)
    assert isinstance(row_t, nvfp4lab.NVFP4Operand) and row_t.shape == (32, 64)


def test_operands_bad_input():
    x = torch.randn(32, 64, device=DEV)
    with pytest.raises(ValueError, match="four_over_six"):
        ops.quantize_nvfp4_operands(x, config=NVFP4QuantConfig(four_over_six="mae"))
    with pytest.raises(ValueError, match="2-D"):
        ops.quantize_nvfp4_operands(x.reshape(2, 16, 64), config=NVFP4QuantConfig())
    with pytest.raises(ValueError, match="multiple of 16"):
        ops.quantize_nvfp4_operands(x[:, :40], config=NVFP4QuantConfig())
    with pytest.raises(TypeError, match="config"):
        ops.quantize_nvfp4_operands(x, config={"rowwise": True})
    with pytest.raises(TypeError, match="dbias_dtype"):
        ops.quantize_nvfp4_operands(x, config=NVFP4QuantConfig(), dbias_dtype=torch.int32)


@pytest.mark.parametrize("sides", list(SIDES))
def test_operands_with_dbias(sides, monkeypatch):
    """With ``dbias_dtype`` (a Linear's dy, TE's SR + RHT recipe): the same operands and packed copies as without,
    and x's column sums from the amax pass's read of x, in its order (rows in order within parts of 16 * STEPS rows,
    then part by part), bit for bit, rounded once to bf16; the reference backend sums with torch."""
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True)
    x = rht_exact_input(80, 96, seed=4)
    x[3, 5] = float("inf")
    x = x.to(DEV)
    monkeypatch.setattr(kq, "_EAGER_PLANS", {})
    monkeypatch.setattr(kq.opt_flags, "AMAX_RHT_COL_MIN_PROGRAMS", 1)  # several 16-row groups per program
    amax_runs = record_launches(monkeypatch, sys.modules["nvfp4lab.kernels.nvfp4_quantize_details.amax"],
                                "amax_rht_col_kernel")
    row_op, col_op = SIDES[sides]
    packed, row, col, db = kq.quantize_operands(x, config, row_operand=row_op, col_operand=col_op, seed=7, poison=True,
                                                dbias_dtype=torch.bfloat16)
    assert [meta.get("SUMS") for meta in amax_runs] == [True] and amax_runs[0]["STEPS"] > 1
    assert db.dtype == torch.bfloat16 and db.shape == (96,)
    want = sums_in_row_order(x, 16 * amax_runs[0]["STEPS"]).bfloat16()
    assert _same(db.cpu(), want)
    plain = kq.quantize_operands(x, config, row_operand=row_op, col_operand=col_op, seed=7, poison=True)
    for got, same in zip((packed, row, col), plain):
        if got is None:
            assert same is None
            continue
        for field in ("values", "amax") if isinstance(got, nvfp4lab.NVFP4Operand) else ("rowwise_data",
                                                                                         "columnwise_data"):
            if getattr(got, field) is not None:
                assert _same(getattr(got, field), getattr(same, field))
    ref_db = ops.quantize_nvfp4_operands(x, config=config, rowwise_operand=row_op, columnwise_operand=col_op, seed=7,
                                         backend="ref", dbias_dtype=torch.float32)[3]
    assert _same(ref_db, x.sum(0, dtype=torch.float32))


def test_operands_traced_equal_eager():
    """torch.compile (fullgraph) runs the cast through the custom op and its fake: the same values as eager."""
    x = _input((32, 64), torch.bfloat16, DEV)
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True)

    def cast(t):
        _, row, col = kq.quantize_operands(t, config, row_operand=True, col_operand=True)
        return row.values, row.amax, col.values, col.amax

    compiled = torch.compile(cast, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(x), cast(x)):
        assert _same(got, want)


def test_operands_empty_input():
    x = torch.empty(0, 64, device=DEV)
    packed, row, col = ops.quantize_nvfp4_operands(x, config=NVFP4QuantConfig(columnwise=True), backend="triton")
    assert row.values.shape == (0, 64) and col.values.shape == (64, 0) and packed is None


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_takes_operands(per_token, with_bias):
    """Any mix of packed and operand inputs gives the reference GEMM's result (the CPU twin of cuBLAS sums
    exact products in fp32, so bit for bit there; on the GPU within the golden tolerance)."""
    m, n, k = 64, 96, 320  # K not a multiple of the expansion's 128-column tile
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, per_token=per_token)
    x, w = _input((m, k), torch.bfloat16, DEV, 1), _input((n, k), torch.bfloat16, DEV, 2)
    qx, qw = kq.quantize(x, config), kq.quantize(w, config)
    _, xr, _ = kq.quantize_operands(x, config, row_operand=True, col_operand=False)
    _, wr, _ = kq.quantize_operands(w, config, row_operand=True, col_operand=False)
    bias = torch.randn(n, device=DEV).to(torch.bfloat16) if with_bias else None
    want = ops.nvfp4_gemm(qx, qw, bias=bias, backend="ref")
    for a, b in ((xr, qw), (qx, wr), (xr, wr)):
        got = ops.nvfp4_gemm(a, b, bias=bias, backend="triton")
        assert torch.equal(ops.nvfp4_gemm(a, b, bias=bias, backend="ref"), want)
        if DEV == "cpu":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3)


OPERAND_CONFIGS = {
    "16x16": dict(block="16x16"),
    "16x16-compact": dict(block="16x16", scale_layout="compact"),
    "16x16-4over6": dict(block="16x16", four_over_six="mae", e4m3_max=256.0),
    "1x16": dict(),
    "per-token": dict(per_token=True),
}


@pytest.mark.parametrize("name", list(OPERAND_CONFIGS))
@pytest.mark.parametrize("shape", [(48, 80), (32, 272)])  # 272: K past the expansion's 128-column tile
def test_nvfp4_operand_matches_reference(name, shape):
    """ops.nvfp4_operand: the rowwise copy's values as the reference expands them; transposed (16x16 blocks only)
    the columnwise copy's values, as a column-major view."""
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, **OPERAND_CONFIGS[name])
    t = ref_nvfp4.quantize(_input(shape, torch.bfloat16, DEV, seed=5, special=name == "1x16"), config)
    _, want_row, want_col = ref_gemm.expanded_operands(t, True, True)
    for backend in ("triton", "ref"):
        row = ops.nvfp4_operand(t, backend=backend)
        assert row.shape == shape and row.config == want_row.config and _same(row.values, want_row.values)
        if config.block != "16x16":
            with pytest.raises(ValueError, match="16x16"):
                ops.nvfp4_operand(t, transposed=True, backend=backend)
            continue
        col = ops.nvfp4_operand(t, transposed=True, backend=backend)
        assert col.shape == shape[::-1] and col.values.stride(0) == 1 and col.config == want_col.config
        assert _same(col.values, want_col.values) and torch.equal(col.amax, want_col.amax)


def test_nvfp4_operand_traced_through_the_expand_op():
    """ops.nvfp4_operand under tracing (torch.compile, make_fx) runs the expansion as one custom op,
    ``nvfp4lab::nvfp4_expand_rowwise``: opcheck's schema and fake tensors, and make_fx records the op and gives the
    eager values, shape and strides (272: K past the expansion's tile)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    config = NVFP4QuantConfig(rowwise=True, columnwise=True, block="16x16")
    t = kq.quantize(_input((32, 272), torch.bfloat16, DEV, seed=6), config)
    args = (t.rowwise_data, t.rowwise_scale, t.rowwise_amax, t.scale_layout, 272)
    torch.library.opcheck(torch.ops.nvfp4lab.nvfp4_expand_rowwise.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    eager = ops.nvfp4_operand(t, transposed=True, backend="triton").values

    def f(data, scale, amax):
        rowwise = nvfp4lab.NVFP4Tensor.from_parts(t.shape, t.dtype, NVFP4QuantConfig(block="16x16"),
                                                  rowwise=(data, scale, amax))
        return ops.nvfp4_operand(rowwise, transposed=True, backend="triton").values

    graph = make_fx(f, tracing_mode="fake")(*args[:3])
    targets = [str(node.target) for node in graph.graph.nodes if str(node.target).startswith("nvfp4lab.")]
    assert targets == ["nvfp4lab.nvfp4_expand_rowwise.default"]
    traced = graph(*args[:3])
    assert traced.shape == eager.shape and traced.stride() == eager.stride() and _same(traced, eager)


@pytest.mark.parametrize("per_token_a", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_takes_transposed_operand(per_token_a, out_dtype, with_bias):
    """A weight's dgrad from its rowwise copy transposed equals the one from its columnwise copy (the reference
    GEMM on both), on either backend, with the packed or the operand form of A (the CPU twin of cuBLAS sums exact
    products in fp32, so bit for bit there; on the GPU within the golden tolerance)."""
    m, n, k = 64, 96, 160  # dx (m, k) = dy (m, n) @ W (n, k)
    w = _input((n, k), torch.bfloat16, DEV, seed=2)
    dy = _input((m, n), torch.bfloat16, DEV, seed=3)
    qw = kq.quantize(w, NVFP4QuantConfig(rowwise=True, columnwise=True, block="16x16"))
    dy_config = NVFP4QuantConfig(per_token=per_token_a)
    qdy = kq.quantize(dy, dy_config)
    _, dy_row, _ = kq.quantize_operands(dy, dy_config, row_operand=True, col_operand=False)
    bias = torch.randn(k, device=DEV).to(out_dtype) if with_bias else None
    want = ops.nvfp4_gemm(qdy, transposed_operand(qw), bias=bias, out_dtype=out_dtype, backend="ref")
    for backend in ("triton", "ref"):
        w_t = ops.nvfp4_operand(qw, transposed=True, backend=backend)
        for a in (qdy, dy_row):
            got = ops.nvfp4_gemm(a, w_t, bias=bias, out_dtype=out_dtype, backend=backend)
            if DEV == "cpu" or backend == "ref":
                assert torch.equal(got, want)
            else:
                torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("bias", [None, "shared", "per-expert"])
def test_grouped_gemm_takes_transposed_stacked_operand(bias):
    """The grouped dgrad of stacked 16x16 weights from their rowwise stack transposed equals the one from the
    columnwise stack (the reference on both; every backend), with uneven and empty experts."""
    from nvfp4lab import functional as F

    num, n, k, splits = 3, 32, 48, [16, 0, 40]  # dx (m, k) = dy_e (m_e, n) @ W_e (n, k)
    weights = [_input((n, k), torch.bfloat16, DEV, seed=10 + e) for e in range(num)]
    row, col = F.quantize_grouped_weights(weights, NVFP4Recipe.te_default(), columnwise=True)
    dy = _input((sum(splits), n), torch.bfloat16, DEV, seed=4)
    qdy = ops.quantize_nvfp4_grouped_bulk(dy, splits, config=NVFP4QuantConfig(scale_layout="compact"))
    bias_t = {None: None, "shared": torch.randn(k), "per-expert": torch.randn(num, k)}[bias]
    bias_t = None if bias_t is None else bias_t.to(DEV, torch.bfloat16)
    want = ops.nvfp4_grouped_gemm(qdy, col, bias=bias_t, m_splits=splits, backend="ref")
    for backend in ("triton", "ref"):
        w_t = ops.nvfp4_operand(row, transposed=True, backend=backend)
        assert w_t.shape == (num, k, n) and w_t.values.stride(-2) == 1
        got = ops.nvfp4_grouped_gemm(qdy, w_t, bias=bias_t, m_splits=splits, backend=backend)
        if DEV == "cpu" or backend == "ref":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3)
    with pytest.raises(ValueError, match="m_splits"):
        ops.nvfp4_grouped_gemm(qdy, w_t)
    with pytest.raises(ValueError, match=r"\(E, N, K\)"):
        ops.nvfp4_grouped_gemm(qdy, ops.nvfp4_operand(transposed_operand(kq.quantize(
            weights[0], NVFP4QuantConfig(columnwise=True, block="16x16")))), m_splits=splits)


def test_nvfp4_operand_bad_input_and_empty():
    x = _input((32, 64), torch.bfloat16, DEV)
    t = kq.quantize(x, NVFP4QuantConfig(rowwise=False, columnwise=True, block="16x16"))
    with pytest.raises(ValueError, match="rowwise copy"):
        ops.nvfp4_operand(t)
    with pytest.raises(TypeError, match="NVFP4Tensor"):
        ops.nvfp4_operand(x)
    with pytest.raises(ValueError, match="per-tensor"):
        ops.nvfp4_operand(ref_nvfp4.quantize(x, NVFP4QuantConfig(block="16x16", per_token=True, numerics="te_pr3045")),
                          transposed=True)
    with pytest.raises(ValueError, match="2-D"):
        ops.nvfp4_operand(ops.quantize_nvfp4(x.reshape(2, 2, 8, 64), config=NVFP4QuantConfig(), backend="ref"))
    empty = kq.quantize(torch.empty(0, 64, device=DEV), NVFP4QuantConfig(block="16x16"))
    assert ops.nvfp4_operand(empty, transposed=True).values.shape == (64, 0)


def _linear_step(recipe, m, k, n, device, force_operands):
    """y, dx, dW, db of one Linear step with the operand casts forced on or off (the GEMM's path choice replaced)."""
    functional_linear = sys.modules["nvfp4lab.functional.linear"]
    original = ops.gemm_takes_operands
    ops.gemm_takes_operands = lambda *args, **kwargs: force_operands
    functional_linear._clear_path_caches()
    try:
        torch.manual_seed(0)
        layer = nvfp4lab.Linear(k, n, recipe=recipe, device=device, dtype=torch.bfloat16)
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)
        torch.manual_seed(1)
        y = layer(x)
        y.backward(dy)
        return y.detach(), x.grad, layer.weight.grad, layer.bias.grad
    finally:
        ops.gemm_takes_operands = original
        functional_linear._clear_path_caches()


@pytest.mark.parametrize("preset", ["te_default", "per_token"])
def test_linear_operands_path_same_as_packed(preset):
    """The Linear step through the operand casts equals the packed path bit for bit on the CPU twin (and
    within the golden tolerance on the GPU, where cuBLAS may sum K in another order)."""
    recipe = getattr(NVFP4Recipe, preset)()
    packed = _linear_step(recipe, 48, 128, 64, DEV, False)
    operands = _linear_step(recipe, 48, 128, 64, DEV, True)
    for a, b in zip(packed, operands):
        if DEV == "cpu":
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a.float(), b.float(), rtol=2**-7, atol=1e-2)


# ---------------------------------------------------------------- grouped: tokens, a stack of experts' weights
GROUPED_RECIPES = ["tensor", "16x16", "sr", "per-token"]
GROUPED_COL_RECIPES = ["tensor", "rht", "rht-sr", "per-token"]  # with the columnwise copy (a MoE layer's x and dy)


def _check_grouped(x, splits, config, seed=5):
    """quantize_grouped_operand (Triton, outputs poisoned) against the reference grouped quantize (its rowwise copy
    expanded, its columnwise copy as is), and the public op's reference backend against the same."""
    offsets = torch.tensor([0] + splits, device=x.device).cumsum(0)
    packed, got = grouped_quantize.quantize_grouped_operand(x, offsets, config, seed=seed, poison=True)
    if config.stochastic_rounding:  # the packed grouped cast with the same seed draws the same bytes
        bulk = grouped_quantize.quantize_grouped(x, offsets, config, seed=seed, poison=True)
    else:
        bulk = ref_nvfp4.quantize_grouped(x, offsets, config)
    want = ref_gemm.grouped_rowwise_operand(bulk)
    assert got.values.dtype == torch.bfloat16 and got.values.shape == x.shape
    assert _same(got.values, want.values) and _same(got.amax, want.amax)
    assert got.config.rowwise and not got.config.columnwise
    if config.columnwise:
        assert not packed.config.rowwise and packed.rowwise_data is None and torch.equal(packed.split_offsets, offsets)
        assert torch.equal(packed.columnwise_data, bulk.columnwise_data)
        assert torch.equal(packed.columnwise_scale, bulk.columnwise_scale)
        assert _same(packed.columnwise_amax, bulk.columnwise_amax)
    else:
        assert packed is None
    if not config.stochastic_rounding:
        public_packed, public = ops.quantize_nvfp4_grouped_operands(x, splits, config=config, backend="ref")
        assert _same(public.values, want.values) and _same(public.amax, want.amax)
        assert (public_packed is None) == (packed is None)
        if packed is not None:
            assert torch.equal(public_packed.columnwise_data, packed.columnwise_data)


@pytest.mark.parametrize("recipe", GROUPED_RECIPES)
@pytest.mark.parametrize("splits", [[16, 0, 48, 32], [64, 32]])
def test_grouped_operand_matches_reference(recipe, splits):
    config = NVFP4QuantConfig(rowwise=True, columnwise=False, scale_layout="compact", **RECIPES[recipe])
    x = _input((sum(splits), 80), torch.bfloat16, DEV, seed=4)
    x[16:64] *= 1000.0  # splits with amaxes far apart: each its own global scale
    _check_grouped(x, splits, config)


@pytest.mark.parametrize("recipe", GROUPED_COL_RECIPES)
@pytest.mark.parametrize("splits", [[16, 0, 48, 32], [64, 32]])
def test_grouped_operand_with_columnwise_copy_matches_reference(recipe, splits):
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, scale_layout="compact", **RECIPES[recipe])
    x = _input((sum(splits), 80), torch.bfloat16, DEV, seed=7)
    x[16:64] *= 1000.0
    _check_grouped(x, splits, config)


@pytest.mark.parametrize("recipe", ["tensor", "16x16"])
def test_grouped_operand_special_values(recipe):
    config = NVFP4QuantConfig(rowwise=True, columnwise=False, scale_layout="compact", **RECIPES[recipe])
    _check_grouped(_input((64, 64), torch.bfloat16, DEV, seed=6, special=True), [32, 32], config)


def test_grouped_operand_of_stacked_weights_equals_nvfp4_operand():
    """The values a grouped GEMM's b gets either way: the cast's operand reshaped (E, N, K), or the packed stack
    expanded by nvfp4_operand."""
    from nvfp4lab import functional as F
    recipe = NVFP4Recipe.te_default()
    weights = [_input((32, 64), torch.bfloat16, DEV, seed=s) * (10.0 ** s) for s in range(3)]
    rowwise, _ = F.quantize_grouped_weights(weights, recipe, columnwise=False)
    want = ops.nvfp4_operand(rowwise)
    config = NVFP4QuantConfig(rowwise=True, columnwise=False, block="16x16", scale_layout="compact")
    packed, got = ops.quantize_nvfp4_grouped_operands(torch.cat(weights), [32] * 3, config=config, backend="triton")
    assert packed is None
    assert _same(got.values.view(3, 32, 64), want.values) and _same(got.amax, want.amax)


@pytest.mark.parametrize("backend", ["ref", "triton"])
@pytest.mark.parametrize("recipe", ["rht", "per-token"])
def test_grouped_gemm_of_token_operand_equals_packed(recipe, backend):
    """nvfp4_grouped_gemm with a given as the tokens' operand (per-split or per-row amax) equals the GEMM of the
    packed grouped tensor, bit for bit (one reference product per expert either way)."""
    splits = [32, 0, 48, 16]
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, scale_layout="compact", **RECIPES[recipe])
    x = _input((sum(splits), 64), torch.bfloat16, DEV, seed=9)
    x[32:80] *= 100.0
    w = _input((4 * 24, 64), torch.bfloat16, DEV, seed=10)
    wq = nvfp4lab.quantize_nvfp4(w.view(4, 24, 64).reshape(96, 64), block="16x16")
    wq = nvfp4lab.NVFP4Tensor.from_parts(torch.Size((4, 24, 64)), wq.dtype, wq.config,
                                         rowwise=(wq.rowwise_data, wq.rowwise_scale, wq.rowwise_amax))
    bulk = ops.quantize_nvfp4_grouped_bulk(x, splits, config=config, backend=backend)
    _, x_op = ops.quantize_nvfp4_grouped_operands(x, splits, config=config, backend=backend)
    offs = bulk.split_offsets[1:]
    want = ops.nvfp4_grouped_gemm(bulk, wq, backend=backend, m_splits=splits, out_dtype=torch.float32)
    got = ops.nvfp4_grouped_gemm(x_op, wq, offs, backend=backend, m_splits=splits, out_dtype=torch.float32)
    assert _same(got, want)
    with pytest.raises(ValueError, match="m_splits"):
        ops.nvfp4_grouped_gemm(x_op, wq, offs, backend=backend)
    with pytest.raises(ValueError, match="offs"):
        ops.nvfp4_grouped_gemm(x_op, wq, backend=backend, m_splits=splits)


def test_grouped_operand_bad_input_and_empty():
    x = torch.randn(32, 64, device=DEV)
    with pytest.raises(ValueError, match="rowwise"):
        ops.quantize_nvfp4_grouped_operands(x, [16, 16], config=NVFP4QuantConfig(rowwise=False, columnwise=True,
                                                                                 scale_layout="compact"))
    with pytest.raises(ValueError, match="four_over_six"):
        ops.quantize_nvfp4_grouped_operands(x, [16, 16], config=NVFP4QuantConfig(four_over_six="mae",
                                                                                  scale_layout="compact"))
    with pytest.raises(ValueError, match="split_sections"):
        ops.quantize_nvfp4_grouped_operands(x, [8, 24], config=NVFP4QuantConfig(block="16x16", scale_layout="compact"))
    with pytest.raises(TypeError, match="config"):
        ops.quantize_nvfp4_grouped_operands(x, [16, 16], config=None)
    packed, empty = ops.quantize_nvfp4_grouped_operands(torch.empty(0, 64, device=DEV), [0, 0],
                                                        config=NVFP4QuantConfig(scale_layout="compact"), backend="triton")
    assert packed is None
    assert empty.values.shape == (0, 64) and empty.amax.shape == (2,) and torch.equal(empty.amax, torch.zeros(2))


def test_grouped_operand_traced_equal_eager():
    x = _input((48, 64), torch.bfloat16, DEV, seed=8)
    offsets = torch.tensor([0, 16, 48], device=DEV)
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True, scale_layout="compact")

    def cast(t):
        packed, op = grouped_quantize.quantize_grouped_operand(t, offsets, config)
        return op.values, op.amax, packed.columnwise_data, packed.columnwise_scale, packed.columnwise_amax

    compiled = torch.compile(cast, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(x), cast(x)):
        assert _same(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", GROUPED_RECIPES)
@pytest.mark.parametrize("columnwise", [False, True])
def test_gpu_grouped_operand_large(recipe, columnwise):
    """The MoE weight stack's and tokens' shape class on the GPU (the hardware conversions): 8 splits of 256 x 2048."""
    if columnwise and recipe == "16x16":
        recipe = "rht"  # a token config: the columnwise copy with RHT
    config = NVFP4QuantConfig(rowwise=True, columnwise=columnwise, scale_layout="compact", **RECIPES[recipe])
    x = _input((8 * 256, 2048), torch.bfloat16, "cuda", seed=12)
    x[256:512] *= 1e4
    _check_grouped(x, [256] * 8, config)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("shape", [(4096, 4096), (1008, 2048)])
def test_gpu_operands_large(recipe, shape):
    """Large shapes on the GPU: the split row / col launches (from 2^24 elements) and the hardware paths."""
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, **RECIPES[recipe])
    x = _input(shape, torch.bfloat16, "cuda", seed=11)
    for sides in SIDES.values():
        _check_case(x, config, sides)


@pytest.mark.gpu
def test_gpu_linear_takes_operands_by_default():
    """On the GPU the largest Linears' passes cast operands by themselves (smaller ones keep the packed casts, but
    for dgrad's dy operand of TE's SR + RHT gradient recipe, from 2^23 elements), and the step through operands
    matches the packed path."""
    assert ops.gemm_takes_operands(8192, 8192, 8192, "cuda") and not ops.gemm_takes_operands(4096, 2048, 2048, "cuda")
    recipe = NVFP4Recipe.te_default()
    plan = sys.modules["nvfp4lab.functional.linear"]._new_gemm_plan(recipe, 4096, 2048, 2048, torch.device("cuda:0"),
                                                                    None, True, True)
    assert plan.dy_row_op and not plan.dy_col_op and plan.dy_beside
    packed = _linear_step(recipe, 4096, 2048, 2048, "cuda", False)
    operands = _linear_step(recipe, 4096, 2048, 2048, "cuda", True)
    for a, b in zip(packed, operands):
        torch.testing.assert_close(a.float(), b.float(), rtol=2**-7, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_gpu_gemm_transposed_operand_large(out_dtype):
    """At the dequant_mm path's sizes: cuBLASLt takes the transposed operand as it is (column-major, no copy), and
    the dgrad equals the reference's within the golden tolerance."""
    from nvfp4lab.kernels.nvfp4_gemm_details import cublaslt
    m, n, k = 1024, 2048, 1536
    w = _input((n, k), torch.bfloat16, "cuda", seed=2)
    dy = _input((m, n), torch.bfloat16, "cuda", seed=3)
    qw = kq.quantize(w, NVFP4QuantConfig(rowwise=True, columnwise=True, block="16x16"))
    qdy = kq.quantize(dy, NVFP4QuantConfig())
    w_t = ops.nvfp4_operand(qw, transposed=True)
    assert w_t.values.stride(0) == 1
    out = torch.empty(m, k, dtype=out_dtype, device="cuda")
    assert cublaslt.plan(dy, w_t.values, out) is not None
    want = ops.nvfp4_gemm(qdy, transposed_operand(qw), out_dtype=out_dtype, backend="ref")
    got = ops.nvfp4_gemm(qdy, w_t, out_dtype=out_dtype)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3)


@pytest.mark.gpu
def test_gpu_grouped_gemm_transposed_stacked_operand_large():
    """At the per-expert cuBLAS path's sizes (MoE dgrad): the transposed stacked operand within the golden
    tolerance of the reference on the columnwise stack; a GroupedLinear of this size takes it by itself."""
    from nvfp4lab import functional as F

    num, n, k, splits = 4, 1024, 2048, [1024, 512, 2048, 512]
    recipe = NVFP4Recipe.te_default()
    assert F.dgrad_reads_rowwise(recipe, sum(splits), n, k, "cuda", num_experts=num)
    weights = [_input((n, k), torch.bfloat16, "cuda", seed=10 + e) for e in range(num)]
    row, col = F.quantize_grouped_weights(weights, recipe, columnwise=True)
    dy = _input((sum(splits), n), torch.bfloat16, "cuda", seed=4)
    qdy = ops.quantize_nvfp4_grouped_bulk(dy, splits, config=NVFP4QuantConfig(scale_layout="compact"))
    want = ops.nvfp4_grouped_gemm(qdy, col, m_splits=splits, backend="ref")
    got = ops.nvfp4_grouped_gemm(qdy, ops.nvfp4_operand(row, transposed=True), m_splits=splits)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3)
