"""The NVFP4 cast of every recipe without 4over6: ``cast16_kernel``, GROUPS 16-row groups x BLOCK_K
columns per program, one after the other (``_cast16_group``), both outputs from one read of x.

Layout: 16-row groups x 128 columns per one-warp program, each laid out so that each thread holds 8 rows of 8
columns, i.e. half of a rowwise and half of a columnwise block, each packing one word of each; the cheaper
encoders, because on Hopper (no E2M1 convert) the instruction count per element bounds the kernel
(``tools/sass_stats.py`` counts them without a GPU): ``_scale_and_factor_fast`` (the block scale by the hardware
E4M3 convert, HW), and for round-to-nearest codes that only get packed, ``_row_words`` / ``_col_words``
(``cast_row``'s ``code_top`` / ``push_code``: a code in the top nibble by one multiply-add, packed by one funnel
shift); casts that reuse or expand the codes, and SR, take ``e2m1_scale_encode`` and ``pack_codes``. HW: inline
PTX on the GPU, integer formulas with the same bits under the interpreter. Per-token casts load their global
scales from ``pt_scales_kernel``'s tables. RHT recipes (1x16 blocks) transform the columnwise side in registers
(``rht16_cast16``). Stochastic rounding: :mod:`.stochastic_rounding`. PR3045 (per-token only): PR 3045's
numerics, S_enc from the floored amax and enc = S_enc / s (0 for a zero scale), and its fp32 RHT. Columnwise
stores: a program of 4 groups writes 32 contiguous bytes (a whole sector) into each column's row of the (K, M/2)
output instead of 8-byte pieces, which is what bounded the plain columnwise casts.
"""
import triton
import triton.language as tl

from ..formats import e2m1_encode_fast, e2m1_scale_encode, e4m3_decode, e4m3_encode, to_f32
from ..pdl import wait_prior_grid
from .cast_col import word8
from .cast_row import e4m3_code
from .common import (
    FLT_MAX,
    ONE_SIXTH,
    abs_bits,
    clamp_flt_max,
    encode_factor,
    encode_factor_pr3045,
    global_encode_pr3045,
    global_scales,
    group_split,
    normal_range,
    operand_values,
    operand_values_rn,
    pack_codes,
    scale_offsets,
    split8,
    split_of,
    split_span,
)
from .pt_scales import pt_table_load
from .rht import bf16_saturating, rht16_cast16
from .stochastic_rounding import pair_bytes_cols, pair_bytes_rows, sr_e2m1, sr_seed


@triton.jit
def _scale_and_factor(bamax, outer, E6: tl.constexpr, EXACT: tl.constexpr):
    """Block scale (E4M3 bits) and encode factor fl(1 / fl(s * S_dec)) of every block (spec 3.1)."""
    s_enc, s_dec = global_scales(outer, E6, EXACT)
    scale = e4m3_encode(clamp_flt_max(bamax * (s_enc * ONE_SIXTH)))
    return scale, encode_factor(e4m3_decode(scale), s_dec, EXACT)


@triton.jit
def _scale_and_factor_pr3045(bamax, outer, EXACT: tl.constexpr):
    """PR 3045's block scale and encode factor min(fl(S_enc / s), FLT_MAX) (0 for s == 0), S_enc from
    the floored outer amax (the EXACT path of per-token tiles)."""
    s_enc = global_encode_pr3045(outer, EXACT)
    scale = e4m3_encode(clamp_flt_max(bamax * (s_enc * ONE_SIXTH)))
    return scale, encode_factor_pr3045(e4m3_decode(scale), s_enc, EXACT)


@triton.jit
def _scale_and_factor_fast(bamax, outer, E6: tl.constexpr, HW: tl.constexpr):
    """``_scale_and_factor`` for normal-range tiles (``normal_range``), in about half the instructions
    (this per-block work is a third of the cast kernel's): the E4M3 scale by ``e4m3_code`` (HW: Hopper's
    saturating convert, else ``e4m3_encode_fast``; bamax * S_enc / 6 >= 0; inf saturates like the clamp;
    NaN blocks get 0x7F), decoded exactly as bits(code << 20) * 2^120 (the 7 magnitude bits at fp32 bits
    26..20 read as value * 2^-120; multiplication keeps subnormals: no FTZ), and the factor by one correctly
    rounded division."""
    s_enc, s_dec = global_scales(outer, E6, False)
    return _scale_and_factor_pre(bamax, s_enc * ONE_SIXTH, s_dec, False, HW)


