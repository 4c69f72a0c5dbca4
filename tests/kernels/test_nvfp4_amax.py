"""The per-tensor post-RHT amax pass ``amax_rht_col_kernel`` (kernels/nvfp4_quantize_details/amax.py): which amax passes
take it, and its two outputs (the post-RHT amax and x's own amax) against the reference: tiles masked along both
axes, several row groups per program, special values, under the interpreter (its integer formulas) and, in the gpu
tier, on the GPU (its packed 16-bit max)."""
import pytest
import torch

from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.kernels import launch
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.kernels.nvfp4_quantize_details import amax as amax_module
from nvfp4lab.ref import nvfp4 as ref_nvfp4
from nvfp4lab.rht import DEFAULT_RHT_SIGN_MASK, apply_rht

from .kernel_checks import assert_same_bits, record_launches, rht_exact_input, sums_in_row_order

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def launches(monkeypatch):
    """The launches of ``amax_rht_col_kernel`` during the test."""
    return record_launches(monkeypatch, amax_module, "amax_rht_col_kernel")


def reference_amaxes(x, mask):
    """(max |x|, max |bf16(RHT(x^T))|) as fp32 (1,) tensors, on the CPU."""
    x = x.cpu()
    return x.float().abs().amax().reshape(1), apply_rht(x.t().contiguous(), mask).float().abs().amax().reshape(1)


def assert_amaxes(launches, x, mask, row_mode, context, tile=None):
    before = len(launches)
    row, col = kq.compute_amax(x.to(DEV), row_mode, kq.AMAX_TENSOR_RHT, mask, **(tile or {}))
    assert len(launches) == before + 1, f"{context}: amax_rht_col_kernel did not run"
    want_row, want_col = reference_amaxes(x, mask)
    assert_same_bits(col.cpu(), want_col, nan_equal=True)
    if row_mode == kq.AMAX_TENSOR:
        assert_same_bits(row.cpu(), want_row, nan_equal=True)
    else:
        assert row is None


