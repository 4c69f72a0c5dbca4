"""MXFP8 quantize / dequantize kernels vs nvfp4lab.ref.mxfp8, bit for bit (interpreter on CPU, GPU tier)."""

import pytest
import torch

import nvfp4lab
from nvfp4lab import ref
from nvfp4lab.config import MXFP8QuantConfig
from nvfp4lab.kernels import mxfp8 as mk
from nvfp4lab.tensors import MXFP8Tensor

from .kernel_checks import assert_conformance, assert_same_bits, forbid_launches, gpu_golden_folders, record_launches

# inf-producing inputs (random bytes, inf elements) make numpy warn inside the interpreter
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
LAYOUTS = ["compact", "padded", "swizzled"]
PARTS = ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale")


def assert_same_quantization(got: MXFP8Tensor, want: MXFP8Tensor):
    for part in PARTS:
        g, w = getattr(got, part), getattr(want, part)
        assert (g is None) == (w is None), part
        if w is not None:
            assert g.shape == w.shape and g.dtype == w.dtype, (part, g.shape, w.shape)
            assert torch.equal(g, w), f"{part}: {int((g != w).sum())} bytes differ"


def _x(m, k, seed=0, dtype=torch.bfloat16, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    # rows and columns of very different magnitudes: many distinct E8M0 scales in both directions
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, 1, generator=g) * 3) * torch.exp(torch.randn(1, k, generator=g))
    return x.to(dtype).to(device)


def _quantize_both(x, fmt="e4m3", layout="compact", rowwise=True, columnwise=True, fp8_cast="soft"):
    cfg = MXFP8QuantConfig(rowwise=rowwise, columnwise=columnwise, fp8_format=fmt, scale_layout=layout)
    got = mk.quantize_mxfp8(x, cfg, fp8_cast=fp8_cast)
    want = ref.mxfp8.quantize(x, cfg)
    assert_same_quantization(got, want)
    return got


# ------------------------------------------------------------------------------------ fast encoders
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from nvfp4lab.kernels import formats  # noqa: E402


@triton.jit
def _encode_kernel(x_ptr, out_ptr, n, clamp, E5M2: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n)
    code = formats.e5m2_encode_fast(v, clamp) if E5M2 else formats.e4m3_encode_fast(v, clamp)
    tl.store(out_ptr + offs, code.to(tl.uint8), mask=offs < n)


def _encode_fast(bits: torch.Tensor, fmt: str, clamp: float, device: str) -> torch.Tensor:
    x = bits.view(torch.float32).to(device)
    out = torch.empty(x.numel(), dtype=torch.uint8, device=device)
    _encode_kernel[(triton.cdiv(x.numel(), 1 << 14),)](x, out, x.numel(), clamp, E5M2=fmt == "e5m2", BLOCK=1 << 14)
    return out.cpu()


def _encoder_inputs() -> torch.Tensor:
    """fp32 bit patterns: every bf16 pattern (every exponent, sign, NaN, inf, the bf16 denormals), every
    fp32 pattern around the fp8 rounding ties and binade edges of [2^-17, 2^17] (all low mantissa bits
    in a window), and 2^20 random fp32 patterns."""
    g = torch.Generator().manual_seed(11)
    bf16 = torch.arange(1 << 16, dtype=torch.int32) << 16
    exps = torch.arange(127 - 17, 127 + 17, dtype=torch.int32) << 23
    # mantissas whose bits below the fp8 rounding position (20 or 21) are near 0, a half, or all ones
    low = torch.cat([torch.arange(-8, 9), (1 << 19) + torch.arange(-8, 9), (1 << 20) + torch.arange(-8, 9)]).to(torch.int32)
    top = torch.arange(8, dtype=torch.int32) << 20
    mant = ((top[:, None] + low[None, :]) & 0x7FFFFF).flatten()
    edges = (exps[:, None] | mant[None, :]).flatten()
    edges = torch.cat([edges, edges | (-(2**31))])
    rand = torch.randint(-(2**31), 2**31 - 1, (1 << 20,), generator=g, dtype=torch.int32)
    return torch.cat([bf16, edges, rand])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fast_encoder_matches_ref(fmt):
    """The magic-add encoders the quantize kernel uses give ref.codecs' codes bit for bit: for every
    non-NaN input with the max-finite clamp, and 0x7F | sign for NaN with the NaN-block clamp."""
    bits = _encoder_inputs()
    x = bits.view(torch.float32)
    want = (ref.codecs.e4m3_encode if fmt == "e4m3" else ref.codecs.e5m2_encode)(x)
    fmax, nan_clamp = (448.0, 480.0) if fmt == "e4m3" else (57344.0, 114688.0)
    nan = torch.isnan(x)
    got = _encode_fast(bits, fmt, fmax, "cpu")
    assert torch.equal(got[~nan], want[~nan]), f"{int((got != want)[~nan].sum())} codes differ"
    got_nan = _encode_fast(bits[nan], fmt, nan_clamp, "cpu")
    assert torch.equal(got_nan, want[nan])


