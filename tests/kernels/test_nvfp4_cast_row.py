"""The rowwise-only per-tensor cast ``cast_row_kernel`` (kernels/nvfp4_quantize_details/cast_row.py): which
casts take it, and its bits against the reference (masked tiles, scale layouts, special values, every
E4M3 scale code, extreme outer amaxes; with stochastic rounding against the documented Philox mapping, and as
the rowwise launch of split row+col casts), under the interpreter (its integer formulas) and, in the gpu
tier, on the GPU (its inline PTX)."""
import dataclasses

import pytest
import torch

from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.kernels.nvfp4_quantize_details import cast16 as cast16_module
from nvfp4lab.kernels.nvfp4_quantize_details import cast_col as cast_col_module
from nvfp4lab.kernels.nvfp4_quantize_details import cast_row as cast_row_module
from nvfp4lab.kernels.nvfp4_quantize_details import cast_rowcol as cast_rowcol_module
from nvfp4lab.kernels.nvfp4_quantize_details import opt_flags
from nvfp4lab.kernels.nvfp4_quantize_details import pt_scales as pt_scales_module
from nvfp4lab.kernels.nvfp4_quantize_details.cast_row import TABLE_ENTRIES, row_factor_table_kernel
from nvfp4lab.ref import codecs
from nvfp4lab.ref import nvfp4 as ref_nvfp4

from .kernel_checks import (
    FIELDS,
    TILE_16X32,
    assert_field_equal,
    assert_operand_of,
    assert_same_bits,
    assert_seed_read_from_device,
    host_sr_bytes,
    record_launches,
    scale_code_input,
    scaled_values,
    special_input,
)
from .kernel_checks import normal_bf16_input as normal_input

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's x/0 under the interpreter

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ROW = NVFP4QuantConfig(rowwise=True)
FLT_MAX = torch.finfo(torch.float32).max


@pytest.fixture
def cast_row_from(plan_flags):
    """``cast_row_from(n)``: per-tensor casts take cast_row_kernel from n elements on during the test."""
    return lambda elements: plan_flags(CAST_ROW_MIN_ELEMENTS=elements)


@pytest.fixture
def launches(monkeypatch, cast_row_from):
    """The launches of ``cast_row_kernel`` during the test, which takes per-tensor casts of any size."""
    cast_row_from(0)
    return record_launches(monkeypatch, cast_row_module, "cast_row_kernel")


def assert_rowwise_same(launches, x, config, context="", device=DEV, tile=None, amax=None, nan_sign=False):
    """The rowwise data, scales and amax of the kernels (outputs poisoned first; ``tile``: an explicit
    tile) equal the reference's, and the cast ran as ``cast_row_kernel``. ``nan_sign``: a NaN scale
    reads 0x7F or 0xFF and a NaN amax any NaN (the sign and payload of a NaN amax are unspecified:
    torch's CPU reductions and arithmetic and the GPU's differ)."""
    before = len(launches)
    got = kq.quantize(x.to(device), config, poison=True, amax=None if amax is None else amax.to(device), **(tile or {}))
    assert len(launches) == before + 1, f"{context}: cast_row_kernel did not run"
    want = ref_nvfp4.quantize(x.cpu(), config, amax=amax)
    if nan_sign:
        want.rowwise_scale = torch.where(want.rowwise_scale == 0xFF, 0x7F, want.rowwise_scale).to(torch.uint8)
        nan_both = torch.isnan(want.rowwise_amax) & torch.isnan(got.rowwise_amax.cpu())
        want.rowwise_amax = torch.where(nan_both, got.rowwise_amax.cpu(), want.rowwise_amax)
    for field in ("rowwise_data", "rowwise_scale", "rowwise_amax"):
        assert_field_equal(getattr(got, field).cpu(), getattr(want, field), f"{context} {field}")
    return want


