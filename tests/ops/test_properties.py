"""Property-based tests of the public ops (hypothesis): the Triton backend (the interpreter on a CPU)
against the reference, bit for bit, over random shapes, dtypes, value distributions and every recipe.

* quantize + dequantize, NVFP4 (every distinct tensor config of the named recipes, plus arbitrary valid
  option sets) and MXFP8: data, scales, amaxes and dequantized values equal bit for bit (stochastic
  rounding: scales and amaxes; its codes come from each backend's own random bits), and finite input
  never gives NaN or inf (amaxes, dequantized values);
* grouped quantize == each split quantized alone;
* the three scale layouts carry the same bits;
* the GEMM: within the golden tolerance of the reference (its fp32 summation order is free), finite.

Shapes: K an odd multiple of 16, M one row (rowwise 1x16 only), an odd multiple of 16, or 3-D.
Distributions: normal at a random scale, heavy tails, subnormals, exact E2M1 bin edges, E4M3 rounding
midpoints, zero / all-equal blocks, magnitudes up to the dtype's max.

CI runs a fixed, derandomized set of few examples (about 2 minutes on 2 cores). Long mode, opt-in:
``NVFP4LAB_FUZZ_EXAMPLES=500 python -m pytest -q tests/ops/test_properties.py`` runs that many random
examples per test (hypothesis prints the seed of a failure; ``--hypothesis-seed=N`` repeats a run).
The variable is read here only.
"""
from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nvfp4lab
from nvfp4lab import recipes
from nvfp4lab.config import NVFP4QuantConfig
from nvfp4lab.ops import triton_available

from ..kernels.gemm_checks import assert_close, atol_bound

pytestmark = pytest.mark.skipif(not triton_available(), reason="needs triton (the interpreter on a CPU)")

FUZZ_EXAMPLES = int(os.environ.get("NVFP4LAB_FUZZ_EXAMPLES", "0"))  # 0: the CI set


def fuzz(ci_examples: int):
    """CI: ``ci_examples`` derandomized examples (a fixed seed); long mode: NVFP4LAB_FUZZ_EXAMPLES random ones."""
    return settings(max_examples=FUZZ_EXAMPLES or ci_examples, derandomize=not FUZZ_EXAMPLES, deadline=None,
                    database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.uint8: torch.uint8}
DISTRIBUTIONS = ("normal", "heavy", "subnormal", "e2m1_edges", "e4m3_midpoints", "blocks", "max")
E2M1_EDGES = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0)


def _recipe_configs() -> list:
    """The distinct tensor configs (both copies, compact scales) of every named NVFP4 recipe."""
    seen = {}
    for name in recipes.nvfp4_recipe_names(list(recipes.NVFP4_FEATURES)):
        recipe = recipes.from_recipe_name(name)
        for tensor in recipes.TENSORS:
            cfg = dataclasses.replace(recipe.tensor_config(tensor, rowwise=True, columnwise=True), scale_layout="compact")
            seen.setdefault(cfg, name)
    return list(seen)


RECIPE_CONFIGS = _recipe_configs()


def _config_id(cfg: NVFP4QuantConfig) -> str:
    parts = [cfg.block, "pt" if cfg.per_token else "", "rht" if cfg.rht else "", cfg.four_over_six or "",
             "E256" if cfg.e4m3_max == 256 else "", "sr" if cfg.stochastic_rounding else ""]
    return "-".join(p for p in parts if p)


