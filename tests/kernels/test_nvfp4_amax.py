"""The per-tensor post-RHT amax pass ``amax_rht_col_kernel`` (kernels/nvfp4_quantize_details/amax.py): which amax passes
take it, and its two outputs (the post-RHT amax and x's own amax) against the reference: tiles masked along both
axes, several row groups per program, special values, under the interpreter (its integer formulas) and, in the gpu
tier, on the GPU (its packed 16-bit max)."""
import pytest
import torch

from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.kernels.nvfp4_quantize_details import amax as amax_module
from nvfp4lab.ref import nvfp4 as ref_nvfp4
from nvfp4lab.rht import DEFAULT_RHT_SIGN_MASK, apply_rht

from .kernel_checks import assert_same_bits, record_launches, rht_exact_input

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
