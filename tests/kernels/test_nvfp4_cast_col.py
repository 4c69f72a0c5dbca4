"""The columnwise-only per-tensor RHT cast ``cast_col_kernel`` (kernels/nvfp4_quantize_details/cast_col.py): which
casts take it, and its bits against the reference (masked tiles, 1, 2 and 4 row groups, scale layouts, special
values, extreme outer amaxes) and, with stochastic rounding, against the documented Philox mapping, under the
interpreter (its integer formulas) and, in the gpu tier, on the GPU (its inline PTX)."""
import dataclasses

import pytest
import torch

from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.kernels.nvfp4_quantize_details import cast as cast_module
from nvfp4lab.kernels.nvfp4_quantize_details import cast16 as cast16_module
from nvfp4lab.kernels.nvfp4_quantize_details import cast_col as cast_col_module
from nvfp4lab.kernels.nvfp4_quantize_details import opt_flags
from nvfp4lab.ref import codecs
from nvfp4lab.ref import nvfp4 as ref_nvfp4

from .kernel_checks import (
    assert_operand_of,
    assert_seed_read_from_device,
    host_sr_bytes,
    record_launches,
    rht_exact_input,
    scaled_values,
    set_plan_flags,
)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's x/0 under the interpreter

DEV = "cuda" if torch.cuda.is_available() else "cpu"
COL_RHT = NVFP4QuantConfig(rowwise=False, columnwise=True, rht=True)
FLT_MAX = torch.finfo(torch.float32).max


@pytest.fixture
def cast_col_from(plan_flags):
    """``cast_col_from(n)``: columnwise-only RHT casts take cast_col_kernel from n elements on, and split row+col
    casts split from n elements on, during the test."""
    return lambda elements: plan_flags(CAST_COL_MIN_ELEMENTS=elements,
                                       SPLIT_CAST_MIN_ELEMENTS=dict.fromkeys(("rht", "rht_sr", "sr"), elements))


@pytest.fixture
def launches(monkeypatch, cast_col_from):
    """The launches of ``cast_col_kernel`` during the test, which takes columnwise RHT casts of any size."""
    cast_col_from(0)
    return record_launches(monkeypatch, cast_col_module, "cast_col_kernel")


def special_input():
    """(64, 96): blocks scaled by 2^-120 (bf16 subnormal sums), 2^-60, 2^60, 2^120, a zero block and -0.0, an inf
    element (its column block: +-inf; the amax inf, so the RHT saturates), a block at bf16 max (RHT results past
    bf16's range: saturated)."""
    scales = torch.ones(4, 96)
    scales[0, 5], scales[1, 6], scales[2, 7], scales[3, 8] = 2.0**-120, 2.0**-60, 2.0**60, 2.0**120
    scales[1, 9] = 0.0
    x = rht_exact_input(64, 96, seed=5, block_scales=scales)
    x[20:36, 10] = -0.0
    x[40, 11] = float("inf")
    x[48:64, 12] = 3.3895e38
    return x


