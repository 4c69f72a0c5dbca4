"""The rowwise-only NVFP4 cast of 1x16 bf16 recipes, stochastically rounded or not: ``cast_row_kernel``,
fed by ``row_factor_table_kernel``'s 128-entry table of encode factors (per tensor) or by the per-row
tables of ``pt_scales_kernel`` (per token, TE main's numerics). It also runs the rowwise launch of split
row+col casts (``opt_flags.use_cast_row``).

On Hopper (no E2M1 convert) the rowwise cast is bound by how its loads use the L1 and by instructions per
element; this kernel reads x in coalesced 16-byte pieces and does the per-block work in a few instructions:

* The encode factor enc = min(fl(1 / fl(s * S_dec)), FLT_MAX) depends only on the block scale's E4M3
  code s (128 codes, 0x7F the NaN) and the tensor's S_dec, so ``row_factor_table_kernel`` (one
  program, 128 lanes, once per cast) writes all of them, plus fl(S_enc * fl(1/6)) at entry 128; the
  cast reads one table entry per block (an L1-resident gather) instead of dividing per block. The
  table divides in fp64 (rounded once: exact for every outer amax, subnormal or huge ones too), so
  the cast has no EXACT path: one code path for every amax (0, inf and NaN included).
* The block scale e4m3(min(bamax * fl(S_enc * fl(1/6)), FLT_MAX)) by Hopper's own
  ``cvt.rn.satfinite.e4m3x2.f32`` (inline PTX; satfinite maps inf to 448 like the clamp); under the
  interpreter by the integer encoder ``e4m3_encode_fast``, same bits. A NaN product gives 0x7F (with
  its sign bit, as ``e4m3_encode``).
* The block amax on packed bf16 pairs: x is read as int32 words of two bf16, folded by
  ``max.NaN.xorsign.abs.bf16x2`` (one instruction per word pair on sm_90: the larger magnitude per half, NaN
  propagated; the sign bits, garbage, are cleared once per block); under the interpreter by an unsigned 16x2 max
  of ``w & 0x7FFF7FFF`` (bf16 magnitude order is integer order, NaN above inf: torch.amax's NaN).
* The E2M1 codes by ``e2m1_scale_encode``'s rounding (one FFMA onto the grid of the value's binade)
  with the code and sign read into the top nibble by one multiply-add (``code_top``), packed by one
  funnel shift per code (``shf.l``; shifts and ORs under the interpreter); the bf16 values unpacked
  from the words by one shift or mask each (exact, subnormals included). Sm_90's integer (ALU) pipe is half as wide
  as its FMA pipe and was the busiest: the sign comes from a float add, not integer ops.

Per token the factor depends on the row's S_dec too, so there is one correctly rounded division per
block (16 elements) instead of the table read, and tiles with a row amax outside the normal range
recompute S_enc, S_dec and the factor in fp64 from the amax, as ``cast16_kernel``.

Blocks whose factor is NaN (a NaN element, or a NaN outer amax) get code 0 everywhere, as the
reference (x * NaN encodes as 0); with stochastic rounding they get ``sr_e2m1``'s code of NaN (+6), as the
reference's rule.

Stochastic rounding (SR): the codes of ``sr_e2m1`` on fl(x * enc) with the random bytes of the documented
Philox mapping (``stochastic_rounding``: one Philox block per 2 rows x 8 columns, stream 0), the bits of
``cast16_kernel``'s SR. The program takes its even and its odd rows as two sets of BLOCK_M / 2 rows with the same
layout, so each lane holds both rows of each of its half blocks and draws each Philox block once: words 0 and 1
feed the even row's half, words 2 and 3 the odd row's, byte c % 4 of word c // 4 element c (no per-element
selection). The codes are packed by one multiply-add per code (acc * 16 + code).

OPERAND: instead of codes and scales the kernel writes the BF16 GEMM operand (M, K), the exact values q * s of the
same codes (RN: ``e2m1_rn_value``, the grid value of ``code_top``'s rounding; SR: ``sr_e2m1``'s code decoded) times
the decoded block scale, two per int32 word by one bf16x2 convert, in x's own layout (a lane's 8 values, 16 bytes).

Layout: x (M, K) bf16 contiguous, K % 16 == 0, read as (M, K / 2) int32; rowwise data (M, K / 2)
uint8 written as (M, K / 8) int32; scales (E4M3 bits) compact / padded / swizzled (``scale_offsets``).
A program covers BLOCK_M rows x KB blocks of 16 columns (``opt_flags.cast_row_tile``: 8192 elements (per token
4096) in as few rows as K allows, so a lane's loads and stores along a row differ by constant offsets; no masks
where the tiles cover x exactly, ``EVEN``), read as one [BLOCK_M, 8 KB] int32 load viewed as
[BLOCK_M, 2 KB, 4]: each lane holds one 8-element half block (16 bytes), consecutive lanes consecutive halves, so a
warp's load is one contiguous run. (With a lane per whole block, read as two 16-byte loads 32 bytes apart, each load
request costs one L1 wavefront per lane, and the L1 pipe rather than DRAM bounds the cast.) A block's two halves sit in a
lane pair: the block amax takes one shuffle (``tl.reduce`` over the pair); both lanes then compute the block's scale
and read its factor, each packs its 8 codes into one int32 word and stores it (a warp's stores are contiguous too).
"""
import torch
import triton
import triton.language as tl