# --------------------------------------------------------------------------------------- dispatch
@pytest.mark.parametrize("kwargs,dtype,takes_it", [
    (dict(rowwise=True), torch.bfloat16, True),
    (dict(rowwise=True, rht=True), torch.bfloat16, True),  # RHT touches only columnwise outputs
    (dict(rowwise=True, scale_layout="swizzled"), torch.bfloat16, True),
    (dict(rowwise=True), torch.float32, False),
    (dict(rowwise=True, per_token=True), torch.bfloat16, True),
    (dict(rowwise=True, per_token=True, numerics="te_pr3045"), torch.bfloat16, False),
    (dict(rowwise=True, stochastic_rounding=True), torch.bfloat16, True),
    (dict(rowwise=True, per_token=True, stochastic_rounding=True), torch.bfloat16, True),
    (dict(rowwise=True, columnwise=True), torch.bfloat16, False),
    (dict(rowwise=True, block="16x16"), torch.bfloat16, False),
    (dict(rowwise=True, four_over_six="mae"), torch.bfloat16, False),
])
def test_which_casts_take_cast_row(kwargs, dtype, takes_it, monkeypatch, cast_row_from):
    cast_row_from(0)
    fast = record_launches(monkeypatch, cast_row_module, "cast_row_kernel")
    x = normal_input((32, 64), seed=1).to(dtype).to(DEV)
    kq.quantize(x, NVFP4QuantConfig(**kwargs), poison=True)
    assert bool(fast) == takes_it


@pytest.mark.parametrize("per_token", [False, True])
def test_small_per_tensor_casts_take_cast16(per_token, monkeypatch, cast_row_from):
    """Below CAST_ROW_MIN_ELEMENTS a per-tensor cast runs cast16_kernel (no factor-table launch); per-token
    casts (whose tables launch either way) take cast_row_kernel at any size."""
    cast_row_from(32 * 64 + 16)
    fast = record_launches(monkeypatch, cast_row_module, "cast_row_kernel")
    slow = record_launches(monkeypatch, cast16_module, "cast16_kernel")
    x = normal_input((32, 64), seed=3)
    config = NVFP4QuantConfig(rowwise=True, per_token=per_token)
    got = kq.quantize(x.bfloat16().to(DEV), config, poison=True)
    assert_same_bits(got.rowwise_data.cpu(), ref_nvfp4.quantize(x.bfloat16(), config).rowwise_data)
    assert (bool(fast), bool(slow)) == (per_token, not per_token)


def test_misaligned_input_takes_cast16(monkeypatch, cast_row_from):
    """x not 16-byte aligned (a view at an odd offset): not read as int32 words."""
    cast_row_from(0)
    fast = record_launches(monkeypatch, cast_row_module, "cast_row_kernel")
    slow = record_launches(monkeypatch, cast16_module, "cast16_kernel")
    x = normal_input((1, 32 * 64 + 1), seed=2).flatten()[1:].reshape(32, 64)
    got = kq.quantize(x.to(DEV), ROW, poison=True)
    want = ref_nvfp4.quantize(x, ROW)
    assert_same_bits(got.rowwise_data.cpu(), want.rowwise_data)
    assert not fast and slow


# ---------------------------------------------------------------------------------- bits vs the reference
@pytest.mark.parametrize("shape,tile", [
    ((16, 16), {}),
    ((48, 80), {}),
    ((37, 80), TILE_16X32),  # masked rows and blocks
    ((37, 48), dict(block_m=32, block_k=128, num_warps=2)),
    ((128, 512), {}),
    ((40, 1040), {}),  # default tile: three program columns, the last one masked after its first half-block pair
    ((8, 512), dict(block_m=1, block_k=256, num_warps=2)),  # one-row tiles covering x exactly: no masks
    ((6, 1024), dict(block_m=2, block_k=512, num_warps=1)),
    ((5, 272), dict(block_m=1, block_k=256, num_warps=2)),  # one-row tiles, the last column masked
])
@pytest.mark.parametrize("layout", ["compact", "padded", "swizzled"])
def test_matches_reference(shape, tile, layout, launches):
    config = NVFP4QuantConfig(rowwise=True, scale_layout=layout)
    if tile.get("block_m", 0) in (1, 2):  # the cases cover the unmasked path they claim
        meta = opt_flags.cast_row_meta(*shape, layout, False, 448.0, **tile)
        assert meta["EVEN"] == (shape[1] % tile["block_k"] == 0)
    assert_rowwise_same(launches, normal_input(shape, seed=shape[0] + shape[1]), config, f"{shape} {tile} {layout}", tile=tile)


