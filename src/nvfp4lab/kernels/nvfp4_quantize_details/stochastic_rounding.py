"""Stochastic rounding of the NVFP4 cast: Philox random bytes and the E2M1 rounding rule.

Philox4x32-10 (``tl.philox``), 8 random bits per element, stream 0 rowwise / 1 columnwise (counter word
2), the seed an int or an int64 device tensor read by the kernel. Which bits feed which element (TE's
own mapping differs per kernel; only statistics are specified): one Philox block per unit of 2 rows x
8 columns of the quantized matrix (x rowwise, x^T or RHT(x^T) columnwise), counter
(r // 2) * (cols / 8) + c // 8, byte 8 (r % 2) + c % 8 (word byte // 4, byte byte % 4), so each
thread of ``cast16_kernel`` computes each of its Philox blocks once.
"""
import triton
import triton.language as tl


@triton.jit
def philox_words(seed, counter, STREAM: tl.constexpr):
    """The four uint32 words of the Philox block of each int64 block counter (key = seed, counter =
    (lo, hi, STREAM, 0))."""
    lo = (counter & 0xFFFFFFFF).to(tl.uint32)
    hi = (counter >> 32).to(tl.uint32)
    return tl.philox(seed, lo, hi, tl.zeros_like(lo) + STREAM, tl.zeros_like(lo))


@triton.jit
def _philox_bytes(seed, counter, STREAM: tl.constexpr, jj):
    """Byte jj (0..15, broadcastable against counter) of the Philox block of each block counter
    (``philox_words``): word jj // 4, byte jj % 4 (TE's mapping)."""
    w0, w1, w2, w3 = philox_words(seed, counter, STREAM)
    w = tl.where(jj < 4, w0, tl.where(jj < 8, w1, tl.where(jj < 12, w2, w3))).to(tl.int32, bitcast=True)
    return (w >> ((jj % 4) * 8)) & 0xFF


@triton.jit
def pair_bytes_rows(seed, g, pid_k, k_blocks, KB: tl.constexpr):
    """Random bytes of a ``cast16_kernel`` tile's rowwise blocks, [16 (tile rows), KB, 16].

    Unit = 2 rows x 8 columns of x: rows 2p, 2p + 1, columns 8q..8q+7, counter p * (K / 8) + q
    (stream 0); byte 8 (row % 2) + (column % 8) of its Philox block (word byte // 4, byte byte % 4).
    A thread holds 8 whole units (rows 8h + 2jp + jl, columns 16b + 8s + e), so each Philox block
    is computed once, by one thread."""
    jp = tl.arange(0, 4)[:, None, None, None, None, None]
    jl = tl.arange(0, 2)[None, :, None, None, None, None]
    h = tl.arange(0, 2)[None, None, :, None, None, None]
    b = tl.arange(0, KB)[None, None, None, :, None, None]
    s = tl.arange(0, 2)[None, None, None, None, :, None]
    e = tl.arange(0, 8)[None, None, None, None, None, :]
    unit = (g * 8 + h * 4 + jp) * (k_blocks * 2) + (pid_k * KB + b) * 2 + s  # [4, 1, 2, KB, 2, 1]
    rb = _philox_bytes(seed, unit, 0, jl * 8 + e)  # [4 (jp), 2 (jl), 2 (h), KB, 2 (s), 8 (e)]
    # tile row i = 2 j + h with j = 2 jp + jl (row 8 h + j); column 16 b + 8 s + e
    return tl.reshape(rb, [16, KB, 16])


@triton.jit
def pair_bytes_cols(seed, unit_base, unit_stride, pid_k, BLOCK_K: tl.constexpr):
    """Random bytes of a ``cast16_kernel`` tile's columnwise blocks, [16 (tile rows), BLOCK_K].

    The rowwise units on the quantized matrix x^T (or RHT(x^T)): columns 2p, 2p + 1 of x, rows
    8q..8q+7, counter p * (M / 8) + q (stream 1; grouped: the split's bulk block offset + its own
    units), byte 8 (column % 2) + (row % 8). A thread holds rows 8h..8h+7 of 8 columns: 4 whole units."""
    j = tl.arange(0, 8)[:, None, None, None]
    h = tl.arange(0, 2)[None, :, None, None]
    cp = tl.arange(0, BLOCK_K // 2)[None, None, :, None]
    cl = tl.arange(0, 2)[None, None, None, :]
    unit = unit_base + h + (pid_k * (BLOCK_K // 2) + cp).to(tl.int64) * unit_stride  # [1, 2, BK/2, 1]
    cb = _philox_bytes(seed, unit, 1, cl * 8 + j)  # [8 (j), 2 (h), BK/2, 2 (cl)]
    return tl.reshape(cb, [16, BLOCK_K])


@triton.jit
def sr_seed(seed_ptr, seed_value, SR: tl.constexpr, SEED_FROM_PTR: tl.constexpr):
    """The SR key: read from the int64 device tensor, or the int argument (0 without SR)."""
    seed = 0
    if SR:
        if SEED_FROM_PTR:
            seed = tl.load(seed_ptr)
        else:
            seed = seed_value
    return seed


@triton.jit
def sr_e2m1(y, rbytes):
    """Stochastic rounding onto the E2M1 grid: the codes of ref.nvfp4.stochastic_round_e2m1 (the spec's
    fp32 rule) for every fp32 y and byte 0..255 (NaN -> +6), in about half the instructions of that rule.

    |y| >= 1 (inf, NaN included): the grid step is the fp32 ulp of a 1-bit mantissa (bit 22), so
    t = |y| + u * step is bits(|y|) + (byte << 14) as integers, exact (fp32 would round only when t
    enters the next binade, and never across a grid point there: t < 2^(e+1) + step / 2 and the next
    point is 2^(e+1) + 2 step), and the code is the exponent and bit 22: (bits >> 22) - 252, saturated
    at 7 (uint32: NaN bits do not wrap). |y| < 1: step 0.5, the code is floor(fl(2|y| + byte / 256)),
    = floor(2 fl(|y| + byte / 512)) (2|y| and byte / 256 are exact). The sign goes on nonzero codes
    of y < 0 (the float path's -0.0 encodes as 0; NaN fails y < 0)."""
    a = tl.abs(y)
    big = (a.to(tl.uint32, bitcast=True) + (rbytes.to(tl.uint32) << 14)) >> 22
    hi = tl.minimum(big.to(tl.int32) - 252, 7)
    lo = tl.fma(rbytes.to(tl.float32), 0.00390625, a + a).to(tl.int32)  # byte / 256 exact: one rounding
    mag = tl.where(a < 1.0, lo, hi)
    return tl.where((y < 0.0) & (mag != 0), mag | 8, mag)