def assert_columnwise_same(launches, x, config, context="", device=DEV, tile=None, columnwise_amax=None,
                           nan_scale=False):
    """The columnwise data, scales and amax of the kernels (outputs poisoned first) equal the reference's, and
    the columnwise launch ran as ``cast_col_kernel``. ``nan_scale``: a NaN scale may read 0x7F or 0xFF and a NaN
    amax any NaN (their sign is unspecified: torch's CPU reductions and the GPU's differ)."""
    before = len(launches)
    amax = None if columnwise_amax is None else columnwise_amax.to(device)
    got = kq.quantize(x.to(device), config, poison=True, columnwise_amax=amax, **(tile or {}))
    assert len(launches) == before + 1, f"{context}: cast_col_kernel did not run"
    want = ref_nvfp4.quantize(x.cpu(), config, columnwise_amax=columnwise_amax)
    if nan_scale:
        want.columnwise_scale = torch.where(want.columnwise_scale == 0xFF, 0x7F, want.columnwise_scale).to(torch.uint8)
    for field in ("columnwise_data", "columnwise_scale", "columnwise_amax"):
        a, b = getattr(got, field).cpu(), getattr(want, field)
        assert a.shape == b.shape and a.dtype == b.dtype, (context, field, a.shape, b.shape)
        if a.dtype == torch.float32:
            same = (a.view(torch.int32) == b.view(torch.int32)) | (torch.isnan(a) & torch.isnan(b))
        else:
            same = a == b
        if not bool(same.all()):
            bad = (~same).nonzero()
            raise AssertionError(f"{context} {field}: {bad.shape[0]} of {a.numel()} differ, first at "
                                 f"{tuple(bad[0].tolist())}: {a[tuple(bad[0])].item()} != {b[tuple(bad[0])].item()}")
    return want


# --------------------------------------------------------------------------------------- dispatch
@pytest.mark.parametrize("kwargs,dtype,takes_it", [
    (dict(rowwise=False, columnwise=True, rht=True), torch.bfloat16, True),
    (dict(rowwise=False, columnwise=True, rht=True, stochastic_rounding=True), torch.bfloat16, True),
    (dict(rowwise=False, columnwise=True, rht=True, scale_layout="swizzled"), torch.bfloat16, True),
    (dict(rowwise=True, columnwise=True, rht=True), torch.bfloat16, True),  # split: its columnwise launch
    (dict(rowwise=False, columnwise=True, rht=True), torch.float32, False),
    (dict(rowwise=False, columnwise=True), torch.bfloat16, False),  # cast16's four-group cast is faster
    (dict(rowwise=False, columnwise=True, stochastic_rounding=True), torch.bfloat16, False),
    (dict(rowwise=False, columnwise=True, per_token=True), torch.bfloat16, False),
    (dict(rowwise=False, columnwise=True, per_token=True, rht=True, numerics="te_pr3045"), torch.bfloat16, False),
    (dict(rowwise=True, columnwise=False, rht=True), torch.bfloat16, False),
])
def test_which_casts_take_cast_col(kwargs, dtype, takes_it, monkeypatch, cast_col_from):
    cast_col_from(0)
    fast = record_launches(monkeypatch, cast_col_module, "cast_col_kernel")
    x = rht_exact_input(32, 64, seed=1).to(dtype).to(DEV)
    kq.quantize(x, NVFP4QuantConfig(**kwargs), poison=True, seed=3)
    assert bool(fast) == takes_it


def test_small_casts_take_cast16(monkeypatch, cast_col_from):
    """Below CAST_COL_MIN_ELEMENTS a columnwise RHT cast runs cast16_kernel."""
    cast_col_from(32 * 64 + 16)
    fast = record_launches(monkeypatch, cast_col_module, "cast_col_kernel")
    slow = record_launches(monkeypatch, cast16_module, "cast16_kernel")
    x = rht_exact_input(32, 64, seed=3)
    got = kq.quantize(x.to(DEV), COL_RHT, poison=True)
    assert torch.equal(got.columnwise_data.cpu(), ref_nvfp4.quantize(x, COL_RHT).columnwise_data)
    assert not fast and slow


def test_misaligned_input_takes_cast16(monkeypatch, cast_col_from):
    """x not 16-byte aligned (a view at an odd offset): not read as int32 words."""
    cast_col_from(0)
    fast = record_launches(monkeypatch, cast_col_module, "cast_col_kernel")
    x = rht_exact_input(32, 64, seed=2)
    x_dev = torch.empty(32 * 64 + 1, dtype=torch.bfloat16, device=DEV)[1:].view(32, 64)  # made on the device: .to() aligns
    x_dev.copy_(x)
    assert x_dev.data_ptr() % 16
    got = kq.quantize(x_dev, COL_RHT, poison=True)
    assert torch.equal(got.columnwise_data.cpu(), ref_nvfp4.quantize(x, COL_RHT).columnwise_data)
    assert not fast


