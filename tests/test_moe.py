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