# ------------------------------------------------------------------------------------ inputs
def _e4m3_values() -> torch.Tensor:
    return torch.arange(1, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # positive, finite


def make_x(seed: int, shape: tuple, dtype: torch.dtype, dist: str, rht: bool = False) -> torch.Tensor:
    """A finite ``dtype`` tensor of ``shape`` drawn from ``dist`` (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    m, k = math.prod(shape[:-1]), shape[-1]
    fmax = torch.finfo(dtype).max
    min_normal = -14 if dtype == torch.float16 else -126  # log2 of the smallest normal value
    randn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    pick = lambda n, hi: torch.randint(0, hi, (n,), generator=g)  # noqa: E731
    if dist == "normal":
        e = int(pick(1, 40)) - 20
        x = randn(m, k) * 2.0**e
    elif dist == "heavy":  # log-normal magnitudes over many binades
        x = randn(m, k) * torch.exp2(randn(m, k) * 6)
    elif dist == "subnormal":  # the dtype's subnormals, some normal neighbours
        x = randn(m, k) * 2.0 ** (min_normal - 4) * torch.where(torch.rand(m, k, generator=g) < 0.1, 2.0**6, 1.0)
    elif dist in ("e2m1_edges", "e4m3_midpoints"):
        # a fixed element 2688 * 2^e makes S_enc = 2^-e: blocks of max 6 * 2^e get scale 1 and enc 2^-e,
        # so x * enc lands exactly on E2M1 bin edges; 4over6's fl(bamax / 6) * S_enc lands exactly on
        # E4M3 midpoints
        e = int(pick(1, 8)) - 8 if dtype == torch.float16 else int(pick(1, 40)) - 20
        if dist == "e2m1_edges":
            edges = torch.tensor(E2M1_EDGES, dtype=torch.float64)
            x = edges[pick(m * k, len(E2M1_EDGES))].reshape(m, k) * torch.where(randn(m, k) < 0, -1.0, 1.0)
            x.view(m, k // 16, 16)[:, :, 0] = 6.0
        else:
            vals = _e4m3_values().double()
            mids = (vals[:-1] + vals[1:]) / 2
            x = (torch.rand(m, k, generator=g, dtype=torch.float64) * 2 - 1)
            x.view(m, k // 16, 16)[:, :, 0] = 6.0 * mids[pick(m * k // 16, len(mids))].reshape(m, k // 16)
            x = x.clamp(-6.0 * 448, 6.0 * 448)
        x = x * 2.0**e
        x[:, 0] = 2688.0 * 2.0**e
    elif dist == "blocks":  # zero blocks, all-equal blocks, ordinary ones
        kind = pick(m * k // 16, 3).reshape(m, k // 16, 1)
        x = torch.where(kind == 0, 0.0, torch.where(kind == 1, randn(m, k // 16, 1), randn(m, k // 16, 16))).reshape(m, k)
    elif dist == "max":  # up to the dtype's max, some exactly +-max
        x = (torch.rand(m, k, generator=g, dtype=torch.float64) * 2 - 1) * fmax
        x = torch.where(torch.rand(m, k, generator=g) < 0.05, torch.sign(x) * fmax, x)
    else:
        raise ValueError(dist)
    x = x.clamp(-fmax, fmax).to(dtype)
    if rht:
        x = _rht_exact_sums(x)
    assert x.isfinite().all()
    return x.reshape(shape)


def _rht_exact_sums(x: torch.Tensor) -> torch.Tensor:
    """x with every value below 2^-12 of its 16-row chunk's max set to 0, for RHT configs: each 16-term
    sum of the transform then has every partial sum exact in fp32 (terms are multiples of 2^-22 of the
    chunk max after the bf16 rounding, sums stay below 2^2 of it), so the kernels' butterfly order and the
    reference's matmul order agree (the spec leaves the order free; inexact sums may differ)."""
    m, k = x.shape
    v = x.to(torch.bfloat16).double().reshape(m // 16, 16, k)
    chunk_max = v.abs().amax(dim=1, keepdim=True)
    keep = v.abs() >= chunk_max * 2.0**-12
    return torch.where(keep, x.double().reshape(m // 16, 16, k), 0.0).reshape(m, k).to(x.dtype)


@st.composite
def nvfp4_case(draw, cfg: NVFP4QuantConfig):
    """(x, config) for one NVFP4 config: which copies, scale layout, shape, dtype, distribution."""
    copies = draw(st.sampled_from([(True, True), (True, False), (False, True)]))
    layout = draw(st.sampled_from(["compact", "padded", "swizzled"]))
    cfg = dataclasses.replace(cfg, rowwise=copies[0], columnwise=copies[1], scale_layout=layout)
    k = 16 * draw(st.sampled_from([1, 3, 5]))
    needs_16_rows = cfg.columnwise or cfg.block == "16x16"
    m = draw(st.sampled_from([16, 48, 80] if needs_16_rows else [1, 3, 16, 48]))
    shape = draw(st.sampled_from([(m, k), (m // 16 if m % 16 == 0 else 1, 16 if m % 16 == 0 else m, k)]))
    dtype = draw(st.sampled_from(DTYPES))
    dist = draw(st.sampled_from(DISTRIBUTIONS))
    seed = draw(st.integers(0, 2**31 - 1))
    rht = cfg.rht and cfg.columnwise
    x = make_x(seed, shape, dtype, dist, rht=rht and math.prod(shape[:-1]) % 16 == 0)
    return x, cfg


def assert_same_bits(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, f"{name}: {got.shape}/{got.dtype} vs {want.shape}/{want.dtype}"
    g, w = got.contiguous().view(BITS[got.dtype]), want.contiguous().view(BITS[want.dtype])
    diff = (g != w).nonzero()
    assert diff.numel() == 0, (f"{name}: {diff.shape[0]} of {g.numel()} differ, first at {diff[0].tolist()}: "
                               f"{got[tuple(diff[0])].item()!r} vs {want[tuple(diff[0])].item()!r}")


def check_nvfp4(x: torch.Tensor, cfg: NVFP4QuantConfig, seed: int = 1) -> None:
    """Triton == reference bit for bit (SR: scales and amaxes), finite amaxes and dequantized values."""
    sr = cfg.stochastic_rounding
    got = nvfp4lab.quantize_nvfp4(x, config=cfg, backend="triton", seed=seed if sr else None)
    want = nvfp4lab.quantize_nvfp4(x, config=cfg, backend="ref", seed=seed if sr else None)
    for side in ("rowwise", "columnwise"):
        if not getattr(cfg, side):
            continue
        for part in ("scale", "amax") if sr else ("data", "scale", "amax"):
            assert_same_bits(f"{side}_{part}", getattr(got, f"{side}_{part}"), getattr(want, f"{side}_{part}"))
        assert getattr(got, f"{side}_amax").isfinite().all(), f"{side}_amax not finite"
        for dtype in (x.dtype, torch.float32):
            d_got = nvfp4lab.dequantize_nvfp4(got, dtype=dtype, which=side, backend="triton")
            assert d_got.isfinite().all(), f"dequantize({side}, {dtype}) of finite input is not finite"
            if not sr:
                d_want = nvfp4lab.dequantize_nvfp4(want, dtype=dtype, which=side, backend="ref")
                assert_same_bits(f"dequantize({side}, {dtype})", d_got, d_want)


# ------------------------------------------------------------------------------------ NVFP4
@pytest.mark.parametrize("cfg", RECIPE_CONFIGS, ids=_config_id)
@fuzz(ci_examples=2)
@given(data=st.data())
def test_quantize_every_recipe_matches_reference(cfg, data):
    x, case_cfg = data.draw(nvfp4_case(cfg))
    check_nvfp4(x, case_cfg, seed=data.draw(st.integers(0, 2**63 - 1)))


@st.composite
def any_valid_config(draw):
    """An arbitrary valid NVFP4QuantConfig (the option space, beyond the recipes' combinations)."""
    while True:
        options = dict(block=draw(st.sampled_from(["1x16", "16x16"])), per_token=draw(st.booleans()),
                       rht=draw(st.booleans()), four_over_six=draw(st.sampled_from([None, "mae", "mse"])),
                       e4m3_max=draw(st.sampled_from([None, 448, 256.0])), stochastic_rounding=draw(st.booleans()),
                       rht_sign_mask=draw(st.integers(0, 0xFFFF)))
        try:
            return NVFP4QuantConfig(columnwise=True, **options)
        except ValueError:
            continue


@fuzz(ci_examples=6)
@given(data=st.data())
def test_quantize_any_valid_options_match_reference(data):
    x, cfg = data.draw(nvfp4_case(data.draw(any_valid_config())))
    check_nvfp4(x, cfg)


def test_the_recipe_configs_cover_every_feature():
    """The parametrized set holds each kernel-relevant feature (a test of the enumeration above)."""
    seen = {(c.block, c.per_token, c.rht, c.four_over_six, c.e4m3_max, c.stochastic_rounding, c.numerics)
            for c in RECIPE_CONFIGS}
    main = "te_main"
    assert ("16x16", False, False, None, 448.0, False, main) in seen and ("1x16", False, True, None, 448.0, True, main) in seen
    assert ("1x16", True, False, "mse", 256.0, False, main) in seen and ("1x16", True, False, None, 448.0, True, main) in seen
    assert any(key[-1] == "te_pr3045" for key in seen)
    assert len(seen) == len(RECIPE_CONFIGS) >= 19


@st.composite
def grouped_case(draw):
    # (PR 3045's 2D weight is a per-tensor cast: the grouped quantize refuses it)
    cfg = draw(st.sampled_from([c for c in RECIPE_CONFIGS if not c.stochastic_rounding and not c.broadcast_2d]))
    columnwise = draw(st.booleans()) or cfg.block == "16x16"
    cfg = dataclasses.replace(cfg, columnwise=columnwise)
    unit = 16 if (columnwise or cfg.block == "16x16") else 1
    sections = draw(st.lists(st.integers(0, 4).map(lambda n: n * unit if unit == 16 else n * 7), min_size=1, max_size=4))
    k = 16 * draw(st.sampled_from([1, 3]))
    dtype = draw(st.sampled_from(DTYPES))
    dist = draw(st.sampled_from(DISTRIBUTIONS))
    seed = draw(st.integers(0, 2**31 - 1))
    m = sum(sections)
    if m == 0 or (cfg.rht and m % 16):
        sections = sections + [16]
        m += 16
    x = make_x(seed, (m, k), dtype, dist, rht=cfg.rht and columnwise)
    return x, sections, cfg


@fuzz(ci_examples=6)
@given(case=grouped_case())
def test_grouped_quantize_equals_each_split(case):
    x, sections, cfg = case
    parts = nvfp4lab.quantize_nvfp4_grouped(x, sections, config=cfg, backend="triton")
    row = 0
    for size, got in zip(sections, parts):
        if size:
            want = nvfp4lab.quantize_nvfp4(x[row:row + size], config=cfg, backend="ref")
            for side in ("rowwise", "columnwise"):
                if getattr(cfg, side):
                    for part in ("data", "scale", "amax"):
                        assert_same_bits(f"split at {row}: {side}_{part}", getattr(got, f"{side}_{part}"),
                                         getattr(want, f"{side}_{part}").reshape(getattr(got, f"{side}_{part}").shape))
        row += size


@fuzz(ci_examples=4)
@given(data=st.data())
def test_scale_layouts_carry_the_same_bits(data):
    cfg = data.draw(st.sampled_from([c for c in RECIPE_CONFIGS if not c.stochastic_rounding]))
    x, _ = data.draw(nvfp4_case(cfg))
    x = x.reshape(-1, x.shape[-1])
    cfg = dataclasses.replace(cfg, rowwise=True, columnwise=x.shape[0] % 16 == 0)
    backend = data.draw(st.sampled_from(["triton", "ref"]))
    q = {layout: nvfp4lab.quantize_nvfp4(x, config=dataclasses.replace(cfg, scale_layout=layout), backend=backend)
         for layout in ("compact", "padded", "swizzled")}
    for side in ("rowwise", "columnwise") if cfg.columnwise else ("rowwise",):
        compact = getattr(q["compact"], f"{side}_scale")
        rows, cols = compact.shape
        assert_same_bits(f"{side} padded", getattr(q["padded"], f"{side}_scale")[:rows, :cols], compact)
        assert_same_bits(f"{side} swizzled", nvfp4lab.unswizzle_scales(getattr(q["swizzled"], f"{side}_scale"), rows, cols,
                                                                       backend=backend), compact)
        assert_same_bits(f"{side} swizzle", nvfp4lab.swizzle_scales(compact, backend=backend),
                         getattr(q["swizzled"], f"{side}_scale"))
        for layout in ("padded", "swizzled"):
            for part in ("data", "amax"):
                assert_same_bits(f"{side}_{part} ({layout})", getattr(q[layout], f"{side}_{part}"),
                                 getattr(q["compact"], f"{side}_{part}"))
            assert_same_bits(f"dequantize {side} ({layout})", q[layout].dequantize(which=side), q["compact"].dequantize(which=side))


@fuzz(ci_examples=5)
@given(data=st.data())
def test_gemm_within_tolerance_of_reference(data):
    k = 16 * data.draw(st.sampled_from([1, 3, 5]))
    m, n = data.draw(st.sampled_from([1, 16, 48])), data.draw(st.sampled_from([16, 48]))
    dist = data.draw(st.sampled_from(["normal", "heavy", "subnormal", "blocks", "e2m1_edges"]))
    a_cfg = NVFP4QuantConfig(per_token=data.draw(st.booleans()), four_over_six=data.draw(st.sampled_from([None, "mae"])))
    b_cfg = NVFP4QuantConfig(block=data.draw(st.sampled_from(["1x16", "16x16"])))
    a = nvfp4lab.quantize_nvfp4(make_x(data.draw(st.integers(0, 2**31 - 1)), (m, k), torch.bfloat16, dist), config=a_cfg)
    b = nvfp4lab.quantize_nvfp4(make_x(data.draw(st.integers(0, 2**31 - 1)), (n, k), torch.float32, dist), config=b_cfg)
    out_dtype = data.draw(st.sampled_from(DTYPES))
    got = nvfp4lab.nvfp4_gemm(a, b, out_dtype=torch.float32, backend="triton")
    want = nvfp4lab.nvfp4_gemm(a, b, out_dtype=torch.float32, backend="ref")
    assert got.isfinite().all()
    assert_close(got, want, atol_bound(a, b))
    assert nvfp4lab.nvfp4_gemm(a, b, out_dtype=out_dtype, backend="triton").dtype == out_dtype


# ------------------------------------------------------------------------------------ MXFP8
@fuzz(ci_examples=6)
@given(data=st.data())
def test_mxfp8_matches_reference(data):
    k = 32 * data.draw(st.sampled_from([1, 3]))
    m = 32 * data.draw(st.sampled_from([1, 3]))
    dtype = data.draw(st.sampled_from(DTYPES))
    x = make_x(data.draw(st.integers(0, 2**31 - 1)), (m, k), dtype, data.draw(st.sampled_from(DISTRIBUTIONS)))
    copies = data.draw(st.sampled_from([(True, True), (True, False), (False, True)]))
    kwargs = dict(rowwise=copies[0], columnwise=copies[1], fp8_format=data.draw(st.sampled_from(["e4m3", "e5m2"])),
                  scale_layout=data.draw(st.sampled_from(["compact", "padded", "swizzled"])))
    got = nvfp4lab.quantize_mxfp8(x, backend="triton", **kwargs)
    want = nvfp4lab.quantize_mxfp8(x, backend="ref", **kwargs)
    for side in ("rowwise", "columnwise"):
        if getattr(got.config, side):
            for part in ("data", "scale"):
                assert_same_bits(f"{side}_{part}", getattr(got, f"{side}_{part}"), getattr(want, f"{side}_{part}"))
            for out_dtype in (dtype, torch.float32):
                d_got = nvfp4lab.dequantize_mxfp8(got, dtype=out_dtype, which=side, backend="triton")
                assert d_got.isfinite().all(), f"dequantize({side}, {out_dtype}) of finite input is not finite"
                assert_same_bits(f"dequantize({side})", d_got, nvfp4lab.dequantize_mxfp8(want, dtype=out_dtype, which=side, backend="ref"))
