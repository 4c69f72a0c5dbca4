"""Triton NVFP4 quantize (kernels/nvfp4_quantize.py) against the reference, bit for bit.

On CPU the kernels run under the Triton interpreter with small shapes; the ``gpu`` tests repeat the
comparisons on large shapes, check CUDA-graph capture/replay and torch.compile, and run the golden
conformance folder. ``quantize`` poisons every uninitialized output byte with 0xFF before the kernels run.
"""
import os
import zlib
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import nvfp4lab
from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.conformance import default_folder, run_folder
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.kernels.formats import e2m1_decode, e2m1_encode, e2m1_encode_fast, e2m1_scale_encode, to_f32
from nvfp4lab.kernels.nvfp4_quantize_details import amax as amax_module
from nvfp4lab.kernels.nvfp4_quantize_details import cast16 as cast16_module
from nvfp4lab.kernels.nvfp4_quantize_details import cast_row as cast_row_module
from nvfp4lab.kernels.nvfp4_quantize_details import four_over_six as four_over_six_module
from nvfp4lab.kernels.nvfp4_quantize_details import pt_scales as pt_scales_module
from nvfp4lab.kernels.nvfp4_quantize_details.four_over_six import (
    dequant_fast,
    dequant_pair,
    div_const_rn,
    seq_sum_pair,
    tree_sum8_pair,
)
from nvfp4lab.kernels.nvfp4_quantize_details.stochastic_rounding import sr_e2m1
from nvfp4lab.ref import codecs
from nvfp4lab.ref import nvfp4 as ref_nvfp4

from .kernel_checks import FIELDS, QUANTIZE_CASES, TILE_16X32, forbid_launches, record_launches, scaled_values
from .kernel_checks import host_sr_bytes as _host_sr_bytes

# the interpreter evaluates x/0 with numpy, which warns; the results are the IEEE ones
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

REPO_ROOT = Path(__file__).resolve().parents[2]
# the small-shape tier runs natively when a GPU is present, under the interpreter otherwise
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def quantize(x, config, **kwargs):
    """``kq.quantize`` with its outputs 0xFF-poisoned before the kernels write them."""
    return kq.quantize(x, config, poison=True, **kwargs)


def assert_same(got, want, context=""):
    for field in FIELDS:
        a, b = getattr(got, field), getattr(want, field)
        if b is None:
            assert a is None, f"{context} {field}: expected no output"
            continue
        assert a is not None, f"{context} {field}: missing"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{context} {field}: {a.dtype}{tuple(a.shape)} != {b.dtype}{tuple(b.shape)}"
        if a.dtype == torch.float32:
            a, b = a.view(torch.int32), b.view(torch.int32)
        a, b = a.cpu(), b.cpu()
        if not torch.equal(a, b):
            bad = (a != b).nonzero()
            raise AssertionError(f"{context} {field}: {bad.shape[0]} of {a.numel()} bytes differ, first at {tuple(bad[0].tolist())}")


def normal_input(shape, dtype, seed, device=DEV):
    """Normal values whose rows and columns are scaled by 10**U(-1, 1) (so per-token amax matters)."""
    g = torch.Generator().manual_seed(seed)
    m, k = shape
    x = torch.randn(m, k, generator=g)
    x = x * 10.0 ** (torch.rand(m, 1, generator=g) * 2 - 1) * 10.0 ** (torch.rand(1, k, generator=g) * 2 - 1)
    return x.to(dtype).to(device)


def rht_safe_input(shape, dtype, seed, device=DEV):
    """Magnitudes in [2^-3, 2^3]: every 16-term RHT sum is exact in fp32, so any summation order (CPU
    matmul, interpreter, tensor cores) gives the reference's bits (golden RHT cases are chosen the same way)."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.rand(shape, generator=g) * 6 - 3)
    sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    return (sign * mag).to(dtype).to(device)


def make_input(config_kwargs, shape, dtype, seed, device=DEV):
    maker = rht_safe_input if config_kwargs.get("rht") else normal_input
    return maker(shape, dtype, seed, device)


CONFIGS = {
    "1x16-row": dict(rowwise=True),
    "1x16-col": dict(rowwise=False, columnwise=True),
    "1x16-rowcol": dict(rowwise=True, columnwise=True),
    "16x16-rowcol": dict(block="16x16", rowwise=True, columnwise=True),
    "16x16-col": dict(block="16x16", rowwise=False, columnwise=True),
    "pertoken-rowcol": dict(per_token=True, rowwise=True, columnwise=True),
    "pertoken-col": dict(per_token=True, rowwise=False, columnwise=True),
    "rht-d7e8-rowcol": dict(rht=True, rht_sign_mask=0xD7E8, rowwise=True, columnwise=True),
    "rht-0000-rowcol": dict(rht=True, rht_sign_mask=0, rowwise=True, columnwise=True),
    "rht-d7e8-col": dict(rht=True, rowwise=False, columnwise=True),
    "4o6-pertoken-mae-256-rowcol": dict(per_token=True, four_over_six="mae", e4m3_max=256, rowwise=True, columnwise=True),
    "4o6-pertoken-mse-448-row": dict(per_token=True, four_over_six="mse", e4m3_max=448, rowwise=True),
}
for _block in ("1x16", "16x16"):
    for _mode in ("mae", "mse"):
        for _e in (448, 256):
            CONFIGS[f"4o6-{_block}-{_mode}-{_e}-rowcol"] = dict(block=_block, four_over_six=_mode, e4m3_max=_e, rowwise=True,
                                                                 columnwise=True)

# 32x32x1 / 64 rows: cast16_kernel with two / four 16-row groups per program (every recipe; by default only
# casts with a per-tensor columnwise output and no SR take more than one, and only on tensors large enough
# to keep CAST16_MIN_PROGRAMS programs), the last program's later groups outside the 48 rows
CASES = dict(QUANTIZE_CASES, **{"48x80-bf16-tiles16x32": ((48, 80), torch.bfloat16, TILE_16X32),
                                "48x80-bf16-tiles32x32": ((48, 80), torch.bfloat16, dict(block_m=32, block_k=32, num_warps=1)),
                                "48x80-bf16-rows64": ((48, 80), torch.bfloat16, dict(block_m=64))})


# (four_over_six_kernel, the 16x16 4over6 cast, has one 16-row group per program whatever block_m: no 32x32 or
# 64-row case for it; four_over_six_1x16_kernel takes block_m as its rowwise rows and columnwise 16-row groups)
@pytest.mark.parametrize("name,case", [(name, case) for name in CONFIGS for case in CASES
                                       if not (case.endswith(("tiles32x32", "rows64")) and "four_over_six" in CONFIGS[name]
                                               and CONFIGS[name].get("block") == "16x16")])
def test_matches_reference(name, case):
    shape, dtype, tile = CASES[case]
    kwargs = CONFIGS[name]
    config = NVFP4QuantConfig(**kwargs)
    x = make_input(kwargs, shape, dtype, seed=zlib.crc32(f"{name}/{case}".encode()) % 1000)
    assert_same(quantize(x, config, **tile), ref_nvfp4.quantize(x, config), f"{name} {case}")


@pytest.mark.parametrize("kwargs", [
    dict(rowwise=True),
    dict(rowwise=True, per_token=True),
    dict(rowwise=True, four_over_six="mae"),
    dict(rowwise=True, per_token=True, four_over_six="mse", e4m3_max=448),
    dict(rowwise=True, scale_layout="swizzled"),
])
def test_rowwise_takes_any_m(kwargs):
    config = NVFP4QuantConfig(**kwargs)
    x = normal_input((37, 48), torch.bfloat16, seed=3)
    # 37 rows: three 16-row tiles, the last one 5 rows
    assert_same(quantize(x, config, **TILE_16X32), ref_nvfp4.quantize(x, config), str(kwargs))


def _special_inputs():
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(7))
    x[3] = 0.0  # zero row
    x[:, 5] = 0.0  # zero column
    x[16:32, 16:32] = 0.0  # zero 16x16 tile
    x[9, :16] = 1e-30  # block far below the tensor amax (scale underflow)
    x[7, 40] = 1e-40  # fp32 denormal
    x[20, 50] = -0.0
    big = torch.randn(32, 64, generator=torch.Generator().manual_seed(8))
    big = big / big.abs().max() * 3.3895e38  # amax at bf16 max
    with_inf = torch.randn(32, 64, generator=torch.Generator().manual_seed(9))
    with_inf[2, 3] = float("inf")
    tiny = torch.randn(32, 64, generator=torch.Generator().manual_seed(10))
    return {
        # outer amax below 2^-100: the kernel's fp64-division tiles
        "tiny-1e-36": (tiny / tiny.abs().max() * 1e-36).to(DEV),
        "denormal-tensor": (tiny / tiny.abs().max() * 1e-39).to(DEV),
        "zeros-tensor": torch.zeros(32, 64, device=DEV),
        "zero-rows-cols-tiles-tiny": x.to(DEV),
        "bf16-max": big.bfloat16().to(DEV),
        "inf": with_inf.to(DEV),
    }


@pytest.mark.parametrize("kwargs", [
    dict(rowwise=True, columnwise=True),
    dict(rowwise=True, columnwise=True, per_token=True),
    dict(block="16x16", rowwise=True, columnwise=True),
    dict(block="16x16", rowwise=True, columnwise=True, four_over_six="mse"),
    dict(rowwise=True, columnwise=True, four_over_six="mae", e4m3_max=448),
])
@pytest.mark.parametrize("which", list(_special_inputs()))
def test_special_values(kwargs, which):
    x = _special_inputs()[which]
    config = NVFP4QuantConfig(**kwargs)
    assert_same(quantize(x, config), ref_nvfp4.quantize(x, config), f"{which} {kwargs}")


def test_special_values_rht():
    for x in (torch.zeros(32, 32, device=DEV), _special_inputs()["zero-rows-cols-tiles-tiny"][:, :32].bfloat16()):
        config = NVFP4QuantConfig(rht=True, rowwise=True, columnwise=True)
        assert_same(quantize(x, config), ref_nvfp4.quantize(x, config), "rht special")


@pytest.mark.parametrize("tile", [{}, dict(block_m=64), dict(block_m=32, block_k=32, num_warps=2)])
def test_rht_amax_of_an_inf_element_any_tile(tile):
    """The post-RHT amax of a tensor holding one inf is inf (its column block's RHT: +-inf) for every explicit
    tile: a block-diagonal RHT dot wider than 16 rows multiplied the zeros off its diagonal blocks by the inf."""
    x = rht_safe_input((64, 64), torch.bfloat16, seed=3, device="cpu")
    x[5, 7] = float("inf")
    config = NVFP4QuantConfig(rht=True, rowwise=False, columnwise=True)
    got = quantize(x.to(DEV), config, **tile)
    want = ref_nvfp4.quantize(x, config)
    assert torch.isinf(want.columnwise_amax).all() and torch.isinf(got.columnwise_amax.cpu()).all()


def _bf16_subnormals(rows: int) -> torch.Tensor:
    """Every bf16 subnormal, both signs (exponent 0, mantissa 1..127), with zeros, in (rows, 16 k) rows."""
    mant = torch.arange(1, 128, dtype=torch.int32)
    bits = torch.cat([mant, mant | 0x8000, torch.zeros(2, dtype=torch.int32)]).to(torch.int16)
    x = bits.view(torch.bfloat16)
    return x.repeat(rows * 256 // x.numel() + 1)[: rows * 256].reshape(rows, 256)


@pytest.mark.skipif(DEV == "cuda", reason="the interpreter's conversion; the GPU converts exactly")
@pytest.mark.parametrize("kwargs", [
    dict(rowwise=True, columnwise=True),
    dict(rowwise=True, columnwise=True, per_token=True),
    dict(block="16x16", rowwise=True, columnwise=True),
    dict(rowwise=True, columnwise=True, four_over_six="mae"),
    dict(rowwise=True, columnwise=True, rht=True),
])
def test_bf16_subnormals_under_the_interpreter(kwargs):
    """The interpreter's own bf16 -> fp32 conversion is wrong for subnormals (4.13e-39 loads as
    4.78e-39); the launchers make interpreted kernels convert bf16 by its bits, so amaxes and codes of
    subnormal inputs equal the reference's (mixed with normal values, and alone: tiny amaxes)."""
    config = NVFP4QuantConfig(**kwargs)
    sub = _bf16_subnormals(32)
    mixed = sub.clone()
    mixed[::3, ::5] = 1.5
    for x in (sub, mixed):
        assert_same(quantize(x, config), ref_nvfp4.quantize(x, config), f"bf16 subnormals {kwargs}")