@pytest.mark.parametrize("sr,rows,graph_split", [(False, 1024, True), (True, 1024, False), (True, 2048, True)])
def test_graph_capture_plans_split_casts(sr, rows, graph_split):
    """The launches planned for a row+col RHT cast of rows x 1024 (2^20 / 2^21 elements): one in eager calls; inside
    a CUDA-graph capture (``graphed``) a rowwise launch and a cast_col_kernel launch from
    SPLIT_CAST_MIN_ELEMENTS_GRAPHED elements (RHT 2^19, RHT + SR 2^21)."""
    x = torch.empty(rows, 1024, dtype=torch.bfloat16)
    args = (x, torch.zeros(1, dtype=torch.int64) if sr else None, 0, True, True, False, False, COL_RHT.rht_sign_mask, 0,
            448.0, sr, "compact")
    def launches(**kwargs):
        return [(s.cast.kernel, s.rowwise, s.columnwise) for s in cast_module.cast_steps(*args, **kwargs)]

    one = [(cast16_module.cast16_kernel, True, True)]
    split = [(cast16_module.cast16_kernel, True, False), (cast_col_module.cast_col_kernel, False, True)]
    assert launches() == one
    assert launches(graphed=True) == (split if graph_split else one)


@pytest.mark.parametrize("m,block_m,groups", [(64, 64, 4), (96, 64, 2), (48, 64, 1), (64, 32, 2), (64, 16, 1)])
def test_row_groups_divide_the_rows(m, block_m, groups):
    """GROUPS is the largest of 4, 2, 1 within block_m / 16 that divides M / 16 (the kernel has no row masks)."""
    assert opt_flags.cast_col_meta(m, 64, "compact", 0xD7E8, 448.0, False, False, block_m=block_m)["GROUPS"] == groups


# -------------------------------------------------------------------- the BF16 operand output (OPERAND)
@pytest.mark.parametrize("shape", [(48, 80), (64, 272), (96, 80)])  # one, four and two 16-row groups per program
@pytest.mark.parametrize("sr", [False, True])
def test_operand_matches_expanded_codes(shape, sr, launches):
    """The columnwise operand of RHT(x^T), (K, M), equals the expansion of the reference's codes and scales (SR: of
    the packed cast with the same seed, checked against the Philox mapping below)."""
    config = dataclasses.replace(COL_RHT, stochastic_rounding=sr)
    x = rht_exact_input(*shape, seed=shape[0] + shape[1] + 1).to(DEV)
    want = kq.quantize(x, config, poison=True, seed=5) if sr else ref_nvfp4.quantize(x.cpu(), config)
    assert_operand_of(launches, x, config, want, True, f"{shape} sr={sr}", seed=5)


@pytest.mark.parametrize("sr", [False, True])
def test_operand_special_values(sr, launches):
    """Scale-0 blocks, tiny and huge blocks, -0.0, an inf column (saturating RHT), bf16 max, a NaN element (NaN
    values), and an amax outside the normal range (the program cast again, SATURATE)."""
    config = dataclasses.replace(COL_RHT, stochastic_rounding=sr)
    x = special_input()
    x[30, 13] = float("nan")
    want = kq.quantize(x.to(DEV), config, poison=True, seed=5) if sr else ref_nvfp4.quantize(x, config)
    assert_operand_of(launches, x.to(DEV), config, want, True, f"special sr={sr}", seed=5)