@triton.jit
def _finite_kernel(x_ptr, code_ptr, amax_ptr, scale_ptr, mult_ptr, n, max_rcp, E5M2: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n)
    a, sign_bits = tl.abs(v), v.to(tl.int32, bitcast=True)
    code = formats.e5m2_encode_finite(a, sign_bits) if E5M2 else formats.e4m3_encode_finite(a, sign_bits)
    tl.store(code_ptr + offs, (code >> 24).to(tl.uint8), mask=offs < n)
    scale, mult = formats.e8m0_scale_finite(tl.load(amax_ptr + offs, mask=offs < n), max_rcp)
    tl.store(scale_ptr + offs, scale, mask=offs < n)
    tl.store(mult_ptr + offs, mult, mask=offs < n)


def _finite_codecs(x: torch.Tensor, amax: torch.Tensor, fmt: str, device: str):
    x, amax = x.to(device), amax.to(device)
    code = torch.empty(x.numel(), dtype=torch.uint8, device=device)
    scale = torch.empty(x.numel(), dtype=torch.int32, device=device)
    mult = torch.empty(x.numel(), dtype=torch.float32, device=device)
    rcp = torch.tensor(1.0 / (448.0 if fmt == "e4m3" else 57344.0), dtype=torch.float32).item()
    _finite_kernel[(triton.cdiv(x.numel(), 1 << 14),)](x, code, amax, scale, mult, x.numel(), rcp, E5M2=fmt == "e5m2", BLOCK=1 << 14)
    return code.cpu(), scale.cpu(), mult.cpu()


def _finite_inputs(fmt):
    """Encoder inputs: every finite fp32 pattern from :func:`_encoder_inputs` within the format's range
    (the MXFP8 scale keeps every finite block there). Scale inputs: the same patterns' magnitudes
    (any finite block maximum: zero, denormals, every binade up to fp32's max)."""
    x = _encoder_inputs().view(torch.float32)
    fmax = 448.0 if fmt == "e4m3" else 57344.0
    amax = x.abs()
    amax = amax[torch.isfinite(amax)]
    return x[torch.isfinite(x) & (x.abs() <= fmax)], amax[: x.numel()]


