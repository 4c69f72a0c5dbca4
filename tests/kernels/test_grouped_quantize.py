"""Grouped (MoE) NVFP4 quantize (kernels/grouped_quantize.py) against ref.nvfp4.quantize_grouped, the
definition (each split quantized alone), bit for bit (SR: exact where the block counters coincide,
statistics elsewhere). ``quantize_grouped`` and ``quantize`` 0xFF-poison the outputs before the kernels
run, so unwritten bytes show."""
import zlib

import pytest
import torch

import nvfp4lab
from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.kernels import grouped_quantize as gq
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.kernels.nvfp4_quantize_details import cast16 as cast16_module
from nvfp4lab.kernels.nvfp4_quantize_details import pt_scales as pt_scales_module
from nvfp4lab.ref import nvfp4 as ref_nvfp4
from nvfp4lab.rht import DEFAULT_RHT_SIGN_MASK, apply_rht

from .kernel_checks import assert_same_bits, record_launches, rht_exact_input
from .test_nvfp4_amax import blocks_input
from .test_nvfp4_quantize import DEV, make_input

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
PARTS = [f"{side}_{part}" for side in ("rowwise", "columnwise") for part in ("data", "scale", "amax")]


def quantize_grouped(x, offsets, config, **kwargs):
    """``gq.quantize_grouped`` with its outputs 0xFF-poisoned (group splits -1) before the kernels run."""
    return gq.quantize_grouped(x, offsets, config, poison=True, **kwargs)


def offsets_of(sizes, device=DEV):
    return torch.cumsum(torch.tensor([0] + list(sizes), dtype=torch.int64), 0).to(device)


def assert_same_grouped(got, want, context=""):
    assert torch.equal(got.split_offsets.cpu(), want.split_offsets.cpu())
    for name in PARTS:
        a, b = getattr(got, name), getattr(want, name)
        if b is None:
            assert a is None, f"{context} {name}: expected none"
            continue
        assert a.shape == b.shape and a.dtype == b.dtype, f"{context} {name}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        if a.dtype == torch.float32:  # bit equality, NaN included
            a, b = a.view(torch.int32), b.view(torch.int32)
        a, b = a.cpu(), b.cpu()
        if not torch.equal(a, b):
            raise AssertionError(f"{context} {name}: {(a != b).sum().item()} of {a.numel()} differ")


RECIPES = {
    "1x16-row": dict(rowwise=True),
    "1x16-rowcol": dict(rowwise=True, columnwise=True),
    "1x16-col": dict(rowwise=False, columnwise=True),
    "16x16-rowcol": dict(block="16x16", rowwise=True, columnwise=True),
    "pertoken-rowcol": dict(per_token=True, rowwise=True, columnwise=True),
    "pertoken-row": dict(per_token=True, rowwise=True),
    "rht-rowcol": dict(rht=True, rowwise=True, columnwise=True),
    "4o6-mae-256-rowcol": dict(four_over_six="mae", e4m3_max=256, rowwise=True, columnwise=True),
    "4o6-mse-16x16-rowcol": dict(four_over_six="mse", block="16x16", rowwise=True, columnwise=True),
    "4o6-pertoken-mse-row": dict(four_over_six="mse", per_token=True, rowwise=True),
}
# split sizes in rows; multiples of 16 where a columnwise or 16x16 output exists
SPLITS16 = {
    "uneven": [48, 16, 80, 32],
    "zero-front-mid-end": [0, 32, 0, 48, 16, 0],
    "all-zero-but-one": [0, 0, 64, 0],
    "single": [96],
    # with 32-row tiles the amax pass covers 128 rows a program: rows 128-255 lie in one split (maxima
    # carried across tiles), the programs around them straddle splits
    "long": [16, 256, 0, 32],
}
SPLITS_ANY = {"uneven-any": [5, 0, 37, 1, 21], "tiny": [1, 2, 3, 0, 10], "long-any": [3, 300, 0, 13]}


def _needs16(kwargs):
    return kwargs.get("columnwise", False) or kwargs.get("block") == "16x16"


# tiles straddle splits; 48 columns = a partial K tile
TILE_32X32 = dict(block_m=32, block_k=32, num_warps=4)
CASES = [(r, s) for r in RECIPES for s in list(SPLITS16) + ([] if _needs16(RECIPES[r]) else list(SPLITS_ANY))]


