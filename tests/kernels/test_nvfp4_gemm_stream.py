"""The NVFP4 GEMM's weight-stream path (kernels/nvfp4_gemm_details/stream.py: dense, M <= 64) against
the reference GEMM: its PTX decoder through the emulator, the kernel on exact operands (bitwise), the
K-split rule and the table rows' dispatch. Helpers: gemm_checks.py."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from nvfp4lab import ref
from nvfp4lab.kernels import nvfp4_gemm as G
from nvfp4lab.kernels.nvfp4_gemm_details import opt_flags, stream

from .gemm_checks import (
    E2M1,
    SCALES_1_2,
    SCALES_SUBNORMAL,
    assert_close,
    assert_equal,
    atol_bound,
    emulated_asm,
    exact_operand,
    gemm,
    poisoned,
    quant,
    run_ptx,
    skip_cpu_tier_without_interpreter,
)

__all__ = ["emulated_asm"]  # a fixture


@pytest.fixture(autouse=True)
def _cpu_tier_needs_interpreter(request):
    skip_cpu_tier_without_interpreter(request)


def test_stream_ptx_decoder_every_code_and_scale():
    """The stream decoder's PTX on every code in every nibble of a word, with every E4M3 scale (the
    cvt included): each FP16 pair (codes i, i + 4) must be e2m1 * s * 2^-14 exactly."""
    rng = np.random.default_rng(1)
    e4m3 = ref.codecs.e4m3_decode(torch.arange(256)).numpy()
    words, scale_bytes = [], []
    for nib in range(8):
        for code in range(16):
            for s in range(256):
                w = int(rng.integers(0, 1 << 32))
                w = (w & ~(0xF << (4 * nib))) | (code << (4 * nib))
                words.append(w)
                scale_bytes.append(s)
    words = np.array(words, dtype=np.uint32)
    scale_bytes = np.array(scale_bytes, dtype=np.uint32)
    pair = scale_bytes | (np.uint32(0x38) << np.uint32(8))  # the cvt decodes both bytes of its operand
    s16 = run_ptx(stream.E4M3X2_ASM_TEXT, 1, [pair])[0]
    assert np.array_equal(s16 & np.uint32(0xFFFF), np.array(e4m3[scale_bytes], dtype=np.float16).view(np.uint16))
    assert np.array_equal(s16 >> np.uint32(16), np.full(len(pair), np.float16(1.0).view(np.uint16)))
    out = run_ptx(stream.STREAM_ASM_TEXT, 4, [words, s16 & np.uint32(0xFFFF)])
    for p in range(4):
        for half, i in enumerate((p, p + 4)):
            got = ((out[p] >> np.uint32(16 * half)) & np.uint32(0xFFFF)).astype(np.uint16)
            codes = (words >> np.uint32(4 * i)) & np.uint32(0xF)
            val = np.array(E2M1, dtype=np.float64)[codes & 7] * np.where(codes & 8, -1.0, 1.0)
            want = (val * e4m3[scale_bytes].astype(np.float64) * 2.0 ** -14).astype(np.float16)
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(got.view(np.float16)), nan), f"pair {p}: NaN pattern"
            assert np.array_equal(got[~nan], want[~nan].view(np.uint16)), f"pair {p}, code {i}"


# (block_m from M, block_n, block_k, warps, split_k (0 = auto), a_pre): tile edges in N and K, splits of
# uneven length, both ways of feeding A, two K tiles at once (V = 2).
STREAM_VARIANTS = [(64, 128, 4, 1, False), (64, 128, 4, 3, True), (64, 256, 4, 2, False), (128, 128, 8, 0, True)]


@pytest.mark.parametrize("m", [1, 5, 16, 33, 64])
def test_stream_kernel(m):
    """The weight-stream kernel: K = 288 (2.25 tiles of 128), N = 72 (a partial tile), A rows padded to
    16/32/64, bias + accumulate, per-token A, per-row swizzled B; output NaN-poisoned where not written."""
    gen = torch.Generator().manual_seed(80 + m)
    n, k = 72, 288
    a = exact_operand(m, k, gen, amax="token")
    b = exact_operand(n, k, gen, amax="token", layout="swizzled")
    bias = torch.randn(n, generator=gen)
    old = torch.randn(m, n, generator=gen).to(torch.bfloat16)
    want = old.clone()
    gemm(a, b, "ref", bias=bias, out=want, accumulate=True)
    for bn, bk, warps, split, a_pre in STREAM_VARIANTS:
        cfg = G.GemmConfig(opt_flags.stream_block_m(m), bn, bk, 8, warps, 1, stream=True, split_k=split, a_pre=a_pre)
        got = old.clone()
        G.run(a, b, got, bias=bias, accumulate=True, config=cfg)
        assert_equal(got, want)
    out = poisoned((m, n), torch.float32, "cpu")
    G.run(a, b, out, config=G.GemmConfig(16, 64, 128, 8, 4, 1, stream=True, split_k=2))  # M tiles of 16 rows
    assert_equal(out, gemm(a, b, "ref", out_dtype=torch.float32))


def test_stream_layouts_subnormal_scales_and_nan():
    """Compact / padded scale layouts on both sides, subnormal E4M3 scales, a NaN scale (0x7F)."""
    gen = torch.Generator().manual_seed(88)
    a = exact_operand(7, 256, gen, scales=SCALES_SUBNORMAL + (0x38,), layout="padded")
    b = exact_operand(64, 256, gen, scales=SCALES_SUBNORMAL, layout="compact", amax="token")
    cfg = G.GemmConfig(16, 64, 128, 8, 4, 1, stream=True, split_k=2)
    out = poisoned((7, 64), torch.float32, "cpu")
    G.run(a, b, out, config=cfg)
    assert_equal(out, gemm(a, b, "ref", out_dtype=torch.float32))
    big = torch.zeros(64, 130, dtype=torch.uint8)  # codes at an odd byte offset: no int32 view, a copy
    big[:, 1:129] = b.rowwise_data
    b.rowwise_data = big[:, 1:129]
    out = poisoned((7, 64), torch.float32, "cpu")
    G.run(a, b, out, config=cfg)
    assert_equal(out, gemm(a, b, "ref", out_dtype=torch.float32))
    b.rowwise_scale[5, 3] = 0x7F
    want = gemm(a, b, "ref", out_dtype=torch.float32)
    G.run(a, b, out, config=cfg)
    assert torch.equal(torch.isnan(out), torch.isnan(want)) and torch.isnan(want[:, 5]).all()
    assert_equal(out[~torch.isnan(want)], want[~torch.isnan(want)])


def test_stream_counters_reset_and_quantized_data():
    """Split-K counters are left at zero for the next call (same result twice); quantized random data
    within the golden tolerance."""
    gen = torch.Generator().manual_seed(89)
    x, w = torch.randn(16, 512, generator=gen), torch.randn(192, 512, generator=gen)
    a, b = quant(x, per_token=True), quant(w)
    cfg = G.GemmConfig(16, 64, 128, 8, 4, 1, stream=True, split_k=3)
    first = G.run(a, b, poisoned((16, 192), torch.bfloat16, "cpu"), config=cfg)
    assert not stream.stream_counters(torch.device("cpu"), 1).any()
    second = G.run(a, b, poisoned((16, 192), torch.bfloat16, "cpu"), config=cfg)
    assert_equal(second, first)
    assert_close(first, gemm(a, b, "ref"), atol_bound(a, b))


@pytest.mark.parametrize("m,k,amax_a,amax_b,layout_b", [(9, 384, "token", "tensor", "swizzled"),
                                                        (3, 256, "tensor", "token", "compact")])
def test_stream_ptx_decoder_in_kernel(emulated_asm, m, k, amax_a, amax_b, layout_b):
    """The stream kernel with DECODE=1 (operand packing, pair order, both A paths) through the emulator;
    per-token A with swizzled B, and per-row B amax with compact scales."""
    gen = torch.Generator().manual_seed(90 + m)
    a = exact_operand(m, k, gen, amax=amax_a, scales=SCALES_1_2 + (0x00, 0x01))
    b = exact_operand(64, k, gen, amax=amax_b, layout=layout_b)
    want = gemm(a, b, "ref", out_dtype=torch.float32)
    for a_pre in (False, True):
        out = poisoned((m, 64), torch.float32, "cpu")
        G.run(a, b, out, decode=1, config=G.GemmConfig(16, 64, 128, 8, 4, 1, stream=True, split_k=2, a_pre=a_pre))
        assert_equal(out, want)


def test_stream_splits_rule():
    """The computed K splits of the stream kernel: about ctas_per_sm programs per SM, never more than one
    wave of max_resident programs per SM, at least split_min_k_tiles K tiles per split, every split
    non-empty; an explicit split_k is taken as given (capped at the K tiles, rounded to non-empty splits)."""
    def cdiv(a, b):
        return -(-a // b)

    def non_empty(s, k_tiles):
        return cdiv(k_tiles, cdiv(k_tiles, s))

    sms = 132
    base = G.GemmConfig(64, 128, 128, 8, 4, 3, stream=True, split_k=0, ctas_per_sm=2)
    for n, k in [(4096, 4096), (14336, 4096), (7168, 2048), (4096, 14336), (128, 128), (100000, 4096)]:
        tiles, k_tiles = cdiv(n, 128), cdiv(k, 128)
        free = opt_flags.stream_splits(base, 64, n, k, sms)
        assert free == non_empty(max(1, min(k_tiles, cdiv(2 * sms, tiles))), k_tiles)
        capped = opt_flags.stream_splits(dataclasses.replace(base, max_resident=2), 64, n, k, sms)
        assert capped == non_empty(max(1, min(k_tiles, cdiv(2 * sms, tiles), 2 * sms // tiles)), k_tiles)
        assert capped * tiles <= max(tiles, 2 * sms)  # one wave
        long = opt_flags.stream_splits(dataclasses.replace(base, max_resident=2, split_min_k_tiles=8), 64, n, k, sms)
        assert long <= capped and (long == 1 or k_tiles // long >= 8)
        for s in (1, 3, 1000):
            explicit = dataclasses.replace(base, split_k=s, max_resident=2, split_min_k_tiles=8)
            assert opt_flags.stream_splits(explicit, 64, n, k, sms) == non_empty(min(s, k_tiles), k_tiles)
    # the case that motivated the cap: 112 output tiles with 2 programs per SM: 3 splits start a second wave
    assert opt_flags.stream_splits(base, 64, 14336, 4096, sms) == 3
    assert opt_flags.stream_splits(dataclasses.replace(base, max_resident=2), 64, 14336, 4096, sms) == 2
    row64 = next(cfg for max_m, cfg in opt_flags.DENSE_RULES["H200"]["stream"] if max_m == 64)
    assert opt_flags.stream_splits(row64, 64, 14336, 4096, sms) * cdiv(14336, row64.block_n) <= row64.max_resident * sms


@pytest.mark.parametrize("m", [5, 24, 40])  # one M per stream row of the dense rules (up to 16, 32, 64 rows)
def test_stream_rule_rows_default_dispatch(m, monkeypatch):
    """The GPU's default path for few rows, run by the interpreter: nvfp4lab.nvfp4_gemm with no config,
    choose_config answering as on an H200 (on CPU it picks the interpreter's tiles), so each stream row of
    the dense rules (M 17..32 included) runs as the GPU runs it. N = 200 (a partial tile), K = 544 (4.25
    tiles of 128: splits of uneven length), bias, per-token A, per-row swizzled B, bf16 accumulate."""
    choose, launch, used = opt_flags.choose_config, stream.gemm, []

    def as_on_h200(m_, n_, k_, device, grouped=False):
        with monkeypatch.context() as mp:
            mp.setattr(opt_flags, "interpreting", lambda: False)
            mp.setattr(opt_flags, "gpu_key", lambda dev: "H200")
            return choose(m_, n_, k_, torch.device("cuda"), grouped)

    monkeypatch.setattr(opt_flags, "choose_config", as_on_h200)
    monkeypatch.setattr(stream, "gemm", lambda *args: used.append(args[-2]) or launch(*args))
    row = next(cfg for max_m, cfg in opt_flags.DENSE_RULES["H200"]["stream"] if m <= max_m)
    assert row.block_m == opt_flags.stream_block_m(m)
    gen = torch.Generator().manual_seed(95 + m)
    n, k = 200, 544
    a = exact_operand(m, k, gen, amax="token")
    b = exact_operand(n, k, gen, amax="token", layout="swizzled")
    bias = torch.randn(n, generator=gen)
    assert_equal(gemm(a, b, "triton", bias=bias, out_dtype=torch.float32),
                 gemm(a, b, "ref", bias=bias, out_dtype=torch.float32))
    old = torch.randn(m, n, generator=gen).to(torch.bfloat16)
    got, want = old.clone(), old.clone()
    gemm(a, b, "triton", bias=bias, out=got, accumulate=True)
    gemm(a, b, "ref", bias=bias, out=want, accumulate=True)
    assert_equal(got, want)
    assert used == [row, row]


# ------------------------------------------------------------------------------------ GPU tier
GPU_STREAM_CONFIGS = [  # (block_n, block_k, warps, stages, split_k, a_pre) besides the table's row (PTX decoder)
    (256, 128, 8, 3, 0, True), (128, 256, 4, 4, 3, True), (128, 128, 4, 3, 0, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 24, 37])  # one M per stream row of the dense rules
def test_gpu_stream_kernel(m):
    """The weight-stream kernel: the table's row with both decoders, other shapes of it with the PTX
    one; exact operands, K = 8.25 tiles of 128, N = 1000 (partial tiles), bias + accumulate, per-token A,
    per-row swizzled B; each configuration twice (the second call finds the split-K counters reset)."""
    gen = torch.Generator().manual_seed(90 + m)
    n, k = 1000, 1056
    a = exact_operand(m, k, gen, amax="token", device="cuda")
    b = exact_operand(n, k, gen, layout="swizzled", amax="token", device="cuda")
    bias = torch.randn(n, device="cuda")
    old = torch.randn(m, n, device="cuda").to(torch.bfloat16)
    want = old.clone()
    gemm(a, b, "ref", bias=bias, out=want, accumulate=True)
    table = opt_flags.choose_config(m, n, k, torch.device("cuda"))
    assert table.stream
    runs = [(table, 0), (table, 1)]
    runs += [(G.GemmConfig(opt_flags.stream_block_m(m), bn, bk, 8, w, st, stream=True, split_k=sp, a_pre=pre), 1)
             for bn, bk, w, st, sp, pre in GPU_STREAM_CONFIGS if pre or m <= 32]  # Triton 3.6: in-loop A, M <= 32
    for cfg, decode in runs:
        for _ in range(2):
            got = old.clone()
            G.run(a, b, got, bias=bias, accumulate=True, config=cfg, decode=decode)
            assert_equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(1, 14336), (16, 4096), (32, 14336), (64, 14336)])
def test_gpu_stream_large(m, n):
    """LLM decode shapes through the default configuration (the stream kernel: every row of its rules),
    exact operands."""
    gen = torch.Generator().manual_seed(m + n)
    k = 4096
    a = exact_operand(m, k, gen, amax="token", device="cuda")
    b = exact_operand(n, k, gen, device="cuda")
    cfg = opt_flags.choose_config(m, n, k, torch.device("cuda"))
    assert cfg.stream and cfg.block_m == opt_flags.stream_block_m(m)
    out = poisoned((m, n), torch.bfloat16)
    G.run(a, b, out)
    assert_equal(out, gemm(a, b, "ref", out_dtype=torch.bfloat16))