def test_special_values(launches):
    want = assert_rowwise_same(launches, special_input(), ROW, "special")
    # the input exercises what it claims: inf saturating the scale (amax inf: S_enc = 1), a zero scale
    assert want.rowwise_scale[8, 0] == 0x7E and want.rowwise_scale[5, 0] == 0
    assert_rowwise_same(launches, special_input(), ROW, "special, masked tiles", tile=TILE_16X32)
    # a NaN element: with a finite given amax only its block is NaN (scale 0x7F, codes 0); with the
    # computed (NaN) amax every block is
    want = assert_rowwise_same(launches, special_input(nan=True), ROW, "NaN block", amax=torch.tensor([1e4]))
    assert want.rowwise_scale[10, 3] == 0x7F and (want.rowwise_data[10, 24:32] == 0).all()
    assert (want.rowwise_scale[10, :3] != 0x7F).all()
    want = assert_rowwise_same(launches, special_input(nan=True), ROW, "NaN amax")
    assert (want.rowwise_scale == 0x7F).all()


def test_every_scale_code(launches):
    x = scale_code_input()
    amax = torch.tensor([2688.0])
    want = assert_rowwise_same(launches, x, ROW, "every scale code", amax=amax)
    assert set(want.rowwise_scale.flatten().tolist()) >= set(range(127))


@pytest.mark.parametrize("amax", [0.0, float("inf"), float("nan"), 1e-38, 3e-41, 1e-31, 1e30, 1e35, FLT_MAX, 448.0])
def test_provided_amax_outside_the_normal_range(amax, launches):
    """Outer amaxes 0, inf, NaN, subnormal, tiny, huge: one code path (the table divides in fp64)."""
    x = normal_input((32, 64), seed=4)
    assert_rowwise_same(launches, x, ROW, f"amax {amax}", amax=torch.tensor([amax]))
    assert_rowwise_same(launches, x * 1e-30, ROW, f"amax {amax}, tiny x", amax=torch.tensor([amax]))


@pytest.mark.parametrize("amax", [0.0, float("inf"), float("nan"), 3e-41, 1e-31, 2.5, 2688.0, 1e35, FLT_MAX])
@pytest.mark.parametrize("e4m3_max", [448.0, 256.0])
def test_factor_table(amax, e4m3_max):
    """Entries 0..127: min(fl(1 / fl(float(s) * S_dec)), FLT_MAX) of every E4M3 code (NaN for 0x7F), entry
    128: fl(S_enc * fl(1/6)), as the reference's fp32 torch operations give them."""
    table = torch.full((TABLE_ENTRIES,), float("nan"), device=DEV)
    row_factor_table_kernel[(1,)](torch.tensor([amax], device=DEV), table, E6=6.0 * e4m3_max)
    s_enc = ref_nvfp4.global_encode_scale(torch.tensor(amax), e4m3_max)
    s_dec = 1.0 / s_enc
    scale_f = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    want = torch.clamp(1.0 / (scale_f * s_dec), max=FLT_MAX)
    assert_same_bits(table[:128].cpu(), want, nan_equal=True)
    assert torch.isnan(table[127]) and torch.isnan(want[127])
    assert_same_bits(table[128:129].cpu(), (s_enc * torch.tensor(1.0 / 6.0, dtype=torch.float32)).reshape(1),
                     nan_equal=True)


def test_bf16_subnormals(launches):
    bits = torch.arange(1, 128, dtype=torch.int32)
    x = torch.cat([bits, bits | 0x8000, torch.zeros(2, dtype=torch.int32)]).to(torch.int16).view(torch.bfloat16)
    x = x.repeat(33)[: 32 * 256].reshape(32, 256)
    assert_rowwise_same(launches, x, ROW, "subnormals alone")
    mixed = x.clone()
    mixed[::3, ::5] = 1.5
    assert_rowwise_same(launches, mixed, ROW, "subnormals mixed")


