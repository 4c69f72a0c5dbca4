"""nvfp4lab.moe: per-expert NVFP4Tensors into the grouped GEMM's layouts."""
import pytest
import torch

import nvfp4lab
from nvfp4lab import moe
from nvfp4lab.kernels import swizzle as swizzle_kernels


@pytest.mark.parametrize("backend", ["ref", "triton"])
def test_stack_weights_of_swizzled_scales_equals_compact(backend, monkeypatch):
    """Swizzled weight scales are unswizzled (by the Triton kernel when the backend is triton, here under
    the interpreter) into the same compact stack as compact-scale weights."""
    kernel_calls = []
    unswizzle_kernel = swizzle_kernels.unswizzle_scales
    monkeypatch.setattr(swizzle_kernels, "unswizzle_scales", lambda *a: kernel_calls.append(a) or unswizzle_kernel(*a))
    g = torch.Generator().manual_seed(3)
    weights = [torch.randn(48, 80, generator=g).to(torch.bfloat16) for _ in range(3)]  # 48 x 5 scales: padded both ways
    stacks = {}
    for layout in ("compact", "swizzled"):
        quantized = [nvfp4lab.quantize_nvfp4(w, rowwise=True, columnwise=True, scale_layout=layout, backend="ref")
                     for w in weights]
        stacks[layout] = moe.stack_weights(quantized, backend=backend)
    assert len(kernel_calls) == (3 if backend == "triton" else 0)
    got, want = stacks["swizzled"], stacks["compact"]
    assert got.shape == want.shape == torch.Size((3, 48, 80)) and got.scale_layout == "compact"
    for name in ("rowwise_data", "rowwise_scale", "rowwise_amax"):
        assert torch.equal(getattr(got, name).view(torch.uint8), getattr(want, name).view(torch.uint8)), name


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("path", ["ref", "kernel", "per_expert_cublas"])
def test_grouped_gemm_of_a_grouped_tensor_equals_its_token_operand(per_token, path, monkeypatch):
    """A GroupedNVFP4Tensor as the grouped GEMM's A: its per-split amax read per expert (fused kernel; with host
    splits and a dequant config, one alpha per expert in cuBLAS' epilogue, here its CPU twin) gives the bits of the
    same tensor as one operand with each split's amax repeated over its rows (and of the reference)."""
    from nvfp4lab.kernels import nvfp4_gemm as G
    from nvfp4lab.kernels.nvfp4_gemm_details import opt_flags

    if path == "per_expert_cublas":
        monkeypatch.setattr(opt_flags, "grouped_dequant_applies", lambda *args, **kwargs: True)
        monkeypatch.setitem(opt_flags.DENSE_RULES, "default", dict(opt_flags.DENSE_RULES["default"],
                                                                   dequant=G.GemmConfig(32, 32, 64, dequant_mm=True)))
    backend = "ref" if path == "ref" else "triton"
    g = torch.Generator().manual_seed(11)
    sizes, n, k = [32, 0, 48, 16], 40, 64
    x = (torch.randn(sum(sizes), k, generator=g) * torch.rand(sum(sizes), 1, generator=g) * 8).to(torch.bfloat16)
    bulk = nvfp4lab.quantize_nvfp4_grouped_bulk(x, sizes, per_token=per_token, backend="ref")
    w = [nvfp4lab.quantize_nvfp4(torch.randn(n, k, generator=g).to(torch.bfloat16), backend="ref") for _ in sizes]
    b = moe.stack_weights(w)
    tokens = moe.token_operand(bulk, moe.per_row_amax(bulk))
    offs = bulk.split_offsets[1:]
    for m_splits in (None, sizes):
        want = nvfp4lab.nvfp4_grouped_gemm(tokens, b, offs, m_splits=m_splits, backend="ref")
        got = nvfp4lab.nvfp4_grouped_gemm(bulk, b, m_splits=m_splits, backend=backend)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    with pytest.raises(ValueError, match="offs must be None"):
        nvfp4lab.nvfp4_grouped_gemm(bulk, b, offs, backend=backend)
    with pytest.raises(ValueError, match="E = 2 splits"):
        nvfp4lab.nvfp4_grouped_gemm(bulk, moe.stack_weights(w[:2]), backend=backend)


@pytest.mark.gpu
def test_gpu_grouped_gemm_of_a_grouped_tensor_scales_in_cublas(monkeypatch):
    """On the GPU, large experts of a per-split-amax grouped tensor take one cuBLAS GEMM per expert with cuBLAS'
    epilogue (an alpha per expert, no epilogue kernel), within fp32 summation error of the per-row operand's result."""
    from nvfp4lab.kernels.nvfp4_gemm_details import dequant_mm

    calls = []
    real = dequant_mm._per_expert_scaled_mm
    monkeypatch.setattr(dequant_mm, "_per_expert_scaled_mm", lambda *args: calls.append(args[4:6]) or real(*args))
    g = torch.Generator().manual_seed(12)
    sizes, n, k = [512, 0, 768, 768], 1024, 2048
    x = torch.randn(sum(sizes), k, generator=g).to("cuda", torch.bfloat16)
    bulk = nvfp4lab.quantize_nvfp4_grouped_bulk(x, sizes)
    w = [nvfp4lab.quantize_nvfp4(torch.randn(n, k, generator=g).to("cuda", torch.bfloat16)) for _ in sizes]
    b = moe.stack_weights(w)
    got = nvfp4lab.nvfp4_grouped_gemm(bulk, b, m_splits=sizes)
    assert calls == [(True, True)]
    want = nvfp4lab.nvfp4_grouped_gemm(moe.token_operand(bulk, moe.per_row_amax(bulk)), b, bulk.split_offsets[1:],
                                       m_splits=sizes, out_dtype=torch.float32)
    torch.testing.assert_close(got.float(), want, rtol=2 ** -7, atol=1e-2)
