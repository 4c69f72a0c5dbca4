"""The per-tensor row+col cast ``cast_rowcol_kernel`` (kernels/nvfp4_quantize_details/cast_rowcol.py): which casts
take it, its two factor tables, and the bits of both copies against the reference (tiles with and without masks,
program orders, scale layouts, special values, every E4M3 scale code, extreme and unequal outer amaxes), under the
interpreter (its integer formulas) and, in the gpu tier, on the GPU (its inline PTX)."""
import pytest
import torch

from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.kernels.nvfp4_quantize_details import cast16 as cast16_module
from nvfp4lab.kernels.nvfp4_quantize_details import cast_rowcol as rowcol_module
from nvfp4lab.kernels.nvfp4_quantize_details import opt_flags
from nvfp4lab.kernels.nvfp4_quantize_details.cast import scale_buffer
from nvfp4lab.kernels.nvfp4_quantize_details.cast_row import TABLE_ENTRIES, row_factor_table_kernel
from nvfp4lab.kernels.nvfp4_quantize_details.cast_rowcol import col_scales_grid, col_scales_kernel, factor_tables_kernel
from nvfp4lab.ref import nvfp4 as ref_nvfp4
from nvfp4lab.ref.swizzle import apply_scale_layout

from .kernel_checks import (
    FIELDS,
    assert_field_equal,
    assert_same_bits,
    normal_bf16_input,
    record_launches,
    scale_code_input,
    special_input,
)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's x/0 under the interpreter

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ROWCOL = NVFP4QuantConfig(rowwise=True, columnwise=True)


@pytest.fixture
def launches(monkeypatch, plan_flags):
    """The launches of ``cast_rowcol_kernel`` during the test, which takes per-tensor row+col casts of any size."""
    plan_flags(CAST_ROWCOL_MIN_ELEMENTS=0)
    return record_launches(monkeypatch, rowcol_module, "cast_rowcol_kernel")


def assert_same(launches, x, config, context="", device=DEV, tile=None, amax=None, columnwise_amax=None,
                nan_sign=False):
    """Both copies (data, scales, amax) of the kernels (outputs poisoned first; ``tile``: an explicit tile) equal the
    reference's, and the cast ran as one ``cast_rowcol_kernel`` launch. ``nan_sign``: a NaN scale reads 0x7F or 0xFF
    (the GPU's NaNs are positive, the CPU reference's may not be)."""
    before = len(launches)
    given = [None if t is None else t.to(device) for t in (amax, columnwise_amax)]
    got = kq.quantize(x.to(device), config, poison=True, amax=given[0], columnwise_amax=given[1], **(tile or {}))
    assert len(launches) == before + 1, f"{context}: cast_rowcol_kernel did not run"
    want = ref_nvfp4.quantize(x.cpu(), config, amax=amax, columnwise_amax=columnwise_amax)
    for field in FIELDS:
        a, b = getattr(got, field).cpu(), getattr(want, field)
        if nan_sign and field.endswith("scale"):
            b = torch.where(b == 0xFF, 0x7F, b).to(torch.uint8)
        if field.endswith("amax"):
            assert_same_bits(a, b, nan_equal=True)
            continue
        assert_field_equal(a, b, f"{context} {field}")
    return want


# --------------------------------------------------------------------------------------- dispatch
@pytest.mark.parametrize("kwargs,dtype,shape,takes_it", [
    (dict(), torch.bfloat16, (32, 64), True),
    (dict(scale_layout="swizzled"), torch.bfloat16, (32, 64), True),
    (dict(), torch.float32, (32, 64), False),
    (dict(), torch.bfloat16, (40, 64), False),  # M not a multiple of 16
    (dict(per_token=True), torch.bfloat16, (32, 64), False),
    (dict(rht=True), torch.bfloat16, (32, 64), False),
    (dict(stochastic_rounding=True), torch.bfloat16, (32, 64), False),
    (dict(block="16x16"), torch.bfloat16, (32, 64), False),
    (dict(four_over_six="mae"), torch.bfloat16, (32, 64), False),
    (dict(columnwise=False), torch.bfloat16, (32, 64), False),
])
def test_which_casts_take_cast_rowcol(kwargs, dtype, shape, takes_it, monkeypatch, plan_flags):
    plan_flags(CAST_ROWCOL_MIN_ELEMENTS=0)
    fast = record_launches(monkeypatch, rowcol_module, "cast_rowcol_kernel")
    x = normal_bf16_input(shape, seed=1).to(dtype).to(DEV)
    kq.quantize(x, NVFP4QuantConfig(**{"rowwise": True, "columnwise": True, **kwargs}), poison=True)
    assert bool(fast) == takes_it