def blocks_input(m, k, seed):
    """rht_exact_input with 16-row blocks scaled by 2^-120 .. 2^120 (bf16 subnormal sums included), a zero block and
    one block per column holding the largest values, at a column that differs per seed."""
    g = torch.Generator().manual_seed(seed)
    scales = 2.0 ** torch.randint(-120, 121, (m // 16, k), generator=g).float()
    scales[0, 1] = 0.0
    x = rht_exact_input(m, k, seed, block_scales=scales)
    return x


@pytest.mark.parametrize("shape", [(64, 96), (48, 40), (16, 2), (96, 264)])
@pytest.mark.parametrize("tile", [{}, dict(block_m=32), dict(block_m=48, block_k=32, num_warps=1),
                                  dict(block_m=16, block_k=64, num_warps=2)])
@pytest.mark.parametrize("row_mode", [kq.AMAX_NONE, kq.AMAX_TENSOR])
def test_matches_reference(shape, tile, row_mode, launches):
    """Groups past M in the last program (3 groups per program of 4, 5, 6), columns past K / 2 (BLOCK_C above it)."""
    x = blocks_input(*shape, seed=shape[0] * 7 + shape[1])
    assert_amaxes(launches, x, DEFAULT_RHT_SIGN_MASK, row_mode, f"{shape} {tile}", tile)


@pytest.mark.parametrize("mask", [0, 0xFFFF, 0x8001, DEFAULT_RHT_SIGN_MASK])
def test_sign_masks(mask, launches):
    x = rht_exact_input(64, 64, seed=mask & 0xFF)
    assert_amaxes(launches, x, mask, kq.AMAX_TENSOR, f"mask {mask:#x}")


def _with(x, rows, cols, value):
    x = x.clone()
    x[rows, cols] = value
    return x


BASE = rht_exact_input(64, 64, seed=11)
SPECIAL = {
    "zeros": torch.zeros(64, 64, dtype=torch.bfloat16),
    "negative-zeros": torch.full((64, 64), -0.0, dtype=torch.bfloat16),
    "inf": _with(BASE, 37, 21, float("inf")),
    "-inf": _with(BASE, 3, 62, float("-inf")),
    "nan": _with(BASE, 50, 8, float("nan")),
    "inf-and-nan": _with(_with(BASE, 0, 0, float("inf")), 63, 63, float("nan")),
    "bf16-max-block": _with(BASE, slice(16, 32), 5, 3.3895e38),  # sums past bf16's range: the amax saturates
    "largest-in-odd-column": _with(BASE, 40, 33, -96.0),
    "largest-in-even-column": _with(BASE, 41, 34, 96.0),
    "subnormal-blocks": rht_exact_input(64, 64, seed=4) * 2.0**-130,
}


@pytest.mark.parametrize("name", list(SPECIAL))
@pytest.mark.parametrize("tile", [{}, dict(block_m=48, block_k=32, num_warps=1)])
def test_special_values(name, tile, launches):
    assert_amaxes(launches, SPECIAL[name], DEFAULT_RHT_SIGN_MASK, kq.AMAX_TENSOR, name, tile)


@pytest.mark.parametrize("kwargs,dtype,offset,takes_it", [
    (dict(rowwise=False, columnwise=True, rht=True), torch.bfloat16, 0, True),
    (dict(rowwise=True, columnwise=True, rht=True), torch.bfloat16, 0, True),
    (dict(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True), torch.bfloat16, 0, True),
    (dict(rowwise=True, columnwise=True, rht=True), torch.float32, 0, False),
    (dict(rowwise=True, columnwise=True, rht=True), torch.bfloat16, 1, False),  # not 16-byte aligned
    (dict(rowwise=True, columnwise=True), torch.bfloat16, 0, False),
    (dict(rowwise=True, columnwise=True, per_token=True, rht=True, numerics="te_pr3045"), torch.bfloat16, 0, False),
])
def test_which_passes_take_it(kwargs, dtype, offset, takes_it, launches):
    x = rht_exact_input(32, 64, seed=2).to(dtype)
    x_dev = torch.empty(x.numel() + offset, dtype=dtype, device=DEV)[offset:].view(32, 64)
    x_dev.copy_(x)
    config = NVFP4QuantConfig(**kwargs)
    got = kq.quantize(x_dev, config, poison=True, seed=3)
    assert bool(launches) == takes_it
    want = ref_nvfp4.quantize(x, config)
    assert_same_bits(got.columnwise_amax.cpu(), want.columnwise_amax)


def test_m_not_a_multiple_of_16_takes_amax_kernel(launches):
    x = rht_exact_input(48, 64, seed=6)[:40]
    row, col = kq.compute_amax(x.to(DEV), kq.AMAX_TENSOR, kq.AMAX_TENSOR_RHT, DEFAULT_RHT_SIGN_MASK)
    assert not launches and torch.equal(row.cpu(), x.float().abs().amax().reshape(1))


# ---------------------------------------------------------------------------------- GPU (packed max)
@pytest.mark.gpu
def test_gpu_matches_reference(launches):
    """max.u16x2 and the butterflies on the GPU: special values, every tile, and large tensors whose maxima lie in
    either bf16 column of a word, bit for bit against the reference."""
    for name, x in SPECIAL.items():
        assert_amaxes(launches, x, DEFAULT_RHT_SIGN_MASK, kq.AMAX_TENSOR, f"gpu {name}")
    for odd in (False, True):
        x = blocks_input(1024, 4096, seed=21 + odd)
        x[768:784, 2001 + odd] = 0.0  # the largest value alone in its block: every RHT sum exact
        x[777, 2001 + odd] = -3e37
        for tile in ({}, dict(block_m=128, num_warps=8), dict(block_m=48, block_k=96, num_warps=1)):
            for row_mode in (kq.AMAX_NONE, kq.AMAX_TENSOR):
                assert_amaxes(launches, x, DEFAULT_RHT_SIGN_MASK, row_mode, f"gpu odd={odd} {tile}", tile)


# ------------------------------------------------------------ DIRECT passes where a call zeroes a scratch of its own
FRESH_CASES = {
    "te_x (row + RHT col)": (dict(rowwise=True, columnwise=True, rht=True), "amax_rht_col_kernel"),
    "te_dy (SR, RHT col alone)": (dict(rowwise=False, columnwise=True, rht=True, stochastic_rounding=True),
                                  "amax_rht_col_kernel"),
    "row+col, one shared amax": (dict(rowwise=True, columnwise=True), "amax_kernel"),
    "16x16 weight": (dict(block="16x16", rowwise=True, columnwise=True), "amax_kernel"),
    "rowwise": (dict(), "amax_kernel"),
}


def assert_same_quantized(got, want, context):
    """Every copy of two NVFP4Tensors: the same presence, codes and scales byte for byte, amaxes bit for bit (any NaN
    matching any NaN)."""
    for field in ("rowwise_data", "rowwise_scale", "rowwise_amax", "columnwise_data", "columnwise_scale",
                  "columnwise_amax"):
        g, w = getattr(got, field), getattr(want, field)
        assert (g is None) == (w is None), (field, context)
        if g is not None and g.dtype == torch.float32:
            assert_same_bits(g.cpu(), w.cpu(), nan_equal=True)
        elif g is not None:
            assert torch.equal(g.cpu(), w.cpu()), (field, context)


@pytest.mark.parametrize("special", ["randn", "inf-and-nan", "negative-zeros"])
@pytest.mark.parametrize("case", list(FRESH_CASES))
def test_direct_pass_where_the_call_would_zero_a_scratch(case, special, monkeypatch):
    """Where a call may keep no scratch between calls (stream capture, a compiled graph's call: ``keep_buffers``
    False, stood in for here), a per-tensor amax pass accumulates straight into its outputs, zeroed by one launch,
    with no ticket and no scratch: the same bits as the ticketed pass of an eager call."""
    kwargs, kernel = FRESH_CASES[case]
    config = NVFP4QuantConfig(**kwargs)
    x = rht_exact_input(64, 64, seed=5) if special == "randn" else SPECIAL[special]
    x = x.to(DEV)
    monkeypatch.setattr(kq, "_EAGER_PLANS", {})
    want = kq.quantize(x, config, poison=True, seed=9)
    metas = record_launches(monkeypatch, amax_module, kernel)
    monkeypatch.setattr(kq, "keep_buffers", lambda device: False)
    monkeypatch.setattr(amax_module, "scratch_buffer", lambda *args: pytest.fail("a DIRECT pass took a scratch"))
    got = kq.quantize(x, config, poison=True, seed=9)
    assert [meta["DIRECT"] for meta in metas] == [True]
    assert_same_quantized(got, want, case)


def test_zero_kernel_zeroes_its_ranges_only():
    a = torch.full((2100,), -1, dtype=torch.int32, device=DEV)
    b = torch.full((40,), -1, dtype=torch.int32, device=DEV)
    amax_module._zero_launch(2051, (launch.arg_key(2051), launch.arg_key(37)))(a, 2051, b, 37)
    assert torch.equal(a[:2051].cpu(), torch.zeros(2051, dtype=torch.int32))
    assert torch.equal(a[2051:].cpu(), torch.full((49,), -1, dtype=torch.int32))
    assert torch.equal(b.cpu(), torch.tensor([0] * 37 + [-1] * 3, dtype=torch.int32))


@pytest.mark.parametrize("n_row,n_col", [(5, 3), (0, 7), (6, 0), (0, 0)])
def test_zeroed_amaxes(n_row, n_col):
    row, col = amax_module.zeroed_amaxes(torch.device(DEV), n_row, n_col)
    for got, n in ((row, n_row), (col, n_col)):
        assert got is None if not n else (got.shape == (n,) and got.dtype == torch.float32 and not got.any())
    if row is not None and col is not None:
        assert row.untyped_storage().data_ptr() != col.untyped_storage().data_ptr()  # outputs of an op: no alias


@pytest.mark.gpu
def test_gpu_zeroed_amaxes_of_one_length_and_other_specializations():
    """Lengths that share their launch's grid but not what Triton specializes on (the value 1, 16-divisibility) take
    launches of their own (``Launch.verify``, on in the GPU tier, refuses another specialization), and every entry is
    zeroed over memory the allocator hands back dirty."""
    for n_row, n_col in ((1, 32), (2, 32), (17, 32), (32, 32), (32, 1), (48, 0)):
        torch.full((4096,), -1.0, device="cuda")  # freed: the next allocations may reuse its block
        row, col = amax_module.zeroed_amaxes(torch.device("cuda"), n_row, n_col)
        for got, n in ((row, n_row), (col, n_col)):
            assert got is None if not n else not got.any(), (n_row, n_col)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(FRESH_CASES))
def test_gpu_direct_pass_gives_the_ticketed_bits(case, monkeypatch):
    """On the GPU (``zero_kernel`` and the DIRECT atomics, launched with programmatic dependent launch): the bits of
    the eager call's ticketed pass, on a large tensor with and without inf / NaN."""
    config = NVFP4QuantConfig(**FRESH_CASES[case][0])
    torch.manual_seed(3)
    for special in (None, float("inf"), float("nan")):
        x = (torch.randn(2048, 4096, device="cuda") * 3).to(torch.bfloat16)
        if special is not None:
            x[1000, 77] = special
        monkeypatch.setattr(kq, "keep_buffers", amax_module.keep_buffers)
        want = kq.quantize(x, config, poison=True, seed=9)
        monkeypatch.setattr(kq, "keep_buffers", lambda device: False)
        got = kq.quantize(x, config, poison=True, seed=9)
        assert_same_quantized(got, want, f"{case} {special}")


# ------------------------------------------------------------ x's column sums from the amax pass (quantize_dbias)
DBIAS_CASES = {  # config, x dtype, the amax pass that sums
    "te_dy (SR, row + RHT col)": (dict(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True),
                                  torch.bfloat16, "amax_rht_col_kernel"),
    "per-tensor SR row + col": (dict(rowwise=True, columnwise=True, stochastic_rounding=True), torch.bfloat16,
                                "amax_kernel"),
    "per-token dy": (dict(rowwise=True, columnwise=True, per_token=True, stochastic_rounding=True), torch.bfloat16,
                     "amax_kernel"),
    "fp32 x, RHT col": (dict(rowwise=True, columnwise=True, rht=True), torch.float32, "amax_kernel"),
}


@pytest.mark.parametrize("special", ["randn", "inf-and-nan"])
@pytest.mark.parametrize("shape", [(80, 96), (48, 264)])
@pytest.mark.parametrize("case", list(DBIAS_CASES))
def test_dbias_from_the_amax_pass(case, shape, special, monkeypatch):
    """quantize_dbias: the quantized copies of quantize with the same seed, byte for byte, and x's column sums from
    the amax pass's read of x: added in row order per program (several 16-row groups per program, the last one past
    M) then program by program, bit for bit, for ``amax_rht_col_kernel``; within fp32's rounding of the exact sums
    and the same bits call after call for ``amax_kernel``'s tile reduction; rounded once (RNE) to bf16."""
    kwargs, dtype, kernel = DBIAS_CASES[case]
    config = NVFP4QuantConfig(**kwargs)
    x = rht_exact_input(*shape, seed=shape[0])
    if special != "randn":
        x = _with(_with(x, 0, 3, float("inf")), shape[0] - 1, 70, float("nan"))
    x = x.to(dtype).to(DEV)
    monkeypatch.setattr(kq, "_EAGER_PLANS", {})
    monkeypatch.setattr(kq.opt_flags, "AMAX_RHT_COL_MIN_PROGRAMS", 1)  # 4 groups per program (8 at most, 5 or 3 here)
    metas = record_launches(monkeypatch, amax_module, kernel)
    got, sums = kq.quantize_dbias(x, config, torch.float32, seed=9, poison=True)
    assert [meta.get("SUMS") for meta in metas] == [True]
    assert_same_quantized(got, kq.quantize(x, config, seed=9, poison=True), case)
    if kernel == "amax_rht_col_kernel":
        assert metas[0]["STEPS"] > 1
        assert_same_bits(sums.cpu(), sums_in_row_order(x, 16 * metas[0]["STEPS"]), nan_equal=True)
    else:
        exact = x.double().sum(0).cpu()
        finite = exact.isfinite()
        assert torch.equal(sums.cpu().isfinite(), finite) and torch.equal(sums.cpu().isnan(), exact.isnan())
        torch.testing.assert_close(sums.cpu()[finite].double(), exact[finite], rtol=0, atol=1e-4)
        assert_same_bits(kq.quantize_dbias(x, config, torch.float32, seed=9)[1].cpu(), sums.cpu(), nan_equal=True)
    _, sums_bf16 = kq.quantize_dbias(x, config, torch.bfloat16, seed=9, poison=True)
    assert_same_bits(sums_bf16.cpu().float(), sums.cpu().bfloat16().float(), nan_equal=True)


@pytest.mark.parametrize("case", ["te_dy (SR, row + RHT col)", "per-tensor SR row + col"])
def test_dbias_of_empty_x_and_through_the_traced_op(case):
    """No rows: zero sums (nothing launched for them). The traced op (opcheck's schema and fake tensors) returns the
    eager call's sums and copies."""
    config = NVFP4QuantConfig(**DBIAS_CASES[case][0])
    q, sums = kq.quantize_dbias(torch.empty(0, 32, dtype=torch.bfloat16, device=DEV), config, torch.bfloat16, seed=1)
    assert sums.shape == (32,) and sums.dtype == torch.bfloat16 and not sums.any()
    x = rht_exact_input(64, 96, seed=2).to(DEV)
    args = (x, None, None, None, 9, *kq._config_fields(config), 0, 0, 0, False, False, False, torch.bfloat16)
    torch.library.opcheck(kq.nvfp4_quantize.op, args, test_utils=("test_schema", "test_faketensor"))
    outputs = kq.nvfp4_quantize.op(*args)
    want, want_sums = kq.quantize_dbias(x, config, torch.bfloat16, seed=9)
    assert torch.equal(outputs[6], want_sums)
    assert torch.equal(outputs[0], want.rowwise_data) and torch.equal(outputs[3], want.columnwise_data)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["te_dy (SR, row + RHT col)", "per-tensor SR row + col"])