@pytest.mark.parametrize("recipe,splits", CASES)
def test_matches_reference(recipe, splits):
    kwargs = RECIPES[recipe]
    sizes = SPLITS16.get(splits) or SPLITS_ANY[splits]
    config = NVFP4QuantConfig(**kwargs)
    x = make_input(kwargs, (sum(sizes), 48), torch.bfloat16, seed=zlib.crc32(f"{recipe}/{splits}".encode()) % 1000)
    offsets = offsets_of(sizes)
    got = quantize_grouped(x, offsets, config, **TILE_32X32)
    assert_same_grouped(got, ref_nvfp4.quantize_grouped(x, offsets, config), f"{recipe} {splits}")


@pytest.mark.parametrize("tile", [{}, dict(block_m=64)])
@pytest.mark.parametrize("recipe", ["1x16-rowcol", "pertoken-rowcol", "1x16-row"])
def test_many_experts(recipe, tile):
    """70 experts (binary search over 128 slots), a third of them empty, default tiles and four 16-row groups per
    program (each group finds its own split)."""
    kwargs = RECIPES[recipe]
    g = torch.Generator().manual_seed(7)
    sizes = [int(v) * 16 for v in torch.randint(0, 3, (70,), generator=g)]
    if not _needs16(kwargs):
        sizes = [s + int(v) for s, v in zip(sizes, torch.randint(0, 3, (70,), generator=g))]
    config = NVFP4QuantConfig(**kwargs)
    x = make_input(kwargs, (sum(sizes), 32), torch.bfloat16, seed=11)
    offsets = offsets_of(sizes)
    assert_same_grouped(quantize_grouped(x, offsets, config, **tile), ref_nvfp4.quantize_grouped(x, offsets, config), recipe)


@pytest.mark.parametrize("kwargs", [dict(rowwise=True, columnwise=True), dict(rowwise=True, per_token=True)])
def test_zero_total_rows(kwargs):
    config = NVFP4QuantConfig(**kwargs)
    x = torch.zeros(0, 32, dtype=torch.bfloat16, device=DEV)
    offsets = offsets_of([0, 0, 0])
    assert_same_grouped(quantize_grouped(x, offsets, config), ref_nvfp4.quantize_grouped(x, offsets, config))


def test_special_values_per_split():
    """NaN / inf / zero splits keep their own amaxes (one bad expert does not poison the others)."""
    config = NVFP4QuantConfig(rowwise=True, columnwise=True)
    sizes = [16, 16, 16, 16]
    x = make_input({}, (64, 32), torch.float32, seed=5)
    x[0, 3] = float("nan")
    x[20, 7] = float("inf")
    x[32:48] = 0.0
    offsets = offsets_of(sizes)
    assert_same_grouped(quantize_grouped(x, offsets, config), ref_nvfp4.quantize_grouped(x, offsets, config))


PT_SPLITS = ["uneven", "zero-front-mid-end", "long", "uneven-any", "long-any"]


@pytest.mark.parametrize("recipe,splits", [(r, s) for r, s in CASES if r in ("pertoken-rowcol", "pertoken-row") and s in PT_SPLITS])
def test_pertoken_tables_grouped(recipe, splits, monkeypatch):
    """The grouped per-token cast reads per-row (M,) and per-(split, column) (n, K) tables, filled by one
    launch before the cast."""
    casts = record_launches(monkeypatch, cast16_module, "cast16_kernel")
    tables = record_launches(monkeypatch, pt_scales_module, "pt_scales_kernel")
    test_matches_reference(recipe, splits)
    assert casts and all(call["PER_TOKEN"] and call["GROUPED"] for call in casts)
    assert len(tables) == len(casts) == 1