def test_small_and_misaligned_casts_take_cast16(monkeypatch, plan_flags):
    """Below CAST_ROWCOL_MIN_ELEMENTS, or with x not 16-byte aligned (not read as int32 words), a row+col cast runs
    cast16_kernel, with the same bits."""
    plan_flags(CAST_ROWCOL_MIN_ELEMENTS=32 * 64 + 16)
    fast = record_launches(monkeypatch, rowcol_module, "cast_rowcol_kernel")
    slow = record_launches(monkeypatch, cast16_module, "cast16_kernel")
    x = normal_bf16_input((32, 64), seed=3)
    got = kq.quantize(x.to(DEV), ROWCOL, poison=True)
    assert_same_bits(got.columnwise_data.cpu(), ref_nvfp4.quantize(x, ROWCOL).columnwise_data)
    assert not fast and len(slow) == 1
    plan_flags(CAST_ROWCOL_MIN_ELEMENTS=0)
    x = normal_bf16_input((1, 32 * 64 + 1), seed=2).flatten()[1:].reshape(32, 64)
    got = kq.quantize(x.to(DEV), ROWCOL, poison=True)
    assert_same_bits(got.rowwise_data.cpu(), ref_nvfp4.quantize(x, ROWCOL).rowwise_data)
    assert not fast and len(slow) == 2


# ---------------------------------------------------------------------------------- bits vs the reference
@pytest.mark.parametrize("shape,tile,band", [
    ((16, 16), {}, 32),
    ((48, 80), {}, 32),  # default tile wider than K: masked quads
    ((64, 256), dict(block_m=64, block_k=128, num_warps=1), 1),  # four groups, tiles covering x exactly
    ((96, 160), dict(block_m=32, block_k=64, num_warps=2), 2),  # a partial last band, masked quads
    ((48, 2064), dict(block_m=16, block_k=256, num_warps=2), 2),
])
@pytest.mark.parametrize("layout", ["compact", "padded", "swizzled"])
def test_matches_reference(shape, tile, band, layout, launches, plan_flags):
    plan_flags(CAST_ROWCOL_MIN_ELEMENTS=0, CAST_ROWCOL_ROW_BAND=band)
    if tile.get("block_m") == 64:  # the case covers the unmasked path it claims
        assert opt_flags.cast_rowcol_meta(*shape, layout, **tile)["EVEN"]
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, scale_layout=layout)
    assert_same(launches, normal_bf16_input(shape, seed=shape[0] + shape[1]), config, f"{shape} {tile} {band} {layout}",
                tile=tile)


def test_special_values(launches):
    want = assert_same(launches, special_input(), ROWCOL, "special")
    # the input exercises what it claims: inf saturating the scale (amax inf: S_enc = 1), a zero scale
    assert want.rowwise_scale[8, 0] == 0x7E and want.rowwise_scale[5, 0] == 0
    assert want.columnwise_scale[0, 0] == 0x7E
    # a NaN element: with finite given amaxes only its blocks are NaN (scale 0x7F, codes 0); with the computed
    # (NaN) amaxes every block is
    x = special_input(nan=True)
    amax = torch.tensor([1e4])
    want = assert_same(launches, x, ROWCOL, "NaN block", amax=amax, columnwise_amax=amax)
    assert want.rowwise_scale[10, 3] == 0x7F and (want.rowwise_data[10, 24:32] == 0).all()
    assert want.columnwise_scale[50, 0] == 0x7F and (want.columnwise_data[50, :8] == 0).all()
    assert (want.rowwise_scale[10, :3] != 0x7F).all() and want.columnwise_scale[49, 0] != 0x7F
    want = assert_same(launches, x, ROWCOL, "NaN amax")
    assert (want.rowwise_scale == 0x7F).all() and (want.columnwise_scale == 0x7F).all()


def test_every_scale_code(launches):
    amax = torch.tensor([2688.0])
    want = assert_same(launches, scale_code_input(), ROWCOL, "every scale code", amax=amax, columnwise_amax=amax)
    assert set(want.rowwise_scale.flatten().tolist()) >= set(range(127))


@pytest.mark.parametrize("amax", [0.0, float("inf"), float("nan"), 3e-41, 1e-31, 1e35, torch.finfo(torch.float32).max])
def test_provided_amax_outside_the_normal_range(amax, launches):
    """Outer amaxes 0, inf, NaN, subnormal, tiny, huge: one code path (the tables divide in fp64)."""
    x = normal_bf16_input((32, 64), seed=4)
    a = torch.tensor([amax])
    assert_same(launches, x, ROWCOL, f"amax {amax}", amax=a, columnwise_amax=a)
    assert_same(launches, x * 1e-30, ROWCOL, f"amax {amax}, tiny x", amax=a, columnwise_amax=a)


def test_unequal_outer_amaxes(launches):
    """Each copy reads its own table: rowwise and columnwise outer amaxes that differ (and each beside a special one)."""
    x = normal_bf16_input((64, 96), seed=9)
    for row, col in ((1e4, 2.5), (2.5, 1e4), (0.0, 30.0), (30.0, float("inf"))):
        assert_same(launches, x, ROWCOL, f"amaxes {row} / {col}", amax=torch.tensor([row]),
                    columnwise_amax=torch.tensor([col]))