from ...layout import cdiv
from ..formats import e2m1_decode, e4m3_decode, e4m3_encode_fast
from ..pdl import wait_prior_grid
from .common import ONE_SIXTH, bf16x2_word, e2m1_rn_value, encode_factor, global_scales, scale_offsets
from .pt_scales import pt_table_load
from .stochastic_rounding import philox_words, sr_e2m1, sr_seed

TABLE_ENTRIES = 132  # 128 encode factors, fl(S_enc * fl(1/6)), padding to 16 bytes


@triton.jit
def row_factor_table_kernel(amax_ptr, table_ptr, E6: tl.constexpr, PDL: tl.constexpr = False):
    """table[c] = min(fl(1 / fl(e4m3(c) * S_dec)), FLT_MAX) for E4M3 codes c = 0..127 (NaN for 0x7F),
    table[128] = fl(S_enc * fl(1/6)), of the per-tensor amax at amax_ptr (spec 3.1); fp64 divisions
    rounded once (correctly rounded for every amax). One program."""
    wait_prior_grid(PDL)
    factor_table(tl.load(amax_ptr + tl.zeros([128], tl.int32)), table_ptr, E6)


@triton.jit
def factor_table(outer, table_ptr, E6: tl.constexpr):
    """``row_factor_table_kernel``'s table of the outer amax ``outer`` (the same value in each of 128 lanes)."""
    codes = tl.arange(0, 128)
    s_enc, s_dec = global_scales(outer, E6, True)
    tl.store(table_ptr + codes, encode_factor(e4m3_decode(codes), s_dec, True))
    tl.store(table_ptr + 128 + codes, s_enc * ONE_SIXTH, mask=codes == 0)


@triton.jit
def absmax16x2(a, b, HW: tl.constexpr):
    """Per 16-bit half: the larger bf16 magnitude of two int32 words of two bf16, NaN above inf, in bits 0..14 and
    16..30 (bits 15 and 31: garbage). One ``max.NaN.xorsign.abs.bf16x2`` on the GPU."""
    if HW:
        out = tl.inline_asm_elementwise("max.NaN.xorsign.abs.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32,
                                        is_pure=True, pack=1)
    else:
        a = a & 0x7FFF7FFF  # integer halves: magnitude order is integer order
        b = b & 0x7FFF7FFF
        out = tl.maximum(a & -65536, b & -65536) | tl.maximum(a & 0xFFFF, b & 0xFFFF)
    return out


@triton.jit
def absmax16x2_hw(a, b):
    return absmax16x2(a, b, True)


@triton.jit
def absmax16x2_sw(a, b):
    return absmax16x2(a, b, False)


