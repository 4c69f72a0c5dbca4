"""Launch choices of the NVFP4 quantize kernels, in one place: which cast kernel runs a recipe and in how
many launches, tiles and num_warps, the register cap, tiles per amax program, and the constexpr dicts
the launchers take.

Every choice is a default: the ``*_meta`` builders take explicit ``block_m`` / ``block_k`` /
``num_warps`` (0: the default here), which tests use to force masked tiles on small shapes. Any tile
gives the same bits; the defaults are the fastest of ``benchmarks/quantize.py --tile-sweep`` at
8192x8192 bf16 (figures in benchmarks/RESULTS.md). Register pressure, not memory bandwidth, decides:
smaller per-thread footprints win for every kernel that produces columnwise blocks.
"""
from __future__ import annotations

from ...layout import cdiv, next_power_of_2
from ..launch import LAUNCH_OPTIONS, interpreting
from .amax import AMAX_NONE, AMAX_PER_TOKEN, AMAX_PER_TOKEN_RHT, AMAX_TENSOR, AMAX_TENSOR_RHT

# (BLOCK_M, BLOCK_K, num_warps) of the amax passes: per tensor, with a per-token output, post-RHT
AMAX_TILE = (64, 128, 8)
AMAX_PER_TOKEN_TILE = (32, 64, 2)
AMAX_RHT_TILE = (16, 128, 4)
# amax_rht_col_kernel (the per-tensor post-RHT amax of bf16 x, M % 16 == 0): (16-row groups per program, num_warps; one
# word column of two bf16 per thread), and the programs a launch keeps by taking fewer groups per program on small
# tensors (each program's groups run one after another)
AMAX_RHT_COL_TILE = (8, 4)
AMAX_RHT_COL_MIN_PROGRAMS = 1024
# the post-RHT amax's block-diagonal dot takes one 16-row group per tile row block: a wider one would multiply
# the zeros off its diagonal blocks by the tile, and an inf element would make the amax 0 * inf = NaN
RHT_MAX_BLOCK_M = 16
# four_over_six_kernel: cast16_kernel's layout (one 16-row group x 128 columns per one-warp program)
FOUR_OVER_SIX_BLOCK_K, FOUR_OVER_SIX_WARPS = 128, 1
# four_over_six_1x16_kernel (1x16 4over6 of bf16 input, one output per launch, whole blocks per thread): rowwise
# (BLOCK_M rows, blocks per program, num_warps); columnwise num_warps (a word column of two bf16 per thread)
FOUR_OVER_SIX_ROW_TILE = (4, 8, 1)
FOUR_OVER_SIX_COL_WARPS = 1
# eager row+col casts take it from this size on: below, the second launch's host time outweighs the GPU time saved
FOUR_OVER_SIX_1X16_MIN_ELEMENTS = 1 << 22
FOUR_OVER_SIX_COL_GROUPS = 2  # 16-row groups per columnwise program (a column's 2 blocks: one 16-byte store)
# cast16_kernel: 16-row groups per program of casts with a per-tensor columnwise output without SR (see cast16_tile),
# BLOCK_K, num_warps
CAST16_COL_GROUPS, CAST16_BLOCK_K, CAST16_WARPS = 4, 128, 1
# programs a cast16 launch keeps by taking fewer row groups per program on small tensors: each program's groups
# run one after another, so a few long programs leave the GPU waiting on their latency
CAST16_MIN_PROGRAMS = 1024
CAST16_ROW_MAXNREG = 128
CAST16_ROW_OPERAND_MAXNREG = 168
PT_SCALES_BLOCK, PT_SCALES_WARPS = 1024, 4
# cast_row_kernel (``cast_row_tile``): (elements per program, the widest tile), num_warps, and the tile width where K
# has no power-of-2 divisor as large; per-tensor casts take it from CAST_ROW_MIN_ELEMENTS elements on: below, its
# factor-table launch costs more host time than the kernel saves on the GPU. Per tensor 16 half blocks per lane (more
# bytes in flight); per token, whose per-block divisions need registers, 8
CAST_ROW_TILE, CAST_ROW_PER_TOKEN_TILE, CAST_ROW_WARPS = (8192, 2048), (4096, 4096), 2
# with stochastic rounding (per tensor or per token) 8 half blocks per lane: its Philox rounds and rounding rule
# take more registers and latency per element (benchmarks/RESULTS.md)
CAST_ROW_SR_TILE = (4096, 2048)
# writing the BF16 operand (OPERAND) per tensor without SR, 8 half blocks per lane too: at 16 the four output words of
# each live beside its input words (114 registers against 63; static SASS, sm_90)
CAST_ROW_OPERAND_TILE = (4096, 2048)
CAST_ROW_MASKED_BLOCK_K = 512
CAST_ROW_MIN_ELEMENTS = 1 << 24
# the rowwise launch of a split RHT + SR row+col cast (``split_cast``) takes cast_row_kernel from this size on: its
# factor table is made in the launch that makes the columnwise one's, so it adds no launch (the split casts whose
# columnwise launch takes no table would add one: eager calls pay host time for it, benchmarks/RESULTS.md)
CAST_ROW_SPLIT_MIN_ELEMENTS = 1 << 23
# cast_col_kernel: (16-row groups per program, num_warps; one word column of two bf16 per thread); taken from
# CAST_COL_MIN_ELEMENTS elements on (the smallest size timed against cast16_kernel)
CAST_COL_TILE = (2, 4)
CAST_COL_MIN_ELEMENTS = 1 << 19
# cast_rowcol_kernel: (16-row groups per program, columns per program, num_warps; two words of a row per lane), and
# tile rows per band of its program order (``common.banded_order``); per-tensor row+col casts take it from
# CAST_ROWCOL_MIN_ELEMENTS elements on (below, it was slower than cast16_kernel, and its tables launch costs host time)
CAST_ROWCOL_TILE = (2, 512, 4)
CAST_ROWCOL_ROW_BAND = 32
CAST_ROWCOL_MIN_ELEMENTS = 1 << 24
# col_scales_kernel (cast_rowcol's columnwise scales from their staging buffer): (groups, columns, num_warps) per
# program, for the compact / padded layouts and for the swizzled one
COL_SCALES_TILE = (32, 128, 4)
COL_SCALES_SWIZZLED_TILE = (16, 256, 4)
LAYOUT_CODES = {"compact": 0, "padded": 1, "swizzled": 2}