def test_bf16_loads_by_bits_every_pattern():
    """``formats.to_f32`` with SOFT_BF16 (what interpreted launches pass) gives torch's fp32 value of
    every bf16 bit pattern; the kernel below is the issue's case (load bf16, store fp32)."""
    @triton.jit
    def load_store(x_ptr, y_ptr, N: tl.constexpr, SOFT_BF16: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(y_ptr + i, to_f32(tl.load(x_ptr + i), SOFT_BF16))

    x = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).to(DEV)
    y = torch.empty(1 << 16, dtype=torch.float32, device=DEV)
    load_store[(1,)](x, y, N=1 << 16, SOFT_BF16=True)
    want = x.float()
    assert torch.equal(y.view(torch.int32)[~want.isnan()], want.view(torch.int32)[~want.isnan()])
    assert y[want.isnan()].isnan().all()
    assert y[x.view(torch.int16) == 0x002D].item() == torch.tensor(0x002D, dtype=torch.int16).view(torch.bfloat16).item()


def _check_rht_near_max(dtype, device, rows=32, cols=32):
    big = torch.finfo(dtype).max
    x = torch.full((rows, cols), big, dtype=dtype, device=device)
    x[1::2] = -big  # chunks that cancel: the exact transform of those columns is small
    x[:, cols // 2:] = big  # chunks that add up: 4x past the range, saturated
    config = NVFP4QuantConfig(rht=True, rowwise=True, columnwise=True)
    got, want = quantize(x, config), ref_nvfp4.quantize(x, config)
    assert_same(got, want, f"rht {dtype} max")
    assert want.columnwise_amax.item() == torch.finfo(torch.bfloat16).max
    for which in ("rowwise", "columnwise"):
        assert nvfp4lab.dequantize_nvfp4(got, which=which, backend="triton").isfinite().all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rht_of_values_near_the_dtype_max_stays_finite(dtype):
    """16-term RHT sums of values near bf16 / fp32 max overflowed fp32 although the transform fits:
    both backends sum with T / 16 and scale back (the same bits wherever the plain sums are finite);
    results past bf16's range, and fp32 inputs past it, saturate to bf16's max."""
    _check_rht_near_max(dtype, DEV)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_rht_of_values_near_the_dtype_max_stays_finite(dtype):
    """The same on the GPU: the amax pass's bf16 tensor-core dot and the cast's butterflies."""
    _check_rht_near_max(dtype, "cuda", 1024, 2048)


@pytest.mark.parametrize("kwargs,amax_kind", [
    (dict(rowwise=True, columnwise=True), "tensor"),  # one amax serves both outputs
    (dict(rowwise=True, columnwise=True, per_token=True), "per_token"),  # rows given, columns computed
    (dict(rowwise=True, columnwise=True, per_token=True), "per_token+col"),
    (dict(rowwise=True, columnwise=True, rht=True), "tensor"),  # columnwise amax is computed post-RHT
    (dict(rowwise=True, columnwise=True, rht=True), "tensor+col"),
    (dict(rowwise=False, columnwise=True, block="16x16", four_over_six="mae"), "col"),
    (dict(rowwise=True, columnwise=True, block="16x16"), "tensor"),  # 2D: columnwise codes = rowwise codes
    (dict(rowwise=True, columnwise=True, block="16x16"), "tensor+col"),  # different amaxes: encoded twice
])
def test_provided_amax(kwargs, amax_kind):
    config = NVFP4QuantConfig(**kwargs)
    x = make_input(kwargs, (32, 64), torch.bfloat16, seed=11)
    xf = x.float()
    per_token = kwargs.get("per_token", False)
    amax = columnwise_amax = None
    # amaxes larger than the data's, so that using them (or not) changes the scales
    if amax_kind.startswith("tensor"):
        amax = xf.abs().amax().reshape(1) * 3
    if amax_kind.startswith("per_token"):
        amax = xf.abs().amax(dim=1) * 3
    if amax_kind.endswith("col"):
        columnwise_amax = (xf.abs().amax(dim=0) if per_token else xf.abs().amax().reshape(1)) * 5
    got = quantize(x, config, amax=amax, columnwise_amax=columnwise_amax)
    want = ref_nvfp4.quantize(x, config, amax=amax, columnwise_amax=columnwise_amax)
    assert_same(got, want, f"{kwargs} {amax_kind}")
    for given in (amax, columnwise_amax):
        for field in ("rowwise_amax", "columnwise_amax"):
            out = getattr(got, field)
            if given is not None and out is not None:
                assert out.data_ptr() != given.data_ptr(), f"{field} aliases the caller's amax"


@pytest.mark.parametrize("layout", ["compact", "padded", "swizzled"])
@pytest.mark.parametrize("block", ["1x16", "16x16"])
@pytest.mark.parametrize("shape", [(48, 80), (128, 128)])  # padding on both sides / no padding
def test_scale_layouts(layout, block, shape):
    config = NVFP4QuantConfig(block=block, rowwise=True, columnwise=True, scale_layout=layout)
    x = normal_input(shape, torch.bfloat16, seed=5)
    assert_same(quantize(x, config), ref_nvfp4.quantize(x, config), f"{layout} {block} {shape}")


def test_scale_layouts_4over6_swizzled():
    config = NVFP4QuantConfig(block="16x16", rowwise=True, columnwise=True, four_over_six="mse", scale_layout="swizzled")
    x = normal_input((48, 80), torch.bfloat16, seed=6)
    assert_same(quantize(x, config), ref_nvfp4.quantize(x, config))


def test_3d_input_through_ops():
    x = normal_input((48, 64), torch.bfloat16, seed=12).reshape(2, 24, 64)
    kwargs = dict(rowwise=True, columnwise=True, per_token=True, scale_layout="padded")
    got = nvfp4lab.quantize_nvfp4(x, backend="triton", **kwargs)
    want = nvfp4lab.quantize_nvfp4(x, backend="ref", **kwargs)
    assert got.shape == x.shape
    assert_same(got, want)


@pytest.mark.parametrize("shape", [(0, 32), (32, 0), (0, 0)])
@pytest.mark.parametrize("kwargs", [
    dict(rowwise=True, columnwise=True),
    dict(rowwise=True, columnwise=True, per_token=True),
    dict(rowwise=True, columnwise=True, rht=True, scale_layout="swizzled"),
    dict(block="16x16", rowwise=True, columnwise=True, scale_layout="padded", four_over_six="mae"),
    dict(rowwise=True, columnwise=True, four_over_six="mse"),
    dict(rowwise=True, columnwise=True, stochastic_rounding=True),
])
def test_empty_input(shape, kwargs, monkeypatch):
    forbid_launches(monkeypatch, amax_module, "amax_kernel", "amax_rht_col_kernel")
    forbid_launches(monkeypatch, cast16_module, "cast16_kernel")
    forbid_launches(monkeypatch, four_over_six_module, "four_over_six_kernel", "four_over_six_1x16_kernel")
    forbid_launches(monkeypatch, pt_scales_module, "pt_scales_kernel")
    config = NVFP4QuantConfig(**kwargs)
    x = torch.empty(shape, dtype=torch.bfloat16, device=DEV)
    assert_same(quantize(x, config, seed=1), ref_nvfp4.quantize(x, config), f"{shape} {kwargs}")


def test_empty_3d_through_ops():
    x = torch.empty(2, 0, 32, dtype=torch.float16, device=DEV)
    got = nvfp4lab.quantize_nvfp4(x, rowwise=True, columnwise=True, backend="triton")
    want = nvfp4lab.quantize_nvfp4(x, rowwise=True, columnwise=True, backend="ref")
    assert got.shape == x.shape
    assert_same(got, want)


# ----------------------------------------------------------------------------- stochastic rounding
E2M1_GRID = torch.tensor(codecs.E2M1_GRID)

SR_CONFIGS = {
    "1x16": dict(rowwise=True, columnwise=True, stochastic_rounding=True),
    "rht": dict(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True),
    "16x16": dict(block="16x16", rowwise=True, columnwise=True, stochastic_rounding=True),
}


def _rn_config(kwargs):
    return NVFP4QuantConfig(**{k: v for k, v in kwargs.items() if k != "stochastic_rounding"})


def _assert_neighbours(codes_packed, scaled, context):
    """Every SR value is one of the two E2M1 grid values around |x*enc| (6 above 6), with x's sign."""
    q = codecs.e2m1_decode(codecs.unpack_fp4(codes_packed.cpu()))
    scaled = scaled.cpu()
    a = scaled.abs().clamp(max=6.0)
    idx_hi = torch.searchsorted(E2M1_GRID, a.contiguous(), right=False).clamp(max=7)
    hi = E2M1_GRID[idx_hi]
    lo = E2M1_GRID[(idx_hi - (hi > a).long()).clamp(min=0)]
    mag = q.abs()
    ok = (mag == lo) | (mag == hi)
    ok &= (q == 0) | (torch.sign(q) == torch.sign(scaled))
    assert bool(ok.all()), f"{context}: {(~ok).sum().item()} SR values are not a neighbouring grid value"


@pytest.mark.parametrize("name", list(SR_CONFIGS))
def test_sr_rounds_to_a_neighbour_and_keeps_scales(name):
    kwargs = SR_CONFIGS[name]
    x = make_input(kwargs, (32, 64), torch.bfloat16, seed=21)
    got = quantize(x, NVFP4QuantConfig(**kwargs), seed=1234)
    rn = ref_nvfp4.quantize(x, _rn_config(kwargs))
    for field in ("rowwise_scale", "rowwise_amax", "columnwise_scale", "columnwise_amax"):
        a, b = getattr(got, field), getattr(rn, field)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{name} {field} differs from round-to-nearest"
    xf = x.float()
    col_mat = ref_nvfp4.apply_rht(x.t(), kwargs.get("rht_sign_mask", 0xD7E8)).float() if kwargs.get("rht") else xf.t()
    _assert_neighbours(got.rowwise_data, scaled_values(xf, rn.rowwise_scale, rn.rowwise_amax, 448.0), f"{name} rowwise")
    _assert_neighbours(got.columnwise_data, scaled_values(col_mat, rn.columnwise_scale, rn.columnwise_amax, 448.0), f"{name} columnwise")
    assert not torch.equal(got.rowwise_data, rn.rowwise_data), "SR gave exactly the RN codes"


@pytest.mark.parametrize("name", list(SR_CONFIGS))
def test_sr_mean_has_lower_error_than_rn(name):
    kwargs = SR_CONFIGS[name]
    x = make_input(kwargs, (32, 64), torch.bfloat16, seed=22)
    xf = x.float()
    rn = ref_nvfp4.quantize(x, _rn_config(kwargs))
    draws = [quantize(x, NVFP4QuantConfig(**kwargs), seed=s) for s in range(50)]
    for which in ("rowwise", "columnwise"):
        rn_err = (ref_nvfp4.dequantize(rn, torch.float32, which) - xf).pow(2).mean().sqrt()
        mean = torch.stack([ref_nvfp4.dequantize(d, torch.float32, which) for d in draws]).mean(0)
        sr_err = (mean - xf).pow(2).mean().sqrt()
        assert sr_err < rn_err, f"{name} {which}: mean of 50 SR draws RMSE {sr_err:.4g} >= RN {rn_err:.4g}"


@pytest.mark.parametrize("name", list(SR_CONFIGS))
def test_sr_bits_match_host_philox(name):
    """The SR codes are the reference rule (ref.nvfp4.stochastic_round_e2m1) on x * enc with the bytes
    of the documented Philox mapping (``_host_sr_bytes``), bit for bit."""
    kwargs = SR_CONFIGS[name]
    m, k = 48, 96
    x = make_input(kwargs, (m, k), torch.bfloat16, seed=24)
    got = quantize(x, NVFP4QuantConfig(**kwargs), seed=0x1234_5678_9ABC)
    rn = ref_nvfp4.quantize(x, _rn_config(kwargs))
    xf = x.float().cpu()
    col_mat = ref_nvfp4.apply_rht(x.t(), kwargs.get("rht_sign_mask", 0xD7E8)).float().cpu() if kwargs.get("rht") else xf.t()
    for which, mat, stream in (("rowwise", xf, 0), ("columnwise", col_mat.contiguous(), 1)):
        scale, amax = getattr(rn, f"{which}_scale").cpu(), getattr(rn, f"{which}_amax").cpu()
        if name == "16x16":  # compact (R/16 rows of) 2D scales -> one per 1x16 block
            scale = scale.repeat_interleave(16, dim=0)[: mat.shape[0]] if scale.shape[0] != mat.shape[0] else scale
        scaled = scaled_values(mat, scale, amax, 448.0)
        rbytes = _host_sr_bytes(0x1234_5678_9ABC, mat.shape[0], mat.shape[1], stream)
        want = codecs.pack_fp4(ref_nvfp4.stochastic_round_e2m1(scaled, rbytes))
        assert torch.equal(getattr(got, f"{which}_data").cpu(), want), f"{name} {which}"


def test_sr_seeds():
    config = NVFP4QuantConfig(**SR_CONFIGS["1x16"])
    x = normal_input((32, 64), torch.bfloat16, seed=23)
    a = quantize(x, config, seed=7)
    assert_same(quantize(x, config, seed=7), a, "same seed")
    b = quantize(x, config, seed=8)
    assert not torch.equal(a.rowwise_data, b.rowwise_data)
    assert not torch.equal(a.columnwise_data, b.columnwise_data)
    # the seed drawn from a generator (on x.device, read by the kernel from device memory)
    g1 = quantize(x, config, generator=torch.Generator(DEV).manual_seed(5))
    assert_same(quantize(x, config, generator=torch.Generator(DEV).manual_seed(5)), g1, "same generator seed")
    g2 = quantize(x, config, generator=torch.Generator(DEV).manual_seed(6))
    assert not torch.equal(g1.rowwise_data, g2.rowwise_data)
    torch.manual_seed(0)
    d1 = quantize(x, config)  # torch's default generator
    d2 = quantize(x, config)
    assert not torch.equal(d1.rowwise_data, d2.rowwise_data)
    # seeds through the public op
    p1 = nvfp4lab.quantize_nvfp4(x, backend="triton", seed=7, **SR_CONFIGS["1x16"])
    assert_same(p1, a, "ops seed")


def test_sr_rowwise_and_columnwise_streams_differ():
    # a symmetric input (x == x^T): with one shared stream, rowwise block (r, b) and columnwise block
    # (c, g) with the same index would get the same bits and the two outputs would be equal bytes.
    # Every 1x16 block holds one 1.0 (its amax, -> 6) and fifteen 0.3 (-> 1.8, between 1.5 and 2).
    idx = torch.arange(64)
    x = torch.where((idx.view(-1, 1) % 16) == (idx.view(1, -1) % 16), 1.0, 0.3).to(torch.bfloat16).to(DEV)
    t = quantize(x, NVFP4QuantConfig(**SR_CONFIGS["1x16"]), seed=3)
    assert torch.equal(t.rowwise_scale, t.columnwise_scale)
    assert not torch.equal(t.rowwise_data, t.columnwise_data)


# ------------------------------------------------------------------------------- E2M1 encoder
@triton.jit
def _e2m1_probe_kernel(v_ptr, fast_ptr, slow_ptr, N: tl.constexpr):
    off = tl.program_id(0) * N + tl.arange(0, N)
    v = tl.load(v_ptr + off)
    tl.store(fast_ptr + off, e2m1_encode_fast(v))
    tl.store(slow_ptr + off, e2m1_encode(v))


@triton.jit
def _e2m1_scale_probe_kernel(x_ptr, enc_ptr, out_ptr, N: tl.constexpr):
    off = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(out_ptr + off, e2m1_scale_encode(tl.load(x_ptr + off), tl.load(enc_ptr + off)) & 15)


def test_e2m1_encode_fast_matches_reference():
    # every bf16 pattern, +-1000 fp32 ulps around every rounding edge and region boundary (both
    # signs), specials, and random fp32 bit patterns; checked against ref.codecs and formats.e2m1_encode
    # (an offline run also compared all 2^32 fp32 patterns with formats.e2m1_encode)
    parts = [torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.int16).to(torch.int32) << 16]
    edges = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.0, 2.5, 3.5, 4.0, 5.0, 6.0, 1e-38, 3.4e38]).view(torch.int32)
    near = (edges.view(-1, 1) + torch.arange(-1000, 1000, dtype=torch.int32).view(1, -1)).flatten()
    parts += [near, near | torch.tensor(-(2**31), dtype=torch.int32)]
    parts.append(torch.tensor([0, -(2**31), 0x7F800000, -8388608, 0x7FC00000, -1, 1, 0x7F7FFFFF], dtype=torch.int32))
    parts.append(torch.randint(-(2**31), 2**31 - 1, (1 << 18,), generator=torch.Generator().manual_seed(70), dtype=torch.int32))
    bits = torch.cat(parts)
    n = 4096
    bits = torch.cat([bits, torch.zeros((-bits.numel()) % n, dtype=torch.int32)])
    v = bits.view(torch.float32).to(DEV)
    fast = torch.empty(v.numel(), dtype=torch.int32, device=DEV)
    slow = torch.empty_like(fast)
    _e2m1_probe_kernel[(v.numel() // n,)](v, fast, slow, n)
    want = codecs.e2m1_encode(v.cpu()).to(torch.int32)
    assert torch.equal(slow.cpu(), want)
    assert torch.equal(fast.cpu(), want)


@triton.jit
def _sr_e2m1_probe_kernel(y_ptr, r_ptr, out_ptr, N: tl.constexpr):
    off = tl.program_id(0) * N + tl.arange(0, N)
    tl.store(out_ptr + off, sr_e2m1(tl.load(y_ptr + off), tl.load(r_ptr + off)))


def test_sr_e2m1_matches_reference():
    # sr_e2m1 (integer path for |y| >= 1) against ref.nvfp4.stochastic_round_e2m1: every bf16 pattern
    # with 12 bytes, +-300 ulps around every grid point and step boundary (both signs) and specials
    # with all 256 bytes, random fp32 patterns and bytes (an offline run: every mantissa of the
    # exponents 90..132, 0, 1, 254, 255, both signs, 8 byte patterns each, against the torch mirror)
    gen = torch.Generator().manual_seed(72)
    bf = (torch.arange(-(2**15), 2**15, dtype=torch.int32) << 16).view(torch.float32)
    byte_set = torch.tensor([0, 1, 2, 63, 64, 127, 128, 129, 191, 192, 254, 255], dtype=torch.int32)
    ys = [bf.repeat_interleave(byte_set.numel())]
    rs = [byte_set.repeat(bf.numel())]
    edges = torch.tensor([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 1e-38]).view(torch.int32)
    near = (edges.view(-1, 1) + torch.arange(-300, 300, dtype=torch.int32).view(1, -1)).flatten()
    near = torch.cat([near, near | torch.tensor(-(2**31), dtype=torch.int32)])
    special = torch.tensor([0x7F800000, -8388608, 0x7FC00000, -1, 0x7FFFFFFF, 1, 0, -(2**31), 0x7F7FFFFF], dtype=torch.int32)
    vals = torch.cat([near, special]).view(torch.float32)
    ys.append(vals.repeat_interleave(256))
    rs.append(torch.arange(256, dtype=torch.int32).repeat(vals.numel()))
    ys.append(torch.randint(-(2**31), 2**31 - 1, (1 << 18,), generator=gen, dtype=torch.int32).view(torch.float32))
    rs.append(torch.randint(0, 256, (1 << 18,), generator=gen, dtype=torch.int32))
    y, r = torch.cat(ys), torch.cat(rs)
    n = 1 << 14
    pad = (-y.numel()) % n
    y, r = torch.cat([y, torch.zeros(pad)]), torch.cat([r, torch.zeros(pad, dtype=torch.int32)])
    out = torch.full((y.numel(),), -1, dtype=torch.int32, device=DEV)
    _sr_e2m1_probe_kernel[(y.numel() // n,)](y.to(DEV), r.to(DEV), out, n)
    want = ref_nvfp4.stochastic_round_e2m1(y, r).to(torch.int32)
    assert torch.equal(out.cpu(), want)


def test_e2m1_scale_encode_matches_reference():
    # x * enc over every bf16 x (enc = 1), bf16 x times random normal factors (the kernels' use),
    # +-1000 ulps around every rounding edge, -0.0 and products that underflow to -0.0 (-> code 0)
    gen = torch.Generator().manual_seed(71)
    every_bf16 = (torch.arange(-(2**15), 2**15, dtype=torch.int32) << 16).view(torch.float32)
    edges = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.0, 2.5, 3.5, 4.0, 5.0, 6.0, 1.0, 0.5]).view(torch.int32)
    near = (edges.view(-1, 1) + torch.arange(-1000, 1000, dtype=torch.int32).view(1, -1)).flatten().view(torch.float32)
    xs = torch.cat([every_bf16, near, -near, torch.tensor([-0.0, 0.0, -1e-45, 1e-45, float("inf"), -float("inf")])])
    encs = torch.ones_like(xs)
    rand_x = torch.randn(1 << 17, generator=gen).to(torch.bfloat16).float() * 8
    rand_enc = torch.exp2(torch.empty(1 << 17).uniform_(-3, 3, generator=gen))
    tiny_x = torch.tensor([-1e-30, -3e-39, 2e-39, -1e-38])
    xs = torch.cat([xs, rand_x, tiny_x])
    encs = torch.cat([encs, rand_enc, torch.full((4,), 1e-15)])
    keep = ~torch.isnan(xs * encs)
    xs, encs = xs[keep], encs[keep]
    n = 4096
    pad = (-xs.numel()) % n
    xs, encs = torch.cat([xs, torch.ones(pad)]), torch.cat([encs, torch.ones(pad)])
    out = torch.full((xs.numel(),), -1, dtype=torch.int32, device=DEV)
    _e2m1_scale_probe_kernel[(xs.numel() // n,)](xs.to(DEV), encs.to(DEV), out, n)
    want = codecs.e2m1_encode(xs * encs).to(torch.int32)
    assert torch.equal(out.cpu(), want)


# ------------------------------------------------------------------------- summation-order helpers
@triton.jit
def _sum_probe_kernel(t_ptr, seq_ptr, tree_ptr, A: tl.constexpr):
    # t: (A, 16, 16) fp32: seq sums of the A * 16 rows of 16 (halves 8 | 8); tree sums of the A groups of 16
    a = tl.arange(0, A)[:, None, None, None]
    b = tl.arange(0, 16)[None, :, None, None]
    half = tl.arange(0, 2)[None, None, :, None]
    e = tl.arange(0, 8)[None, None, None, :]
    t = tl.load(t_ptr + (a * 16 + b) * 16 + half * 8 + e)  # [A, 16, 2, 8]
    s = tl.sum(tl.where(tl.arange(0, 2)[None, None, :] == 1, seq_sum_pair(t, A, 16), 0.0), axis=2)
    tl.store(seq_ptr + tl.arange(0, A)[:, None] * 16 + tl.arange(0, 16)[None, :], s)
    r = tl.load(t_ptr + tl.arange(0, A)[:, None, None] * 256 + tl.arange(0, 2)[None, :, None] * 8
                + tl.arange(0, 8)[None, None, :])  # [A, 2, 8]: the first 16 terms of each group
    tl.store(tree_ptr + tl.arange(0, A), tree_sum8_pair(r, A))


def test_error_sum_orders():
    # 4over6 picks by comparing fp32 error sums; only the exact order reproduces TE's picks when two
    # candidates are within an ulp, which random end-to-end inputs almost never hit. Terms spanning
    # 2^-30..1 make every order round differently, so this test tells the orders apart.
    g = torch.Generator().manual_seed(50)
    terms = torch.exp2(-30 * torch.rand(4, 16, 16, generator=g)).to(DEV)
    seq = torch.empty(4, 16, device=DEV)
    tree = torch.empty(4, device=DEV)
    _sum_probe_kernel[(1,)](terms, seq, tree, 4, enable_fp_fusion=False)
    want_seq = torch.zeros(4, 16, device=DEV)
    for i in range(16):
        want_seq = want_seq + terms[:, :, i]
    parts, width = terms[:, 0, :], 16
    while width > 1:
        width //= 2
        parts = parts[:, :width] + parts[:, width : 2 * width]
    want_tree = parts[:, 0]
    assert torch.equal(seq.view(torch.int32), want_seq.view(torch.int32))
    assert torch.equal(tree.view(torch.int32), want_tree.view(torch.int32))
    assert not torch.equal(want_seq[:, 0], want_tree), "inputs do not separate the two orders"


@triton.jit
def _div_const_probe_kernel(y_ptr, out_ptr, C: tl.constexpr, BLOCK: tl.constexpr):
    off = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + off, div_const_rn(tl.load(y_ptr + off), C))


@pytest.mark.parametrize("divisor", [6.0, 1536.0, 2688.0])
def test_div_const_rn_is_correctly_rounded(divisor):
    # every significand in one binade is too many for the interpreter: a random 2^16 of them, the
    # significands next to exact multiples of the divisor and next to quotient midpoints, and 0
    g = torch.Generator().manual_seed(62)
    mant = torch.randint(0, 1 << 23, (1 << 16,), generator=g, dtype=torch.int32)
    y = ((mant | (127 << 23)).view(torch.float32) * torch.exp2(torch.randint(-60, 60, (1 << 16,), generator=g).float()))
    q = torch.arange(1 << 12, dtype=torch.float64) * 2.0**-12 + 1.0
    near = torch.cat([q * divisor, (q + 2.0**-25) * divisor]).float()  # exact quotients and near-midpoints
    near = (near.view(torch.int32).view(-1, 1) + torch.arange(-2, 3, dtype=torch.int32).view(1, -1)).flatten().view(torch.float32)
    y = torch.cat([y, near, torch.zeros(4)])
    y = torch.cat([y, torch.ones((-y.numel()) % 1024)])
    out = torch.empty(y.numel(), device=DEV)
    _div_const_probe_kernel[(y.numel() // 1024,)](y.to(DEV), out, divisor, 1024, enable_fp_fusion=False)
    want = (y.double() / divisor).float()
    assert torch.equal(out.cpu().view(torch.int32), want.view(torch.int32))


@triton.jit
def _dequant_probe_kernel(scale_ptr, amax_ptr, fast_ptr, exact_ptr, A: tl.constexpr, B: tl.constexpr, E6: tl.constexpr):
    a = tl.program_id(0) * A + tl.arange(0, A)[:, None]  # A scales per program
    b = tl.arange(0, B)[None, :]
    scale_f = tl.load(scale_ptr + a + b * 0)  # [A, B]: one E4M3 scale per row
    outer = tl.load(amax_ptr + b + a * 0)  # [A, B]: one outer amax per column
    codes = tl.zeros([A, B, 8], tl.int32) + tl.arange(0, 8)[None, None, :]
    off = (a[:, :, None] * B + b[:, :, None]) * 8 + tl.arange(0, 8)[None, None, :]
    v_one, v_three_halves = dequant_pair(scale_f, outer, E6)
    tl.store(fast_ptr + off, dequant_fast(e2m1_decode(codes), v_one[:, :, None], v_three_halves[:, :, None]))
    exact = tl.math.div_rn((e2m1_decode(codes) * scale_f[:, :, None]) * outer[:, :, None], tl.zeros([A, B, 8], tl.float32) + E6)
    tl.store(exact_ptr + off, exact)


@pytest.mark.parametrize("e4m3_max", [448.0, 256.0])
def test_4over6_fast_dequant_is_exact_in_range(e4m3_max):
    # every E4M3 scale (0..448) x every magnitude x amaxes log-uniform over [2^-100, 2^100], the bounds and 0
    scales = codecs.e4m3_decode(torch.arange(0, 128, dtype=torch.uint8))
    scales = torch.cat([scales[:127], torch.zeros(1)])  # 0x7F is NaN: only from NaN inputs
    g = torch.Generator().manual_seed(60)
    amax = torch.exp2(torch.rand(60, generator=g) * 200 - 100) * (1 + torch.rand(60, generator=g))
    amax = torch.cat([amax.clamp(2.0**-100, 2.0**100), torch.tensor([2.0**-100, 2.0**100, 0.0, 1.0])])
    fast = torch.empty(128, 64, 8, device=DEV)
    exact = torch.empty(128, 64, 8, device=DEV)
    _dequant_probe_kernel[(16,)](scales.to(DEV), amax.to(DEV), fast, exact, 8, 64, 6.0 * e4m3_max, enable_fp_fusion=False)
    assert torch.equal(fast.view(torch.int32), exact.view(torch.int32))


@pytest.mark.parametrize("magnitude", [2.0**-120, 2.0**-97, 2.0**96, 2.0**110, 1e37])
@pytest.mark.parametrize("kwargs", [
    dict(four_over_six="mae", e4m3_max=256, rowwise=True, columnwise=True),
    dict(block="16x16", four_over_six="mse", e4m3_max=448, rowwise=True, columnwise=True),
])
def test_4over6_extreme_magnitudes(magnitude, kwargs):
    # amax outside [2^-100, 2^100] takes the per-element division; just inside it the fast path
    x = normal_input((32, 64), torch.float32, seed=61)
    x = x / x.abs().max() * magnitude
    config = NVFP4QuantConfig(**kwargs)
    assert_same(quantize(x, config), ref_nvfp4.quantize(x, config), f"{magnitude:g} {kwargs}")


@pytest.mark.parametrize("outer", [221184.0, 2.0**40, 2.0**90])
@pytest.mark.parametrize("kwargs", [dict(four_over_six="mae", e4m3_max=256), dict(four_over_six="mse", e4m3_max=448),
                                    dict(four_over_six="mae", e4m3_max=256, per_token=True)])
def test_4over6_bf16_signs_of_products_that_underflow(outer, kwargs):
    # bf16 blocks of large values with tiny negative ones (down to the smallest subnormal): where fl(x * enc)
    # underflows to -0.0 the code is +0, as the reference's fl(x * enc) < 0. 221184 = 1.6875 * 2^17 is just under
    # x_sign_safe's bound for E = 256 (codes signed by x there), the larger amaxes are above it
    g = torch.Generator().manual_seed(63)
    x = torch.randn(32, 64, generator=g)
    x = x / x.abs().max() * outer
    tiny = torch.tensor([-2.0**-133, -2.0**-130, -2.0**-125, -1e-38, -2.0**-110, 2.0**-133, -2.0**-120, -2.0**-100])
    x[:, 3::8] = tiny.repeat(4)[:, None]
    x = x.bfloat16().to(DEV)
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, **kwargs)
    assert_same(quantize(x, config), ref_nvfp4.quantize(x, config), f"{outer:g} {kwargs}")


def test_4over6_per_token_mixed_rows():
    # rows spanning 1e-38 .. 1e36 and zero rows: tiles mix fast and exact paths per token
    x = normal_input((64, 64), torch.float32, seed=62)
    row_scale = torch.logspace(-38, 36, 64, device=DEV).view(-1, 1)
    x = x / x.abs().amax(dim=1, keepdim=True) * row_scale
    x[5] = 0.0
    for mode in ("mae", "mse"):
        config = NVFP4QuantConfig(per_token=True, four_over_six=mode, rowwise=True, columnwise=True)
        assert_same(quantize(x, config), ref_nvfp4.quantize(x, config), mode)


# ------------------------------------------------------- per-token global scales from tables
# pt_scales_kernel computes each row's / column's S_enc / 6 and S_dec once (S_dec -1 flags an amax
# outside the normal range) and cast16_kernel loads them: the reference's bits, and the tile's fast /
# EXACT decision must not move.
PT_CONFIGS = {
    "pertoken-rowcol": dict(per_token=True, rowwise=True, columnwise=True),
    "pertoken-col": dict(per_token=True, rowwise=False, columnwise=True),
    "pertoken-row": dict(per_token=True, rowwise=True),
    "pertoken-row-swizzled": dict(per_token=True, rowwise=True, columnwise=True, scale_layout="swizzled"),
}


TILE_32X1 = dict(block_k=32, num_warps=1)  # 48 x 80: 3 x 3 cast programs, the last K tile half full


def _record_pt_launches(monkeypatch):
    """(cast launches, table launches): the tables come from the amax pass when it computes every
    per-token amax of the call, else from pt_scales_kernel (one launch before each cast launch). Cast
    launches: ``cast16_kernel``'s and ``cast_row_kernel``'s (rowwise-only bf16 casts)."""
    casts = record_launches(monkeypatch, cast16_module, "cast16_kernel")
    record_launches(monkeypatch, cast_row_module, "cast_row_kernel", casts)
    tables = record_launches(monkeypatch, pt_scales_module, "pt_scales_kernel")
    amax_tables = record_launches(monkeypatch, amax_module, "amax_kernel")
    return casts, (tables, amax_tables)


def _check_pt_launches(casts, tables, provided_amax: bool):
    """Every per-token cast reads tables: written by the one amax launch (TABLE_E6), or, with provided
    amaxes, by one pt_scales launch (both sides' tables) before each cast launch."""
    scale_tables, amax_launches = tables
    assert casts and all(call["PER_TOKEN"] for call in casts)
    if provided_amax:
        assert len(scale_tables) == len(casts) and not amax_launches
    else:
        assert not scale_tables and len(amax_launches) == 1 and amax_launches[0]["TABLE_E6"] > 0


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(PT_CONFIGS))
def test_pertoken_tables_match_reference(name, case, monkeypatch):
    shape, dtype, tile = CASES[case]
    casts, tables = _record_pt_launches(monkeypatch)
    kwargs = PT_CONFIGS[name]
    config = NVFP4QuantConfig(**kwargs)
    x = make_input(kwargs, shape, dtype, seed=zlib.crc32(f"pt/{name}/{case}".encode()) % 1000)
    assert_same(quantize(x, config, **tile), ref_nvfp4.quantize(x, config), f"{name} {case}")
    _check_pt_launches(casts, tables, provided_amax=False)


def _pt_extreme_inputs():
    """fp32 (the interpreter's bf16 -> fp32 load flushes bf16 subnormals wrongly, the GPU's does not)
    48 x 80 inputs whose per-token amaxes leave the normal range in some 16-row groups / 32-column
    tiles only, so that fast and EXACT tiles mix in one launch."""
    g = torch.Generator().manual_seed(71)
    base = torch.randn(48, 80, generator=g) * 10.0 ** (torch.rand(48, 1, generator=g) * 2 - 1)
    rows = base.clone()  # rows 16..31 (group 1) extreme; every column then holds 1e35: columns EXACT
    rows[17] = 0.0
    rows[18] *= 1e-35
    rows[19] *= 1e35
    rows[20] *= 1e-38  # fp32 subnormals in the row
    rows[21, 4] = float("inf")
    rows[22] *= 2.0**-100 / rows[22].abs().max()  # amax exactly the range's ends: fast path
    rows[23] *= 2.0**100 / rows[23].abs().max()
    cols = base.clone()  # columns 0..31 (first 32-column tile) extreme; rows then EXACT
    cols[:, 3] = 0.0
    cols[:, 5] *= 1e-35
    cols[:, 6] *= 1e35
    cols[:, 9] *= 1e-38
    cols[7, 11] = float("-inf")
    nan = base.clone()
    nan[20, 40] = float("nan")
    return {"rows": rows, "cols": cols, "nan": nan, "zeros": torch.zeros(48, 80)}


@pytest.mark.parametrize("which", list(_pt_extreme_inputs()))
@pytest.mark.parametrize("name", ["pertoken-rowcol", "pertoken-row"])
def test_pertoken_tables_extreme_amaxes(name, which, monkeypatch):
    casts, tables = _record_pt_launches(monkeypatch)
    kwargs = PT_CONFIGS[name]
    config = NVFP4QuantConfig(**kwargs)
    x = _pt_extreme_inputs()[which].to(DEV)
    got = quantize(x, config, **TILE_32X1)
    _check_pt_launches(casts, tables, provided_amax=False)
    assert all(call["BLOCK_K"] == 32 for call in casts)
    want = ref_nvfp4.quantize(x, config)
    if which == "nan":
        # NaN's sign and payload are unspecified: a NaN column's scale byte is 0x7F in the kernel, 0xFF in
        # the reference, and its amax another NaN; those read as the kernel's, every other byte bit for bit
        assert bool(torch.isnan(want.rowwise_amax).any()), "the input gives no NaN amax"
        for side in ("rowwise", "columnwise"):
            scale, amax, got_amax = getattr(want, f"{side}_scale"), getattr(want, f"{side}_amax"), getattr(got, f"{side}_amax")
            if scale is not None:
                setattr(want, f"{side}_scale", torch.where(scale == 0xFF, torch.full_like(scale, 0x7F), scale))
                setattr(want, f"{side}_amax", torch.where(torch.isnan(amax) & torch.isnan(got_amax), got_amax, amax))
    assert_same(got, want, f"{name} {which}")


def test_pertoken_tables_rowwise_any_m(monkeypatch):
    # 37 rows: the last 16-row group holds 5; a tiny and a huge row in different groups
    casts, tables = _record_pt_launches(monkeypatch)
    config = NVFP4QuantConfig(per_token=True, rowwise=True)
    x = normal_input((37, 48), torch.float32, seed=72)
    x[2] *= 1e-36
    x[35] *= 1e36
    x[36] = 0.0
    assert_same(quantize(x, config, **TILE_32X1), ref_nvfp4.quantize(x, config))
    _check_pt_launches(casts, tables, provided_amax=False)


def test_pertoken_long_vectors_take_the_tables_launch(monkeypatch):
    """Past opt_flags.AMAX_TABLES_MAX_ENTRIES row + column amaxes, the tables come from pt_scales_kernel
    (the amax pass writes plain amaxes): the same bits."""
    from nvfp4lab.kernels.nvfp4_quantize_details import opt_flags

    casts, (scale_tables, amax_launches) = _record_pt_launches(monkeypatch)
    config = NVFP4QuantConfig(per_token=True, rowwise=True, columnwise=True)
    x = normal_input((opt_flags.AMAX_TABLES_MAX_ENTRIES, 32), torch.bfloat16, seed=74)
    assert_same(quantize(x, config), ref_nvfp4.quantize(x, config))
    assert len(scale_tables) == len(casts) == 1
    assert len(amax_launches) == 1 and amax_launches[0]["TABLE_E6"] == 0


@pytest.mark.parametrize("special", [0.0, 1e-35, 1e35, float("inf"), float("nan")])
def test_pertoken_tables_provided_amaxes(special, monkeypatch):
    # supplied amaxes (the amax pass does not run) with one row and one column set to a special value
    casts, tables = _record_pt_launches(monkeypatch)
    config = NVFP4QuantConfig(per_token=True, rowwise=True, columnwise=True)
    x = normal_input((48, 80), torch.float32, seed=73)
    amax = x.abs().amax(dim=1) * 2
    columnwise_amax = x.abs().amax(dim=0) * 3
    amax[20] = special
    columnwise_amax[70] = special
    got = quantize(x, config, amax=amax, columnwise_amax=columnwise_amax, **TILE_32X1)
    want = ref_nvfp4.quantize(x, config, amax=amax, columnwise_amax=columnwise_amax)
    assert_same(got, want, f"{special}")
    _check_pt_launches(casts, tables, provided_amax=True)


# ----------------------------------------------------------------------------- conformance, compile
def test_conformance_shipped_subset():
    results = run_folder(default_folder(), backend="triton", pattern="nvfp4_quantize_*")
    assert results, "no nvfp4_quantize case in the shipped subset"
    failed = [f"{r.name}: {r.detail}" for r in results if not r.passed]
    assert not failed, "\n".join(failed)


# Traced calls: the one op nvfp4lab::nvfp4_quantize. name -> (config kwargs, amaxes given: None, "tensor"
# (one per-tensor amax) or "token" (both per-token vectors), SR seed)
OP_CASES = {
    "1x16-row": (dict(), None, None),
    "1x16-rowcol": (dict(columnwise=True), None, None),  # one amax serves both copies: returned once
    "1x16-col": (dict(rowwise=False, columnwise=True), None, None),
    "16x16-rowcol-swizzled": (dict(block="16x16", columnwise=True, scale_layout="swizzled"), None, None),
    "rht-sr-rowcol": (dict(columnwise=True, rht=True, stochastic_rounding=True), None, 5),
    "pertoken-rowcol-padded": (dict(columnwise=True, per_token=True, scale_layout="padded"), None, None),  # (3, n) tables
    "pr3045-rht-rowcol": (dict(columnwise=True, per_token=True, rht=True, numerics="te_pr3045"), None, None),
    "4over6-rowcol": (dict(columnwise=True, four_over_six="mae"), None, None),
    "1x16-rowcol-amax": (dict(columnwise=True), "tensor", None),
    "pertoken-rowcol-amaxes": (dict(columnwise=True, per_token=True), "token", None),
}


def _op_case(name, seed_tensor=False):
    """(x, config, quantize kwargs) of an OP_CASES entry; ``seed_tensor``: the SR seed as an int64 (1,)
    device tensor (what a traced call on CUDA passes) instead of an int."""
    kwargs, given, seed = OP_CASES[name]
    x = make_input(kwargs, (32, 64), torch.bfloat16, seed=zlib.crc32(name.encode()) % 1000)
    extra = {}
    if given == "tensor":
        extra["amax"] = x.float().abs().amax().reshape(1) * 2
    elif given == "token":
        extra = dict(amax=x.float().abs().amax(1) * 2, columnwise_amax=x.float().abs().amax(0) * 3)
    if seed is not None:
        extra["seed"] = torch.tensor([seed], dtype=torch.int64, device=DEV) if seed_tensor else seed
    return x, NVFP4QuantConfig(**kwargs), extra


def _op_args(x, config, extra):
    seed = extra.get("seed", 0)
    seed_tensor, seed = (seed, 0) if isinstance(seed, torch.Tensor) else (None, seed)
    return (x, extra.get("amax"), extra.get("columnwise_amax"), seed_tensor, seed, *kq._config_fields(config))


@pytest.mark.parametrize("name", list(OP_CASES))
def test_quantize_op_opcheck(name):
    """Schema (no output aliases an input) and fake implementation (exact shapes, dtypes, strides) of the
    one traced op, for every kind of output: absent copies, the shared per-tensor amax, the per-token
    tables' first rows, the caller's amaxes copied, the SR seed tensor."""
    x, config, extra = _op_case(name, seed_tensor=True)
    args = _op_args(x, config, extra)
    torch.library.opcheck(kq.nvfp4_quantize.op, args, test_utils=("test_schema", "test_faketensor"))
    outputs = kq.nvfp4_quantize.op(*args)
    inputs = {t.untyped_storage().data_ptr() for t in args if isinstance(t, torch.Tensor)}
    storages = [t.untyped_storage().data_ptr() for t in outputs if t.numel()]
    assert len(set(storages)) == len(storages) and not inputs & set(storages), "an output aliases another tensor"


@pytest.mark.parametrize("name", ["1x16-rowcol", "rht-sr-rowcol", "pertoken-rowcol-padded", "1x16-rowcol-amax"])
def test_quantize_op_equals_eager(name):
    """The op called directly (through the dispatcher) gives the eager container's tensors, bit for bit."""
    x, config, extra = _op_case(name)
    want = kq.quantize(x, config, **extra)
    parts = kq.nvfp4_quantize.op(*_op_args(x, config, extra), poison=True)
    for field, got in zip(FIELDS, parts):
        expected = getattr(want, field)
        if expected is None or (field == "columnwise_amax" and kq._shared_amax(config, extra.get("amax"), None)):
            assert got.shape == (0,), field
        else:
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), field


@pytest.mark.parametrize("rht_sign_mask,four_over_six,sr,block_2d,per_token", [
    (0xD7E8, 1, False, False, False),  # 4over6 with RHT
    (-1, 2, True, False, False),  # 4over6 with SR
    (0xD7E8, 0, False, True, False),  # RHT with 16x16 blocks
    (0xD7E8, 0, False, False, True),  # RHT with per-token amaxes
    (-1, 3, False, False, False),  # no such 4over6 mode
])
def test_cast_rejects_combinations_no_recipe_has(rht_sign_mask, four_over_six, sr, block_2d, per_token, monkeypatch):
    # the cast kernels implement only the recipes NVFP4QuantConfig accepts: a direct call of the cast pass
    # or of the op outside them is a ValueError before anything launches
    forbid_launches(monkeypatch, cast16_module, "cast16_kernel")
    forbid_launches(monkeypatch, four_over_six_module, "four_over_six_kernel", "four_over_six_1x16_kernel")
    forbid_launches(monkeypatch, amax_module, "amax_kernel", "amax_rht_col_kernel")
    x = normal_input((32, 64), torch.bfloat16, seed=33)
    amax = x.float().abs().amax().reshape(1)
    with pytest.raises(ValueError):
        kq.cast_outputs(x, amax, amax, None, 0, True, True, block_2d, per_token, rht_sign_mask, four_over_six,
                        448.0, sr, "compact")
    fields = ("16x16" if block_2d else "1x16", True, True, per_token, rht_sign_mask >= 0, max(rht_sign_mask, 0),
              {0: None, 1: "mae", 2: "mse", 3: "mxe"}[four_over_six], 448.0, sr, "compact", "te_main")
    with pytest.raises(ValueError):
        kq.nvfp4_quantize.op(x, None, None, None, 0, *fields)


@pytest.mark.parametrize("name", list(OP_CASES))
def test_compile_fullgraph_cpu(name):
    """torch.compile (fullgraph, aot_eager: the op's implementation runs) gives the eager bits, and the
    reference's for round-to-nearest recipes."""
    x, config, extra = _op_case(name)

    def fn(inp):
        return kq.quantize(inp, config, **extra)

    torch._dynamo.reset()  # one code object for every case: a fresh cache, no recompile limit
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
    assert isinstance(got, nvfp4lab.NVFP4Tensor)
    assert_same(got, fn(x), "compiled vs eager")
    if not config.stochastic_rounding:
        assert_same(got, ref_nvfp4.quantize(x, config, amax=extra.get("amax"), columnwise_amax=extra.get("columnwise_amax")),
                    "compiled vs reference")
    if kq._shared_amax(config, extra.get("amax"), extra.get("columnwise_amax")):
        assert got.columnwise_amax is got.rowwise_amax


def test_compile_fullgraph_public_api_cpu():
    x = normal_input((32, 64), torch.bfloat16, seed=31)

    def fn(inp):
        return nvfp4lab.quantize_nvfp4(inp, rowwise=True, columnwise=True, per_token=True, backend="triton")

    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
    assert isinstance(got, nvfp4lab.NVFP4Tensor)
    assert_same(got, fn(x))


# Triton's code generator (not the interpreter) enforces typing rules such as "a name rebound inside a
# runtime `if` keeps its shape"; Triton 3.6 rejected every row+col kernel once for that. This builds the
# TTIR of each recipe's cast kernel for sm_90 in a child process without the interpreter (no GPU needed).
_COMPILE_SCRIPT = r"""
import json, sys
from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.kernels.nvfp4_quantize_details import opt_flags
from nvfp4lab.kernels.nvfp4_quantize_details.cast16 import cast16_kernel
from nvfp4lab.kernels.nvfp4_quantize_details.four_over_six import four_over_six_kernel
from nvfp4lab.kernels.nvfp4_quantize_details.pt_scales import pt_scales_kernel
from tests.kernels.kernel_checks import sm90_frontend as frontend

FOUR_OVER_SIX_CODES = {None: 0, "mae": 1, "mse": 2}

failures = {}
for name, kwargs in json.loads(sys.argv[1]).items():
    sig = dict(x_ptr="*bf16", row_data_ptr="*i32", row_scale_ptr="*u8", col_data_ptr="*i32", col_scale_ptr="*u8",
               row_amax_ptr="*fp32", col_amax_ptr="*fp32", seed_ptr="*i64", seed_value="i64", M="i32", K="i32",
               offsets_ptr="*i64", group_split_ptr="*i32", num_splits="i32")
    cfg = NVFP4QuantConfig(**kwargs)
    block_2d, mask = cfg.block == "16x16", cfg.rht_sign_mask if cfg.rht else -1
    try:
        if opt_flags.use_cast16(cfg.four_over_six):
            # the one-launch cast, and for row+col SR / RHT casts the rowwise-only and columnwise-only
            # launches a split cast makes
            sides = [(cfg.rowwise, cfg.columnwise)]
            if cfg.rowwise and cfg.columnwise and (cfg.rht or cfg.stochastic_rounding) and not block_2d:
                sides += [(True, False), (False, True)]
            for rowwise, columnwise in sides:
                meta16 = opt_flags.constexprs(opt_flags.cast16_meta(
                    8192, 8192, rowwise, columnwise, block_2d, cfg.per_token, mask, cfg.e4m3_max, cfg.stochastic_rounding,
                    cfg.stochastic_rounding, cfg.scale_layout, pr3045=cfg.numerics == "te_pr3045"))
                frontend(cast16_kernel, sig, meta16, 1)
                frontend(cast16_kernel, sig, dict(meta16, GROUPS=4), 1)
                frontend(cast16_kernel, sig, dict(meta16, GROUPED=True, SPLIT_STEPS=3, LAYOUT=0), 1)
                frontend(cast16_kernel, sig, dict(meta16, GROUPED=True, SPLIT_STEPS=3, LAYOUT=0, GROUPS=4), 1)
                # both sides as BF16 GEMM operands (quantize_operands)
                meta_op = opt_flags.constexprs(opt_flags.cast16_meta(
                    8192, 8192, rowwise, columnwise, block_2d, cfg.per_token, mask, cfg.e4m3_max, cfg.stochastic_rounding,
                    cfg.stochastic_rounding, cfg.scale_layout, pr3045=cfg.numerics == "te_pr3045", row_operand=True,
                    col_operand=True))
                frontend(cast16_kernel, dict(sig, row_data_ptr="*bf16", col_data_ptr="*bf16"), meta_op, 1)
        else:
            meta = opt_flags.constexprs(opt_flags.four_over_six_meta(
                8192, 8192, cfg.rowwise, cfg.columnwise, block_2d, cfg.per_token, FOUR_OVER_SIX_CODES[cfg.four_over_six],
                cfg.e4m3_max, cfg.scale_layout))
            frontend(four_over_six_kernel, sig, meta, 1)
            frontend(four_over_six_kernel, sig, dict(meta, GROUPED=True, SPLIT_STEPS=3, LAYOUT=0), 1)
    except Exception as exc:  # report every recipe, not only the first failure
        failures[name] = str(exc).strip().splitlines()[-1][:400]
from nvfp4lab.kernels import grouped_quantize as gq
amax_sig = dict(x_ptr="*bf16", row_amax_ptr="*i32", col_amax_ptr="*i32", offsets_ptr="*i64", group_split_ptr="*i32",
                num_splits="i32", M="i32", K="i32")
for row_mode, col_mode in [(1, 1), (2, 2), (1, 3), (1, 0), (0, 1), (2, 0), (2, 4)]:
    try:
        frontend(gq._grouped_amax_kernel, amax_sig, dict(ROW_MODE=row_mode, COL_MODE=col_mode, RHT_MASK=0xD7E8, BLOCK_M=64,
                 BLOCK_K=128, DOT_BF16=True, SPLIT_STEPS=3, STEPS_M=4), 8)
    except Exception as exc:
        failures[f"grouped-amax-{row_mode}-{col_mode}"] = str(exc).strip().splitlines()[-1][:400]
for pr3045 in (False, True):
    try:
        frontend(pt_scales_kernel, dict(row_amax_ptr="*fp32", row_table_ptr="*fp32", N_ROW="i32", col_amax_ptr="*fp32",
                                        col_table_ptr="*fp32", N_COL="i32"), dict(E6=2688.0, BLOCK=1024, PR3045=pr3045), 4)
    except Exception as exc:
        failures[f"pt-scales-{pr3045}"] = str(exc).strip().splitlines()[-1][:400]
print(json.dumps(failures))
"""


def test_cast_kernels_build_for_sm90():
    """Every recipe's cast kernel (single and grouped) and the grouped amax kernel pass Triton's code
    generator (typing rules the interpreter skips)."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join((str(REPO_ROOT / "src"), str(REPO_ROOT))))
    configs = dict(CONFIGS, **{f"sr-{k}": dict(v, stochastic_rounding=True) for k, v in CONFIGS.items() if not v.get("four_over_six")})
    pr3045 = dict(per_token=True, numerics="te_pr3045", rowwise=True, columnwise=True)  # PR 3045's cast (2D: per tensor)
    configs.update({"pr3045-rowcol": pr3045, "pr3045-rht-sr-rowcol": dict(pr3045, rht=True, stochastic_rounding=True)})
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, json.dumps(configs)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failures, failures


# ----------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.gpu


@gpu
def test_gpu_16384_per_tensor_rowcol():
    config = NVFP4QuantConfig(rowwise=True, columnwise=True)
    x = normal_input((16384, 16384), torch.bfloat16, seed=40, device="cuda")
    got = quantize(x, config)
    want = ref_nvfp4.quantize(x, config)
    assert_same(got, want, "16384^2")


@gpu
@pytest.mark.parametrize("shape", [(4096, 4096), (2064, 3088)])  # the second is no multiple of any tile
@pytest.mark.parametrize("name", list(CONFIGS))
def test_gpu_matches_reference(name, shape):
    kwargs = CONFIGS[name]
    config = NVFP4QuantConfig(**kwargs)
    for dtype in (torch.bfloat16, torch.float32):
        x = make_input(kwargs, shape, dtype, seed=41, device="cuda")
        assert_same(quantize(x, config), ref_nvfp4.quantize(x, config), f"{name} {shape} {dtype}")


@gpu
@pytest.mark.parametrize("layout", ["padded", "swizzled"])
def test_gpu_scale_layouts(layout):
    for block in ("1x16", "16x16"):
        config = NVFP4QuantConfig(block=block, rowwise=True, columnwise=True, scale_layout=layout)
        x = normal_input((4000, 2064), torch.bfloat16, seed=42, device="cuda")
        assert_same(quantize(x, config), ref_nvfp4.quantize(x, config), f"{layout} {block}")


@gpu
def test_gpu_offsets_beyond_2_31():
    # 65536 x 32768 = 2^31 elements: slices of the outputs against the reference on the same slices
    m, k = 65536, 32768
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    amax = x.abs().amax().float().reshape(1)
    config = NVFP4QuantConfig(rowwise=True, columnwise=True)
    got = quantize(x, config, amax=amax)
    for rows in (slice(0, 256), slice(m - 256, m)):
        want = ref_nvfp4.quantize(x[rows].contiguous(), NVFP4QuantConfig(rowwise=True), amax=amax)
        assert torch.equal(got.rowwise_data[rows], want.rowwise_data)
        assert torch.equal(got.rowwise_scale[rows], want.rowwise_scale)
    for cols in (slice(0, 256), slice(k - 256, k)):
        want = ref_nvfp4.quantize(x[:, cols].contiguous(), NVFP4QuantConfig(rowwise=False, columnwise=True), amax=amax)
        assert torch.equal(got.columnwise_data[cols], want.columnwise_data)
        assert torch.equal(got.columnwise_scale[cols], want.columnwise_scale)


@gpu
@pytest.mark.parametrize("name", list(SR_CONFIGS))
def test_gpu_sr(name):
    kwargs = SR_CONFIGS[name]
    x = make_input(kwargs, (1024, 2048), torch.bfloat16, seed=43, device="cuda")
    xf = x.float()
    rn = ref_nvfp4.quantize(x, _rn_config(kwargs))
    got = quantize(x, NVFP4QuantConfig(**kwargs), seed=99)
    assert torch.equal(got.rowwise_scale, rn.rowwise_scale) and torch.equal(got.columnwise_scale, rn.columnwise_scale)
    col_mat = ref_nvfp4.apply_rht(x.t(), 0xD7E8).float() if kwargs.get("rht") else xf.t()
    _assert_neighbours(got.rowwise_data, scaled_values(xf, rn.rowwise_scale, rn.rowwise_amax, 448.0).cpu(), "rowwise")
    _assert_neighbours(got.columnwise_data, scaled_values(col_mat, rn.columnwise_scale, rn.columnwise_amax, 448.0).cpu(), "columnwise")
    draws = [quantize(x, NVFP4QuantConfig(**kwargs)) for _ in range(50)]  # seeds from torch's CUDA generator
    for which in ("rowwise", "columnwise"):
        rn_err = (ref_nvfp4.dequantize(rn, torch.float32, which) - xf).pow(2).mean().sqrt()
        mean = torch.stack([ref_nvfp4.dequantize(d, torch.float32, which) for d in draws]).mean(0)
        assert (mean - xf).pow(2).mean().sqrt() < rn_err


def _golden_folder():
    folder = os.environ.get("NVFP4LAB_GOLDEN")
    return Path(folder) if folder else REPO_ROOT / ".gpu" / "golden"


@gpu
def test_gpu_conformance():
    folder = _golden_folder()
    if not folder.is_dir():
        pytest.skip(f"golden folder {folder} not found (set NVFP4LAB_GOLDEN)")
    results = run_folder(folder, backend="triton", device="cuda", pattern="nvfp4_quantize_*")
    assert results
    failed = [f"{r.name}: {r.detail}" for r in results if not r.passed]
    assert not failed, f"{len(failed)} of {len(results)} failed:\n" + "\n".join(failed)


def _capture(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compile and warm up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@gpu
@pytest.mark.parametrize("name", ["1x16-rowcol", "pertoken-rowcol", "rht-d7e8-rowcol", "4o6-16x16-mae-256-rowcol"])
def test_gpu_cuda_graph(name):
    kwargs = CONFIGS[name]
    x = make_input(kwargs, (2048, 4096), torch.bfloat16, seed=44, device="cuda")
    config = NVFP4QuantConfig(**kwargs)
    graph, out = _capture(lambda: quantize(x, config))
    x.copy_(make_input(kwargs, (2048, 4096), torch.bfloat16, seed=45, device="cuda"))  # new data, same buffer
    graph.replay()
    torch.cuda.synchronize()
    assert_same(out, ref_nvfp4.quantize(x, config), f"graph replay {name}")


@gpu
@pytest.mark.parametrize("shape", [(4096, 4096), (2064, 3088)])
@pytest.mark.parametrize("name", ["pertoken-rowcol", "pertoken-row"])
def test_gpu_pertoken_tables(name, shape):
    """Per-token casts (global scales from pt_scales_kernel's tables) at size, a few rows and columns
    outside the normal range (fp32 input), and CUDA-graph replay with the table kernel inside the
    captured cast."""
    kwargs = PT_CONFIGS[name]
    config = NVFP4QuantConfig(**kwargs)
    x = make_input(kwargs, shape, torch.float32, seed=46, device="cuda")
    x[100] = 0.0
    x[1000] *= 1e-35
    x[2000] *= 1e35
    assert_same(quantize(x, config), ref_nvfp4.quantize(x, config), f"{name} {shape}")
    xb = make_input(kwargs, shape, torch.bfloat16, seed=47, device="cuda")
    graph, out = _capture(lambda: quantize(xb, config))
    xb.copy_(make_input(kwargs, shape, torch.bfloat16, seed=48, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_same(out, ref_nvfp4.quantize(xb, config), f"graph replay {name} {shape}")


@gpu
def test_gpu_cuda_graph_sr_draws_fresh_bits():
    kwargs = SR_CONFIGS["rht"]
    x = make_input(kwargs, (1024, 2048), torch.bfloat16, seed=46, device="cuda")
    config = NVFP4QuantConfig(**kwargs)
    graph, out = _capture(lambda: quantize(x, config))  # seed drawn from torch's CUDA generator
    graph.replay()
    first = out.rowwise_data.clone(), out.columnwise_data.clone()
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.equal(first[0], out.rowwise_data)
    assert not torch.equal(first[1], out.columnwise_data)
    rn = ref_nvfp4.quantize(x, _rn_config(kwargs))
    assert torch.equal(out.rowwise_scale, rn.rowwise_scale)
    assert torch.equal(out.columnwise_amax.view(torch.int32), rn.columnwise_amax.view(torch.int32))


@gpu
@pytest.mark.parametrize("kwargs", [
    dict(rowwise=True, columnwise=True),
    dict(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True, seed=5),
    dict(block="16x16", rowwise=True, columnwise=True, four_over_six="mae", scale_layout="swizzled"),
])
def test_gpu_compile_fullgraph(kwargs):
    x = make_input(kwargs, (1024, 2048), torch.bfloat16, seed=47, device="cuda")

    def fn(inp):
        return nvfp4lab.quantize_nvfp4(inp, backend="triton", **kwargs)

    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True)(x)
    assert_same(got, fn(x))
