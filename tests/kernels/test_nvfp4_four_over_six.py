"""The 1x16 4over6 cast of bf16 input ``four_over_six_1x16_kernel`` (kernels/nvfp4_quantize_details/four_over_six.py):
which casts take it, and the bits of both outputs against the reference (tiles with and without masks, row and
column groups, scale layouts, per tensor and per token, special values, every E4M3 scale code, products that
underflow, extreme outer amaxes), under the interpreter and, in the gpu tier, on the GPU (its E4M3 convert).
``four_over_six_kernel`` (16x16 blocks, other dtypes) is covered by test_nvfp4_quantize.py."""
import pytest
import torch

from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.kernels.nvfp4_quantize_details import four_over_six as four_over_six_module
from nvfp4lab.ref import nvfp4 as ref_nvfp4

from .kernel_checks import (
    FIELDS,
    assert_field_equal,
    normal_bf16_input,
    record_launches,
    scale_code_input,
    special_input,
)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's x/0 under the interpreter

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SIDES = {"rowcol": dict(rowwise=True, columnwise=True), "row": dict(rowwise=True),
         "col": dict(rowwise=False, columnwise=True)}
MODES = {"mae256": dict(four_over_six="mae", e4m3_max=256), "mse448": dict(four_over_six="mse", e4m3_max=448),
         "mae448-pt": dict(four_over_six="mae", e4m3_max=448, per_token=True),
         "mse256-pt": dict(four_over_six="mse", e4m3_max=256, per_token=True)}


@pytest.fixture
def launches(monkeypatch, plan_flags):
    """The launches of ``four_over_six_1x16_kernel`` during the test, which takes row+col casts of any size."""
    plan_flags(FOUR_OVER_SIX_1X16_MIN_ELEMENTS=0)
    return record_launches(monkeypatch, four_over_six_module, "four_over_six_1x16_kernel")


def assert_same(launches, x, config, context="", tile=None, amax=None, nan_sign=False):
    """Every output of the kernel (outputs poisoned first; ``tile``: an explicit tile; ``amax``: a given outer amax
    of both outputs)
    equal the reference's, and the cast ran as one ``four_over_six_1x16_kernel`` launch per output. ``nan_sign``: NaN
    scales and amaxes of either sign match (the sign of a NaN from arithmetic differs between machines)."""
    before = len(launches)
    given = None if amax is None else amax.to(DEV)
    got = kq.quantize(x.to(DEV), config, poison=True, amax=given, columnwise_amax=given, **(tile or {}))
    assert len(launches) == before + int(config.rowwise) + int(config.columnwise), f"{context}: the kernel did not run"
    want = ref_nvfp4.quantize(x, config, amax=amax, columnwise_amax=amax)
    for field in FIELDS:
        if getattr(want, field) is not None:
            got_field, want_field = getattr(got, field).cpu(), getattr(want, field)
            if nan_sign:
                got_field, want_field = _positive_nan(got_field, field), _positive_nan(want_field, field)
            assert_field_equal(got_field, want_field, f"{context} {field}")


def _positive_nan(t, field):
    """An output with its NaNs of either sign read as one value: E4M3 scale bits 0x7F and 0xFF as 0x7F, fp32 amax
    NaNs as the positive quiet NaN (the other fields as given)."""
    if field.endswith("_scale"):
        return torch.where(t & 0x7F == 0x7F, torch.full_like(t, 0x7F), t)
    if field.endswith("_amax"):
        return torch.where(t.isnan(), torch.full_like(t, float("nan")).abs(), t)
    return t


@pytest.mark.parametrize("tile", [{}, dict(block_m=16, block_k=32, num_warps=4), dict(block_m=32, block_k=32, num_warps=1),
                                  dict(block_m=64, block_k=64, num_warps=2)])
@pytest.mark.parametrize("shape", [(16, 16), (48, 80), (64, 256)])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("side", list(SIDES))
def test_matches_reference(launches, side, mode, shape, tile):
    # 48 x 80: partial tiles along both axes, the last columnwise program's later groups past the 48 rows
    config = NVFP4QuantConfig(**SIDES[side], **MODES[mode])
    x = normal_bf16_input(shape, seed=shape[0] + shape[1])
    assert_same(launches, x, config, f"{side} {mode} {shape} {tile}", tile)


