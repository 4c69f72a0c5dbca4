"""Grouped (MoE) quantize on the reference backend: each split equals the single-tensor op."""
import pytest
import torch

import nvfp4lab

CONFIGS = [
    dict(rowwise=True, columnwise=True),
    dict(rowwise=True, columnwise=True, per_token=True),
    dict(rowwise=True, columnwise=True, rht=True),
    dict(rowwise=True, columnwise=False, four_over_six="mse"),
    dict(rowwise=False, columnwise=True, block="16x16"),
]


@pytest.mark.parametrize("opts", CONFIGS)
@pytest.mark.parametrize("sections", [[32, 0, 48, 16], [0, 0, 96], [96], [16] * 6, [48, 48, 0]])
def test_each_split_equals_single_quantize(opts, sections):
    x = torch.randn(96, 64, dtype=torch.bfloat16) * torch.logspace(-2, 2, 96).view(-1, 1).bfloat16()
    parts = nvfp4lab.quantize_nvfp4_grouped(x, sections, backend="ref", **opts)
    assert len(parts) == len(sections)
    lo = 0
    for size, got in zip(sections, parts):
        if size == 0:
            assert got.shape == (0, 64)
            if got.rowwise_data is not None:
                assert got.rowwise_data.shape == (0, 32)
            if got.columnwise_data is not None:
                assert got.columnwise_data.shape == (64, 0)
        else:
            want = nvfp4lab.quantize_nvfp4(x[lo : lo + size], backend="ref", **opts)
            for name in ("rowwise_data", "rowwise_scale", "rowwise_amax", "columnwise_data", "columnwise_scale", "columnwise_amax"):
                w, g = getattr(want, name), getattr(got, name)
                assert (w is None) == (g is None), name
                if w is not None:
                    assert torch.equal(g.reshape(w.shape), w), (name, size)
        lo += size


def test_views_share_the_bulk_buffers_and_device_offsets():
    x = torch.randn(64, 32)
    bulk = nvfp4lab.quantize_nvfp4_grouped_bulk(x, torch.tensor([16, 48]), rowwise=True, columnwise=True)
    assert bulk.split_offsets.tolist() == [0, 16, 64]
    parts = bulk.split()
    assert parts[1].rowwise_data.data_ptr() == bulk.rowwise_data[16:].data_ptr()
    assert parts[1].columnwise_data.data_ptr() == bulk.columnwise_data[32 * 16 // 2 :].data_ptr()
    assert parts[1].columnwise_data.is_contiguous()


def test_swizzled_layout_per_split():
    x = torch.randn(64, 64)
    parts = nvfp4lab.quantize_nvfp4_grouped(x, [16, 48], rowwise=True, columnwise=True, scale_layout="swizzled")
    want = nvfp4lab.quantize_nvfp4(x[16:], rowwise=True, columnwise=True, scale_layout="swizzled")
    assert torch.equal(parts[1].rowwise_scale, want.rowwise_scale)
    assert torch.equal(parts[1].columnwise_scale, want.columnwise_scale)


def test_grouped_rejects_bad_splits():
    x = torch.randn(64, 32)
    with pytest.raises(ValueError, match="must sum to M = 64"):
        nvfp4lab.quantize_nvfp4_grouped(x, [16, 16])
    with pytest.raises(ValueError, match="must be >= 0"):
        nvfp4lab.quantize_nvfp4_grouped(x, [80, -16])
    with pytest.raises(ValueError, match="multiples of 16"):
        nvfp4lab.quantize_nvfp4_grouped(x, [8, 56], columnwise=True)
    with pytest.raises(TypeError, match="list of ints"):
        nvfp4lab.quantize_nvfp4_grouped(x, "16,48")
    with pytest.raises(ValueError, match="at least one split"):
        nvfp4lab.quantize_nvfp4_grouped(x[:0], [])
    # rowwise-only 1x16 takes any split sizes; an all-empty input works
    assert len(nvfp4lab.quantize_nvfp4_grouped(x, [8, 56])) == 2
    empty = nvfp4lab.quantize_nvfp4_grouped(torch.randn(0, 32), [0, 0, 0], columnwise=True)
    assert [p.rowwise_data.shape for p in empty] == [(0, 16)] * 3