# ---------------------------------------------------------------------------------- bits vs the reference
@pytest.mark.parametrize("shape,tile", [
    ((16, 16), {}),
    ((48, 80), {}),
    ((64, 272), dict(block_m=64)),  # four groups per program
    ((96, 80), dict(block_m=32, block_k=32, num_warps=1)),  # two groups, masked word columns
    ((48, 80), dict(block_m=64, block_k=64, num_warps=2)),  # M / 16 = 3: one group
])
@pytest.mark.parametrize("layout", ["compact", "padded", "swizzled"])
def test_matches_reference(shape, tile, layout, launches):
    config = NVFP4QuantConfig(rowwise=False, columnwise=True, rht=True, scale_layout=layout)
    x = rht_exact_input(*shape, seed=shape[0] + shape[1])
    assert_columnwise_same(launches, x, config, f"{shape} {tile} {layout}", tile=tile)


def test_row_and_columnwise_split(launches):
    """A split row+col RHT cast: its columnwise launch is cast_col_kernel, both copies the reference's."""
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True)
    x = rht_exact_input(64, 96, seed=9)
    got = kq.quantize(x.to(DEV), config, poison=True)
    want = ref_nvfp4.quantize(x, config)
    assert len(launches) == 1
    for field in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), field


def test_special_values(launches):
    want = assert_columnwise_same(launches, special_input(), COL_RHT, "special")
    # the input exercises what it claims: the inf column's amax (no NaN from the RHT), a zero scale
    assert torch.isinf(want.columnwise_amax).all()
    assert (want.columnwise_scale[9, 1] == 0) and (want.columnwise_scale[5, 0] == 0)
    assert_columnwise_same(launches, special_input(), COL_RHT, "special, 4 groups", tile=dict(block_m=64))
    x = special_input()
    x[40, 11] = 1.0
    x[30, 13] = float("nan")
    assert_columnwise_same(launches, x, COL_RHT, "NaN element", nan_scale=True)


@pytest.mark.parametrize("amax", [0.0, float("inf"), float("nan"), 1e-38, 3e-41, 1e-31, 1e30, 1e35, FLT_MAX, 20.0])
def test_provided_amax_outside_the_normal_range(amax, launches):
    """Given columnwise amaxes 0, inf, NaN, subnormal, tiny, huge: fp64 factors outside the normal range, fp32 in it; outside
    the normal range the RHT saturates past bf16's range (the reference's rule)."""
    scales = torch.ones(2, 64)
    scales[0, 3] = 2.0**120
    x = rht_exact_input(32, 64, seed=4, block_scales=scales)
    assert_columnwise_same(launches, x, COL_RHT, f"amax {amax}", columnwise_amax=torch.tensor([amax]),
                           nan_scale=amax != amax)


def _beyond_amax_input(case):
    """(64, 96) with one column block whose RHT results a provided amax of 1 does not bound (``case``)."""
    x = rht_exact_input(64, 96, seed=12)
    if case == "past-bf16-max":  # sums past bf16's range: saturated
        x[16:32, 3] = 3.3895e38
    elif case == "partial-sums-overflow":  # sums with signs +-1 would overflow fp32 (T / 16 ones do not)
        x[32:48, 5] = torch.tensor([3.3895e38, -3.3895e38] * 8)
    elif case == "inf":
        x[20, 7] = float("inf")
    else:
        x[40, 9] = float("nan")
    return x


@pytest.mark.parametrize("case", ["past-bf16-max", "partial-sums-overflow", "inf", "nan"])
@pytest.mark.parametrize("sr", [False, True])
def test_provided_amax_below_the_results(case, sr, launches):
    """A provided normal-range amax that does not bound the RHT results: a program with an inf or NaN result casts
    its groups again the way outer amaxes outside the normal range do (the reference's saturation)."""
    config = NVFP4QuantConfig(rowwise=False, columnwise=True, rht=True, stochastic_rounding=sr)
    x = _beyond_amax_input(case)
    if sr:  # the SR codes are checked against the host Philox elsewhere; here the scales
        got = kq.quantize(x.to(DEV), config, poison=True, columnwise_amax=torch.tensor([1.0], device=DEV), seed=5)
        same = ref_nvfp4.quantize(x, NVFP4QuantConfig(rowwise=False, columnwise=True, rht=True),
                                  columnwise_amax=torch.tensor([1.0]))
        assert torch.equal(got.columnwise_scale.cpu(), same.columnwise_scale), case
        return
    assert_columnwise_same(launches, x, config, case, columnwise_amax=torch.tensor([1.0]), nan_scale=case == "nan")