@pytest.mark.parametrize("e4m3_max", [448.0, 256.0])
def test_factor_tables(e4m3_max):
    """Program 0 writes the rowwise amax's table, program 1 the columnwise one's after it: each equal to
    ``row_factor_table_kernel``'s table of that amax (whose entries tests/kernels/test_nvfp4_cast_row.py checks
    against the reference)."""
    row, col = torch.tensor([2.5], device=DEV), torch.tensor([1e35], device=DEV)
    tables = torch.full((2 * TABLE_ENTRIES,), float("nan"), device=DEV)
    factor_tables_kernel[(2,)](row, col, tables, E6=6.0 * e4m3_max)
    for i, amax in enumerate((row, col)):
        want = torch.full((TABLE_ENTRIES,), float("nan"), device=DEV)
        row_factor_table_kernel[(1,)](amax, want, E6=6.0 * e4m3_max)
        assert_same_bits(tables[i * TABLE_ENTRIES:i * TABLE_ENTRIES + 129].cpu(), want[:129].cpu(), nan_equal=True)
    assert not torch.equal(tables[:128], tables[TABLE_ENTRIES:TABLE_ENTRIES + 128])


@pytest.mark.parametrize("layout", ["compact", "padded", "swizzled"])
@pytest.mark.parametrize("m_blocks,k", [(3, 48), (40, 272)])  # tiles masked along both axes
def test_col_scales_from_the_staging_buffer(layout, m_blocks, k):
    """``col_scales_kernel`` writes the (m_blocks, k) staging buffer transposed, in the layout: every byte of the
    reference layout of its transpose (padding as the zero-filled buffer leaves it), on a poisoned buffer."""
    stage = torch.randint(0, 256, (m_blocks, k), dtype=torch.uint8, generator=torch.Generator().manual_seed(k))
    out = scale_buffer(k, m_blocks, layout, DEV, poison=True)
    meta = opt_flags.col_scales_meta(layout)
    col_scales_kernel[col_scales_grid(16 * m_blocks, k, meta)](stage.to(DEV), out, m_blocks, k, **meta)
    assert_same_bits(out.cpu().flatten(), apply_scale_layout(stage.t().contiguous(), layout).flatten())


def test_bf16_subnormals(launches):
    bits = torch.arange(1, 128, dtype=torch.int32)
    x = torch.cat([bits, bits | 0x8000, torch.zeros(2, dtype=torch.int32)]).to(torch.int16).view(torch.bfloat16)
    x = x.repeat(33)[: 32 * 256].reshape(32, 256)
    assert_same(launches, x, ROWCOL, "subnormals alone")
    mixed = x.clone()
    mixed[::3, ::5] = 1.5
    assert_same(launches, mixed, ROWCOL, "subnormals mixed")


def test_empty_input(plan_flags):
    plan_flags(CAST_ROWCOL_MIN_ELEMENTS=0)
    for shape in ((0, 64), (32, 0)):
        out = kq.quantize(torch.zeros(shape, dtype=torch.bfloat16, device=DEV), ROWCOL, poison=True)
        assert out.rowwise_data.shape == (shape[0], shape[1] // 2)
        assert out.columnwise_data.shape == (shape[1], shape[0] // 2)


# ---------------------------------------------------------------------------------- GPU (inline PTX)
@pytest.mark.gpu
def test_gpu_inline_ptx_matches_reference(launches):
    """cvt.rn.satfinite.e4m3x2.f32 (two scales per convert), max.NaN.xorsign.abs.bf16x2 and shf.l on the GPU: bit for
    bit against the reference on special values, every scale code, extreme and unequal amaxes, random tensors at the
    default tile (banded program order) and a masked one."""
    assert_same(launches, special_input(), ROWCOL, "gpu special", device="cuda")
    amax = torch.tensor([1e4])
    assert_same(launches, special_input(nan=True), ROWCOL, "gpu NaN block", device="cuda", amax=amax,
                columnwise_amax=amax, nan_sign=True)
    assert_same(launches, special_input(nan=True), ROWCOL, "gpu NaN amax", device="cuda", nan_sign=True)
    amax = torch.tensor([2688.0])
    assert_same(launches, scale_code_input(), ROWCOL, "gpu every scale code", device="cuda", amax=amax,
                columnwise_amax=amax)
    for value in (0.0, float("inf"), float("nan"), 3e-41, 1e-31, 1e35):
        assert_same(launches, normal_bf16_input((64, 256), seed=5), ROWCOL, f"gpu amax {value}", device="cuda",
                    amax=torch.tensor([value]), columnwise_amax=torch.tensor([2.5]))
    for layout in ("compact", "padded", "swizzled"):
        config = NVFP4QuantConfig(rowwise=True, columnwise=True, scale_layout=layout)
        assert_same(launches, normal_bf16_input((1024, 4096), seed=6), config, f"gpu random {layout}", device="cuda")
        assert_same(launches, normal_bf16_input((96, 160), seed=7), config, f"gpu masked {layout}", device="cuda",
                    tile=dict(block_m=32, block_k=64, num_warps=2))
