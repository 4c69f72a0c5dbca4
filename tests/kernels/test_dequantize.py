"""NVFP4 dequantize kernel vs nvfp4lab.ref.nvfp4.dequantize, bit for bit.

Inputs come from the reference quantizer (``backend="ref"``) or are random bytes (every E2M1 and E4M3
code, NaN scales included). Small shapes run under the interpreter; large ones are GPU tier.
"""
import dataclasses

import pytest
import torch

import nvfp4lab
from nvfp4lab import ref
from nvfp4lab.config import NVFP4QuantConfig
from nvfp4lab.kernels import dequantize as dq
from nvfp4lab.tensors import NVFP4Tensor

from .kernel_checks import assert_same_bits, forbid_launches, record_launches

OUT_DTYPES = [torch.bfloat16, torch.float16, torch.float32]
LAYOUTS = ["compact", "padded", "swizzled"]


def _x(m, k, seed=0, dtype=torch.bfloat16, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    # rows of very different magnitude exercise per-token amax and subnormal block scales
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, 1, generator=g) * 2)
    return x.to(dtype).to(device)


def _check(t: NVFP4Tensor, dtype, which):
    got = dq.dequantize_nvfp4(t, dtype, which)
    want = ref.nvfp4.dequantize(t, dtype, which)
    assert got.shape == t.shape
    assert_same_bits(got, want)
    return got