def normal_range_amaxes(n, seed):
    """n columnwise amaxes across the range where the kernel divides in fp32: both ends (2^-100, 2^100), 2^-100's
    fp32 predecessor and 2^100's successor (fp64 there), and log-uniform values with random mantissas between."""
    g = torch.Generator().manual_seed(seed)
    spread = 2.0 ** (torch.rand(max(n - 4, 0), generator=g, dtype=torch.float64) * 200 - 100)
    ends = torch.tensor([2.0**-100, 2.0**100], dtype=torch.float64)
    beyond = torch.nextafter(ends.float(), torch.tensor([0.0, float("inf")]))
    return torch.cat([ends.float(), beyond, spread.float()])


def test_encode_factor_across_the_normal_range(launches):
    """Each block's encode factor 1 / (s * S_dec) by one fp32 division for outer amaxes in [2^-100, 2^100]: the
    reference's bits (scales from 2^-9 to 448 among the blocks) at both ends, just past them, and between."""
    scales = 2.0 ** torch.arange(-12, 12, dtype=torch.float32).reshape(2, 12).repeat(1, 4)
    x = rht_exact_input(32, 48, seed=8, block_scales=scales)
    for amax in normal_range_amaxes(12, seed=1).tolist():
        assert_columnwise_same(launches, x, COL_RHT, f"amax {amax!r}", columnwise_amax=torch.tensor([amax]))


# ---------------------------------------------------------------------------------- stochastic rounding
def _scaled_columnwise(x, rn):
    """RHT(x^T) * enc of each element, from the reference's scale formulas and its (RN) scales."""
    mat = ref_nvfp4.apply_rht(x.t(), COL_RHT.rht_sign_mask).float()
    return scaled_values(mat, rn.columnwise_scale, rn.columnwise_amax, 448.0)


@pytest.mark.parametrize("shape,tile", [((48, 96), {}), ((64, 80), dict(block_m=64, block_k=32, num_warps=1))])
def test_sr_bits_match_host_philox(shape, tile, launches, device=DEV):
    """The SR codes are the reference rule on RHT(x^T) * enc with the bytes of the documented Philox mapping
    (stream 1, units of 2 columns x 8 rows of x), bit for bit; the scales are the round-to-nearest ones."""
    config = NVFP4QuantConfig(rowwise=False, columnwise=True, rht=True, stochastic_rounding=True)
    x = rht_exact_input(*shape, seed=24)
    seed = 0x1234_5678_9ABC
    before = len(launches)
    got = kq.quantize(x.to(device), config, seed=seed, poison=True, **tile)
    assert len(launches) == before + 1
    rn = ref_nvfp4.quantize(x, COL_RHT)
    assert torch.equal(got.columnwise_scale.cpu(), rn.columnwise_scale)
    rbytes = host_sr_bytes(seed, shape[1], shape[0], 1)
    want = codecs.pack_fp4(ref_nvfp4.stochastic_round_e2m1(_scaled_columnwise(x, rn), rbytes))
    assert torch.equal(got.columnwise_data.cpu(), want)


def test_sr_seed_from_a_device_tensor(launches):
    x = rht_exact_input(64, 96, seed=25).to(DEV)
    amax = ref_nvfp4.quantize(x.cpu(), COL_RHT).columnwise_amax.to(DEV)
    assert_seed_read_from_device(
        lambda seed_tensor, seed: kq.cast_outputs(x, None, amax, seed_tensor, seed, False, True, False, False,
                                                  COL_RHT.rht_sign_mask, 0, 448.0, True, "compact", poison=True), 2, DEV)
    assert len(launches) == 3


