"""The format decoders of nvfp4lab.kernels.formats on every code, against decodes that do not use them:
torch's float8 dtypes (E4M3, E5M2) and the OCP E2M1 value table (interpreter on CPU, GPU tier)."""

import pytest
import torch
import triton
import triton.language as tl

from nvfp4lab.kernels import formats

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # OCP MX spec, magnitudes of codes 0..7
POISON = 1e30  # no format here decodes to it, and NaN is an expected output, so the fill is finite


@triton.jit
def _decode_kernel(out_ptr, FMT: tl.constexpr, N: tl.constexpr):
    code = tl.arange(0, N)
    if FMT == 0:
        val = formats.e2m1_decode(code)
    elif FMT == 1:
        val = formats.e4m3_decode(code)
    else:
        val = formats.e5m2_decode(code)
    tl.store(out_ptr + code, val)


def _decode_all(fmt: str, device: str) -> torch.Tensor:
    fmt_id, n = {"e2m1": (0, 16), "e4m3": (1, 256), "e5m2": (2, 256)}[fmt]
    out = torch.full((n,), POISON, dtype=torch.float32, device=device)
    _decode_kernel[(1,)](out, FMT=fmt_id, N=n)
    return out.cpu()


def _independent(fmt: str) -> torch.Tensor:
    if fmt == "e2m1":
        mags = torch.tensor(E2M1_VALUES, dtype=torch.float32)
        return torch.cat([mags, -mags])  # code 8 is -0.0
    dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).to(torch.float32)


def _check(fmt: str, device: str):
    got, want = _decode_all(fmt, device), _independent(fmt)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), f"NaN codes: {torch.nonzero(torch.isnan(got)).flatten().tolist()}"
    if fmt == "e4m3":
        assert torch.nonzero(nan).flatten().tolist() == [0x7F, 0xFF]
    # bit for bit on every other code: signed zeros and subnormals included
    bad = torch.nonzero(got.view(torch.int32)[~nan] != want.view(torch.int32)[~nan]).flatten()
    assert bad.numel() == 0, f"{bad.numel()} codes differ, first {torch.arange(got.numel())[~nan][bad][:8].tolist()}"


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3", "e5m2"])
def test_decode_every_code(fmt):
    """formats.e2m1_decode / e4m3_decode / e5m2_decode: the value of every code, NaN exactly where the
    format has one (E4M3: 0x7F and 0xFF only)."""
    _check(fmt, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["e2m1", "e4m3", "e5m2"])
def test_gpu_decode_every_code(fmt):
    _check(fmt, "cuda")
