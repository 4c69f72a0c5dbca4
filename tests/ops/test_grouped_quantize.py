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
    with pytest.raises(TypeError, match="list or tuple of ints"):
        nvfp4lab.quantize_nvfp4_grouped(x, "16,48")
    with pytest.raises(ValueError, match="at least one split"):
        nvfp4lab.quantize_nvfp4_grouped(x[:0], [])
    # host sections given to split() must be the tensor's own split sizes: other row ranges would take other splits'
    # amaxes
    bulk = nvfp4lab.quantize_nvfp4_grouped_bulk(x, [32, 32], columnwise=True)
    for sections, pattern in (([64], "must have 2 entries"), ([32, 16], "must sum to M = 64"),
                              ([24, 40], "multiples of 16"), ([16, 48], "this tensor's split sizes")):
        with pytest.raises(ValueError, match=pattern):
            bulk.split(sections)
    assert [p.shape for p in bulk.split([32, 32])] == [(32, 32), (32, 32)]
    # rowwise-only 1x16 takes any split sizes; an all-empty input works
    assert len(nvfp4lab.quantize_nvfp4_grouped(x, [8, 56])) == 2
    empty = nvfp4lab.quantize_nvfp4_grouped(torch.randn(0, 32), [0, 0, 0], columnwise=True)
    assert [p.rowwise_data.shape for p in empty] == [(0, 16)] * 3


def test_given_device_offsets_are_used_without_a_host_copy(monkeypatch):
    from nvfp4lab import ops

    x = torch.randn(96, 64)
    sections = [32, 0, 48, 16]
    want = nvfp4lab.quantize_nvfp4_grouped_bulk(x, sections, rowwise=True, columnwise=True, rht=True)
    offsets = torch.tensor([0, 32, 32, 80, 96])

    def no_copy(*args, **kwargs):
        raise AssertionError("host->device copy of the offsets although split_offsets was given")

    monkeypatch.setattr(ops, "host_ints_on_device", no_copy)
    got = nvfp4lab.quantize_nvfp4_grouped_bulk(x, sections, split_offsets=offsets, rowwise=True, columnwise=True, rht=True)
    assert got.split_offsets is offsets
    for name in ("rowwise_data", "rowwise_scale", "rowwise_amax", "columnwise_data", "columnwise_scale", "columnwise_amax"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


@pytest.mark.parametrize(
    "sections, split_offsets, exc, match",
    [
        ([16, 48], torch.tensor([0, 16, 64], dtype=torch.int32), TypeError, "split_offsets must be int64"),
        ([16, 48], torch.tensor([0, 64]), ValueError, r"split_offsets must have shape \(n \+ 1,\) = \(3,\)"),
        ([16, 48], torch.zeros(3, dtype=torch.int64, device="meta"), ValueError, "split_offsets must be on x's device"),
        ([16, 48], [0, 16, 64], TypeError, "split_offsets must be a torch.Tensor"),
        (torch.tensor([16, 48]), torch.tensor([0, 16, 64]), TypeError, "split_sections .with split_offsets. must be a list"),
        ([16, 16], torch.tensor([0, 16, 32]), ValueError, "must sum to M = 64"),
    ],
)
def test_bad_split_offsets(sections, split_offsets, exc, match):
    with pytest.raises(exc, match=match):
        nvfp4lab.quantize_nvfp4_grouped_bulk(torch.randn(64, 32), sections, split_offsets=split_offsets)


@pytest.mark.parametrize("capturing", [False, True], ids=["eager", "capturing"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_host_ints_on_device(capturing, dtype, monkeypatch):
    from nvfp4lab import runtime

    if capturing:  # a pageable copy cannot be captured: the values must be written by fills
        monkeypatch.setattr(runtime, "graph_capturing", lambda device: True)
        monkeypatch.setattr(torch, "tensor", lambda *a, **kw: pytest.fail("torch.tensor during capture"))
    got = runtime.host_ints_on_device([0, 16, 16, 80], "cpu", dtype=dtype)
    assert got.dtype == dtype and got.tolist() == [0, 16, 16, 80]


def test_per_split_views_use_the_host_sections(monkeypatch):
    # host split_sections make the views directly: the device offsets are not read back (a sync)
    from nvfp4lab.tensors import GroupedNVFP4Tensor

    real_split, sections_given = GroupedNVFP4Tensor.split, []
    monkeypatch.setattr(GroupedNVFP4Tensor, "split",
                        lambda self, sections=None: sections_given.append(sections) or real_split(self, sections))
    nvfp4lab.quantize_nvfp4_grouped(torch.randn(64, 32), [16, 48])
    nvfp4lab.quantize_nvfp4_grouped(torch.randn(64, 32), torch.tensor([16, 48]))
    assert len(sections_given) >= 2 and all(s == [16, 48] for s in sections_given)


BACKENDS = ["ref", pytest.param("triton", marks=pytest.mark.skipif(not nvfp4lab.ops.triton_available(), reason="triton"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bulk", [False, True])
def test_split_offsets_that_disagree_with_the_sections_are_refused(backend, bulk):
    # split_offsets [0, 32, 48] are not the offsets of sections [16, 32] ([0, 16, 48]): split 1 would be
    # quantized from the wrong rows; host offsets (and the reference backend) are compared
    op = nvfp4lab.quantize_nvfp4_grouped_bulk if bulk else nvfp4lab.quantize_nvfp4_grouped
    with pytest.raises(ValueError, match=r"split_offsets must be the row offsets of split_sections, \[0, 16, 48\]"):
        op(torch.randn(48, 32), [16, 32], split_offsets=torch.tensor([0, 32, 48]), backend=backend)
    parts = nvfp4lab.quantize_nvfp4_grouped(torch.randn(48, 32), [16, 32], split_offsets=torch.tensor([0, 16, 48]),
                                            backend=backend)
    assert [p.m for p in parts] == [16, 32]


@pytest.mark.parametrize("sections, exc, match", [
    ([True, True], TypeError, "split_sections must be a list or tuple of ints"),
    (torch.tensor([True, True]), TypeError, "split_sections must be a 1-D integer tensor"),
    (torch.tensor([3, -1]), ValueError, "split_sections must be >= 0 each"),
    (torch.tensor([1, 2]), ValueError, "split_sections must sum to M = 2"),
])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_split_sections(sections, exc, match, backend):
    with pytest.raises(exc, match=match):
        nvfp4lab.quantize_nvfp4_grouped(torch.randn(2, 32), sections, backend=backend)