def _check_finite_codecs(fmt, device):
    x, amax = _finite_inputs(fmt)
    n = min(x.numel(), amax.numel())
    x, amax = x[:n], amax[:n]
    code, scale, mult = _finite_codecs(x, amax, fmt, device)
    want = (ref.codecs.e4m3_encode if fmt == "e4m3" else ref.codecs.e5m2_encode)(x)
    assert torch.equal(code, want), f"{int((code != want).sum())} codes differ"
    rcp = torch.tensor(1.0 / (448.0 if fmt == "e4m3" else 57344.0), dtype=torch.float32)
    want_scale = ref.codecs.e8m0_encode_round_up(amax * rcp).to(torch.int32)
    assert torch.equal(scale, want_scale), f"{int((scale != want_scale).sum())} scales differ"
    assert torch.equal(mult.view(torch.int32), ref.codecs.e8m0_quant_multiplier(want_scale).view(torch.int32))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_finite_codecs_match_ref(fmt):
    """The finite-tile encoders and E8M0 scale the band kernel uses give ref.codecs' bits exactly."""
    _check_finite_codecs(fmt, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_gpu_finite_codecs_match_ref(fmt):
    _check_finite_codecs(fmt, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_gpu_fast_encoder_matches_interpreter(fmt):
    """On the GPU the fast encoders give the reference's codes too (fp32 add / min on hardware)."""
    bits = _encoder_inputs()
    x = bits.view(torch.float32)
    want = (ref.codecs.e4m3_encode if fmt == "e4m3" else ref.codecs.e5m2_encode)(x)
    nan = torch.isnan(x)
    got = _encode_fast(bits, fmt, 448.0 if fmt == "e4m3" else 57344.0, "cuda")
    assert torch.equal(got[~nan], want[~nan])


# ----------------------------------------------------------------------------------------- quantize
# (64, 128) fills whole tiles (unmasked path), the others leave partial tiles.
@pytest.mark.parametrize("shape", [(64, 128), (96, 160), (32, 32), (192, 160)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_quantize_layouts(shape, layout):
    _quantize_both(_x(*shape, seed=1), layout=layout)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_quantize_packed_words(fmt, layout, monkeypatch):
    """Columnwise data stored as uint32 words of 4 codes (PACK): whole tiles, a partial one (byte
    stores), an inf tile and a NaN tile (the saturating path), 0xFF-poisoned outputs."""
    launches = record_launches(monkeypatch, mk, "_mxfp8_quantize_kernel")
    x = _x(96, 256, seed=17)  # whole row+col tiles (32 x 128)
    x[40, 70] = float("inf")
    _quantize_both(x, fmt=fmt, layout=layout)
    assert launches[-1]["PACK"]
    _quantize_both(_x(64, 160, seed=18), fmt=fmt, layout=layout, rowwise=False)  # 160 = 2.5 tiles of 64
    x = _x(64, 128, seed=19, dtype=torch.float32)
    x[33, 5] = float("nan")
    cfg = MXFP8QuantConfig(rowwise=False, columnwise=True, fp8_format=fmt, scale_layout=layout)
    row_shape, col_shape = mk.scale_shapes(64, 128, layout)
    col_data = torch.full((64, 128), 0xFF, dtype=torch.uint8)
    col_scale = torch.zeros(col_shape, dtype=torch.uint8)
    mk.launch_mxfp8_quantize(x, None, None, col_data, col_scale, fp8_format=fmt, scale_layout=layout)
    want = ref.mxfp8.quantize(x, cfg)
    assert torch.equal(col_scale, want.columnwise_scale)
    keep = torch.ones(64, 128, dtype=torch.bool)
    keep[32:64, 5] = False  # the NaN block: NaN codes whose sign follows the platform's NaN arithmetic
    assert torch.equal(col_data[keep], want.columnwise_data[keep])
    assert bool(((col_data[32:64, 5] & 0x7F) == 0x7F).all())


@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_quantize_dtypes_formats(in_dtype, fmt):
    _quantize_both(_x(64, 96, seed=2, dtype=in_dtype), fmt=fmt, layout="swizzled")


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_quantize_bf16_subnormals(fmt):
    """bf16 subnormals (and tiny blocks of them beside normal ones): the interpreter's launches load
    bf16 by its bits (its own conversion is wrong for subnormals), the GPU converts exactly."""
    mant = torch.arange(1, 128, dtype=torch.int32)
    bits = torch.cat([mant, mant | 0x8000, torch.zeros(2, dtype=torch.int32)]).to(torch.int16)
    x = bits.view(torch.bfloat16).repeat(4 * 64 * 64 // 256)[: 64 * 64].reshape(64, 64).clone()
    x[:32, :32] *= 2.0**100
    _quantize_both(x, fmt=fmt)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_dequantize_at_the_dtype_max_saturates(dtype, fmt, device):
    """A block of bf16 / fp32 maxima gets scale 2^120 and code 256 (E4M3): 2^128 fits no fp32, and TE's
    kernel gives inf; both backends saturate to the output dtype's max (the same bits wherever the plain
    cast is finite), so finite input dequantizes finite."""
    big = torch.finfo(dtype).max
    x = torch.full((64, 64), big, dtype=dtype)
    x[1::2] = -big
    x[:, 32:] = torch.randn(64, 32).to(dtype)
    x = x.to(device)
    got = _quantize_both(x, fmt=fmt)
    for which in ("rowwise", "columnwise"):
        for out in (dtype, torch.float32, torch.bfloat16):
            d = mk.dequantize_mxfp8(got, out, which)
            assert_same_bits(d, ref.mxfp8.dequantize(got, out, which))
            assert d.isfinite().all()
            assert (d[:, :32].abs() >= 0.9 * min(torch.finfo(out).max, big)).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_quantize_one_direction_free_dim(layout):
    # rowwise only: M need not be a multiple of 32; columnwise only: K need not be one
    _quantize_both(_x(40, 64, seed=3), layout=layout, columnwise=False)
    _quantize_both(_x(1, 32, seed=3), layout=layout, columnwise=False)
    _quantize_both(_x(64, 40, seed=4), layout=layout, rowwise=False)
    _quantize_both(_x(64, 13, seed=5, dtype=torch.float32), layout=layout, rowwise=False)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_quantize_special_values(fmt):
    """Zero blocks, -0.0, fp32 denormals, huge and tiny magnitudes, +-inf (per spec: 0xFE scale,
    saturated codes), scales at both ends of the E8M0 range."""
    x = torch.randn(64, 128)
    x[0:32, 0:32] = 0.0
    x[32:64, 0:32] = -0.0
    x[:, 32:64] *= 1e-40
    x[0:32, 64:96] *= 3e38 / x[0:32, 64:96].abs().max()
    x[32:64, 64:96] *= 1e-30
    x[5, 100] = float("inf")
    x[40, 110] = float("-inf")
    x[7, 127] = 448.0 * 2.0**-100
    for layout in ("compact", "swizzled"):
        _quantize_both(x, fmt=fmt, layout=layout)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_quantize_scale_rounding_boundaries(fmt):
    """Block amaxes at and one ulp either side of max * 2^k: the E8M0 round-up must see every bit."""
    fmt_max = 448.0 if fmt == "e4m3" else 57344.0
    g = torch.Generator().manual_seed(19)
    x = torch.rand(64, 128, generator=g) - 0.5
    ulps = torch.tensor([0, 1, -1, 2, -2, 7], dtype=torch.int32)
    for block in range(8):  # rowwise blocks (r, 32b) and columnwise blocks (32a, c) both get a boundary max
        k = int(torch.randint(-30, 30, (1,), generator=g))
        peak = torch.tensor(fmt_max * 2.0**k, dtype=torch.float32).view(torch.int32) + ulps[block % 6]
        x[block, 32 * (block % 4)] = peak.view(torch.float32) * (1 if block % 2 else -1)
        x[32 * (block % 2) + 5, 64 + block] = peak.view(torch.float32)
    for layout in ("compact", "swizzled"):
        _quantize_both(x, fmt=fmt, layout=layout)


def test_quantize_nan_blocks():
    """A NaN makes its block's scale 0xFF and every code of the block a NaN code; other blocks are
    exact. (The sign of a NaN code follows the platform's NaN arithmetic, so it is not compared.)"""
    x = _x(64, 64, seed=6, dtype=torch.float32)
    x[3, 5] = float("nan")
    cfg = MXFP8QuantConfig(rowwise=True, columnwise=True)
    got, want = mk.quantize_mxfp8(x, cfg), ref.mxfp8.quantize(x, cfg)
    assert torch.equal(got.rowwise_scale, want.rowwise_scale) and torch.equal(got.columnwise_scale, want.columnwise_scale)
    assert int(got.rowwise_scale[3, 0]) == 0xFF and int(got.columnwise_scale[0, 5]) == 0xFF
    for data, nan_block in ((got.rowwise_data, (3, slice(0, 32))), (got.columnwise_data, (slice(0, 32), 5))):
        want_data = want.rowwise_data if data is got.rowwise_data else want.columnwise_data
        assert bool(((data[nan_block] & 0x7F) == 0x7F).all())
        keep = torch.ones_like(data, dtype=torch.bool)
        keep[nan_block] = False
        assert torch.equal(data[keep], want_data[keep])


@pytest.mark.parametrize("shape", [(64, 96), (64, 128)])  # partial tiles (byte stores), whole tiles (word stores)
def test_quantize_every_byte_written(shape, monkeypatch):
    """Data and compact scales: 0xFF-poisoned buffers. Padded / swizzled scales: real entries poisoned,
    padding zero (the launcher's contract), so each real entry must be written."""
    launches = record_launches(monkeypatch, mk, "_mxfp8_quantize_kernel")
    x = _x(*shape, seed=7)
    rows, cols = x.shape
    for layout in LAYOUTS:
        want = ref.mxfp8.quantize(x, MXFP8QuantConfig(rowwise=True, columnwise=True, scale_layout=layout))
        row_shape, col_shape = mk.scale_shapes(rows, cols, layout)
        poison = torch.full((rows, cols // 32), 0xFF, dtype=torch.uint8)
        poison_t = torch.full((cols, rows // 32), 0xFF, dtype=torch.uint8)
        if layout == "compact":
            row_scale, col_scale = poison.clone(), poison_t.t().contiguous()
        elif layout == "padded":
            row_scale, col_scale = ref.swizzle.pad_scales(poison), ref.swizzle.pad_scales(poison_t).t().contiguous()
        else:
            row_scale, col_scale = ref.swizzle.swizzle_scales(poison), ref.swizzle.swizzle_scales(poison_t)
        assert row_scale.shape == row_shape and col_scale.shape == col_shape
        row_data = torch.full((rows, cols), 0xFF, dtype=torch.uint8)
        col_data = torch.full((rows, cols), 0xFF, dtype=torch.uint8)
        mk.launch_mxfp8_quantize(x, row_data, row_scale, col_data, col_scale, fp8_format="e4m3", scale_layout=layout)
        assert launches[-1]["PACK"] == (cols % 64 == 0)
        got = MXFP8Tensor(shape=x.shape, dtype=x.dtype, config=want.config, rowwise_data=row_data,
                          rowwise_scale=row_scale, columnwise_data=col_data, columnwise_scale=col_scale)
        assert_same_quantization(got, want)


def test_quantize_unaligned_output_stores_bytes(monkeypatch):
    """Columnwise data not 4-byte aligned (a view 1 byte into its buffer) cannot take uint32 stores:
    the launcher falls back to byte stores, whose bytes around the view stay untouched."""
    launches = record_launches(monkeypatch, mk, "_mxfp8_quantize_kernel")
    x = _x(64, 128, seed=20)
    cfg = MXFP8QuantConfig(rowwise=False, columnwise=True)
    buffer = torch.full((64 * 128 + 2,), 0xFF, dtype=torch.uint8)
    col_data = buffer[1:-1].view(64, 128)
    col_scale = torch.zeros(mk.scale_shapes(64, 128, "compact")[1], dtype=torch.uint8)
    mk.launch_mxfp8_quantize(x, None, None, col_data, col_scale, fp8_format="e4m3", scale_layout="compact")
    assert not launches[-1]["PACK"]
    want = ref.mxfp8.quantize(x, cfg)
    assert torch.equal(col_data, want.columnwise_data) and torch.equal(col_scale, want.columnwise_scale)
    assert int(buffer[0]) == 0xFF and int(buffer[-1]) == 0xFF


def test_round_trip_is_idempotent():
    """dequantize(quantize(x)) is a fixed point: quantizing it again gives back the same values (a block
    whose max code rounded down to 224 may come back one scale step lower with codes doubled, which is
    the same values), in fp32 and bf16 (both hold every MXFP8 value of normal range exactly)."""
    x = _x(64, 128, seed=8, dtype=torch.float32)
    cfg = MXFP8QuantConfig(rowwise=True, columnwise=True)
    q = mk.quantize_mxfp8(x, cfg)
    for which in ("rowwise", "columnwise"):
        for dtype in (torch.float32, torch.bfloat16):
            deq = mk.dequantize_mxfp8(q, dtype, which)
            again = mk.dequantize_mxfp8(mk.quantize_mxfp8(deq, cfg), dtype, which)
            assert_same_bits(again, deq)
            assert float((deq.float() - x).norm() / x.norm()) < 0.05


def test_ops_dispatch_triton():
    x = _x(64, 64, seed=9).reshape(2, 32, 64)
    got = nvfp4lab.quantize_mxfp8(x, rowwise=True, columnwise=True, backend="triton")
    want = nvfp4lab.quantize_mxfp8(x, rowwise=True, columnwise=True, backend="ref")
    assert_same_quantization(got, want)
    for which in ("rowwise", "columnwise"):
        assert_same_bits(nvfp4lab.dequantize_mxfp8(got, which=which, backend="triton"),
                         nvfp4lab.dequantize_mxfp8(want, which=which, backend="ref"))


def test_conformance_mxfp8_cases(golden_dirs):
    assert_conformance(golden_dirs, "mxfp8_quantize_*")


# --------------------------------------------------------------------------------------- dequantize
# (192, 160): M/32 = 6 scale rows and K > 128, so the swizzled columnwise scales span 2 x 2 tiles
@pytest.mark.parametrize("shape", [(64, 256), (96, 160), (192, 160)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_dequantize_matches_ref(shape, layout, dtype):
    q = ref.mxfp8.quantize(_x(*shape, seed=10), MXFP8QuantConfig(rowwise=True, columnwise=True, scale_layout=layout))
    for which in ("rowwise", "columnwise"):
        assert_same_bits(mk.dequantize_mxfp8(q, dtype, which), ref.mxfp8.dequantize(q, dtype, which))


def _random_mxfp8(m, k, fmt, layout, seed, device="cpu"):
    """Arbitrary bytes: all 256 fp8 codes (inf / NaN included) and E8M0 codes 0, 1, 254, 255, ...
    Padded buffers get random padding (it must be ignored)."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=g)
    row = torch.randint(0, 256, (m, k // 32), dtype=torch.uint8, generator=g)
    col = torch.randint(0, 256, (m // 32, k), dtype=torch.uint8, generator=g)
    row.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)
    col.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)
    if layout == "padded":
        row_p = torch.randint(0, 256, mk.scale_shapes(m, k, "padded")[0], dtype=torch.uint8, generator=g)
        col_p = torch.randint(0, 256, mk.scale_shapes(m, k, "padded")[1], dtype=torch.uint8, generator=g)
        row_p[:m, : k // 32], col_p[: m // 32, :k] = row, col
        row, col = row_p, col_p
    elif layout == "swizzled":
        row, col = ref.swizzle.swizzle_scales(row), ref.swizzle.swizzle_scales(col.t().contiguous())
    cfg = MXFP8QuantConfig(rowwise=True, columnwise=True, fp8_format=fmt, scale_layout=layout)
    return MXFP8Tensor(shape=torch.Size((m, k)), dtype=torch.bfloat16, config=cfg, rowwise_data=data.to(device),
                       rowwise_scale=row.to(device), columnwise_data=data.to(device), columnwise_scale=col.to(device))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_dequantize_random_bytes(fmt, layout, dtype):
    t = _random_mxfp8(64, 96, fmt, layout, seed=11)
    for which in ("rowwise", "columnwise"):
        assert_same_bits(mk.dequantize_mxfp8(t, dtype, which), ref.mxfp8.dequantize(t, dtype, which), nan_equal=True)


def test_dequantize_layouts_agree():
    x = _x(64, 128, seed=12)
    outs = []
    for layout in LAYOUTS:
        q = mk.quantize_mxfp8(x, MXFP8QuantConfig(rowwise=True, columnwise=True, scale_layout=layout))
        outs.append([mk.dequantize_mxfp8(q, torch.float32, which) for which in ("rowwise", "columnwise")])
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert_same_bits(b, a)


def test_dequantize_every_element_written():
    q = ref.mxfp8.quantize(_x(96, 160, seed=13), MXFP8QuantConfig(rowwise=True, columnwise=True, scale_layout="swizzled"))
    for which in ("rowwise", "columnwise"):
        out = torch.full((96, 160), float("nan"), dtype=torch.bfloat16)
        mk.launch_mxfp8_dequantize(getattr(q, f"{which}_data"), getattr(q, f"{which}_scale"), out,
                                   fp8_format="e4m3", scale_layout="swizzled", colwise=which == "columnwise")
        assert_same_bits(out, ref.mxfp8.dequantize(q, torch.bfloat16, which))


# ------------------------------------------------------------------------------- edge cases, errors
def test_empty_inputs_launch_nothing(monkeypatch):
    forbid_launches(monkeypatch, mk, "_mxfp8_quantize_kernel", "_mxfp8_dequantize_kernel")
    for layout in LAYOUTS:
        cfg = MXFP8QuantConfig(rowwise=True, columnwise=True, scale_layout=layout)
        for shape in ((0, 64), (32, 0)):
            x = torch.empty(shape, dtype=torch.bfloat16)
            got, want = mk.quantize_mxfp8(x, cfg), ref.mxfp8.quantize(x, cfg)
            assert_same_quantization(got, want)
            for which in ("rowwise", "columnwise"):
                assert mk.dequantize_mxfp8(got, torch.float32, which).shape == shape


def test_bad_inputs():
    cfg = MXFP8QuantConfig(rowwise=True, columnwise=True)
    with pytest.raises(ValueError, match=r"K\) must be a multiple of 32"):
        mk.quantize_mxfp8(torch.zeros(32, 48), cfg)
    with pytest.raises(ValueError, match=r"M\) must be a multiple of 32"):
        mk.quantize_mxfp8(torch.zeros(48, 32), cfg)
    with pytest.raises(TypeError, match="x2d must be a float32, bfloat16 or float16"):
        mk.quantize_mxfp8(torch.zeros(32, 32, dtype=torch.int32), cfg)
    with pytest.raises(TypeError, match="config must be an MXFP8QuantConfig"):
        mk.quantize_mxfp8(torch.zeros(32, 32), "e4m3")
    with pytest.raises(ValueError, match="x2d must be 2-D"):
        mk.quantize_mxfp8(torch.zeros(32), cfg)
    # the parts of a container given to dequantize are checked by the public op (tests/ops/test_bad_inputs.py)
    with pytest.raises(ValueError, match="fp8_cast='hw' needs a CUDA tensor"):
        mk.launch_mxfp8_quantize(torch.randn(32, 32), torch.empty(32, 32, dtype=torch.uint8), torch.empty(32, 1, dtype=torch.uint8),
                                 None, None, fp8_format="e4m3", scale_layout="compact", fp8_cast="hw")


def test_custom_ops_trace():
    x = _x(64, 64, seed=14)
    torch.library.opcheck(torch.ops.nvfp4lab.quantize_mxfp8.default, (x, True, True, "e5m2", "swizzled"))
    q = ref.mxfp8.quantize(x, MXFP8QuantConfig(rowwise=True, columnwise=True, scale_layout="padded"))
    torch.library.opcheck(torch.ops.nvfp4lab.dequantize_mxfp8.default,
                          (q.columnwise_data, q.columnwise_scale, "e4m3", "padded", True, torch.bfloat16))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def round_trip(x):
        rd, rs, cd, cs = torch.ops.nvfp4lab.quantize_mxfp8(x, True, True, "e4m3", "padded")
        a = torch.ops.nvfp4lab.dequantize_mxfp8(rd, rs, "e4m3", "padded", False, torch.float32)
        b = torch.ops.nvfp4lab.dequantize_mxfp8(cd, cs, "e4m3", "padded", True, torch.float32)
        return a, b

    a, b = round_trip(x)
    assert_same_bits(a, ref.mxfp8.dequantize(q, torch.float32, "rowwise"))
    assert_same_bits(b, ref.mxfp8.dequantize(q, torch.float32, "columnwise"))

    # the Python entry points (checks, MXFP8Tensor, ops) trace whole as well
    cfg = MXFP8QuantConfig(rowwise=True, columnwise=True, scale_layout="swizzled")
    whole = torch.compile(lambda x: mk.dequantize_mxfp8(mk.quantize_mxfp8(x, cfg), torch.float32, "columnwise"),
                          fullgraph=True, backend="aot_eager")
    assert_same_bits(whole(x), ref.mxfp8.dequantize(ref.mxfp8.quantize(x, cfg), torch.float32, "columnwise"))


# ------------------------------------------------------------------------------------------- GPU tier
@pytest.mark.gpu
@pytest.mark.parametrize("fp8_cast", ["soft", "hw"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("in_dtype", [torch.bfloat16, torch.float32])
def test_gpu_quantize_large(fp8_cast, fmt, layout, in_dtype):
    x = _x(4096, 3072, seed=15, dtype=in_dtype, device="cuda")
    x[:32, :32] = 0.0
    x[100, 200] = float("inf")
    x[200, 100] = float("-inf")
    x[64:96, 64:128] *= 1e-38
    _quantize_both(x, fmt=fmt, layout=layout, fp8_cast=fp8_cast)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8_cast", ["soft", "hw"])
@pytest.mark.parametrize("shape", [(1000, 4096), (4096, 1000), (8192, 8192)])
def test_gpu_quantize_odd_shapes(fp8_cast, shape):
    m, k = shape
    x = _x(m, k, seed=16, device="cuda")
    _quantize_both(x, layout="swizzled", rowwise=k % 32 == 0, columnwise=m % 32 == 0, fp8_cast=fp8_cast)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_gpu_dequantize_random_bytes(fmt, layout, dtype):
    t = _random_mxfp8(4096, 2048, fmt, layout, seed=17, device="cuda")
    for which in ("rowwise", "columnwise"):
        assert_same_bits(mk.dequantize_mxfp8(t, dtype, which), ref.mxfp8.dequantize(t, dtype, which), nan_equal=True)


@pytest.mark.gpu
def test_gpu_64bit_offsets():
    """2^31 + 2^26 elements: the tail rows (beyond int32 offsets) against the reference."""
    m, k = 34816, 65536
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    cfg = MXFP8QuantConfig(rowwise=True, columnwise=True)
    q = mk.quantize_mxfp8(x, cfg)
    tail = ref.mxfp8.quantize(x[-64:], cfg)
    assert torch.equal(q.rowwise_data[-64:], tail.rowwise_data) and torch.equal(q.rowwise_scale[-64:], tail.rowwise_scale)
    assert torch.equal(q.columnwise_data[-64:], tail.columnwise_data) and torch.equal(q.columnwise_scale[-2:], tail.columnwise_scale)
    out = mk.dequantize_mxfp8(q, torch.bfloat16, "columnwise")
    assert_same_bits(out[-64:], ref.mxfp8.dequantize(tail, torch.bfloat16, "columnwise"))


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    x = _x(512, 1024, seed=18, device="cuda")
    cfg = MXFP8QuantConfig(rowwise=True, columnwise=True, scale_layout="swizzled")
    mk.quantize_mxfp8(x, cfg)  # compile outside the capture
    mk.dequantize_mxfp8(mk.quantize_mxfp8(x, cfg), torch.bfloat16, "columnwise")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q = mk.quantize_mxfp8(x, cfg)
        out = mk.dequantize_mxfp8(q, torch.bfloat16, "columnwise")
    q.rowwise_data.zero_()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    want = ref.mxfp8.quantize(x, cfg)
    assert_same_quantization(q, want)
    assert_same_bits(out, ref.mxfp8.dequantize(want, torch.bfloat16, "columnwise"))


@pytest.mark.gpu
def test_gpu_conformance_mxfp8_cases():
    assert_conformance(gpu_golden_folders(), "mxfp8_quantize_*", device="cuda")