def test_empty_input():
    for shape in ((0, 64), (32, 0)):
        out = kq.quantize(torch.zeros(shape, dtype=torch.bfloat16, device=DEV), ROW, poison=True)
        assert out.rowwise_data.shape == (shape[0], shape[1] // 2)


# ---------------------------------------------------------------------------------- per token
PT_ROW = NVFP4QuantConfig(rowwise=True, per_token=True)


def pertoken_extreme_input():
    """bf16 (64, 80) whose row amaxes leave the normal range in the second 16-row group only (fast and
    EXACT tiles in one launch): a zero row, tiny (below 2^-100), subnormal and huge rows, inf, a row
    at bf16 max, amaxes exactly 2^-100 and 2^100 (fast path)."""
    g = torch.Generator().manual_seed(71)
    x = torch.randn(64, 80, generator=g) * 10.0 ** (torch.rand(64, 1, generator=g) * 2 - 1)
    x[17] = 0.0
    x[18] *= 1e-35
    x[19] *= 1e35
    x[20] = x[20] / x[20].abs().max() * 1e-39  # bf16 subnormals
    x[21, 4] = float("inf")
    x[22] *= 2.0**-100 / x[22].abs().max()
    x[23] *= 2.0**100 / x[23].abs().max()
    x[24] = x[24] / x[24].abs().max() * 3.3895e38
    x[25, 1] = -0.0
    return x.bfloat16()


@pytest.mark.parametrize("shape,tile", [((48, 80), {}), ((37, 80), TILE_16X32), ((128, 512), {}), ((40, 1040), {})])
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_pertoken_matches_reference(shape, tile, layout, launches):
    config = NVFP4QuantConfig(rowwise=True, per_token=True, scale_layout=layout)
    assert_rowwise_same(launches, normal_input(shape, seed=shape[0] + 7), config, f"per token {shape} {tile} {layout}",
                        tile=tile)


def test_pertoken_extreme_rows(launches):
    assert_rowwise_same(launches, pertoken_extreme_input(), PT_ROW, "per token extremes")
    assert_rowwise_same(launches, pertoken_extreme_input(), PT_ROW, "per token extremes, masked tiles", tile=TILE_16X32)
    x = pertoken_extreme_input()
    x[40, 7] = float("nan")
    want = assert_rowwise_same(launches, x, PT_ROW, "per token NaN row", nan_sign=True)
    assert torch.isnan(want.rowwise_amax[40]) and not torch.isnan(want.rowwise_amax[39])
    assert (want.rowwise_scale[40] == 0x7F).all() and (want.rowwise_scale[39] != 0x7F).all()


@pytest.mark.parametrize("special", [0.0, 1e-35, 3e-41, 1e35, float("inf"), float("nan")])
def test_pertoken_provided_amaxes(special, launches):
    """Given row amaxes (the tables come from pt_scales_kernel), one of them special."""
    x = normal_input((48, 80), seed=73)
    amax = x.float().abs().amax(dim=1) * 2
    amax[20] = special
    assert_rowwise_same(launches, x, PT_ROW, f"per token amax {special}", amax=amax, nan_sign=special != special)


def test_pertoken_long_vectors(launches, monkeypatch):
    """Past opt_flags.AMAX_TABLES_MAX_ENTRIES rows the amax pass writes plain amaxes and pt_scales_kernel
    the tables: the same bits."""
    tables = record_launches(monkeypatch, pt_scales_module, "pt_scales_kernel")
    x = normal_input((opt_flags.AMAX_TABLES_MAX_ENTRIES + 16, 32), seed=74)
    got = kq.quantize(x.to(DEV), PT_ROW, poison=True)
    want = ref_nvfp4.quantize(x, PT_ROW)
    assert_same_bits(got.rowwise_data.cpu(), want.rowwise_data)
    assert_same_bits(got.rowwise_scale.cpu(), want.rowwise_scale)
    assert len(launches) == 1 and len(tables) == 1


# ---------------------------------------------------------------------------------- stochastic rounding
SR_ROW = NVFP4QuantConfig(rowwise=True, stochastic_rounding=True)
SR_SEED = 0x1234_5678_9ABC


def assert_sr_rows(launches, x, config, context="", device=DEV, tile=None, amax=None, seed=SR_SEED):
    """With stochastic rounding, one ``cast_row_kernel`` launch (outputs poisoned first): the scales and amax are
    the reference's round-to-nearest ones; the codes are its rule (``stochastic_round_e2m1``) on x * enc with the
    bytes of the documented Philox mapping (stream 0, units of 2 rows x 8 columns: ``host_sr_bytes``), bit for bit."""
    before = len(launches)
    got = kq.quantize(x.to(device), config, poison=True, seed=seed, amax=None if amax is None else amax.to(device),
                      **(tile or {}))
    assert len(launches) == before + 1, f"{context}: cast_row_kernel did not run"
    rn = ref_nvfp4.quantize(x.cpu(), dataclasses.replace(config, stochastic_rounding=False), amax=amax)
    for field in ("rowwise_scale", "rowwise_amax"):
        assert_field_equal(getattr(got, field).cpu(), getattr(rn, field), f"{context} {field}")
    compact = ref_nvfp4.quantize(x.cpu(), dataclasses.replace(config, stochastic_rounding=False,
                                                                 scale_layout="compact"), amax=amax)
    scaled = scaled_values(x.float().cpu(), compact.rowwise_scale, compact.rowwise_amax, config.e4m3_max)
    want = codecs.pack_fp4(ref_nvfp4.stochastic_round_e2m1(scaled, host_sr_bytes(seed, *x.shape, 0)))
    assert_same_bits(got.rowwise_data.cpu(), want)
    return got


@pytest.mark.parametrize("shape,tile", [
    ((48, 96), {}),
    ((37, 80), TILE_16X32),  # masked rows (an odd last row without its pair) and blocks
    ((7, 272), dict(block_m=2, block_k=256, num_warps=2)),  # pairs of rows, the last column and row masked
    ((8, 512), dict(block_m=2, block_k=256, num_warps=2)),  # tiles covering x exactly: no masks
    ((1, 64), {}),
])
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_sr_bits_match_host_philox(shape, tile, layout, launches):
    config = dataclasses.replace(SR_ROW, scale_layout=layout)
    x = normal_input(shape, seed=shape[0] * shape[1])
    assert_sr_rows(launches, x, config, f"{shape} {tile} {layout}", tile=tile)


def test_sr_tile_takes_rows_in_pairs():
    """A one-row tile (x of one row, or an explicit one) becomes two rows with SR: the kernel splits its rows into
    even and odd ones."""
    assert opt_flags.cast_row_meta(1, 64, "compact", False, 448.0)["BLOCK_M"] == 1
    assert opt_flags.cast_row_meta(1, 64, "compact", False, 448.0, True, False)["BLOCK_M"] == 2
    assert opt_flags.cast_row_meta(64, 512, "compact", False, 448.0, True, False, block_m=1)["BLOCK_M"] == 2


def test_sr_special_values_and_extreme_amaxes(launches):
    assert_sr_rows(launches, special_input(), SR_ROW, "special")
    x = special_input(nan=True)  # NaN blocks: factor NaN, SR's +6 where round to nearest writes 0
    got = kq.quantize(x.to(DEV), SR_ROW, poison=True, seed=SR_SEED, amax=torch.tensor([1e4], device=DEV))
    scaled = scaled_values(x.float(), got.rowwise_scale.cpu() & 0x7F, torch.tensor([1e4]), 448.0)
    want = codecs.pack_fp4(ref_nvfp4.stochastic_round_e2m1(scaled, host_sr_bytes(SR_SEED, *x.shape, 0)))
    assert torch.isnan(scaled).any()
    assert_same_bits(got.rowwise_data.cpu(), want)
    for amax in (0.0, float("inf"), 3e-41, 1e35):
        assert_sr_rows(launches, normal_input((32, 64), seed=11), SR_ROW, f"amax {amax}", amax=torch.tensor([amax]))


def test_sr_per_token(launches):
    config = dataclasses.replace(PT_ROW, stochastic_rounding=True)
    assert_sr_rows(launches, normal_input((37, 96), seed=12), config, "per token", tile=TILE_16X32)
    assert_sr_rows(launches, pertoken_extreme_input(), config, "per token extremes")


def test_sr_seed_from_a_device_tensor(launches):
    x = normal_input((32, 64), seed=13).to(DEV)
    amax = x.abs().amax().float().reshape(1)
    assert_seed_read_from_device(
        lambda seed_tensor, seed: kq.cast_outputs(x, amax, None, seed_tensor, seed, True, False, False, False, -1, 0,
                                                  448.0, True, "compact", poison=True), 0, DEV)
    assert len(launches) == 3


# -------------------------------------------------------------------- the BF16 operand output (OPERAND)
@pytest.mark.parametrize("shape", [(37, 80), (64, 512)])  # masked rows and blocks; tiles covering x exactly
@pytest.mark.parametrize("config", [ROW, SR_ROW, PT_ROW, dataclasses.replace(PT_ROW, stochastic_rounding=True)],
                         ids=["tensor", "sr", "per-token", "per-token-sr"])
def test_operand_matches_expanded_codes(shape, config, launches):
    """The rowwise operand q * s equals the expansion of the reference's codes and scales (SR: of the packed cast
    with the same seed, whose codes the tests above check against the Philox mapping)."""
    x = normal_input(shape, seed=shape[0] + 3).to(DEV)
    want = (kq.quantize(x, config, poison=True, seed=SR_SEED) if config.stochastic_rounding
            else ref_nvfp4.quantize(x.cpu(), config))
    assert_operand_of(launches, x, config, want, False, f"{shape}", seed=SR_SEED)


@pytest.mark.parametrize("config", [ROW, SR_ROW], ids=["tensor", "sr"])
def test_operand_special_values(config, launches):
    """Zeros and -0.0, subnormals, scale-0 blocks, +-inf, bf16 max, a NaN block (NaN values: its scale is NaN),
    extreme per-token rows."""
    for context, x in (("special", special_input(nan=True)), ("per token extremes", pertoken_extreme_input())):
        for cfg in (config, dataclasses.replace(config, per_token=True)):
            x_dev = x.to(DEV)
            want = (kq.quantize(x_dev, cfg, poison=True, seed=SR_SEED) if cfg.stochastic_rounding
                    else ref_nvfp4.quantize(x, cfg))
            assert_operand_of(launches, x_dev, cfg, want, False, f"{context} {cfg.per_token}", seed=SR_SEED)


@pytest.mark.parametrize("kwargs,launches_want", [
    # RHT + SR: one launch makes both factor tables (cast_col_kernel reads one with SR), so cast_row_kernel adds none
    (dict(rht=True, stochastic_rounding=True),
     {"factor_tables_kernel": 1, "cast_row_kernel": 1, "cast_col_kernel": 1}),
    # the others' columnwise launch reads no table: the rowwise one stays on cast16_kernel (no table launch)
    (dict(rht=True), {"cast16_kernel": 1, "cast_col_kernel": 1}),
    (dict(stochastic_rounding=True), {"cast16_kernel": 2}),
])
def test_split_casts_take_cast_row(kwargs, launches_want, monkeypatch, plan_flags):
    """The rowwise launch of a split row+col cast runs cast_row_kernel from CAST_ROW_SPLIT_MIN_ELEMENTS on where its
    factor table comes with the columnwise launch's; every output equals the one-launch cast's."""
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, **kwargs)
    x = normal_input((64, 96), seed=14).to(DEV)
    plan_flags(SPLIT_CAST_MIN_ELEMENTS=dict.fromkeys(("rht", "rht_sr", "sr"), 1 << 40))
    one = kq.quantize(x, config, poison=True, seed=SR_SEED)
    plan_flags(SPLIT_CAST_MIN_ELEMENTS=dict.fromkeys(("rht", "rht_sr", "sr"), 0), CAST_COL_MIN_ELEMENTS=0,
               CAST_ROW_SPLIT_MIN_ELEMENTS=0)
    modules = dict(cast_row_kernel=cast_row_module, cast_col_kernel=cast_col_module, cast16_kernel=cast16_module,
                   factor_tables_kernel=cast_rowcol_module, row_factor_table_kernel=cast_row_module)
    runs = {name: record_launches(monkeypatch, module, name) for name, module in modules.items()}
    split = kq.quantize(x, config, poison=True, seed=SR_SEED)
    assert {name: len(r) for name, r in runs.items() if r} == launches_want
    for field in FIELDS:
        assert_same_bits(getattr(split, field), getattr(one, field))


