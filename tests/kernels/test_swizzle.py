"""Scale swizzle / unswizzle kernels vs nvfp4lab.ref.swizzle, bit for bit (interpreter on CPU, GPU tier)."""
import pytest
import torch

from nvfp4lab import ops, ref
from nvfp4lab.kernels import swizzle as swz

from .kernel_checks import assert_conformance, forbid_launches, gpu_golden_folders

SHAPES = [(1, 1), (100, 3), (128, 4), (130, 5), (64, 17), (300, 12), (129, 1), (37, 70)]


def _scales(rows, cols, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    # start at 1 so a zero in a real position cannot hide an unwritten (zero) byte
    return torch.randint(1, 256, (rows, cols), dtype=torch.uint8, generator=g).to(device)


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_swizzle_matches_ref(rows, cols):
    scale = _scales(rows, cols)
    got = swz.swizzle_scales(scale)
    want = ref.swizzle.swizzle_scales(scale)
    assert got.shape == want.shape == (ref.swizzle.roundup(rows, 128), ref.swizzle.roundup(cols, 4))
    assert torch.equal(got, want)


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_unswizzle_matches_ref(rows, cols):
    scale = _scales(rows, cols, seed=1)
    swizzled = ref.swizzle.swizzle_scales(scale)
    for buf in (swizzled, swizzled.flatten()):
        got = swz.unswizzle_scales(buf, rows, cols)
        assert torch.equal(got, scale)
        assert torch.equal(got, ref.swizzle.unswizzle_scales(buf, rows, cols))


@pytest.mark.parametrize("rows,cols", [(100, 3), (130, 5)])
def test_every_byte_written(rows, cols):
    """0xFF-poisoned output buffers: the swizzle must write every byte, padding (zeros) included."""
    scale = _scales(rows, cols, seed=2)
    rows_p, cols_p = ref.swizzle.roundup(rows, 128), ref.swizzle.roundup(cols, 4)
    out = torch.full((rows_p, cols_p), 0xFF, dtype=torch.uint8)
    swz.launch_swizzle(scale, out)
    assert torch.equal(out, ref.swizzle.swizzle_scales(scale))
    back = torch.full((rows, cols), 0xFF, dtype=torch.uint8)
    swz.launch_unswizzle(out, rows, cols, back)
    assert torch.equal(back, scale)


def _forbid_launch(monkeypatch):
    forbid_launches(monkeypatch, swz, "_swizzle_kernel", "_unswizzle_kernel")


@pytest.mark.parametrize("rows,cols", [(0, 5), (5, 0), (0, 0)])
def test_empty(monkeypatch, rows, cols):
    _forbid_launch(monkeypatch)
    scale = torch.empty(rows, cols, dtype=torch.uint8)
    got = swz.swizzle_scales(scale)
    assert torch.equal(got, ref.swizzle.swizzle_scales(scale))
    back = swz.unswizzle_scales(got, rows, cols)
    assert back.shape == (rows, cols)


def test_bad_inputs():
    with pytest.raises(TypeError, match="scale must be uint8"):
        swz.swizzle_scales(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="scale must be 2-D"):
        swz.swizzle_scales(torch.zeros(2, 4, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="buf must hold"):
        swz.unswizzle_scales(torch.zeros(100, dtype=torch.uint8), 5, 3)
    with pytest.raises(ValueError, match="rows and cols must be >= 0"):
        swz.unswizzle_scales(torch.zeros(0, dtype=torch.uint8), -1, 3)


def test_ops_dispatch_triton():
    scale = _scales(70, 9, seed=3)
    got = ops.swizzle_scales(scale, backend="triton")
    assert torch.equal(got, ref.swizzle.swizzle_scales(scale))
    assert torch.equal(ops.unswizzle_scales(got, 70, 9, backend="triton"), scale)


def test_custom_ops_trace():
    scale = _scales(5, 3, seed=4)
    torch.library.opcheck(torch.ops.nvfp4lab.swizzle_scales.default, (scale,))
    buf = ref.swizzle.swizzle_scales(scale)
    torch.library.opcheck(torch.ops.nvfp4lab.unswizzle_scales.default, (buf, 5, 3))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def round_trip(s):
        return swz.unswizzle_scales(swz.swizzle_scales(s), 5, 3)

    assert torch.equal(round_trip(scale), scale)


def test_conformance_swizzle_cases(golden_dirs):
    assert_conformance(golden_dirs, "scale_swizzle_*")


# ------------------------------------------------------------------------------------------- GPU tier
@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols", [(16384, 512), (8191, 1023), (128 * 1024, 4), (3, 40000)])
def test_gpu_swizzle_round_trip(rows, cols):
    scale = _scales(rows, cols, seed=5, device="cuda")
    got = swz.swizzle_scales(scale)
    assert torch.equal(got, ref.swizzle.swizzle_scales(scale))
    assert torch.equal(swz.unswizzle_scales(got, rows, cols), scale)


@pytest.mark.gpu
def test_gpu_conformance_swizzle_cases():
    assert_conformance(gpu_golden_folders(), "scale_swizzle_*", device="cuda")