@triton.jit
def _scale_and_factor_pre(bamax, s_enc_sixth, s_third, PR3045: tl.constexpr, HW: tl.constexpr):
    """The per-block part of ``_scale_and_factor_fast`` from the outer amax's fl(S_enc * fl(1/6)) and
    S_dec (computed per block there, read from ``pt_scales_kernel``'s tables for per-token casts).
    PR3045: ``s_third`` is S_enc and the factor is min(fl(S_enc / s), FLT_MAX), 0 for a zero scale."""
    code = e4m3_code(bamax * s_enc_sixth, HW)
    scale = tl.where(bamax != bamax, 0x7F, code)
    scale_f = (code << 20).to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^120
    if PR3045:
        enc = tl.math.div_rn(tl.zeros_like(scale_f) + s_third, scale_f)
        enc = tl.where(scale_f == 0.0, 0.0, tl.minimum(enc, FLT_MAX))
    else:
        enc = tl.minimum(tl.math.div_rn(tl.full(scale_f.shape, 1.0, tl.float32), scale_f * s_third), FLT_MAX)
    return scale, enc


@triton.jit
def _row_words(x3, enc, KB: tl.constexpr, HW: tl.constexpr):
    """[16, KB, 16] values and their blocks' encode factors [16, KB] -> [16, KB, 2] int32 words of the codes of
    fl(x * enc), each word the 8 values a thread holds (round to nearest even; NaN products: unspecified codes):
    ``code_top`` and ``push_code``, a few instructions per value fewer than ``e2m1_scale_encode`` and
    ``pack_codes``, most of them off the integer ALU pipe."""
    v0, v1, v2, v3, v4, v5, v6, v7 = split8(tl.reshape(x3, [16, KB, 2, 1, 8]), 16, KB, 2, 1)
    zero = tl.zeros([16, KB, 2, 1], tl.int32)
    return tl.reshape(word8(v0, v1, v2, v3, v4, v5, v6, v7, enc[:, :, None, None], zero, zero, HW, False), [16, KB, 2])


@triton.jit
def _col_words(xf, enc, BLOCK_K: tl.constexpr, HW: tl.constexpr):
    """``_row_words`` of the columnwise blocks: the [16, BLOCK_K] tile (row 2j + h holds row 8h + j of the group,
    so each thread holds 8 rows of a column) and the columns' encode factors [BLOCK_K] -> [2, BLOCK_K] words, word h
    the codes of rows 8h..8h+7."""
    t = tl.permute(tl.reshape(xf, [8, 2, BLOCK_K]), (1, 2, 0))  # [h, column, j]: j in-thread
    v0, v1, v2, v3, v4, v5, v6, v7 = split8(tl.reshape(t, [2, BLOCK_K, 1, 1, 8]), 2, BLOCK_K, 1, 1)
    zero = tl.zeros([2, BLOCK_K, 1, 1], tl.int32)
    return tl.reshape(word8(v0, v1, v2, v3, v4, v5, v6, v7, enc[None, :, None, None], zero, zero, HW, False),
                      [2, BLOCK_K])


@triton.jit
def _e2m1_codes(x, enc, rbytes, SR: tl.constexpr, EXACT: tl.constexpr):
    """Codes of x scaled by enc (broadcast): stochastic, NaN-safe (EXACT tiles), or the fast encoder
    (normal-range tiles; the caller zeroes the words of blocks whose factor is NaN)."""
    if SR:
        codes = sr_e2m1(x * enc, rbytes)
    elif EXACT:
        codes = e2m1_encode_fast(x * enc)
    else:
        codes = e2m1_scale_encode(x, enc)
    return codes


