import pytest
import torch

from nvfp4lab.ref import swizzle


def _permute_form(scale: torch.Tensor) -> torch.Tensor:
    """Independent statement of the layout (spec section 8): view(Rp/128,4,32,Cp/4,4).permute(0,3,2,1,4)."""
    padded = swizzle.pad_scales(scale)
    rp, cp = padded.shape
    return padded.view(rp // 128, 4, 32, cp // 4, 4).permute(0, 3, 2, 1, 4).reshape(-1)


@pytest.mark.parametrize("rows,cols", [(1, 1), (37, 4), (128, 4), (130, 5), (300, 12), (256, 64), (16, 3)])
def test_swizzle_matches_permute_form_and_round_trips(rows, cols):
    scale = torch.randint(1, 256, (rows, cols), dtype=torch.uint8)
    swz = swizzle.swizzle_scales(scale)
    assert swz.shape == (swizzle.roundup(rows, 128), swizzle.roundup(cols, 4))
    assert torch.equal(swz.flatten(), _permute_form(scale))
    assert torch.equal(swizzle.unswizzle_scales(swz, rows, cols), scale)
    assert torch.equal(swizzle.unswizzle_scales(swz.flatten(), rows, cols), scale)
    # padding bytes are zero: exactly the non-scale bytes of the buffer are 0 (inputs are >= 1)
    assert int((swz == 0).sum()) == swz.numel() - rows * cols


def test_offset_formula_single_entries():
    # spec formula evaluated by hand for a (256, 8) matrix
    offs = swizzle.swizzled_offsets(256, 8)
    assert offs[0, 0] == 0
    assert offs[0, 1] == 1
    assert offs[1, 0] == 16
    assert offs[32, 0] == 4
    assert offs[0, 4] == 512
    assert offs[128, 0] == 1024
    assert offs[255, 7] == (1 * 2 + 1) * 512 + 31 * 16 + 3 * 4 + 3
