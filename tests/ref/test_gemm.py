"""The reference GEMM's epilogue at extreme amaxes (the tolerance comparisons are in tests/kernels)."""
import numpy as np
import torch

import nvfp4lab
from nvfp4lab.ref import gemm as ref_gemm

FLT_MAX = torch.finfo(torch.float32).max


def _fp32_unbounded(v: np.ndarray) -> np.ndarray:
    """float64 -> fp32's 24-bit significand, RNE, unbounded exponent (normal-range values only)."""
    mant, exp = np.frexp(v)
    return np.ldexp(np.round(np.ldexp(mant, 24)), exp - 24)


def test_alpha_is_cublas_where_finite_and_its_unbounded_value_where_not():
    """out = fl(acc * fl(fl(amax_a * amax_b) * fl(1/(36 E_a E_b)))): cuBLAS' bits wherever amax_a * amax_b
    is finite; where it overflows for finite amaxes, the value of that order with an unbounded exponent
    (inf only where the result itself is past fp32's range), never NaN for acc = 0."""
    g = torch.Generator().manual_seed(0)
    amax_a = torch.cat([torch.exp2(torch.rand(40, generator=g) * 250 - 122), torch.tensor([1e20, FLT_MAX, 0.0])])
    amax_b = torch.cat([torch.exp2(torch.rand(30, generator=g) * 250 - 122), torch.tensor([1e19, FLT_MAX, 1.0])])
    acc = torch.randn(amax_a.numel(), amax_b.numel(), generator=g) * torch.exp2(torch.randint(-20, 40, (1, amax_b.numel()),
                                                                                               generator=g).float())
    acc[:, ::7] = 0.0
    for e_a, e_b in ((448.0, 448.0), (256.0, 448.0)):
        got = ref_gemm.apply_alpha(acc, amax_a, amax_b, e_a, e_b)
        cublas = acc * ref_gemm.gemm_alpha(amax_a, amax_b, e_a, e_b)
        inv = float(np.float32(1.0 / (36.0 * e_a * e_b)))
        prod = amax_a.double().view(-1, 1).numpy() * amax_b.double().view(1, -1).numpy()
        overflow = _fp32_unbounded(prod) > FLT_MAX
        assert overflow.any() and (~overflow).any()
        assert torch.equal(got[~overflow].view(torch.int32), cublas[~overflow].view(torch.int32))
        want = _fp32_unbounded(acc.double().numpy() * _fp32_unbounded(_fp32_unbounded(prod) * inv))
        want = np.where(np.abs(want) > FLT_MAX, np.sign(want) * np.inf, want)
        assert np.array_equal(got.double().numpy()[overflow], want[overflow])
        assert not got.isnan().any() and (got[acc == 0] == 0).all()


def test_zero_operand_with_huge_amaxes_gives_zeros():
    a = nvfp4lab.quantize_nvfp4(torch.zeros(16, 32), amax=torch.tensor([1e20]), backend="ref")
    b = nvfp4lab.quantize_nvfp4(torch.randn(16, 32), amax=torch.tensor([1e19]), backend="ref")
    assert torch.equal(nvfp4lab.nvfp4_gemm(a, b, out_dtype=torch.float32, backend="ref"), torch.zeros(16, 16))