def test_gpu_dbias_from_the_amax_pass(case):
    """On the GPU, at a Linear's gradient size: amax_rht_col_kernel's sums bit for bit in its order; amax_kernel's
    within fp32 rounding; both the same bits in a replayed CUDA graph as in the eager call (DIRECT passes there)."""
    kwargs, _, kernel = DBIAS_CASES[case]
    config = NVFP4QuantConfig(**kwargs)
    torch.manual_seed(4)
    x = (torch.randn(4096, 2048, device="cuda") * 3).to(torch.bfloat16)
    q, sums = kq.quantize_dbias(x, config, torch.float32, seed=9)
    launch = kq._eager_plan(config, x, None, None, 0, 0, 0, False, (False, False), torch.float32).amax_launch
    if kernel == "amax_rht_col_kernel":
        parts = x.float().reshape(-1, 16 * launch.meta["STEPS"], 2048)
        part_sums = torch.zeros(parts.shape[0], 2048, device="cuda")
        for r in range(parts.shape[1]):
            part_sums = part_sums + parts[:, r]
        want = torch.zeros(2048, device="cuda")
        for p in part_sums:
            want = want + p
        assert_same_bits(sums.cpu(), want.cpu())
    else:
        torch.testing.assert_close(sums.double(), x.double().sum(0), rtol=0, atol=2e-3)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kq.quantize_dbias(x, config, torch.float32, seed=9)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        q_graph, sums_graph = kq.quantize_dbias(x, config, torch.float32, seed=9)
    graph.replay()
    assert_same_bits(sums_graph.cpu(), sums.cpu())
    assert_same_quantized(q_graph, q, case)