@pytest.mark.parametrize("layout", ["padded", "swizzled"])
@pytest.mark.parametrize("side", list(SIDES))
def test_scale_layouts(launches, side, layout):
    config = NVFP4QuantConfig(**SIDES[side], four_over_six="mae", scale_layout=layout)
    assert_same(launches, normal_bf16_input((48, 80), seed=8), config, f"{side} {layout}")


@pytest.mark.parametrize("mode", list(MODES))
def test_rowwise_takes_any_m(launches, mode):
    config = NVFP4QuantConfig(rowwise=True, **MODES[mode])
    assert_same(launches, normal_bf16_input((37, 48), seed=9), config, mode)


@pytest.mark.parametrize("nan", [False, True])
@pytest.mark.parametrize("mode", list(MODES))
def test_special_values(launches, mode, nan):
    # zeros, -0.0, subnormals, a block far below the amax, +-inf, bf16 max, NaN
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, **MODES[mode])
    assert_same(launches, special_input(nan), config, f"{mode} nan={nan}", nan_sign=nan)


@pytest.mark.parametrize("mode", ["mae256", "mse448"])
def test_every_scale_code(launches, mode):
    # amax given as 2688 (S_enc = 1 with E = 448): block maxima at and between every E4M3 code
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, **MODES[mode])
    assert_same(launches, scale_code_input(), config, mode, amax=torch.tensor([2688.0]))


@pytest.mark.parametrize("outer", [221184.0, 2.0**40, 2.0**90, 2.0**-90, 2.0**110])
@pytest.mark.parametrize("mode", list(MODES))
def test_signs_of_products_that_underflow(launches, mode, outer):
    # large values with tiny negative ones (down to the smallest bf16 subnormal): where fl(x * enc) underflows to
    # -0.0 the code is +0, as the reference's fl(x * enc) < 0. 221184 = 1.6875 * 2^17 lies just under x_sign_safe's
    # bound for E = 256 (codes signed by x), 2^40 and 2^90 above it (signed by the product), 2^-90 and 2^110 take
    # the EXACT path (2^110: outside the normal range)
    g = torch.Generator().manual_seed(63)
    x = torch.randn(32, 64, generator=g)
    x = x / x.abs().max() * outer
    tiny = torch.tensor([-2.0**-133, -2.0**-130, -2.0**-125, -1e-38, -2.0**-110, 2.0**-133, -2.0**-120, -2.0**-100])
    x[:, 3::8] = tiny.repeat(4)[:, None]
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, **MODES[mode])
    assert_same(launches, x.bfloat16(), config, f"{mode} {outer:g}")


def test_small_eager_rowcol_casts_take_one_launch(monkeypatch, plan_flags):
    """Below FOUR_OVER_SIX_1X16_MIN_ELEMENTS an eager row+col cast runs four_over_six_kernel (one launch instead of
    two), with the same bits; single-output casts take four_over_six_1x16_kernel at any size."""
    plan_flags(FOUR_OVER_SIX_1X16_MIN_ELEMENTS=32 * 64 + 16)
    new = record_launches(monkeypatch, four_over_six_module, "four_over_six_1x16_kernel")
    old = record_launches(monkeypatch, four_over_six_module, "four_over_six_kernel")
    x = normal_bf16_input((32, 64), seed=3)
    for kwargs, want in ((dict(rowwise=True, columnwise=True), (0, 1)), (dict(rowwise=True), (1, 1)),
                         (dict(rowwise=False, columnwise=True), (2, 1))):
        config = NVFP4QuantConfig(four_over_six="mae", **kwargs)
        got = kq.quantize(x.to(DEV), config, poison=True)
        ref = ref_nvfp4.quantize(x, config)
        for field in FIELDS:
            if getattr(ref, field) is not None:
                assert_field_equal(getattr(got, field).cpu(), getattr(ref, field), f"{kwargs} {field}")
        assert (len(new), len(old)) == want, kwargs


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
def test_gpu_matches_reference(launches, mode):
    # a large tile-covered shape and one that is no multiple of any tile, on the GPU's hardware paths
    for shape in ((4096, 2048), (2064, 3088)):
        config = NVFP4QuantConfig(rowwise=True, columnwise=True, **MODES[mode])
        assert_same(launches, normal_bf16_input(shape, seed=11), config, f"{mode} {shape}")