@triton.jit
def e4m3_code(v, HW: tl.constexpr):
    """E4M3 bits (int32 0..255) of v >= 0 (or NaN), saturating: e4m3_encode(min(v, FLT_MAX)); NaN gives 0x7F with
    v's sign bit. HW: one ``cvt.rn.satfinite.e4m3x2.f32`` of (0, v): the code in the low byte, zeros above, NaN to
    0x7F (a NaN from the GPU's arithmetic is positive)."""
    if HW:
        code = tl.inline_asm_elementwise(
            "{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, $2, $1; cvt.u32.u16 $0, t; }",
            "=r,f,f", [v, tl.zeros_like(v)], dtype=tl.int32, is_pure=True, pack=1)
    else:
        code = tl.where(v != v, 0x7F | ((v.to(tl.int32, bitcast=True) >> 24) & 0x80), e4m3_encode_fast(v, 448.0) & 0xFF)
    return code


@triton.jit
def code_top(x, enc):
    """The E2M1 code of fl(x * enc) (not NaN) in bits 31..28 of the result (bits below: garbage):
    ``e2m1_scale_encode``'s rounding (one FFMA onto the grid of the value's binade), its code
    (sb + (sb >> 22)) mod 16 read by one multiply, sb * (2^28 + 2^6) (the low product term never
    carries into the top nibble: sb * 2^28 has zeros below it), and the sign bit added in the same
    multiply-add: v < 0, the sign bit of fl(v + 0), which turns -0.0 into +0.0 (code 0, as the reference; the FADD
    runs on the FMA pipe, where an integer formula would load the busier ALU pipe). Kernels calling it compile
    without FMA contraction (x * enc + 0 fused would keep the sign of a product that underflows)."""
    v = x * enc + 0.0
    a = tl.minimum(tl.abs(v), 6.0)
    binade = (tl.maximum(a, 1.0).to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    sb = tl.fma(binade, 5242883.0, a).to(tl.int32, bitcast=True)
    return sb * 268435520 + (v.to(tl.int32, bitcast=True) & -2147483648)  # 2^28 + 2^6


@triton.jit
def push_code(acc, t, HW: tl.constexpr):
    """acc << 4 with the top nibble of t below: one funnel shift (shf.l) on the GPU."""
    if HW:
        out = tl.inline_asm_elementwise("shf.l.wrap.b32 $0, $2, $1, 4;", "=r,r,r", [acc, t], dtype=tl.int32,
                                        is_pure=True, pack=1)
    else:
        out = (acc << 4) | ((t >> 28) & 15)
    return out


@triton.jit
def _push_word(acc, w, enc, HW: tl.constexpr):
    """Push the codes of the two bf16 of int32 word w (high element first: packing runs from the last
    element of an output word down to its first, which ends in the low nibble)."""
    acc = push_code(acc, code_top((w & -65536).to(tl.float32, bitcast=True), enc), HW)
    return push_code(acc, code_top((w << 16).to(tl.float32, bitcast=True), enc), HW)


@triton.jit
def _split4(w):
    """[A, B, 4] -> its four [A, B] slices (in-thread: no data movement)."""
    a, b = tl.split(tl.reshape(w, [w.shape[0], w.shape[1], 2, 2]))  # a: j = 0, 2; b: j = 1, 3
    w0, w2 = tl.split(a)
    w1, w3 = tl.split(b)
    return w0, w1, w2, w3


@triton.jit
def _pack8(w, enc, HW: tl.constexpr):
    """[A, B, 4] int32 words (8 bf16) -> [A, B] int32 word of their 8 E2M1 codes of fl(x * enc)."""
    w0, w1, w2, w3 = _split4(w)
    acc = _push_word(tl.zeros_like(w0), w3, enc, HW)
    acc = _push_word(acc, w2, enc, HW)
    acc = _push_word(acc, w1, enc, HW)
    return _push_word(acc, w0, enc, HW)


@triton.jit
def _push_sr(acc, x, enc, r):
    """acc << 4 with the stochastically rounded E2M1 code of fl(x * enc) (``sr_e2m1``, random byte r) below."""
    return acc * 16 + sr_e2m1(x * enc, r)


@triton.jit
def _push_word_sr(acc, w, enc, rw, SHIFT: tl.constexpr):
    """``_push_word`` with stochastic rounding: the two bf16 of word w take bytes SHIFT / 8 + 1 (high element) and
    SHIFT / 8 (low) of the random word rw."""
    acc = _push_sr(acc, (w & -65536).to(tl.float32, bitcast=True), enc, (rw >> (SHIFT + 8)) & 0xFF)
    return _push_sr(acc, (w << 16).to(tl.float32, bitcast=True), enc, (rw >> SHIFT) & 0xFF)


@triton.jit
def _pack8_sr(w, enc, r_lo, r_hi):
    """``_pack8`` with stochastic rounding: element c of the 8 takes byte c % 4 of r_lo (c < 4) or r_hi."""
    w0, w1, w2, w3 = _split4(w)
    acc = _push_word_sr(tl.zeros_like(w0), w3, enc, r_hi, 16)
    acc = _push_word_sr(acc, w2, enc, r_hi, 0)
    acc = _push_word_sr(acc, w1, enc, r_lo, 16)
    return _push_word_sr(acc, w0, enc, r_lo, 0)


@triton.jit
def _operand_word(w, enc, scale_f, rw, SHIFT: tl.constexpr, SR: tl.constexpr, HW: tl.constexpr):
    """The operand word (two bf16 q * s) of int32 word w of two bf16 x: round to nearest even, or with SR the random
    bytes of ``_push_word_sr``."""
    lo = (w << 16).to(tl.float32, bitcast=True)
    hi = (w & -65536).to(tl.float32, bitcast=True)
    if SR:
        q_lo = e2m1_decode(sr_e2m1(lo * enc, (rw >> SHIFT) & 0xFF))
        q_hi = e2m1_decode(sr_e2m1(hi * enc, (rw >> (SHIFT + 8)) & 0xFF))
    else:
        q_lo = e2m1_rn_value(lo * enc)
        q_hi = e2m1_rn_value(hi * enc)
    return bf16x2_word(q_lo * scale_f, q_hi * scale_f, HW)


@triton.jit
def _operand8(w, enc, scale_f, r_lo, r_hi, SR: tl.constexpr, HW: tl.constexpr):
    """[A, B, 4] int32 words (8 bf16) -> the [A, B, 4] words of their operand values q * s (``_pack8``'s codes, or
    ``_pack8_sr``'s with SR, times the decoded block scale ``scale_f`` [A, B]), in x's own layout."""
    w0, w1, w2, w3 = _split4(w)
    o0 = _operand_word(w0, enc, scale_f, r_lo, 0, SR, HW)
    o1 = _operand_word(w1, enc, scale_f, r_lo, 16, SR, HW)
    o2 = _operand_word(w2, enc, scale_f, r_hi, 0, SR, HW)
    o3 = _operand_word(w3, enc, scale_f, r_hi, 16, SR, HW)
    return tl.reshape(tl.join(tl.join(o0, o2), tl.join(o1, o3)), [w.shape[0], w.shape[1], 4])  # _split4's inverse


@triton.jit
def _cast_rows(x_ptr, data_ptr, scale_ptr, table_ptr, rows, pid_k, M, k_blocks, r_lo, r_hi,
               LAYOUT: tl.constexpr, BLOCK_M: tl.constexpr, KB: tl.constexpr, HW: tl.constexpr,
               PER_TOKEN: tl.constexpr, E6: tl.constexpr, EVEN: tl.constexpr, SR: tl.constexpr,
               OPERAND: tl.constexpr):
    """Codes and scales of ``rows`` (BLOCK_M int64 rows) x this program's KB blocks; with SR, r_lo / r_hi
    ([BLOCK_M, 2 KB] int32) hold the random bytes of each half block's elements 0..3 / 4..7. OPERAND: the operand
    values instead, at data_ptr in x's layout."""
    HALVES: tl.constexpr = 2 * KB
    blks = pid_k * KB + tl.arange(0, KB)
    halves = pid_k * HALVES + tl.arange(0, HALVES)  # 8-element half blocks
    cols = pid_k * (HALVES * 4) + tl.arange(0, HALVES * 4)  # int32 words
    if EVEN:  # the tiles cover x exactly: no masks
        ok = None
        half_ok = None
        x_ok = None
    else:
        ok = (rows < M)[:, None] & (blks < k_blocks)[None, :]
        half_ok = (rows < M)[:, None] & (halves < 2 * k_blocks)[None, :]
        x_ok = (rows < M)[:, None] & (cols < k_blocks * 8)[None, :]
    # one contiguous 2-D load (consecutive lanes read consecutive 16-byte half blocks), viewed as [BM, HALVES, 4]
    x_at = x_ptr + rows[:, None] * (k_blocks * 8) + cols[None, :]
    w = tl.load(x_at) if EVEN else tl.load(x_at, mask=x_ok, other=0)
    w = tl.reshape(w, [BLOCK_M, HALVES, 4])

    a, b = tl.split(tl.reshape(w, [BLOCK_M, HALVES, 2, 2]))
    a, b = tl.split(absmax16x2(a, b, HW))
    mag = tl.reshape(absmax16x2(a, b, HW), [BLOCK_M, KB, 2])  # per half: its two 16-bit maxima
    if HW:
        mag = tl.reduce(mag, 2, absmax16x2_hw)  # [BM, KB]: the lane pair's halves
    else:
        mag = tl.reduce(mag, 2, absmax16x2_sw)
    mag = mag & 0x7FFF7FFF
    bamax = tl.maximum(mag << 16, mag & -65536).to(tl.float32, bitcast=True)

    if PER_TOKEN:
        row_ok = rows < M
        s_enc_sixth, s_dec, normal = pt_table_load(table_ptr, rows, M, row_ok)
        if normal:
            scale = e4m3_code(bamax * s_enc_sixth[:, None], HW)
            enc = encode_factor(e4m3_decode(scale & 0x7F), s_dec[:, None], False)
        else:  # fp64 divisions from the amax (new names: see cast16_kernel)
            outer = tl.load(table_ptr + rows, mask=row_ok, other=0.0)[:, None]
            s_enc_x, s_dec_x = global_scales(outer, E6, True)
            scale_x = e4m3_code(bamax * (s_enc_x * ONE_SIXTH), HW)
            enc = encode_factor(e4m3_decode(scale_x & 0x7F), s_dec_x, True)
            scale = scale_x
        enc = _per_half(enc, BLOCK_M, KB)
    else:
        s_enc_sixth = tl.load(table_ptr + 128)
        scale = e4m3_code(bamax * s_enc_sixth, HW)
        # the factor read per half, in the halves' lanes, through a 1-D gather (a 2-D gather, whose addresses are
        # contiguous along no dimension, may be given a layout with lanes along the rows, and converted)
        # (HW: the code is at most 0x7F, the GPU's NaNs being positive; the interpreter's NaN may carry a sign)
        idx = tl.reshape(_per_half(scale if HW else scale & 0x7F, BLOCK_M, KB), [BLOCK_M * HALVES])
        enc = tl.reshape(tl.load(table_ptr + idx), [BLOCK_M, HALVES])

    if OPERAND:  # q * s of every element, 16 bytes per lane as read (a NaN factor's scale is NaN: NaN values)
        scale_f = _per_half(e4m3_decode(scale), BLOCK_M, KB)
        vals = tl.reshape(_operand8(w, enc, scale_f, r_lo, r_hi, SR, HW), [BLOCK_M, HALVES * 4])
        tl.store(data_ptr + rows[:, None] * (k_blocks * 8) + cols[None, :], vals, mask=x_ok)
    else:
        if SR:  # a NaN factor's codes are sr_e2m1's of NaN, as the reference's
            codes = _pack8_sr(w, enc, r_lo, r_hi)
        else:
            codes = _pack8(w, enc, HW)
            codes = tl.where(enc != enc, 0, codes)  # NaN factor: code 0 (the reference's x * NaN)
        # one word per lane, as computed: unit alignment keeps the store in the halves' layout (a wider vector per
        # thread would take a layout conversion through shared memory)
        out = tl.multiple_of(rows[:, None] * (k_blocks * 2) + halves[None, :], [1, 1])
        tl.store(data_ptr + out, codes, mask=half_ok)
        tl.store(scale_ptr + scale_offsets(rows[:, None], blks[None, :], k_blocks, LAYOUT), scale.to(tl.uint8),
                 mask=ok)


@triton.jit
def cast_row_kernel(x_ptr, data_ptr, scale_ptr, table_ptr, seed_ptr, seed_value, M, K,
                    LAYOUT: tl.constexpr, BLOCK_M: tl.constexpr, KB: tl.constexpr, HW: tl.constexpr,
                    PER_TOKEN: tl.constexpr = False, E6: tl.constexpr = 2688.0, EVEN: tl.constexpr = False,
                    SR: tl.constexpr = False, SEED_FROM_PTR: tl.constexpr = False, OPERAND: tl.constexpr = False,
                    PDL: tl.constexpr = False):
    """Rowwise codes and scales of BLOCK_M rows x KB 16-column blocks (see the module docstring).
    x_ptr: x as int32 words; data_ptr: the rowwise data as int32 words; table_ptr: the
    ``row_factor_table_kernel`` table, or with PER_TOKEN the (3, M) per-row tables of
    ``pt_scales_kernel`` (then one correctly rounded division per block, and tiles with a row amax
    outside the normal range recompute in fp64 from the amax, as ``cast16_kernel``); HW: inline PTX
    (GPU) instead of the integer formulas; EVEN: M % BLOCK_M == 0 and (K / 16) % KB == 0 (no masks).
    SR (BLOCK_M even): stochastic rounding with the seed at seed_ptr (SEED_FROM_PTR) or seed_value; the program
    takes its even and its odd rows as two sets of BLOCK_M / 2, so that each lane holds both rows of each of its
    Philox units (2 rows x 8 columns, ``stochastic_rounding``) and draws each block once.
    OPERAND: data_ptr is the BF16 GEMM operand (M, K) as int32 words (x's layout), written with the exact values
    q * s of the codes above times their decoded block scales; no codes, no scales (scale_ptr is not written)."""
    wait_prior_grid(PDL)
    pid = tl.program_id(0)
    k_blocks = K // 16
    n_k = tl.cdiv(k_blocks, KB)
    pid_m = pid // n_k
    pid_k = pid % n_k
    if SR:
        seed = sr_seed(seed_ptr, seed_value, SR, SEED_FROM_PTR)
        pairs = (pid_m * (BLOCK_M // 2) + tl.arange(0, BLOCK_M // 2)).to(tl.int64)
        halves = pid_k * (2 * KB) + tl.arange(0, 2 * KB)
        w0, w1, w2, w3 = philox_words(seed, pairs[:, None] * (k_blocks * 2) + halves[None, :], 0)
        w0 = w0.to(tl.int32, bitcast=True)
        w1 = w1.to(tl.int32, bitcast=True)
        w2 = w2.to(tl.int32, bitcast=True)
        w3 = w3.to(tl.int32, bitcast=True)
        _cast_rows(x_ptr, data_ptr, scale_ptr, table_ptr, pairs * 2, pid_k, M, k_blocks, w0, w1, LAYOUT, BLOCK_M // 2,
                   KB, HW, PER_TOKEN, E6, EVEN, True, OPERAND)
        _cast_rows(x_ptr, data_ptr, scale_ptr, table_ptr, pairs * 2 + 1, pid_k, M, k_blocks, w2, w3, LAYOUT,
                   BLOCK_M // 2, KB, HW, PER_TOKEN, E6, EVEN, True, OPERAND)
    else:
        rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        _cast_rows(x_ptr, data_ptr, scale_ptr, table_ptr, rows, pid_k, M, k_blocks, 0, 0, LAYOUT, BLOCK_M, KB, HW,
                   PER_TOKEN, E6, EVEN, False, OPERAND)


@triton.jit
def _per_half(v, BLOCK_M: tl.constexpr, KB: tl.constexpr):
    """[BM, KB] per block -> [BM, 2 KB] per half block (both halves of a block hold its value)."""
    return tl.reshape(tl.broadcast_to(v[:, :, None], [BLOCK_M, KB, 2]), [BLOCK_M, 2 * KB])


def row_factor_table(table_launch, amax):
    """The fp32 (TABLE_ENTRIES,) table of ``row_factor_table_kernel`` for the (1,) amax, in one launch
    of ``table_launch`` (a :class:`~nvfp4lab.kernels.launch.Launch` of it; no host sync)."""
    table = torch.empty(TABLE_ENTRIES, dtype=torch.float32, device=amax.device)
    table_launch(amax, table)
    return table


def cast_row_grid(m: int, k: int, meta: dict) -> tuple[int]:
    return (cdiv(m, meta["BLOCK_M"]) * cdiv(k // 16, meta["KB"]),)