def constexprs(meta: dict) -> dict:
    """The constexpr arguments of a meta dict (without its launch options, ``launch.LAUNCH_OPTIONS``)."""
    return {key: value for key, value in meta.items() if key not in LAUNCH_OPTIONS}


def fit_tile(m: int, k: int, tile: tuple[int, int, int], *, rht: bool = False, block_m: int = 0, block_k: int = 0,
             num_warps: int = 0) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_K, num_warps): ``tile`` with the explicit non-zero choices put in, BLOCK_M at most
    RHT_MAX_BLOCK_M with the RHT dot, both blocks at least 16 and at most the next power of 2 of m, k."""
    bm, bk, warps = block_m or tile[0], block_k or tile[1], num_warps or tile[2]
    if rht:
        bm = min(bm, RHT_MAX_BLOCK_M)
    bm = max(16, min(bm, next_power_of_2(max(m, 1))))
    bk = max(16, min(bk, next_power_of_2(max(k, 1))))
    return bm, bk, warps


# ------------------------------------------------------------------------------------------- amax
def amax_tile(m: int, k: int, *, rht: bool, per_token: bool, block_m: int = 0, block_k: int = 0,
              num_warps: int = 0) -> tuple[int, int, int]:
    """Tile of the amax passes (single and grouped): ``rht`` when the post-RHT amax is asked,
    ``per_token`` when a per-row or per-column amax is."""
    tile = AMAX_RHT_TILE if rht else (AMAX_PER_TOKEN_TILE if per_token else AMAX_TILE)
    return fit_tile(m, k, tile, rht=rht, block_m=block_m, block_k=block_k, num_warps=num_warps)


def amax_steps(m: int, block_m: int, *, per_token: bool) -> int:
    """Tiles (consecutive along M) per program of the amax passes: 4 for per-tensor amaxes (fewer
    same-address atomics), 1 with a per-token output (its atomics are per row and column anyway)."""
    return max(1, min(1 if per_token else 4, cdiv(m, block_m)))


def amax_direct(row_mode: int, col_mode: int, table_e6: float, fresh_scratch: bool = False) -> bool:
    """Whether the amax pass accumulates straight into its (zeroed) outputs, which are not written as tables: where
    every output it computes is per token (the scratch's finalize copy would be a serial tail), or where the launch
    would zero a scratch of its own anyway (``fresh_scratch``: stream capture, a compiled graph's call), so zeroing
    the outputs instead costs the same and saves the ticket and finalize at the pass's end."""
    if table_e6 or (row_mode, col_mode) == (AMAX_NONE,) * 2:
        return False
    return fresh_scratch or (row_mode in (AMAX_NONE, AMAX_PER_TOKEN)
                             and col_mode in (AMAX_NONE, AMAX_PER_TOKEN, AMAX_PER_TOKEN_RHT))


def amax_meta(m: int, k: int, row_mode: int, col_mode: int, rht_sign_mask: int, *, table_e6: float = 0.0,
              block_m: int = 0, block_k: int = 0, num_warps: int = 0, fresh_scratch: bool = False) -> dict:
    """Constexprs and num_warps of ``amax_kernel`` for the amax modes of the two outputs (table_e6 > 0:
    per-token outputs written as the cast's (3, N) tables, for E = table_e6 / 6; DIRECT: see
    :func:`amax_direct`)."""
    rht = col_mode == AMAX_TENSOR_RHT
    per_token = AMAX_PER_TOKEN in (row_mode, col_mode) or col_mode == AMAX_PER_TOKEN_RHT
    bm, bk, warps = amax_tile(m, k, rht=rht, per_token=per_token, block_m=block_m, block_k=block_k,
                              num_warps=num_warps)
    return dict(ROW_MODE=row_mode, COL_MODE=col_mode, TENSOR_AMAX=AMAX_TENSOR in (row_mode, col_mode),
                RHT_MASK=rht_sign_mask, BLOCK_M=bm, BLOCK_K=bk, DOT_BF16=not interpreting(),
                STEPS_M=amax_steps(m, bm, per_token=per_token), TABLE_E6=table_e6,
                DIRECT=amax_direct(row_mode, col_mode, table_e6, fresh_scratch), num_warps=warps,
                enable_fp_fusion=False)


# Per-token tables written by the amax pass's last program (TABLE_E6) instead of a launch of
# pt_scales_kernel: one program computes them serially, so only for small vectors, where the launch and
# allocations it saves cost more than the tail it adds (benchmarks/RESULTS.md: at 8192 x 8192 the serial
# tables cost more GPU time than the separate launch).
AMAX_TABLES_MAX_ENTRIES = 2048


def amax_tables(n_entries: int) -> bool:
    """Whether the amax pass writes the per-token tables of ``n_entries`` row and column amaxes."""
    return n_entries <= AMAX_TABLES_MAX_ENTRIES


def amax_grid(m: int, k: int, meta: dict) -> tuple[int]:
    return (cdiv(m, meta["BLOCK_M"] * meta["STEPS_M"]) * cdiv(k, meta["BLOCK_K"]),)


def use_amax_rht_col(m: int, k: int, row_mode: int, col_mode: int, dtype_bf16: bool, x_aligned: bool) -> bool:
    """Whether the amax pass runs ``amax_rht_col_kernel``: the per-tensor post-RHT amax, alone or with x's per-tensor
    amax, of bf16 x, 16-byte aligned (read as int32 words), M a multiple of 16."""
    return (col_mode == AMAX_TENSOR_RHT and row_mode in (AMAX_NONE, AMAX_TENSOR) and dtype_bf16 and x_aligned
            and m % 16 == 0 and k % 2 == 0)


def amax_rht_col_meta(m: int, k: int, row_mode: int, rht_sign_mask: int, *, block_m: int = 0, block_k: int = 0,
                      num_warps: int = 0, fresh_scratch: bool = False) -> dict:
    """Constexprs and num_warps of ``amax_rht_col_kernel`` (block_m: 16 * the row groups per program; block_k: the
    tile's columns, BLOCK_C = block_k / 2 words; by default one word column per thread; DIRECT: see
    :func:`amax_direct`)."""
    warps = num_warps or AMAX_RHT_COL_TILE[1]
    block_c = next_power_of_2(block_k // 2) if block_k else 32 * warps
    block_c = max(8, min(block_c, next_power_of_2(max(k // 2, 1))))
    groups, col_programs = cdiv(m, 16), cdiv(k // 2, block_c)
    if block_m:
        steps = block_m // 16
    else:
        steps = AMAX_RHT_COL_TILE[0]
        while steps > 1 and cdiv(groups, steps) * col_programs < AMAX_RHT_COL_MIN_PROGRAMS:
            steps //= 2
    steps = max(1, min(steps, groups))
    return dict(ROW_MODE=row_mode, RHT_MASK=rht_sign_mask, BLOCK_C=block_c, STEPS=steps, HW=not interpreting(),
                DIRECT=amax_direct(row_mode, AMAX_TENSOR_RHT, 0.0, fresh_scratch), num_warps=warps,
                enable_fp_fusion=False)


def amax_rht_col_grid(m: int, k: int, meta: dict) -> tuple[int]:
    return (cdiv(cdiv(m, 16), meta["STEPS"]) * cdiv(k // 2, meta["BLOCK_C"]),)


# ------------------------------------------------------------------------------------------- cast
def use_cast16(four_over_six) -> bool:
    """Whether a recipe's cast runs ``cast16_kernel`` (every recipe without 4over6, RHT and SR ones
    included) rather than ``four_over_six_kernel``."""
    return not four_over_six


# Elements from which a row+col SR or RHT cast runs as two launches (``split_cast``), by recipe: in eager calls
# (below, the GPU time the split saves is smaller than the host time of the second launch) and in CUDA-graph
# capture (a replay launches nothing from the host; below, the split was slower on the GPU or not measured)
SPLIT_CAST_MIN_ELEMENTS = {"rht": 1 << 24, "rht_sr": 1 << 24, "sr": 1 << 24}
SPLIT_CAST_MIN_ELEMENTS_GRAPHED = {"rht": 1 << 19, "rht_sr": 1 << 21, "sr": 1 << 24}


# Elements of a GEMM's A operand (M x K) from which a cast with BF16 operand outputs (``ROW_OPERAND`` /
# ``COL_OPERAND``) is used in place of a packed cast plus the GEMM's expansion: it writes 4x the bytes of a
# packed one and saves one expansion pass, which pays only on large tensors (benchmarks/RESULTS.md).
OPERAND_CAST_MIN_ELEMENTS = 1 << 26
# The same for a Linear forward's x (the fprop GEMM's A), whose cast runs beside W's on the side stream of a captured
# graph below OPERAND_CAST_MIN_ELEMENTS (functional.linear): it pays from here on (benchmarks/RESULTS.md)
FPROP_OPERAND_CAST_MIN_ELEMENTS = 1 << 25
# The same for the rowwise operand of a stochastically rounded cast with an RHT columnwise copy (TE's gradient recipe):
# its split cast's rowwise launch, ``cast_row_kernel`` from CAST_ROW_SPLIT_MIN_ELEMENTS on, writes the operand in
# about 5 more instructions per element (OPERAND) than its packed codes (benchmarks/RESULTS.md)
SR_ROW_OPERAND_MIN_ELEMENTS = CAST_ROW_SPLIT_MIN_ELEMENTS


def operand_cast_pays(m: int, k: int, fprop: bool = False, sr_rows: bool = False) -> bool:
    """Whether casting an (m, k) GEMM operand as BF16 values beats a packed cast plus its expansion (``fprop``: x's
    operand for a Linear forward, W's cast beside it; ``sr_rows``: the rowwise operand of an SR cast with an RHT
    columnwise copy)."""
    if sr_rows:
        return m * k >= SR_ROW_OPERAND_MIN_ELEMENTS
    return m * k >= (FPROP_OPERAND_CAST_MIN_ELEMENTS if fprop else OPERAND_CAST_MIN_ELEMENTS)


def split_cast(m: int, k: int, rowwise: bool, columnwise: bool, block_2d: bool, rht: bool,
               stochastic_rounding: bool, four_over_six, grouped: bool, graphed: bool = False) -> bool:
    """Whether a row+col cast runs as two launches (rowwise only, then columnwise only: ``cast16_kernel``,
    or ``cast_row_kernel`` / ``cast_col_kernel`` where ``use_cast_row`` / ``use_cast_col`` take that side) instead
    of one. Same bits either
    way (each output's codes and random bytes depend only on its own position); with SR or RHT the two
    lighter kernels (fewer registers each) are faster on the GPU than the one that does both, from
    ``SPLIT_CAST_MIN_ELEMENTS[recipe]`` elements on (``graphed``: a launch captured into a CUDA graph,
    ``SPLIT_CAST_MIN_ELEMENTS_GRAPHED``), while plain, per-token and 16x16 casts (whose columnwise copy
    reuses the rowwise codes) keep one launch. The grouped cast always takes one."""
    if not (rowwise and columnwise) or grouped or not use_cast16(four_over_six) or block_2d:
        return False
    recipe = ("rht_sr" if stochastic_rounding else "rht") if rht else ("sr" if stochastic_rounding else None)
    if recipe is None:
        return False
    return m * k >= (SPLIT_CAST_MIN_ELEMENTS_GRAPHED if graphed else SPLIT_CAST_MIN_ELEMENTS)[recipe]


def cast16_tile(m: int, k: int, *, columnwise: bool, per_token: bool, sr: bool, grouped_rht: bool = False,
                block_m: int = 0, block_k: int = 0, num_warps: int = 0, col_operand: bool = False) -> tuple[int, int, int]:
    """(GROUPS, BLOCK_K, num_warps) of ``cast16_kernel``.

    GROUPS (16-row groups per program; block_m / 16 rounded down to 1, 2 or 4 when given): 4 for casts
    with a per-tensor columnwise output without SR, RHT ones included (grouped ones too: each group finds
    its own split), whose (K, M/2) rows then get 32-byte pieces (a full sector) per program; 1 for
    rowwise-only casts (nothing to gain) and for per-token and SR casts (bound by instructions: more
    groups per program did not make them faster), and for grouped RHT casts (``grouped_rht``: whose groups each
    look up their split; one group per program was faster, benchmarks/RESULTS.md). At most the 16-row groups of m,
    rounded up to a power of 2, and by default fewer where 4 would leave under ``CAST16_MIN_PROGRAMS`` programs (the largest of 4, 2
    that keeps them, else 1). A columnwise BF16 operand (``col_operand``) takes 1: each group stores its own
    32-byte pieces."""
    bk = max(16, min(block_k or CAST16_BLOCK_K, next_power_of_2(max(k, 1))))
    if col_operand:
        groups = 1
    elif block_m:
        groups = 4 if block_m >= 64 else (2 if block_m >= 32 else 1)
    elif columnwise and not (per_token or sr or grouped_rht):
        groups = next((g for g in (CAST16_COL_GROUPS, 2) if cdiv(m, 16 * g) * cdiv(k, bk) >= CAST16_MIN_PROGRAMS), 1)
    else:
        groups = 1
    groups = min(groups, next_power_of_2(max(cdiv(m, 16), 1)))
    return groups, bk, num_warps or CAST16_WARPS


def cast16_launch_options(rowwise: bool, columnwise: bool, row_operand: bool = False) -> dict:
    """Launch options of ``cast16_kernel``: a ptxas register cap (``maxnreg``) for rowwise-only casts.

    Uncapped, ptxas gives the one-warp programs 137-255 registers, i.e. 8-14 warps per SM, too few
    to hide the load latency. A rowwise-only cast fits 128 registers without spilling on its
    normal-range path (the rare EXACT path spills). Casts with a columnwise output spill at any cap
    below ~180 and run slower capped, so they stay uncapped. A rowwise BF16 operand output (its decode
    adds live values) takes ``CAST16_ROW_OPERAND_MAXNREG`` instead."""
    cap = (CAST16_ROW_OPERAND_MAXNREG if row_operand else CAST16_ROW_MAXNREG) if rowwise and not columnwise else 0
    return {"maxnreg": cap} if cap and not interpreting() else {}


def cast16_meta(m: int, k: int, rowwise: bool, columnwise: bool, block_2d: bool, per_token: bool, rht_sign_mask: int,
                e4m3_max: float, stochastic_rounding: bool, seed_from_ptr: bool, scale_layout: str, *,
                split_steps: int | None = None, block_m: int = 0, block_k: int = 0, num_warps: int = 0,
                pr3045: bool = False, row_operand: bool = False, col_operand: bool = False) -> dict:
    """Constexprs, num_warps and launch options of ``cast16_kernel`` (rht_sign_mask < 0: no RHT;
    split_steps: the grouped cast, 2^split_steps >= its number of splits; pr3045: PR 3045's numerics).
    REUSE_2D (16x16 row+col, per tensor, no SR): the columnwise copy takes the rowwise codes when both
    outer amaxes are equal. row_operand / col_operand: that side (when cast) as the BF16 GEMM operand."""
    col_operand = col_operand and columnwise
    groups, bk, warps = cast16_tile(m, k, columnwise=columnwise, per_token=per_token, sr=stochastic_rounding,
                                    grouped_rht=split_steps is not None and rht_sign_mask >= 0, block_m=block_m,
                                    block_k=block_k, num_warps=num_warps, col_operand=col_operand)
    meta = dict(
        ROWWISE=rowwise, COLWISE=columnwise, BLOCK_2D=block_2d, PER_TOKEN=per_token, E6=6.0 * e4m3_max,
        SR=stochastic_rounding, SEED_FROM_PTR=seed_from_ptr, LAYOUT=LAYOUT_CODES[scale_layout], BLOCK_K=bk,
        GROUPED=split_steps is not None, SPLIT_STEPS=split_steps or 0,
        RHT=rht_sign_mask >= 0 and columnwise, RHT_MASK=max(rht_sign_mask, 0),
        REUSE_2D=(block_2d and rowwise and columnwise and not stochastic_rounding and not per_token
                  and rht_sign_mask < 0),
        PR3045=pr3045, GROUPS=groups, ROW_OPERAND=row_operand and rowwise, COL_OPERAND=col_operand,
        HW=not interpreting(), num_warps=warps, enable_fp_fusion=False,
    )
    meta.update(cast16_launch_options(rowwise, columnwise, meta["ROW_OPERAND"]))
    return meta


def cast16_grid(m: int, k: int, meta: dict) -> tuple[int]:
    return (cdiv(cdiv(m, 16), meta["GROUPS"]) * cdiv(k, meta["BLOCK_K"]),)


def four_over_six_meta(m: int, k: int, rowwise: bool, columnwise: bool, block_2d: bool, per_token: bool,
                       four_over_six: int, e4m3_max: float, scale_layout: str, *, split_steps: int | None = None,
                       block_m: int = 0, block_k: int = 0, num_warps: int = 0) -> dict:
    """Constexprs and num_warps of ``four_over_six_kernel`` (four_over_six: 1 MAE, 2 MSE). Its tiles are
    always 16 rows (``block_m`` is ignored, as for ``cast16_kernel``)."""
    bk = max(16, min(block_k or FOUR_OVER_SIX_BLOCK_K, next_power_of_2(max(k, 1))))
    warps = num_warps or FOUR_OVER_SIX_WARPS
    return dict(
        ROWWISE=rowwise, COLWISE=columnwise, BLOCK_2D=block_2d, PER_TOKEN=per_token, FOUR_OVER_SIX=four_over_six,
        E6=6.0 * e4m3_max, LAYOUT=LAYOUT_CODES[scale_layout], BLOCK_K=bk,
        GROUPED=split_steps is not None, SPLIT_STEPS=split_steps or 0, num_warps=warps, enable_fp_fusion=False,
    )


def four_over_six_grid(m: int, k: int, meta: dict) -> tuple[int]:
    return (cdiv(m, 16) * cdiv(k, meta["BLOCK_K"]),)


def use_four_over_six_1x16(m: int, k: int, rowwise: bool, columnwise: bool, block_2d: bool, grouped: bool,
                           dtype_bf16: bool, x_aligned: bool, graphed: bool = False) -> bool:
    """Whether a 4over6 cast runs ``four_over_six_1x16_kernel`` (one launch per output): 1x16 blocks (per tensor
    or per token), not grouped, bf16 x 16-byte aligned (read as int32 words), K % 16 == 0, and M % 16 == 0 with a
    columnwise output; a row+col cast (two launches where ``four_over_six_kernel`` takes one) in eager calls from
    ``FOUR_OVER_SIX_1X16_MIN_ELEMENTS`` elements on, inside a CUDA-graph capture (no host time per launch) at any
    size. Other 4over6 casts run ``four_over_six_kernel``."""
    if rowwise and columnwise and not graphed and m * k < FOUR_OVER_SIX_1X16_MIN_ELEMENTS:
        return False
    return not block_2d and not grouped and dtype_bf16 and x_aligned and k % 16 == 0 and (m % 16 == 0 or not columnwise)


def four_over_six_1x16_meta(m: int, k: int, columnwise: bool, per_token: bool, four_over_six: int, e4m3_max: float,
                            scale_layout: str, *, block_m: int = 0, block_k: int = 0, num_warps: int = 0) -> dict:
    """Constexprs and num_warps of ``four_over_six_1x16_kernel`` for its rowwise or (``columnwise``) columnwise
    output; ``block_k``: the tile's columns (rowwise BLOCK_W = block_k / 16 blocks, columnwise block_k / 2 word
    columns), ``block_m`` the rowwise tile's rows (columnwise: its 16-row groups, 1, 2 or 4)."""
    if columnwise:
        warps = num_warps or FOUR_OVER_SIX_COL_WARPS
        groups = (4 if block_m >= 64 else (2 if block_m >= 32 else 1)) if block_m else FOUR_OVER_SIX_COL_GROUPS
        groups = min(groups, next_power_of_2(max(m // 16, 1)))
        bm, bw = 16 * groups, min(block_k // 2 if block_k else 32 * warps, next_power_of_2(max(k // 2, 1)))
    else:
        bm, bk, warps = FOUR_OVER_SIX_ROW_TILE
        bm, bw, warps = block_m or bm, (block_k // 16 if block_k else bk), num_warps or warps
        bm, bw = min(bm, next_power_of_2(max(m, 1))), min(bw, next_power_of_2(max(k // 16, 1)))
    return dict(COLUMNWISE=columnwise, PER_TOKEN=per_token, FOUR_OVER_SIX=four_over_six, E6=6.0 * e4m3_max,
                LAYOUT=LAYOUT_CODES[scale_layout], BLOCK_M=bm, BLOCK_W=max(bw, 1), HW=not interpreting(),
                GROUPS=bm // 16 if columnwise else 1, num_warps=warps,
                enable_fp_fusion=False)


def four_over_six_1x16_grid(m: int, k: int, meta: dict) -> tuple[int]:
    if meta["COLUMNWISE"]:
        return (cdiv(m // 16, meta["GROUPS"]) * cdiv(k // 2, meta["BLOCK_W"]),)
    return (cdiv(m, meta["BLOCK_M"]) * cdiv(k // 16, meta["BLOCK_W"]),)


def use_cast_row(m: int, k: int, rowwise: bool, columnwise: bool, block_2d: bool, per_token: bool, four_over_six,
                 stochastic_rounding: bool, grouped: bool, pr3045: bool, dtype_bf16: bool, x_aligned: bool,
                 split: bool = False, tables_shared: bool = False) -> bool:
    """Whether a rowwise-only cast runs ``cast_row_kernel`` (cast_row.py): the 1x16 cast of bf16 input with TE main's
    numerics, stochastically rounded or not (RHT only touches columnwise outputs), x 16-byte aligned (read as int32
    words), K % 16 == 0; from ``CAST_ROW_MIN_ELEMENTS`` elements on; per token without SR at any size (its tables
    launch either way); the rowwise launch of a split row+col cast (``split``) only where its factor table comes
    with the columnwise launch's (``tables_shared``: RHT + SR), from ``CAST_ROW_SPLIT_MIN_ELEMENTS`` elements on.
    Everything else runs ``cast16_kernel`` / ``four_over_six_kernel``."""
    if not (rowwise and not columnwise and not block_2d and not four_over_six and not grouped and not pr3045
            and dtype_bf16 and x_aligned and k % 16 == 0):
        return False
    if split:
        return tables_shared and m * k >= CAST_ROW_SPLIT_MIN_ELEMENTS
    return (per_token and not stochastic_rounding) or m * k >= CAST_ROW_MIN_ELEMENTS


def cast_row_meta(m: int, k: int, scale_layout: str, per_token: bool, e4m3_max: float,
                  stochastic_rounding: bool = False, seed_from_ptr: bool = False, *, block_m: int = 0,
                  block_k: int = 0, num_warps: int = 0, operand: bool = False) -> dict:
    """Constexprs and num_warps of ``cast_row_kernel`` (block_k: the tile's columns, KB = block_k / 16; any of
    them 0: ``cast_row_tile``'s). With stochastic rounding BLOCK_M is at least 2 (the kernel takes rows in pairs).
    ``operand``: the BF16 GEMM operand output (OPERAND)."""
    bm, bk, warps = cast_row_tile(m, k, per_token, stochastic_rounding, operand)
    bm, bk, warps = block_m or bm, block_k or bk, num_warps or warps
    bm, bk = min(bm, next_power_of_2(max(m, 1))), max(16, min(bk, next_power_of_2(max(k, 1))))
    if stochastic_rounding:
        bm = max(bm, 2)
    return dict(LAYOUT=LAYOUT_CODES[scale_layout], BLOCK_M=bm, KB=bk // 16, HW=not interpreting(), PER_TOKEN=per_token,
                E6=6.0 * e4m3_max, EVEN=m % bm == 0 and (k // 16) % (bk // 16) == 0, SR=stochastic_rounding,
                SEED_FROM_PTR=seed_from_ptr, OPERAND=operand, num_warps=warps, enable_fp_fusion=False)


def cast_row_tile(m: int, k: int, per_token: bool, stochastic_rounding: bool = False,
                  operand: bool = False) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_K, num_warps) of ``cast_row_kernel``: a fixed number of elements per program (the recipe's:
    per tensor, per token, stochastic rounding, the operand output), in as few rows as the columns allow (a lane's loads and stores
    along one row differ by constant offsets, where rows apart need their own address each). BLOCK_K is the largest
    power of 2 that divides K, up to the recipe's widest, when it is at least ``CAST_ROW_MASKED_BLOCK_K`` (no column
    masks), else at most that (the last tile masked, little of it idle)."""
    if stochastic_rounding:
        elements, widest = CAST_ROW_SR_TILE
    elif operand and not per_token:
        elements, widest = CAST_ROW_OPERAND_TILE
    else:
        elements, widest = CAST_ROW_PER_TOKEN_TILE if per_token else CAST_ROW_TILE
    bk = min(k & -k, widest) if k > 0 else 16
    if bk < CAST_ROW_MASKED_BLOCK_K:
        bk = min(next_power_of_2(max(k, 16)), CAST_ROW_MASKED_BLOCK_K)
    return max(1, min(elements // bk, next_power_of_2(max(m, 1)))), bk, CAST_ROW_WARPS


def use_cast_col(m: int, k: int, rowwise: bool, columnwise: bool, block_2d: bool, per_token: bool, four_over_six,
                 rht: bool, grouped: bool, pr3045: bool, dtype_bf16: bool, x_aligned: bool) -> bool:
    """Whether a columnwise-only launch runs ``cast_col_kernel`` (cast_col.py): per-tensor 1x16 RHT casts (SR
    or not) of bf16 input into packed codes or the BF16 operand, x 16-byte aligned (read as int32 words), from
    ``CAST_COL_MIN_ELEMENTS`` elements on. Split row+col casts (``split_cast``) take it for their columnwise launch. Without RHT
    ``cast16_kernel``'s four-group columnwise cast is faster (benchmarks/RESULTS.md), so it keeps those."""
    return (columnwise and not rowwise and rht and not block_2d and not per_token and not four_over_six and not grouped
            and not pr3045 and dtype_bf16 and x_aligned and m * k >= CAST_COL_MIN_ELEMENTS)


def cast_col_meta(m: int, k: int, scale_layout: str, rht_sign_mask: int, e4m3_max: float, stochastic_rounding: bool,
                  seed_from_ptr: bool, *, block_m: int = 0, block_k: int = 0, num_warps: int = 0,
                  operand: bool = False) -> dict:
    """Constexprs and num_warps of ``cast_col_kernel`` (rht_sign_mask >= 0; block_m: at most 16 * GROUPS rows, GROUPS the largest
    of 4, 2, 1 that divides m / 16; block_k: the tile's columns, BLOCK_C = block_k / 2 words; by default one
    word column per thread; ``operand``: the BF16 GEMM operand output, OPERAND)."""
    warps = num_warps or CAST_COL_TILE[1]
    groups = block_m // 16 if block_m else CAST_COL_TILE[0]
    groups = next(g for g in (4, 2, 1) if g <= max(groups, 1) and (m // 16) % g == 0)
    block_c = block_k // 2 if block_k else 32 * warps
    block_c = max(8, min(block_c, next_power_of_2(max(k // 2, 1))))
    return dict(LAYOUT=LAYOUT_CODES[scale_layout], BLOCK_C=block_c, GROUPS=groups, HW=not interpreting(),
                RHT_MASK=rht_sign_mask, E6=6.0 * e4m3_max, TABLE=stochastic_rounding, SR=stochastic_rounding,
                SEED_FROM_PTR=seed_from_ptr, OPERAND=operand, num_warps=warps, enable_fp_fusion=False)


def use_cast_rowcol(m: int, k: int, rowwise: bool, columnwise: bool, block_2d: bool, per_token: bool, four_over_six,
                    rht: bool, stochastic_rounding: bool, grouped: bool, pr3045: bool, dtype_bf16: bool,
                    x_aligned: bool, operands: tuple) -> bool:
    """Whether a row+col cast runs ``cast_rowcol_kernel`` (cast_rowcol.py): the per-tensor 1x16 cast of bf16 input
    into both packed copies, round to nearest, without RHT, x 16-byte aligned (read as int32 words), M and K
    multiples of 16, from ``CAST_ROWCOL_MIN_ELEMENTS`` elements on."""
    return (rowwise and columnwise and not block_2d and not per_token and not four_over_six and not rht
            and not stochastic_rounding and not grouped and not pr3045 and not any(operands) and dtype_bf16
            and x_aligned and m % 16 == 0 and k % 16 == 0 and m * k >= CAST_ROWCOL_MIN_ELEMENTS)


def cast_rowcol_meta(m: int, k: int, scale_layout: str, *, block_m: int = 0, block_k: int = 0,
                     num_warps: int = 0) -> dict:
    """Constexprs and num_warps of ``cast_rowcol_kernel`` (block_m: at most 16 * GROUPS rows, GROUPS the largest of
    4, 2, 1 that divides m / 16; block_k: the tile's columns, QB = block_k / 16 row blocks; 0: ``CAST_ROWCOL_TILE``)."""
    groups = block_m // 16 if block_m else CAST_ROWCOL_TILE[0]
    groups = next(g for g in (4, 2, 1) if g <= max(groups, 1) and (m // 16) % g == 0)
    qb = max(1, min((block_k or CAST_ROWCOL_TILE[1]) // 16, next_power_of_2(max(k // 16, 1))))
    return dict(LAYOUT=LAYOUT_CODES[scale_layout], QB=qb, GROUPS=groups, HW=not interpreting(),
                EVEN=(k // 16) % qb == 0, ROW_BAND=CAST_ROWCOL_ROW_BAND, num_warps=num_warps or CAST_ROWCOL_TILE[2],
                enable_fp_fusion=False)


def col_scales_meta(scale_layout: str) -> dict:
    """Constexprs and num_warps of ``col_scales_kernel`` (cast_rowcol.py)."""
    tile = COL_SCALES_SWIZZLED_TILE if scale_layout == "swizzled" else COL_SCALES_TILE
    return dict(LAYOUT=LAYOUT_CODES[scale_layout], BLOCK_G=tile[0], BLOCK_C=tile[1], num_warps=tile[2])


def row_factor_table_meta(e4m3_max: float) -> dict:
    """Constexprs and num_warps of ``row_factor_table_kernel`` (one program of 128 lanes)."""
    return dict(E6=6.0 * e4m3_max, num_warps=4, enable_fp_fusion=False)


def pt_scales_meta(e6: float, pr3045: bool = False) -> dict:
    """Constexprs and num_warps of ``pt_scales_kernel``."""
    return dict(E6=e6, BLOCK=PT_SCALES_BLOCK, PR3045=pr3045, num_warps=PT_SCALES_WARPS, enable_fp_fusion=False)