@pytest.mark.parametrize("recipe", ["pertoken-rowcol", "pertoken-row"])
def test_pertoken_tables_grouped_extreme_splits(recipe, monkeypatch):
    """Per-token amaxes outside the normal range in some splits only (fp32: the interpreter mishandles
    bf16 subnormals): a tiny split and a huge split (their (split, column) amaxes take the EXACT path,
    the other splits' the fast one), zero, tiny and huge rows, an empty split."""
    sizes = [32, 16, 0, 48, 16]
    x = make_input({}, (sum(sizes), 48), torch.float32, seed=31)
    x[32:48] *= 1e-35  # split 1
    x[50] = 0.0  # split 3: a zero, a tiny and a range-end row
    x[52] *= 1e-36
    x[60] *= 2.0**-100 / x[60].abs().max()
    x[96:112] *= 1e35  # split 4
    x[5, 7] = float("inf")
    config = NVFP4QuantConfig(**RECIPES[recipe])
    offsets = offsets_of(sizes)
    casts = record_launches(monkeypatch, cast16_module, "cast16_kernel")
    got = quantize_grouped(x.to(DEV), offsets, config, block_k=32, num_warps=1)  # 48 columns: a half-full last K tile
    assert_same_grouped(got, ref_nvfp4.quantize_grouped(x.to(DEV), offsets, config), recipe)
    assert casts and all(call["PER_TOKEN"] and call["BLOCK_K"] == 32 for call in casts)


def test_sr_first_split_matches_single_op():
    """SR block counters are bulk block indices: split 0 (and a lone split) get the single op's bits for
    the same seed; the other splits are stochastic roundings onto the same grid (neighbours of x/s)."""
    config = NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True)
    sizes = [32, 0, 48]
    x = make_input(dict(rht=True), (80, 32), torch.bfloat16, seed=9)
    got = quantize_grouped(x, offsets_of(sizes), config, seed=1234)
    parts = got.split(sizes)
    single = kq.quantize(x[:32], config, seed=1234, poison=True)
    for name in PARTS:
        a, b = getattr(parts[0], name), getattr(single, name)
        assert torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8)), name
    # split 2: scales and amaxes are those of round-to-nearest (SR changes only the codes)
    rn = ref_nvfp4.quantize(x[32:], NVFP4QuantConfig(rowwise=True, columnwise=True, rht=True))
    for name in ("rowwise_scale", "columnwise_scale", "rowwise_amax", "columnwise_amax"):
        assert torch.equal(getattr(parts[2], name).cpu().view(torch.uint8), getattr(rn, name).cpu().view(torch.uint8)), name


def test_ops_bulk_triton_backend_and_device_offsets():
    x = make_input({}, (80, 32), torch.bfloat16, seed=13)
    sizes = [16, 0, 64]
    want = nvfp4lab.ops.quantize_nvfp4_grouped_bulk(x, sizes, rowwise=True, columnwise=True, backend="ref")
    for sections in (sizes, torch.tensor(sizes, device=DEV)):
        got = nvfp4lab.ops.quantize_nvfp4_grouped_bulk(x, sections, rowwise=True, columnwise=True, backend="triton")
        assert_same_grouped(got, want)


def test_custom_op_opcheck_and_passes():
    """The one custom op (traced calls): opcheck's schema and fake tensors for a row+col, a per-token and a
    rowwise-only config; the passes alone: the amax pass's split of each 16-row group."""
    x = make_input({}, (48, 32), torch.bfloat16, seed=14)
    offsets = offsets_of([16, 0, 32])
    for fields in (("1x16", True, True, False, True, 0xD7E8, None, 448.0, True, "te_main"),
                   ("1x16", True, True, True, False, 0, None, 448.0, False, "te_main"),
                   ("16x16", True, False, False, False, 0, None, 448.0, False, "te_main")):
        torch.library.opcheck(gq.nvfp4_grouped_quantize.op, (x, offsets, None, 3, *fields),
                              test_utils=("test_schema", "test_faketensor"))
    ra, ca, group_split = gq.grouped_amax(x, offsets, 1, 1, 0)
    assert group_split.tolist() == [0, 2, 2]
    got = gq.grouped_cast(x, offsets, group_split, ra, ca, None, 3, True, True, False, False, -1, 0, 448.0, True)
    want = quantize_grouped(x, offsets, NVFP4QuantConfig(rowwise=True, columnwise=True, stochastic_rounding=True,
                                                         scale_layout="compact"), seed=3)
    assert all(torch.equal(a, b) for a, b in zip(got, (want.rowwise_data, want.rowwise_scale, want.columnwise_data,
                                                       want.columnwise_scale)))