def test_split_sr_cast_below_the_threshold_keeps_cast16(monkeypatch, plan_flags):
    """Below CAST_ROW_SPLIT_MIN_ELEMENTS the rowwise launch of a split RHT + SR cast stays on cast16_kernel, and
    cast_col_kernel's factor table has its own launch."""
    plan_flags(SPLIT_CAST_MIN_ELEMENTS=dict.fromkeys(("rht", "rht_sr", "sr"), 0), CAST_COL_MIN_ELEMENTS=0,
               CAST_ROW_SPLIT_MIN_ELEMENTS=64 * 96 + 16)
    runs = {name: record_launches(monkeypatch, module, name) for name, module in
            dict(cast16_kernel=cast16_module, cast_col_kernel=cast_col_module,
                 row_factor_table_kernel=cast_row_module, cast_row_kernel=cast_row_module).items()}
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True)
    kq.quantize(normal_input((64, 96), seed=15).to(DEV), config, poison=True, seed=SR_SEED)
    assert {name: len(r) for name, r in runs.items() if r} == {"cast16_kernel": 1, "cast_col_kernel": 1,
                                                               "row_factor_table_kernel": 1}


# ---------------------------------------------------------------------------------- GPU (inline PTX)
@pytest.mark.gpu
def test_gpu_inline_ptx_matches_reference(launches):
    """cvt.rn.satfinite.e4m3x2.f32 and max.u16x2 on the GPU: bit for bit against the reference on
    special values, every scale code, extreme amaxes and a large random tensor (default tile)."""
    assert_rowwise_same(launches, special_input(), ROW, "gpu special", device="cuda")
    # (the GPU's NaNs are positive, the CPU reference's may not be: scale 0x7F / 0xFF)
    assert_rowwise_same(launches, special_input(nan=True), ROW, "gpu NaN block", device="cuda", amax=torch.tensor([1e4]),
                        nan_sign=True)
    assert_rowwise_same(launches, special_input(nan=True), ROW, "gpu NaN amax", device="cuda", nan_sign=True)
    want = assert_rowwise_same(launches, scale_code_input(), ROW, "gpu every scale code", device="cuda", amax=torch.tensor([2688.0]))
    assert set(want.rowwise_scale.flatten().tolist()) >= set(range(127))
    for amax in (0.0, float("inf"), float("nan"), 3e-41, 1e-31, 1e35):
        assert_rowwise_same(launches, normal_input((64, 256), seed=5), ROW, f"gpu amax {amax}", device="cuda",
                            amax=torch.tensor([amax]))
    assert_rowwise_same(launches, pertoken_extreme_input(), PT_ROW, "gpu per token extremes", device="cuda")
    assert_rowwise_same(launches, normal_input((1000, 4096), seed=8), PT_ROW, "gpu per token random", device="cuda")
    for layout in ("compact", "swizzled"):
        config = NVFP4QuantConfig(rowwise=True, scale_layout=layout)
        assert_rowwise_same(launches, normal_input((1000, 4096), seed=6), config, f"gpu random {layout}", device="cuda")
        assert_rowwise_same(launches, normal_input((37, 80), seed=7), config, f"gpu masked {layout}", device="cuda", tile=TILE_16X32)
    # stochastic rounding: the same scales, the codes of the host Philox bytes
    assert_sr_rows(launches, special_input(), SR_ROW, "gpu sr special", device="cuda")
    assert_sr_rows(launches, normal_input((1000, 4096), seed=9), SR_ROW, "gpu sr random", device="cuda")
    assert_sr_rows(launches, normal_input((37, 80), seed=10), SR_ROW, "gpu sr masked", device="cuda", tile=TILE_16X32)
    assert_sr_rows(launches, pertoken_extreme_input(), dataclasses.replace(PT_ROW, stochastic_rounding=True),
                   "gpu sr per token extremes", device="cuda")