# ------------------------------------------------------------------------------------------ rowwise
# (32, 256) fills whole tiles (unmasked path); the others leave partial tiles; (144, 96) spans two
# 128-row bands and two 4-column tiles of a swizzled scale buffer.
@pytest.mark.parametrize("shape", [(32, 256), (48, 80), (5, 48), (144, 96), (1, 32)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_rowwise_matches_ref(shape, layout, dtype):
    q = nvfp4lab.quantize_nvfp4(_x(*shape), scale_layout=layout, backend="ref")
    _check(q, dtype, "rowwise")


RECIPES = {
    "per_token": dict(per_token=True),
    "4over6_mae_e256": dict(four_over_six="mae"),
    "4over6_mse_e448": dict(four_over_six="mse", e4m3_max=448.0),
    "per_token_4over6": dict(per_token=True, four_over_six="mae"),
    "2d_blocks": dict(block="16x16"),
    "stochastic": dict(stochastic_rounding=True, seed=7),
}


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
def test_recipes_both_copies(recipe, layout):
    kwargs = dict(RECIPES[recipe])
    q = nvfp4lab.quantize_nvfp4(_x(48, 96, seed=1), columnwise=True, scale_layout=layout, backend="ref", **kwargs)
    assert q.e4m3_max == (256.0 if recipe == "4over6_mae_e256" or recipe == "per_token_4over6" else 448.0)
    for which in ("rowwise", "columnwise"):
        _check(q, torch.bfloat16, which)


# ------------------------------------------------------------------------------------ columnwise
# x (128, 64): the columnwise copy Q = x^T (64, 128) fills whole transposed tiles; (48, 80) does not;
# (48, 128): whole 64-row tiles, 6 of a tile's 8 words (3 pairs); (256, 48): 48 of 64 rows, whole words.
@pytest.mark.parametrize("shape", [(128, 64), (48, 80), (48, 128), (256, 48)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_columnwise_matches_ref(shape, layout, dtype):
    q = nvfp4lab.quantize_nvfp4(_x(*shape, seed=2), columnwise=True, rowwise=False, scale_layout=layout, backend="ref")
    got = _check(q, dtype, "columnwise")
    assert got.shape == shape  # x's orientation


@pytest.mark.parametrize("recipe", ["per_token", "per_token_4over6", "4over6_mae_e256"])
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_columnwise_recipes(recipe, layout, dtype):
    """Per-token amax (one per Q row) and e4m3_max 256 through the transposing kernel: Q = x^T
    (96, 80) is 1.5 row tiles (64 Q rows) and 10 of a tile's words (5 scale blocks)."""
    q = nvfp4lab.quantize_nvfp4(_x(80, 96, seed=8), columnwise=True, rowwise=False, scale_layout=layout, backend="ref",
                                **RECIPES[recipe])
    _check(q, dtype, "columnwise")


@pytest.mark.parametrize("layout", ["compact", "swizzled"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_columnwise_rht_matches_ref(layout, dtype):
    q = nvfp4lab.quantize_nvfp4(_x(64, 48, seed=3), columnwise=True, rht=True, scale_layout=layout, backend="ref")
    _check(q, dtype, "columnwise")


def test_leading_dims_restored():
    x = _x(6 * 8, 32, seed=4).reshape(6, 8, 32)
    q = nvfp4lab.quantize_nvfp4(x, columnwise=True, backend="ref")
    for which in ("rowwise", "columnwise"):
        got = _check(q, torch.float32, which)
        assert got.shape == (6, 8, 32)


# --------------------------------------------------------------------------------- random bytes
def _random_tensor(m, k, layout, per_token, e4m3_max, seed, device="cpu"):
    """Arbitrary bytes: every E2M1 code, every E4M3 scale (NaN 0x7F/0xFF, negatives, subnormals),
    random amax with zeros; padding of padded scales is random too (it must be ignored)."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, generator=g)
    compact = torch.randint(0, 256, (m, k // 16), dtype=torch.uint8, generator=g)
    amax = torch.rand(m if per_token else 1, generator=g) * 100
    amax[::3] = 0.0
    if layout == "compact":
        scale = compact
    elif layout == "padded":
        scale = torch.randint(0, 256, (ref.swizzle.roundup(m, 128), ref.swizzle.roundup(k // 16, 4)), dtype=torch.uint8, generator=g)
        scale[:m, : k // 16] = compact
    else:
        scale = ref.swizzle.swizzle_scales(compact)
    config = NVFP4QuantConfig(per_token=per_token, e4m3_max=e4m3_max, scale_layout=layout)
    t = NVFP4Tensor(shape=torch.Size((m, k)), dtype=torch.bfloat16, config=config,
                    rowwise_data=data, rowwise_scale=scale, rowwise_amax=amax)
    return _to(t, device), compact


def _to(t, device):
    fields = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)}
    for name, v in fields.items():
        if isinstance(v, torch.Tensor):
            fields[name] = v.to(device)
    return NVFP4Tensor(**fields)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("per_token,e4m3_max", [(False, 448.0), (True, 256.0)])
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_random_bytes_match_ref(layout, per_token, e4m3_max, dtype):
    t, _ = _random_tensor(40, 96, layout, per_token, e4m3_max, seed=5)
    got = dq.dequantize_nvfp4(t, dtype, "rowwise")
    assert_same_bits(got, ref.nvfp4.dequantize(t, dtype, "rowwise"), nan_equal=True)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_huge_amax_rescaled_and_saturated_like_ref(per_token, dtype, device):
    """amax > FLT_MAX / 448 (fl(s * amax) overflows, TE gives inf): both kernels form the factor from
    amax / 2^32 and saturate past the output range, bit for bit as the reference; random bytes (every
    code and scale), amaxes from 1 to FLT_MAX with inf / NaN among them (those keep TE's inf / NaN)."""
    flt_max = torch.finfo(torch.float32).max
    amaxes = torch.tensor([flt_max, 1e36, 7.6e35, 3e38, 5e37, 1.0, float("inf"), float("nan")] * 6)[:44]
    t, _ = _random_tensor(44, 96, "swizzled", per_token, 448.0, seed=21, device=device)
    t.rowwise_amax = (amaxes if per_token else torch.tensor([flt_max])).to(device)
    want = ref.nvfp4.dequantize(t, dtype, "rowwise")
    assert_same_bits(dq.dequantize_nvfp4(t, dtype, "rowwise"), want, nan_equal=True)
    out = torch.full((96, 44), float("nan"), dtype=dtype, device=device)
    dq.launch_nvfp4_dequantize(t.rowwise_data, t.rowwise_scale, t.rowwise_amax, out, scale_layout="swizzled",
                               e4m3_max=448.0, transpose=True)
    assert_same_bits(out, want.t(), nan_equal=True)
    finite_scale = ref.swizzle.compact_scales(t.rowwise_scale, "swizzled", 44, 6).cpu().repeat_interleave(16, 1) & 0x7F != 0x7F
    want = want.cpu()
    finite_rows = t.rowwise_amax.cpu().reshape(-1, 1).expand(44, 1).isfinite()
    assert want[finite_scale & finite_rows].isfinite().all()


@pytest.mark.parametrize("layout,per_token,dtype", [("compact", False, torch.bfloat16), ("padded", True, torch.float32),
                                                    ("swizzled", True, torch.bfloat16), ("compact", True, torch.float16),
                                                    ("swizzled", False, torch.float32)])
def test_transposed_tiles_and_ragged_rows(layout, per_token, dtype):
    """The transposing kernel (columnwise copy -> x's orientation) for every tile override, on random
    bytes (NaN scales included) whose row count is not a multiple of its 8-row (fp32: 4-row) groups and
    whose word count is not one of its tile: each output element is written once with the reference's bits."""
    t, _ = _random_tensor(44, 96, layout, per_token, 448.0, seed=15)  # Q (44, 96): 12 words per row
    want = ref.nvfp4.dequantize(t, dtype, "rowwise").t()
    for tile in [(None, None, None), (1, 4, 1), (2, 8, 2), (4, 16, 1), (2, 2, 1)]:
        out = torch.full((96, 44), float("nan"), dtype=dtype)
        dq.launch_nvfp4_dequantize(t.rowwise_data, t.rowwise_scale, t.rowwise_amax, out, scale_layout=layout,
                                   e4m3_max=448.0, transpose=True, block_rows=tile[0], block_cols=tile[1], num_warps=tile[2])
        assert_same_bits(out, want, nan_equal=True)


def test_transposed_tile_needs_whole_scale_blocks():
    """A transposing tile of one word per Q row would split a 16-code scale block: refused."""
    t, _ = _random_tensor(16, 32, "compact", False, 448.0, seed=15)
    out = torch.empty((32, 16), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="block_cols must be >= 2"):
        dq.launch_nvfp4_dequantize(t.rowwise_data, t.rowwise_scale, t.rowwise_amax, out, scale_layout="compact",
                                   e4m3_max=448.0, transpose=True, block_rows=2, block_cols=1)


@pytest.mark.parametrize("layout,per_token,dtype", [("swizzled", True, torch.bfloat16), ("compact", False, torch.float16),
                                                    ("padded", True, torch.float32), ("swizzled", False, torch.float32)])
@pytest.mark.parametrize("q_shape", [(128, 512), (72, 528)])
def test_transposed_default_tile(layout, per_token, dtype, q_shape, monkeypatch):
    """The transposing kernel at its default tile: 16 groups of 8 Q rows (fp32 output: of 4 rows) x 32
    words, 8 warps, on random bytes, outputs poisoned with -inf (which no input can produce: amax is
    finite): Q (128, 512) is whole tiles; Q (72, 528) has partial row and word tiles."""
    launches = record_launches(monkeypatch, dq, "_nvfp4_dequantize_t_kernel")
    t, _ = _random_tensor(*q_shape, layout, per_token, 448.0, seed=17)
    out = torch.full(q_shape[::-1], float("-inf"), dtype=dtype)
    dq.launch_nvfp4_dequantize(t.rowwise_data, t.rowwise_scale, t.rowwise_amax, out, scale_layout=layout,
                               e4m3_max=448.0, transpose=True)
    want = dict(GR=4 if dtype == torch.float32 else 8, GROUPS=16, WORDS=32, num_warps=8)
    assert {k: launches[-1][k] for k in want} == want
    assert_same_bits(out, ref.nvfp4.dequantize(t, dtype, "rowwise").t(), nan_equal=True)


@pytest.mark.parametrize("per_token,dtype", [(True, torch.bfloat16), (False, torch.float32)])
def test_transposed_local_i64(per_token, dtype, monkeypatch):
    """The 64-bit in-tile offset path (LOCAL_I64, taken for tiles spanning 2^31 elements) of the
    transposing kernel, forced on a small ragged shape by lowering the launcher's limit."""
    monkeypatch.setattr(dq, "_INT32_LIMIT", 1)
    launches = record_launches(monkeypatch, dq, "_nvfp4_dequantize_t_kernel")
    t, _ = _random_tensor(76, 80, "swizzled", per_token, 448.0, seed=19)
    out = torch.full((80, 76), float("-inf"), dtype=dtype)
    dq.launch_nvfp4_dequantize(t.rowwise_data, t.rowwise_scale, t.rowwise_amax, out, scale_layout="swizzled",
                               e4m3_max=448.0, transpose=True)
    assert launches[-1]["LOCAL_I64"]
    assert_same_bits(out, ref.nvfp4.dequantize(t, dtype, "rowwise").t(), nan_equal=True)


def test_layouts_give_identical_outputs():
    x = _x(48, 64, seed=6)
    outs = []
    for layout in LAYOUTS:
        q = nvfp4lab.quantize_nvfp4(x, columnwise=True, per_token=True, scale_layout=layout, backend="ref")
        outs.append([dq.dequantize_nvfp4(q, torch.float32, which) for which in ("rowwise", "columnwise")])
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert_same_bits(b, a)


def test_round_trip_error_bound():
    """dequantize(quantize(x)) lies within one E2M1 step (<= 1.0 in code units, the 4->6 half-gap
    plus scale rounding) of x, element by element, for both copies."""
    x = _x(32, 64, seed=7, dtype=torch.float32)
    q = nvfp4lab.quantize_nvfp4(x, columnwise=True, backend="ref")
    for which, scale, amax, mat in (("rowwise", q.rowwise_scale, q.rowwise_amax, x),
                                    ("columnwise", q.columnwise_scale, q.columnwise_amax, x.t())):
        deq = nvfp4lab.dequantize_nvfp4(q, dtype=torch.float32, which=which, backend="triton")
        factor = ref.codecs.e4m3_decode(scale) * amax.reshape(-1, 1) / (6 * 448.0)
        bound = factor.repeat_interleave(16, dim=1)
        err = (deq if which == "rowwise" else deq.t()) - mat
        assert bool((err.abs() <= bound * 1.0001 + 1e-30).all())
        assert float(err.norm() / mat.norm()) < 0.2


def test_every_output_element_written():
    """Output buffers full of NaN (0xFF bytes) before the launch: every element must be overwritten."""
    q = nvfp4lab.quantize_nvfp4(_x(48, 80, seed=8), columnwise=True, scale_layout="swizzled", backend="ref")
    for transpose, data, scale, amax, shape in ((False, q.rowwise_data, q.rowwise_scale, q.rowwise_amax, (48, 80)),
                                                (True, q.columnwise_data, q.columnwise_scale, q.columnwise_amax, (48, 80))):
        for dtype in (torch.bfloat16, torch.float32):
            out = torch.full(shape, float("nan"), dtype=dtype)
            dq.launch_nvfp4_dequantize(data, scale, amax, out, scale_layout="swizzled", e4m3_max=448.0, transpose=transpose)
            assert_same_bits(out, ref.nvfp4.dequantize(q, dtype, "columnwise" if transpose else "rowwise"))


def test_ops_dispatch_triton():
    q = nvfp4lab.quantize_nvfp4(_x(16, 32, seed=9), columnwise=True, backend="ref")
    for which in ("rowwise", "columnwise"):
        got = nvfp4lab.dequantize_nvfp4(q, which=which, backend="triton")
        assert_same_bits(got, ref.nvfp4.dequantize(q, torch.bfloat16, which))


# ------------------------------------------------------------------------------ edge cases, errors
def test_empty_returns_without_launch(monkeypatch):
    forbid_launches(monkeypatch, dq, "_nvfp4_dequantize_kernel")
    q = nvfp4lab.quantize_nvfp4(torch.empty(0, 32, dtype=torch.bfloat16), backend="ref")
    out = dq.dequantize_nvfp4(q, torch.float32, "rowwise")
    assert out.shape == (0, 32) and out.dtype == torch.float32


def test_bad_inputs():
    # the parts of the container are checked once, by the public op (tests/ops/test_bad_inputs.py)
    q = nvfp4lab.quantize_nvfp4(_x(16, 32), backend="ref")
    with pytest.raises(ValueError, match="block_rows must be a power of two"):
        dq.launch_nvfp4_dequantize(q.rowwise_data, q.rowwise_scale, q.rowwise_amax, torch.empty(16, 32),
                                   scale_layout="compact", e4m3_max=448.0, transpose=False, block_rows=24)


def test_custom_op_traces():
    q = nvfp4lab.quantize_nvfp4(_x(16, 32), columnwise=True, per_token=True, scale_layout="swizzled", backend="ref")
    op = torch.ops.nvfp4lab.dequantize_nvfp4.default
    torch.library.opcheck(op, (q.rowwise_data, q.rowwise_scale, q.rowwise_amax, "swizzled", 448.0, False, torch.bfloat16))

    @torch.compile(fullgraph=True, backend="aot_eager")
    def both(data, scale, amax, cdata, cscale, camax):
        row = op(data, scale, amax, "swizzled", 448.0, False, torch.float32)
        col = op(cdata, cscale, camax, "swizzled", 448.0, True, torch.float32)
        return row + col

    got = both(q.rowwise_data, q.rowwise_scale, q.rowwise_amax, q.columnwise_data, q.columnwise_scale, q.columnwise_amax)
    want = ref.nvfp4.dequantize(q, torch.float32, "rowwise") + ref.nvfp4.dequantize(q, torch.float32, "columnwise")
    assert_same_bits(got, want)

    # the Python entry point (checks + op) traces whole as well
    whole = torch.compile(lambda t: dq.dequantize_nvfp4(t, torch.bfloat16, "columnwise"), fullgraph=True, backend="aot_eager")
    assert_same_bits(whole(q), ref.nvfp4.dequantize(q, torch.bfloat16, "columnwise"))


# ------------------------------------------------------------------------------------------- GPU tier
@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("recipe", ["plain", "per_token", "4over6_mae_e256"])
def test_gpu_large_matches_ref(layout, dtype, recipe):
    kwargs = {} if recipe == "plain" else dict(RECIPES[recipe])
    x = _x(4096, 3072, seed=10, device="cuda")
    q = nvfp4lab.quantize_nvfp4(x, columnwise=True, scale_layout=layout, backend="ref", **kwargs)
    for which in ("rowwise", "columnwise"):
        _check(q, dtype, which)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1008, 4096 + 16), (8192, 8192), (16, 65536)])
def test_gpu_odd_and_rht(shape):
    x = _x(*shape, seed=11, device="cuda")
    q = nvfp4lab.quantize_nvfp4(x, columnwise=True, rht=True, scale_layout="swizzled", backend="ref")
    _check(q, torch.bfloat16, "rowwise")
    _check(q, torch.bfloat16, "columnwise")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_gpu_random_bytes(layout, dtype):
    t, _ = _random_tensor(2048, 4096, layout, True, 448.0, seed=12, device="cuda")
    assert_same_bits(dq.dequantize_nvfp4(t, dtype, "rowwise"), ref.nvfp4.dequantize(t, dtype, "rowwise"), nan_equal=True)


@pytest.mark.gpu
def test_gpu_64bit_offsets():
    """2^31 + 2^24 output elements: compare the last rows (beyond the int32 range) with the reference."""
    m, k = 65536 + 512, 32768
    g = torch.Generator(device="cuda").manual_seed(13)
    data = torch.randint(0, 256, (m, k // 2), dtype=torch.uint8, device="cuda", generator=g)
    scale = torch.randint(0, 0x7F, (m, k // 16), dtype=torch.uint8, device="cuda", generator=g)
    amax = torch.tensor([3.0], device="cuda")
    config = NVFP4QuantConfig()
    t = NVFP4Tensor(shape=torch.Size((m, k)), dtype=torch.bfloat16, config=config,
                    rowwise_data=data, rowwise_scale=scale, rowwise_amax=amax)
    out = dq.dequantize_nvfp4(t, torch.bfloat16, "rowwise")
    tail = NVFP4Tensor(shape=torch.Size((64, k)), dtype=torch.bfloat16, config=config,
                       rowwise_data=data[-64:], rowwise_scale=scale[-64:], rowwise_amax=amax)
    assert_same_bits(out[-64:], ref.nvfp4.dequantize(tail, torch.bfloat16, "rowwise"))
    del out
    t_col = NVFP4Tensor(shape=torch.Size((k, m)), dtype=torch.bfloat16, config=NVFP4QuantConfig(rowwise=False, columnwise=True),
                        columnwise_data=data, columnwise_scale=scale, columnwise_amax=amax)
    out_t = dq.dequantize_nvfp4(t_col, torch.bfloat16, "columnwise")  # (k, m): transposed store
    assert_same_bits(out_t[:, -64:], ref.nvfp4.dequantize(tail, torch.bfloat16, "rowwise").t())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", OUT_DTYPES)
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("layout", ["compact", "swizzled"])
@pytest.mark.parametrize("q_shape", [(8192, 8192), (4104, 3088)])
def test_gpu_columnwise(q_shape, layout, per_token, dtype):
    """The transposing kernel on the benchmark's shape and on one with partial row and word tiles,
    random bytes (NaN scales included)."""
    t, _ = _random_tensor(*q_shape, layout, per_token, 448.0, seed=18, device="cuda")
    out = torch.empty(q_shape[::-1], dtype=dtype, device="cuda")
    dq.launch_nvfp4_dequantize(t.rowwise_data, t.rowwise_scale, t.rowwise_amax, out, scale_layout=layout,
                               e4m3_max=448.0, transpose=True)
    assert_same_bits(out, ref.nvfp4.dequantize(t, dtype, "rowwise").t(), nan_equal=True)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    q = nvfp4lab.quantize_nvfp4(_x(256, 512, seed=14, device="cuda"), columnwise=True, scale_layout="swizzled", backend="ref")
    dq.dequantize_nvfp4(q, torch.bfloat16, "columnwise")  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dq.dequantize_nvfp4(q, torch.bfloat16, "columnwise")
    out.fill_(0)
    graph.replay()
    torch.cuda.synchronize()
    assert_same_bits(out, ref.nvfp4.dequantize(q, torch.bfloat16, "columnwise"))