def test_empty_input(launches):
    for shape in ((0, 64), (32, 0)):
        out = kq.quantize(torch.zeros(shape, dtype=torch.bfloat16, device=DEV), COL_RHT, poison=True)
        assert out.columnwise_data.shape == (shape[1], shape[0] // 2)
    assert not launches


# ---------------------------------------------------------------------------------- GPU (inline PTX)
@pytest.mark.gpu
def test_gpu_inline_ptx_matches_reference(launches):
    """cvt.rn.satfinite.e4m3x2.f32 on the GPU: bit for bit against the reference on special values, extreme
    amaxes, every tile and a large tensor; SR against the host Philox mapping."""
    assert_columnwise_same(launches, special_input(), COL_RHT, "gpu special", device="cuda")
    x = special_input()
    x[40, 11] = 1.0
    x[30, 13] = float("nan")
    assert_columnwise_same(launches, x, COL_RHT, "gpu NaN element", device="cuda", nan_scale=True)
    for amax in (0.0, float("inf"), float("nan"), 3e-41, 1e-31, 1e35):
        assert_columnwise_same(launches, rht_exact_input(64, 256, seed=5), COL_RHT, f"gpu amax {amax}", device="cuda",
                               columnwise_amax=torch.tensor([amax]), nan_scale=amax != amax)
    scales = 2.0 ** torch.arange(-24, 24, dtype=torch.float32).reshape(4, 12).repeat(1, 8)
    x = rht_exact_input(64, 96, seed=8, block_scales=scales)
    for amax in normal_range_amaxes(400, seed=2).tolist():  # the fp32 divisions of div.rn on the GPU
        assert_columnwise_same(launches, x, COL_RHT, f"gpu amax {amax!r}", device="cuda",
                               columnwise_amax=torch.tensor([amax]))
    for tile in ({}, dict(block_m=64), dict(block_m=16), dict(block_m=32, block_k=32, num_warps=1)):
        for layout in ("compact", "swizzled"):
            config = NVFP4QuantConfig(rowwise=False, columnwise=True, rht=True, scale_layout=layout)
            assert_columnwise_same(launches, rht_exact_input(1024, 4096, seed=6), config, f"gpu {tile} {layout}",
                                   device="cuda", tile=tile)
    test_sr_bits_match_host_philox((1024, 2048), {}, launches, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("sr", [False, True])
def test_gpu_graph_capture_splits_where_eager_does_not(sr, monkeypatch):
    """Inside a CUDA-graph capture a row+col RHT cast splits from SPLIT_CAST_MIN_ELEMENTS_GRAPHED elements (its
    columnwise launch: cast_col_kernel), an eager call of the same size keeps one launch; the replay gives the
    eager bits (SR: the same seed tensor)."""
    recipes = ("rht", "rht_sr", "sr")
    set_plan_flags(monkeypatch, opt_flags, kq, cast_module, CAST_COL_MIN_ELEMENTS=0,
                   SPLIT_CAST_MIN_ELEMENTS=dict.fromkeys(recipes, 1 << 40),
                   SPLIT_CAST_MIN_ELEMENTS_GRAPHED=dict.fromkeys(recipes, 0))
    fast = record_launches(monkeypatch, cast_col_module, "cast_col_kernel")
    x = rht_exact_input(256, 512, seed=12).cuda()
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True, stochastic_rounding=sr)
    eager = kq.quantize(x, config, poison=True, seed=5)
    assert not fast
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kq.quantize(x, config, poison=True, seed=5)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kq.quantize(x, config, poison=True, seed=5)
    graph.replay()
    torch.cuda.synchronize()
    assert len(fast) == 1
    for field in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        assert torch.equal(getattr(captured, field), getattr(eager, field)), field