# ------------------------------------------------------------- per-split post-RHT amax (word columns)
def reference_split_amaxes(x, sizes, mask):
    """Per split: (max |x|, max |bf16(RHT(x^T))|) as fp32 (n,) tensors on the CPU (0 for an empty split); and the
    split of each 16-row group (the split that owns its first row)."""
    x = x.cpu()
    rows, cols, owner = [], [], []
    start = 0
    for s, size in enumerate(sizes):
        part = x[start:start + size]
        rows.append(part.float().abs().amax() if size else torch.tensor(0.0))
        cols.append(apply_rht(part.t().contiguous(), mask).float().abs().amax() if size else torch.tensor(0.0))
        owner += [s] * (size // 16)
        start += size
    return torch.stack(rows), torch.stack(cols), torch.tensor(owner, dtype=torch.int32)


def assert_split_amaxes(x, sizes, row_mode, context, tile=None, mask=DEFAULT_RHT_SIGN_MASK):
    launches = []
    with pytest.MonkeyPatch.context() as mp:
        record_launches(mp, gq, "_grouped_amax_rht_col_kernel", launches)
        row, col, group_split = gq.grouped_amax(x.to(DEV), offsets_of(sizes), row_mode, gq.G_SPLIT_RHT, mask,
                                                poison=True, **(tile or {}))
    assert len(launches) == 1, f"{context}: _grouped_amax_rht_col_kernel did not run"
    want_row, want_col, want_split = reference_split_amaxes(x, sizes, mask)
    assert_same_bits(col.cpu(), want_col, nan_equal=True)
    if row_mode == gq.G_SPLIT:
        assert_same_bits(row.cpu(), want_row, nan_equal=True)
    assert torch.equal(group_split.cpu(), want_split), context


RHT_SPLITS = dict(SPLITS16, experts=[int(v) * 16 for v in torch.randint(0, 4, (70,), generator=torch.Generator().manual_seed(5))])


@pytest.mark.parametrize("splits", list(RHT_SPLITS))
@pytest.mark.parametrize("tile", [{}, dict(block_m=32), dict(block_m=48, block_k=32, num_warps=1)])
@pytest.mark.parametrize("row_mode", [gq.G_NONE, gq.G_SPLIT])
def test_split_rht_amax_matches_reference(splits, tile, row_mode):
    """Programs inside one split and straddling splits (empty ones too), groups past M in the last program (3 groups
    per program), columns past K / 2."""
    sizes = RHT_SPLITS[splits]
    x = blocks_input(sum(sizes), 96, seed=zlib.crc32(splits.encode()) % 1000)
    assert_split_amaxes(x, sizes, row_mode, f"{splits} {tile}", tile)


@pytest.mark.parametrize("tile", [{}, dict(block_m=48, block_k=32, num_warps=1)])
def test_split_rht_amax_special_values(tile):
    """NaN, inf and sums past bf16's range each in one split: the other splits keep their own amaxes."""
    sizes = [32, 16, 48, 0, 32]
    x = rht_exact_input(128, 64, seed=8)
    x[40, 5] = float("nan")
    x[64, 63] = float("-inf")
    x[96:112, 6] = 3.3895e38
    x[0:16] = 0.0
    x[16:32] = -0.0
    assert_split_amaxes(x, sizes, gq.G_SPLIT, f"special {tile}", tile)


@pytest.mark.parametrize("kwargs,dtype,takes_it", [
    (dict(rowwise=True, columnwise=True, rht=True), torch.bfloat16, True),
    (dict(rowwise=False, columnwise=True, rht=True, stochastic_rounding=True), torch.bfloat16, True),
    (dict(rowwise=True, columnwise=True, rht=True), torch.float32, False),
    (dict(rowwise=True, columnwise=True, rht=True, per_token=True, numerics="te_pr3045"), torch.bfloat16, False),
])
def test_which_grouped_passes_take_the_rht_amax(kwargs, dtype, takes_it, monkeypatch):
    launches = record_launches(monkeypatch, gq, "_grouped_amax_rht_col_kernel")
    sizes = [32, 0, 48]
    x = rht_exact_input(80, 64, seed=4).to(dtype)
    config = NVFP4QuantConfig(**kwargs)
    got = quantize_grouped(x.to(DEV), offsets_of(sizes), config, seed=5)
    assert bool(launches) == takes_it
    want = ref_nvfp4.quantize_grouped(x, offsets_of(sizes, "cpu"), config)
    assert_same_bits(got.columnwise_amax.cpu(), want.columnwise_amax)


# ----------------------------------------------------------------------------------------- GPU
gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_gpu_matches_reference(recipe):
    kwargs = RECIPES[recipe]
    g = torch.Generator().manual_seed(21)
    sizes = [int(v) * 16 for v in torch.randint(0, 40, (64,), generator=g)]
    sizes[0] = sizes[10] = sizes[-1] = 0
    config = NVFP4QuantConfig(**kwargs)
    x = make_input(kwargs, (sum(sizes), 1024), torch.bfloat16, seed=22, device="cuda")
    offsets = offsets_of(sizes, "cuda")
    assert_same_grouped(quantize_grouped(x, offsets, config), ref_nvfp4.quantize_grouped(x, offsets, config), recipe)


@gpu
def test_gpu_256_experts_cuda_graph():
    """256 experts, offsets changed in place between graph replays (no host sync, no recapture)."""
    config = NVFP4QuantConfig(rowwise=True, columnwise=True)
    x = make_input({}, (256 * 32, 512), torch.bfloat16, seed=23, device="cuda")
    offsets = offsets_of([32] * 256, "cuda")
    quantize_grouped(x, offsets, config)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = quantize_grouped(x, offsets, config)
    g = torch.Generator().manual_seed(24)
    for _ in range(2):
        sizes = [int(v) * 16 for v in torch.randint(0, 5, (256,), generator=g)]
        sizes[-1] += 256 * 32 - sum(sizes)
        if sizes[-1] < 0:
            continue
        offsets.copy_(offsets_of(sizes, "cuda"))
        graph.replay()
        assert_same_grouped(out, ref_nvfp4.quantize_grouped(x, offsets, config))


@pytest.mark.parametrize("name", ["1x16-rowcol", "pertoken-rowcol", "4o6-mae-256-rowcol", "16x16-rowcol", "rht-rowcol"])
@pytest.mark.parametrize("offsets", [[0, 48, 200], [0, 64, 16], [16, 32, 64], [0, -32, 64]],
                         ids=["past_m", "decreasing", "not_from_0", "negative"])
def test_unchecked_device_offsets_never_write_outside_the_outputs(name, offsets):
    """Device offsets are not read on the host (a sync): offsets that are not the splits' (0..M,
    nondecreasing) give unspecified bytes, but every kernel write stays inside the output buffers. The
    cast writes here into views of guarded buffers whose guard bytes must come back untouched."""
    from nvfp4lab.kernels.grouped_quantize import split_steps_of
    from nvfp4lab.kernels.nvfp4_quantize_details.cast import FOUR_OVER_SIX_CODES, launch_cast

    m, k = 64, 32
    config = NVFP4QuantConfig(**RECIPES[name])
    x = make_input(RECIPES[name], (m, k), torch.bfloat16, seed=3)
    offs = torch.tensor(offsets, dtype=torch.int64, device=DEV)
    n = len(offsets) - 1
    row_mode = gq.G_PER_TOKEN if config.per_token else gq.G_SPLIT
    col_mode = gq.G_SPLIT_RHT if config.rht else row_mode
    mask = config.rht_sign_mask if config.rht else -1
    row_amax, col_amax, group_split = gq.grouped_amax(x, offs, row_mode, col_mode, max(mask, 0))
    assert bool(((group_split >= 0) & (group_split < n)).all()), group_split  # every group in some split
    guard = 4096
    buffers = [torch.full((size + 2 * guard,), 0xA5, dtype=torch.uint8, device=DEV)
               for size in (m * k // 2, m * k // 16, k * m // 2, k * m // 16)]
    outputs = [buf[guard:-guard].view(shape) for buf, shape in zip(buffers, [(m, k // 2), (m, k // 16), (k * m // 2,),
                                                                             (k * m // 16,)])]
    launch_cast(x, outputs, row_amax, col_amax, None, 0, True, True, config.block == "16x16", config.per_token, mask,
                FOUR_OVER_SIX_CODES[config.four_over_six], config.e4m3_max, False, "compact", offsets=offs, num_splits=n,
                split_steps=split_steps_of(n), group_split=group_split)
    for buf in buffers:
        assert (buf[:guard] == 0xA5).all() and (buf[-guard:] == 0xA5).all()