@triton.jit(do_not_specialize=["seed_value"])  # a fresh seed per call must not select another compiled kernel
def cast16_kernel(
    x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr,
    row_amax_ptr, col_amax_ptr, seed_ptr, seed_value, M, K, offsets_ptr, group_split_ptr, num_splits,
    ROWWISE: tl.constexpr, COLWISE: tl.constexpr, BLOCK_2D: tl.constexpr, PER_TOKEN: tl.constexpr,
    E6: tl.constexpr, SR: tl.constexpr, SEED_FROM_PTR: tl.constexpr, LAYOUT: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUPED: tl.constexpr = False, SPLIT_STEPS: tl.constexpr = 0, RHT: tl.constexpr = False, RHT_MASK: tl.constexpr = 0,
    REUSE_2D: tl.constexpr = False, PR3045: tl.constexpr = False, SOFT_BF16: tl.constexpr = False,
    GROUPS: tl.constexpr = 1, ROW_OPERAND: tl.constexpr = False, COL_OPERAND: tl.constexpr = False,
    HW: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """One 16-row group x BLOCK_K columns -> its rowwise and columnwise blocks (recipes without
    4over6; RHT only on the columnwise side, 1x16 blocks: ``rht16_cast16``).

    PR3045 (with PER_TOKEN): PR 3045's numerics (the tables' third plane is S_enc; the EXACT path
    recomputes it from the floored amax) and its fp32 RHT (no bf16 rounding of input or output).

    PER_TOKEN: row_amax_ptr / col_amax_ptr point at the (3, N) tables of ``pt_scales_kernel`` (amax,
    fl(S_enc * fl(1/6)), S_dec or -1 outside the normal range) instead of the (N,) amaxes, N = M for
    rows, K (grouped: num_splits * K) for columns, so normal-range tiles load their global scales
    instead of dividing for them per row and column.
    REUSE_2D (16x16 row+col, per tensor, no SR): the columnwise copy takes the rowwise codes when both
    outer amaxes are equal (an element's columnwise block is then its rowwise block).
    GROUPED, SPLIT_STEPS: as ``four_over_six_kernel`` (kernels/grouped_quantize.py).

    Layout: with bf16 input, BLOCK_K = 128 and one warp, each thread loads 16 bytes of 8 of the 16
    rows (see ``r16``): a rowwise block spans two threads, and so does a columnwise block, each thread
    packing one of its two words (one shuffle per block amax; scale math duplicated in the pair).
    GROUPS (1, 2 or 4): consecutive 16-row groups per program, cast one after the other; their
    columnwise words and scales are stored together, so that each column's row of the (K, M/2) output
    gets 8 * GROUPS contiguous bytes from one program instead of 8-byte pieces (GROUPED: each group in
    its own split, contiguous where the groups share one).
    ROW_OPERAND / COL_OPERAND (COL_OPERAND: single casts, GROUPS = 1): that side is written as the exact
    BF16 GEMM operand q * s instead of codes and scales (:func:`.common.operand_values`): rowwise (M, K) at
    row_data_ptr, columnwise (K, M) at col_data_ptr, no scales (their pointers are not written).
    HW: Hopper's instructions by inline PTX (GPU launches), else integer formulas with the same bits.
    """
    wait_prior_grid(PDL)
    pid = tl.program_id(0)
    n_k = tl.cdiv(K, BLOCK_K)
    g0 = (pid // n_k).to(tl.int64) * GROUPS  # first 16-row group = columnwise block index along M
    pid_k = pid % n_k
    if GROUPS == 1:
        _cast16_group(
            x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr, row_amax_ptr, col_amax_ptr, seed_ptr, seed_value, M, K,
            offsets_ptr, group_split_ptr, num_splits, g0, pid_k, ROWWISE, COLWISE, BLOCK_2D, PER_TOKEN, E6, SR, SEED_FROM_PTR,
            LAYOUT, BLOCK_K, GROUPED, SPLIT_STEPS, RHT, RHT_MASK, REUSE_2D, PR3045, SOFT_BF16, True, ROW_OPERAND,
            COL_OPERAND, HW)
    else:
        # a runtime loop (not unrolled), so that only one group's tile is live at a time; each group's
        # columnwise words and scales go into their slots of the per-column rows stored below
        slot = tl.arange(0, 2 * GROUPS)
        words = tl.zeros([BLOCK_K, 2 * GROUPS], tl.int32)
        scales = tl.zeros([BLOCK_K, GROUPS], tl.int32)
        for j in tl.range(0, GROUPS, loop_unroll_factor=1):
            w, s = _cast16_group(
                x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr, row_amax_ptr, col_amax_ptr, seed_ptr, seed_value, M,
                K, offsets_ptr, group_split_ptr, num_splits, g0 + j, pid_k, ROWWISE, COLWISE, BLOCK_2D, PER_TOKEN, E6, SR,
                SEED_FROM_PTR, LAYOUT, BLOCK_K, GROUPED, SPLIT_STEPS, RHT, RHT_MASK, REUSE_2D, PR3045, SOFT_BF16, False,
                ROW_OPERAND, False, HW)
            if COLWISE:
                w_lo, w_hi = tl.split(tl.trans(w))  # [BLOCK_K] each: rows 0-7, rows 8-15
                words = tl.where(slot[None, :] == 2 * j, w_lo[:, None], words)
                words = tl.where(slot[None, :] == 2 * j + 1, w_hi[:, None], words)
                scales = tl.where(tl.arange(0, GROUPS)[None, :] == j, s[:, None], scales)
        if COLWISE:
            m_blocks = M // 16
            cols = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
            groups = g0 + tl.arange(0, GROUPS)
            if GROUPED:
                # each group's own split (groups may straddle splits): its block in the bulk layout, per
                # word slot and per group; contiguous when the program's groups share a split
                slot_blk = _grouped_col_blocks(offsets_ptr, group_split_ptr, g0 + slot // 2, cols, M, K)
                ok = (cols < K)[:, None] & (g0 + slot // 2 < m_blocks)[None, :]
                ok = ok & (slot_blk >= 0) & (slot_blk < m_blocks * K)
                tl.store(col_data_ptr + slot_blk * 2 + (slot % 2)[None, :], words, mask=ok)
                csoff = _grouped_col_blocks(offsets_ptr, group_split_ptr, groups, cols, M, K)  # compact
                sok = (cols < K)[:, None] & (groups < m_blocks)[None, :] & (csoff >= 0) & (csoff < m_blocks * K)
            else:
                ok = (cols < K)[:, None] & (g0 + slot // 2 < m_blocks)[None, :]
                tl.store(col_data_ptr + (cols * m_blocks + g0)[:, None] * 2 + slot[None, :], words, mask=ok)
                csoff = scale_offsets(cols[:, None], groups[None, :], m_blocks, LAYOUT)
                sok = (cols < K)[:, None] & (groups < m_blocks)[None, :]
            tl.store(col_scale_ptr + csoff, scales.to(tl.uint8), mask=sok)


@triton.jit
def _grouped_col_blocks(offsets_ptr, group_split_ptr, g, cols, M, K):
    """Columnwise block index [BLOCK_K, len(g)] in the grouped bulk layout of the 16-row groups g (each in
    the split the amax pass recorded) and columns cols: a split of R rows starting at row S holds a
    (K, R / 16) block matrix from block S / 16 * K on."""
    _, start, split_blocks = split_span(offsets_ptr, group_split_ptr, g, M)
    return (start // 16 * K + (g - start // 16))[None, :] + cols[:, None] * split_blocks[None, :]


@triton.jit
def _cast16_group(
    x_ptr, row_data_ptr, row_scale_ptr, col_data_ptr, col_scale_ptr,
    row_amax_ptr, col_amax_ptr, seed_ptr, seed_value, M, K, offsets_ptr, group_split_ptr, num_splits, g, pid_k,
    ROWWISE: tl.constexpr, COLWISE: tl.constexpr, BLOCK_2D: tl.constexpr, PER_TOKEN: tl.constexpr,
    E6: tl.constexpr, SR: tl.constexpr, SEED_FROM_PTR: tl.constexpr, LAYOUT: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUPED: tl.constexpr, SPLIT_STEPS: tl.constexpr, RHT: tl.constexpr, RHT_MASK: tl.constexpr,
    REUSE_2D: tl.constexpr, PR3045: tl.constexpr, SOFT_BF16: tl.constexpr, STORE_COLS: tl.constexpr,
    ROW_OPERAND: tl.constexpr, COL_OPERAND: tl.constexpr, HW: tl.constexpr,
):
    """The 16-row group g, columns tile pid_k, of ``cast16_kernel``: stores its rowwise blocks and, with
    STORE_COLS, its columnwise ones; returns the columnwise words [2, BLOCK_K] (word h = rows 8h..8h+7)
    and scale codes [BLOCK_K] (zeros without COLWISE)."""
    KB: tl.constexpr = BLOCK_K // 16
    # operands whose codes nothing else uses (no SR, no REUSE_2D): values straight from x (``operand_values_rn``)
    ROW_VALUES_RN: tl.constexpr = ROW_OPERAND and not (SR or REUSE_2D)
    COL_VALUES_RN: tl.constexpr = COL_OPERAND and not (SR or REUSE_2D)
    # tile row i holds row 8 * (i % 2) + i // 2 of the group: with bf16 (16-byte loads of 8 columns,
    # 16 threads along a 128-column tile) the two threads that share a column hold rows 0-7 and 8-15,
    # i.e. exactly one packed word of its columnwise block each
    r16 = (tl.arange(0, 16) % 2) * 8 + tl.arange(0, 16) // 2
    rows = g * 16 + r16.to(tl.int64)
    cols = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
    row_ok = rows < M
    col_ok = cols < K
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
    xf = to_f32(x, SOFT_BF16)
    ab = abs_bits(xf)
    k_blocks = K // 16
    m_blocks = M // 16
    seed = sr_seed(seed_ptr, seed_value, SR, SEED_FROM_PTR)
    if BLOCK_2D:
        bamax_2d = tl.max(tl.max(tl.reshape(ab, [16, KB, 16]), axis=2), axis=0).to(tl.float32, bitcast=True)  # [KB]

    # ---------------------------------------------------------------- rowwise: blocks along K
    if ROWWISE:
        blks = pid_k * KB + tl.arange(0, KB).to(tl.int64)
        blk_ok = blks < k_blocks
        x3 = tl.reshape(xf, [16, KB, 16])
        if BLOCK_2D:
            bamax = tl.broadcast_to(bamax_2d[None, :], [16, KB])
        else:
            bamax = tl.max(tl.reshape(ab, [16, KB, 16]), axis=2).to(tl.float32, bitcast=True)
        if PER_TOKEN:
            pass  # the tables: only EXACT tiles read the amax, below
        elif GROUPED:
            if COLWISE or BLOCK_2D:  # splits of whole 16-row groups: one split for the tile
                outer = tl.zeros([1, 1], tl.float32) + tl.load(row_amax_ptr + group_split(group_split_ptr, g, M))
            else:
                outer = tl.load(row_amax_ptr + split_of(rows, offsets_ptr, num_splits, SPLIT_STEPS))[:, None]
        else:
            outer = tl.zeros([1, 1], tl.float32) + tl.load(row_amax_ptr)
        jj = tl.arange(0, 16)[None, None, :]
        if SR:
            rbytes = pair_bytes_rows(seed, g, pid_k, k_blocks, KB)
        else:
            rbytes = jj
        if PER_TOKEN:
            row_enc6, row_sdec, row_normal = pt_table_load(row_amax_ptr, rows, M, row_ok)
            row_enc6 = row_enc6[:, None]
            row_sdec = row_sdec[:, None]
        else:
            row_normal = normal_range(outer)
        if row_normal:
            if PER_TOKEN:
                row_scale, row_enc = _scale_and_factor_pre(bamax, row_enc6, row_sdec, PR3045, HW)
            else:
                row_scale, row_enc = _scale_and_factor_fast(bamax, outer, E6, HW)
            # the codes themselves are used (SR, REUSE_2D, ROW_OPERAND), or multi-group programs (not STORE_COLS), whose
            # loop-carried columnwise words spill around ``_row_words`` at 255 registers; an operand of
            # round-to-nearest codes alone takes its values without them
            if ROW_VALUES_RN:
                row_vals = operand_values_rn(x3, row_enc[:, :, None], row_scale[:, :, None])
            elif SR or REUSE_2D or ROW_OPERAND or not STORE_COLS:
                row_codes = _e2m1_codes(x3, row_enc[:, :, None], rbytes, SR, False)
                row_words = pack_codes(row_codes, 16, KB)
            else:
                row_words = _row_words(x3, row_enc, KB, HW)
            if not (SR or ROW_VALUES_RN):
                row_words = tl.where((bamax != bamax)[:, :, None], 0, row_words)
        else:
            # (a new name: Triton types a name assigned in a runtime branch by every assignment in it)
            if PER_TOKEN:
                outer_x = tl.load(row_amax_ptr + rows, mask=row_ok, other=0.0)[:, None]
            else:
                outer_x = outer
            if PR3045:
                row_scale_x, row_enc_x = _scale_and_factor_pr3045(bamax, outer_x, True)
            else:
                row_scale_x, row_enc_x = _scale_and_factor(bamax, outer_x, E6, True)
            row_codes = _e2m1_codes(x3, row_enc_x[:, :, None], rbytes, SR, True)
            row_words = pack_codes(row_codes, 16, KB)
            row_scale = row_scale_x
            if ROW_VALUES_RN:
                row_vals = operand_values(row_codes, row_scale_x[:, :, None])
        ok = row_ok[:, None] & blk_ok[None, :]
        if ROW_OPERAND:
            if ROW_VALUES_RN:
                vals = tl.reshape(row_vals, [16, BLOCK_K])
            else:
                vals = tl.reshape(operand_values(row_codes, row_scale[:, :, None]), [16, BLOCK_K])
            tl.store(row_data_ptr.to(tl.pointer_type(tl.bfloat16)) + rows[:, None] * K + cols[None, :], vals,
                     mask=row_ok[:, None] & col_ok[None, :])
        else:
            # a 2-D pointer contiguous along the words: 8-byte vectors with lanes along the columns, 64 bytes per
            # row per store (a 3-D [row, block, word] pointer gets its lanes along the rows in Triton 3.6, 16 bytes
            # per row per store, half sectors)
            wcols = pid_k * (2 * KB) + tl.arange(0, 2 * KB)
            word = rows[:, None] * (k_blocks * 2) + wcols[None, :]
            tl.store(row_data_ptr + word, tl.reshape(row_words, [16, 2 * KB]),
                     mask=row_ok[:, None] & (wcols < k_blocks * 2)[None, :])
            tl.store(row_scale_ptr + scale_offsets(rows[:, None], blks[None, :], k_blocks, LAYOUT), row_scale.to(tl.uint8),
                     mask=ok)

    # ---------------------------------------------------- columnwise: the 16 rows are one block per column
    if COLWISE:
        if GROUPED:
            split, start, split_blocks = split_span(offsets_ptr, group_split_ptr, g, M)
            blk2 = start // 16 * K + cols * split_blocks + (g - start // 16)  # bulk layout, [BLOCK_K]
            unit_base = start // 16 * K + (g - start // 16) * 2  # SR: the same, in 2x8 units
            unit_stride = split_blocks * 2
            if PER_TOKEN:
                pass  # the tables, below
            else:
                couter = tl.zeros([1], tl.float32) + tl.load(col_amax_ptr + split)
        else:
            blk2 = cols * m_blocks + g
            unit_base = g * 2
            unit_stride = m_blocks * 2
            if PER_TOKEN:
                pass  # the tables, below
            else:
                couter = tl.zeros([1], tl.float32) + tl.load(col_amax_ptr)
        if RHT:  # columnwise blocks of bf16(RHT(x^T)) (RHT recipes have 1x16 blocks); PR3045: fp32 RHT(x^T)
            if PR3045:
                xf = rht16_cast16(xf, RHT_MASK, BLOCK_K, True)
            elif x_ptr.dtype.element_ty == tl.bfloat16:
                # a normal-range outer amax (the post-RHT maximum) bounds every result: no saturation
                if normal_range(couter):
                    xf_rht = rht16_cast16(xf, RHT_MASK, BLOCK_K, False, False, HW)
                else:
                    xf_rht = rht16_cast16(xf, RHT_MASK, BLOCK_K)
                xf = xf_rht
            else:
                xf = rht16_cast16(bf16_saturating(xf), RHT_MASK, BLOCK_K)
            ab = abs_bits(xf)
        if BLOCK_2D:
            cbamax = tl.reshape(tl.broadcast_to(bamax_2d[:, None], [KB, 16]), [BLOCK_K])
        else:
            cbamax = tl.max(ab, axis=0).to(tl.float32, bitcast=True)  # [BLOCK_K]
        if SR:
            cbytes = pair_bytes_cols(seed, unit_base, unit_stride, pid_k, BLOCK_K)
        else:
            cbytes = r16[:, None]
        shift = tl.reshape((r16 % 8) * 4, [8, 2])[:, :, None]
        # 16x16 blocks without SR: an element's columnwise block is its rowwise block, so with the same
        # outer amax (per-tensor weights: always) its code is the rowwise one, already in registers
        # in this very layout ([16, KB, 16] is a view of [16, BLOCK_K]): skip the second encoding.
        # (REUSE_2D excludes per-token.)
        if REUSE_2D:
            same_outer = tl.max(tl.reshape(outer, [1]), axis=0) == tl.max(couter, axis=0)
        else:
            same_outer = False
        if PER_TOKEN:
            if GROUPED:
                col_plane = num_splits * K
                col_idx = split * K + cols
            else:
                col_plane = K
                col_idx = cols
            col_enc6, col_sdec, col_normal = pt_table_load(col_amax_ptr, col_idx, col_plane, col_ok)
        else:
            col_normal = normal_range(couter)
        if col_normal:
            if PER_TOKEN:
                col_scale, col_enc = _scale_and_factor_pre(cbamax, col_enc6, col_sdec, PR3045, HW)
            else:
                col_scale, col_enc = _scale_and_factor_fast(cbamax, couter, E6, HW)
            if COL_VALUES_RN:  # (the words are not stored)
                col_vals = operand_values_rn(xf, col_enc[None, :], col_scale[None, :])
                col_words = tl.zeros([2, BLOCK_K], tl.int32)
            elif SR or REUSE_2D or COL_OPERAND:  # the codes themselves are used
                if REUSE_2D:
                    if same_outer:
                        col_codes = tl.reshape(row_codes, [16, BLOCK_K])
                    else:
                        col_codes = _e2m1_codes(xf, col_enc[None, :], cbytes, SR, False)
                else:
                    col_codes = _e2m1_codes(xf, col_enc[None, :], cbytes, SR, False)
                col_words = tl.sum(tl.reshape(col_codes, [8, 2, BLOCK_K]) << shift, axis=0)  # [2, BLOCK_K]: word h = rows 8h..8h+7
                col_codes_o = col_codes
            else:
                col_words = _col_words(xf, col_enc, BLOCK_K, HW)
            if not (SR or COL_VALUES_RN):
                col_words = tl.where((cbamax != cbamax)[None, :], 0, col_words)
        else:
            if PER_TOKEN:
                couter_x = tl.load(col_amax_ptr + col_idx, mask=col_ok, other=0.0)
            else:
                couter_x = couter
            if PR3045:
                col_scale_x, col_enc_x = _scale_and_factor_pr3045(cbamax, couter_x, True)
            else:
                col_scale_x, col_enc_x = _scale_and_factor(cbamax, couter_x, E6, True)
            if REUSE_2D:
                if same_outer:
                    col_codes_x = tl.reshape(row_codes, [16, BLOCK_K])
                else:
                    col_codes_x = _e2m1_codes(xf, col_enc_x[None, :], cbytes, SR, True)
            else:
                col_codes_x = _e2m1_codes(xf, col_enc_x[None, :], cbytes, SR, True)
            col_words = tl.sum(tl.reshape(col_codes_x, [8, 2, BLOCK_K]) << shift, axis=0)
            col_codes_o = col_codes_x
            col_scale = col_scale_x
            if COL_VALUES_RN:
                col_vals = operand_values(col_codes_x, col_scale_x[None, :])
        if COL_OPERAND:  # 16 consecutive rows (32 bytes) of each column's row of the (K, M) operand
            if COL_VALUES_RN:
                vals = col_vals
            else:
                vals = operand_values(col_codes_o, col_scale[None, :])
            # tile rows back in row order (tile row 2j + h holds row 8h + j), so that each column's 16 values
            # are one contiguous run the store can vectorize
            vals = tl.reshape(tl.permute(tl.reshape(vals, [8, 2, BLOCK_K]), (1, 0, 2)), [16, BLOCK_K])
            rows_in_order = g * 16 + tl.arange(0, 16).to(tl.int64)
            tl.store(col_data_ptr.to(tl.pointer_type(tl.bfloat16)) + cols[None, :] * M + rows_in_order[:, None], vals,
                     mask=(rows_in_order < M)[:, None] & col_ok[None, :])
        elif STORE_COLS:
            cok = col_ok & ((tl.zeros_like(cols) + g) < m_blocks)
            if GROUPED:  # device offsets are not checked: whatever they hold, write inside the bulk buffers only
                cok = cok & (blk2 >= 0) & (blk2 < m_blocks * K)
            tl.store(col_data_ptr + blk2[None, :] * 2 + tl.arange(0, 2)[:, None], col_words, mask=cok[None, :])
            if GROUPED:
                csoff = blk2  # compact
            else:
                csoff = scale_offsets(cols, g, m_blocks, LAYOUT)
            tl.store(col_scale_ptr + csoff, col_scale.to(tl.uint8), mask=cok)
    else:
        col_words = tl.zeros([2, BLOCK_K], tl.int32)
        col_scale = tl.zeros([BLOCK_K], tl.int32)
    return col_words, col_scale
