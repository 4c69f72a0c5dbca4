"""NVFP4 GEMM kernel (kernels/nvfp4_gemm.py) against the reference GEMM (ref/gemm.py).

Two kinds of operands:

* "exact" operands, built from random codes and scales drawn from a narrow set: every product and
  every partial sum is a multiple of a common unit below 2^24 units, so any fp32 summation order gives
  the exact sum and the kernel must equal the reference bit for bit (all output dtypes).
* quantized operands (``quantize_nvfp4(..., backend="ref")``) of random data: compared within the
  golden tolerance |got - ref| <= atol + 2^-7 |ref|, with atol the worst-case fp32 summation error of
  either side (so any correct order passes). NaN never passes.

The PTX decoder (DECODE=1) cannot run in the interpreter; its text is run by a small PTX emulator,
alone (every byte, every scale) and inside the kernel by standing in for the interpreter's inline asm.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np
import pytest
import torch

import nvfp4lab
from nvfp4lab import moe, ref
from nvfp4lab.config import NVFP4QuantConfig
from nvfp4lab.kernels import nvfp4_gemm as G
from nvfp4lab.tensors import NVFP4Tensor

RTOL = 2.0 ** -7
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SCALES_1_2 = (0x38, 0x40)  # 1.0, 2.0: products are multiples of 1/4 up to 144
SCALES_SUBNORMAL = tuple(range(1, 8))  # m * 2^-9
DEV = "cuda" if torch.cuda.is_available() else "cpu"
_NO_TRITON_NEEDED = {"test_ptx_decoder_every_byte_and_scale", "test_input_errors", "test_config_table_rows"}


@pytest.fixture(autouse=True)
def _cpu_tier_needs_interpreter(request):
    """CPU-tier tests run Triton on CPU tensors, i.e. under the interpreter (tests/conftest.py sets it
    when there is no GPU); on a GPU machine without TRITON_INTERPRET=1 only the gpu tier applies."""
    if ("gpu" not in request.keywords and request.function.__name__ not in _NO_TRITON_NEEDED
            and torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"):
        pytest.skip("CPU-tier kernel test: needs TRITON_INTERPRET=1 on a machine with a GPU")


# ------------------------------------------------------------------------------------------ helpers
def quant(x, **kw):
    return nvfp4lab.quantize_nvfp4(x, backend="ref", **kw)


def exact_operand(rows, k, gen, *, scales=SCALES_1_2, amax="tensor", layout="compact", e4m3_max=448.0,
                  device="cpu", shape=None):
    """NVFP4Tensor (rows, k) of random codes and scales from ``scales``; amax per "tensor" or per "token"."""
    data = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=gen)
    pick = torch.randint(0, len(scales), (rows, k // 16), generator=gen)
    scale = torch.tensor(scales, dtype=torch.uint8)[pick]
    n_amax = rows if amax == "token" else 1
    amax_t = torch.rand(n_amax, generator=gen) * 10 + 0.1
    if amax == "token" and rows > 2:
        amax_t[1] = 0.0  # an all-zero row's amax
    config = NVFP4QuantConfig(per_token=amax == "token", e4m3_max=e4m3_max, scale_layout=layout)
    return NVFP4Tensor(
        shape=torch.Size(shape or (rows, k)), dtype=torch.bfloat16, config=config,
        rowwise_data=data.to(device), rowwise_scale=ref.swizzle.apply_scale_layout(scale, layout).to(device),
        rowwise_amax=amax_t.to(device),
    )


def _compact(t):
    return ref.swizzle.compact_scales(t.rowwise_scale, t.scale_layout, t.m, t.k // 16)


def atol_bound(a, b):
    """Worst-case |fp32 sum - exact| of both implementations, times |alpha|: (K+1) 2^-22 sum|p|."""
    a_abs = ref.gemm.block_dequantized(a.rowwise_data, _compact(a)).abs().double()
    b_abs = ref.gemm.block_dequantized(b.rowwise_data, _compact(b)).abs().double()
    alpha = ref.gemm.gemm_alpha(a.rowwise_amax, b.rowwise_amax, a.e4m3_max, b.e4m3_max).double().abs()
    return (a_abs @ b_abs.T) * alpha * (a.k + 1) * 2.0 ** -22 + 1e-30


def assert_close(got, want, atol):
    assert got.shape == want.shape and got.dtype == want.dtype
    g, w = got.double().cpu(), want.double().cpu()
    atol = atol.cpu() if isinstance(atol, torch.Tensor) else atol
    bad = ((g - w).abs() > atol + RTOL * w.abs()) | torch.isnan(g) | torch.isnan(w)
    assert not bad.any(), f"{int(bad.sum())} of {bad.numel()} out of tolerance, first at {bad.nonzero()[0].tolist()}"


def assert_equal(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[got.dtype]
    diff = got.cpu().contiguous().view(bits) != want.cpu().contiguous().view(bits)
    assert not diff.any(), f"{int(diff.sum())} of {diff.numel()} differ, first at {diff.nonzero()[0].tolist()}"


def poisoned(shape, dtype, device=DEV):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def gemm(a, b, backend, **kw):
    return nvfp4lab.nvfp4_gemm(a, b, backend=backend, **kw)


# ------------------------------------------------------------------------------------ PTX emulator
def _parse_operand(tok, regs):
    tok = tok.strip()
    if tok in regs:
        return regs[tok]
    if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", tok):
        return np.uint32(int(tok, 0) & 0xFFFFFFFF)
    raise AssertionError(f"unknown PTX operand {tok!r}")


def _prmt(a, b, c):
    """PTX prmt.b32 default mode: result byte i = byte (c >> 4i) & 7 of {b:a}, sign-replicated when
    bit 3 of that selector nibble is set."""
    src = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
    out = np.zeros(np.broadcast(a, b, c).shape, dtype=np.uint32)
    for i in range(4):
        sel = (c >> np.uint32(4 * i)) & np.uint32(0xF)
        byte = ((src >> ((sel & np.uint32(7)).astype(np.uint64) * np.uint64(8))) & np.uint64(0xFF)).astype(np.uint32)
        byte = np.where((sel & np.uint32(8)) != 0, np.where(byte & 0x80, np.uint32(0xFF), np.uint32(0)), byte)
        out |= byte.astype(np.uint32) << np.uint32(8 * i)
    return out


def _mul_f16x2(a, b):
    def halves(v):
        return np.stack([(v & 0xFFFF).astype(np.uint16), (v >> 16).astype(np.uint16)]).view(np.float16)

    # numpy multiplies float16 through float32 (exact for 11x11-bit products) and rounds once: RN.
    prod = (halves(a).astype(np.float32) * halves(b).astype(np.float32)).astype(np.float16).view(np.uint16)
    return prod[0].astype(np.uint32) | (prod[1].astype(np.uint32) << np.uint32(16))


def _lop3(a, b, c, lut):
    """PTX lop3.b32: bit i of the result is bit (a_i << 2 | b_i << 1 | c_i) of the 8-bit table, with
    a, b, c read as the table's 0xF0, 0xCC, 0xAA."""
    out = np.zeros(np.broadcast(a, b, c).shape, dtype=np.uint32)
    for sel in range(8):
        if (lut >> sel) & 1:
            ta = a if sel & 4 else ~a
            tb = b if sel & 2 else ~b
            tc = c if sel & 1 else ~c
            out |= ta & tb & tc
    return out


def _e4m3x2_to_f16x2(v):
    """PTX cvt.rn.f16x2.e4m3x2: low byte -> low half, high byte -> high half (exact; NaN codes -> NaN)."""
    e4m3 = ref.codecs.e4m3_decode(torch.arange(256)).numpy().astype(np.float16).view(np.uint16).astype(np.uint32)
    return e4m3[v & 0xFF] | (e4m3[(v >> 8) & 0xFF] << np.uint32(16))


def run_ptx(asm, n_out, inputs):
    """Run the straight-line PTX of a decoder on numpy uint32 arrays ($n_out.. are the inputs; 16-bit
    operands sit in the low half)."""
    regs = {f"${n_out + i}": np.asarray(v, dtype=np.uint32) for i, v in enumerate(inputs)}
    for line in asm.strip().splitlines():
        line = line.strip()
        if line in ("{", "}") or line.startswith(".reg") or not line:
            continue
        m = re.fullmatch(r"mov\.b32\s+\{\s*(\S+)\s*,\s*(\S+)\s*\}\s*,\s*(\S+)\s*;", line)
        if m:  # unpack a 32-bit register into two 16-bit ones
            v = _parse_operand(m.group(3), regs)
            regs[m.group(1)], regs[m.group(2)] = v & np.uint32(0xFFFF), v >> np.uint32(16)
            continue
        m = re.fullmatch(r"mov\.b32\s+(\S+)\s*,\s*\{\s*(\S+)\s*,\s*(\S+)\s*\}\s*;", line)
        if m:  # pack two 16-bit registers (first = low half)
            lo, hi = (_parse_operand(t, regs) & np.uint32(0xFFFF) for t in m.group(2, 3))
            regs[m.group(1)] = np.asarray(lo | (hi << np.uint32(16)), dtype=np.uint32)
            continue
        m = re.fullmatch(r"([a-z0-9.]+)\s+(.*);", line)
        assert m, f"cannot parse PTX line {line!r}"
        op, args = m.group(1), [t.strip() for t in m.group(2).split(",")]
        if op == "lop3.b32":
            regs[args[0]] = _lop3(*(_parse_operand(t, regs) for t in args[1:4]), int(args[4], 0))
            continue
        if op == "cvt.rn.f16x2.e4m3x2":
            regs[args[0]] = _e4m3x2_to_f16x2(_parse_operand(args[1], regs))
            continue
        dst, src = args[0], [_parse_operand(t, regs) for t in args[1:]]
        if op == "prmt.b32":
            val = _prmt(*src)
        elif op == "shl.b32":
            val = src[0] << np.uint32(int(src[1]))
        elif op == "shr.b32":
            val = src[0] >> np.uint32(int(src[1]))
        elif op == "and.b32":
            val = src[0] & src[1]
        elif op == "or.b32":
            val = src[0] | src[1]
        elif op == "mul.rn.f16x2":
            val = _mul_f16x2(src[0], src[1])
        else:
            raise AssertionError(f"PTX op {op!r} not emulated")
        regs[dst] = np.asarray(val, dtype=np.uint32)
    return [regs[f"${i}"] for i in range(n_out)]


def _decode_ref_f16(code, scale):
    """fp16 bits of e2m1(code) * scale (exact)."""
    v = np.float32(E2M1[code & 7]) * np.float32(scale)
    v = -v if code & 8 else v
    return np.array(v, dtype=np.float16).view(np.uint16)


def test_ptx_decoder_every_byte_and_scale():
    """Every byte value in every position of the word, with every finite positive E4M3 scale."""
    rng = np.random.default_rng(0)
    e4m3 = ref.codecs.e4m3_decode(torch.arange(0x7F)).numpy()  # 0x00..0x7E
    words, scales = [], []
    for pos in range(4):
        for byte in range(256):
            for s in range(0x7F):
                other = rng.integers(0, 256, 4)
                other[pos] = byte
                words.append(int(other[0]) | int(other[1]) << 8 | int(other[2]) << 16 | int(other[3]) << 24)
                scales.append((s, int(rng.integers(0, 0x7F))))
    words = np.array(words, dtype=np.uint32)
    s_lo = np.array([e4m3[s] for s, _ in scales], dtype=np.float16).view(np.uint16).astype(np.uint32)
    s_hi = np.array([e4m3[t] for _, t in scales], dtype=np.float16).view(np.uint16).astype(np.uint32)
    pair01 = s_lo | (s_lo << 16)  # bytes 0, 1 use scale s, bytes 2, 3 scale t
    pair23 = s_hi | (s_hi << 16)
    tab = np.full_like(words, 0x3E3C3800)
    out = run_ptx(G.DECODE_ASM_TEXT, 4, [words, pair01, pair23, tab, tab, tab, tab])
    # $0, $1: low nibbles of bytes (0,1), (2,3); $2, $3: high nibbles of bytes (0,1), (2,3)
    for reg, nibble, bytes_ in ((0, 0, (0, 1)), (1, 0, (2, 3)), (2, 1, (0, 1)), (3, 1, (2, 3))):
        for half, byte_pos in enumerate(bytes_):
            got = (out[reg] >> np.uint32(16 * half)) & np.uint32(0xFFFF)
            codes = (words >> np.uint32(8 * byte_pos + 4 * nibble)) & np.uint32(0xF)
            sc = np.array([e4m3[s if byte_pos < 2 else t] for s, t in scales], dtype=np.float32)
            want = np.array([_decode_ref_f16(int(c), v) for c, v in zip(codes, sc)], dtype=np.uint16)
            assert np.array_equal(got.astype(np.uint16), want), f"register ${reg}, byte {byte_pos}"


@pytest.fixture
def emulated_asm(monkeypatch):
    """Let the interpreter run tl.inline_asm_elementwise through run_ptx (elements packed in groups of
    ``pack`` in flat order: the decoder's result must not depend on how elements are grouped)."""
    from triton.runtime import interpreter

    def create_inline_asm(asm, constraints, values, types, is_pure, pack):
        types = [t.scalar for t in types]
        shape = values[0].data.shape
        regs = []
        for v in values:
            flat = np.ascontiguousarray(v.data).reshape(-1, pack)
            width = flat.dtype.itemsize * 8
            per_reg = min(pack, max(1, 32 // width))  # as Triton packs: elements in order from the low bits
            for r in range(pack // per_reg):
                chunk = np.ascontiguousarray(flat[:, r * per_reg:(r + 1) * per_reg])
                bits = chunk.view(f"u{width // 8}").astype(np.uint32)
                reg = np.zeros(len(chunk), dtype=np.uint32)
                for e in range(per_reg):
                    reg |= bits[:, e] << np.uint32(width * e)
                regs.append(reg)
        out_regs_per = [max(1, pack // max(1, 32 // (t.primitive_bitwidth))) for t in types]
        outs = run_ptx(asm, sum(out_regs_per), regs)
        results, i = [], 0
        for t, nregs in zip(types, out_regs_per):
            width = t.primitive_bitwidth
            words = np.stack(outs[i:i + nregs], axis=1)
            i += nregs
            per_reg = min(pack, max(1, 32 // width))
            elems = np.stack([(words >> np.uint32(width * e)) & np.uint32((1 << width) - 1 if width < 32 else 0xFFFFFFFF)
                              for e in range(per_reg)], axis=2).reshape(len(words), -1)
            np_t = interpreter._get_np_dtype(t)
            results.append(interpreter.TensorHandle(
                np.ascontiguousarray(elems.astype(f"u{width // 8}")).view(np_t).reshape(shape), t))

        class _Call:
            def get_result(self, j):
                return results[j]

        return _Call()

    monkeypatch.setattr(interpreter.interpreter_builder, "create_inline_asm", create_inline_asm)


# --------------------------------------------------------------------------------- dense, CPU tier
@pytest.mark.parametrize("m,n,k", [(32, 32, 64), (48, 80, 96), (7, 24, 32)])
@pytest.mark.parametrize("amax_a,amax_b", [("tensor", "tensor"), ("token", "tensor"), ("tensor", "token"), ("token", "token")])
def test_exact_operands_bitwise(m, n, k, amax_a, amax_b):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    a = exact_operand(m, k, gen, amax=amax_a)
    b = exact_operand(n, k, gen, amax=amax_b)
    for dtype in (torch.bfloat16, torch.float32):
        assert_equal(gemm(a, b, "triton", out_dtype=dtype), gemm(a, b, "ref", out_dtype=dtype))


@pytest.mark.parametrize("layout_a,layout_b", [("compact", "swizzled"), ("swizzled", "padded"), ("padded", "compact")])
def test_scale_layouts(layout_a, layout_b):
    gen = torch.Generator().manual_seed(3)
    a = exact_operand(40, 96, gen, layout=layout_a, amax="token")
    b = exact_operand(136, 96, gen, layout=layout_b)  # > 128 rows: two swizzle row tiles
    assert_equal(gemm(a, b, "triton", out_dtype=torch.float16), gemm(a, b, "ref", out_dtype=torch.float16))


def test_subnormal_scales_and_mixed_e4m3_max():
    gen = torch.Generator().manual_seed(4)
    a = exact_operand(33, 160, gen, scales=SCALES_SUBNORMAL, e4m3_max=256.0)
    b = exact_operand(50, 160, gen, scales=SCALES_SUBNORMAL, amax="token")
    assert_equal(gemm(a, b, "triton", out_dtype=torch.float32), gemm(a, b, "ref", out_dtype=torch.float32))


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16, torch.float32])
def test_bias_and_out(out_dtype, bias_dtype):
    gen = torch.Generator().manual_seed(5)
    a, b = exact_operand(36, 64, gen, amax="token"), exact_operand(40, 64, gen)
    bias = None if bias_dtype is None else (torch.randn(40, generator=gen) * 100).to(bias_dtype)
    out = poisoned((36, 40), out_dtype, "cpu")
    got = gemm(a, b, "triton", bias=bias, out=out)
    assert got is out
    assert_equal(out, gemm(a, b, "ref", out_dtype=out_dtype, bias=bias))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_accumulate(out_dtype):
    gen = torch.Generator().manual_seed(6)
    a, b = exact_operand(20, 64, gen), exact_operand(33, 64, gen, amax="token")
    bias = torch.randn(33, generator=gen)
    old = (torch.randn(20, 33, generator=gen) * 1000).to(out_dtype)
    got, want = old.clone(), old.clone()
    gemm(a, b, "triton", bias=bias, out=got, accumulate=True)
    gemm(a, b, "ref", bias=bias, out=want, accumulate=True)
    assert_equal(got, want)


def test_strided_out():
    gen = torch.Generator().manual_seed(7)
    a, b = exact_operand(24, 64, gen), exact_operand(40, 64, gen)
    big = poisoned((40, 60), torch.float32, "cpu")
    view = big.t()[5:29]  # (24, 40), strides (1, 60)
    gemm(a, b, "triton", out=view)
    assert_equal(view, gemm(a, b, "ref", out_dtype=torch.float32))
    assert torch.isnan(big.t()[:5]).all() and torch.isnan(big.t()[29:]).all()


def test_nan_scale_propagates_like_ref():
    gen = torch.Generator().manual_seed(8)
    a, b = exact_operand(32, 64, gen), exact_operand(32, 64, gen)
    a.rowwise_scale[3, 1] = 0x7F  # E4M3 NaN
    got, want = gemm(a, b, "triton", out_dtype=torch.float32), gemm(a, b, "ref", out_dtype=torch.float32)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.isnan(want[3]).all()
    assert_equal(got[~torch.isnan(want)], want[~torch.isnan(want)])


@pytest.mark.parametrize("m,n,k", [(48, 80, 96), (64, 64, 256)])
@pytest.mark.parametrize("per_token_a,per_token_b", [(False, False), (True, False), (False, True), (True, True)])
def test_quantized_random_data(m, n, k, per_token_a, per_token_b):
    gen = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=gen) * torch.logspace(-2, 2, m).view(-1, 1)
    w = torch.randn(n, k, generator=gen)
    x[2] = 0.0  # zero row: amax 0 per token
    x[:, 16:32] = 0.0  # zero blocks: scale 0
    a, b = quant(x, per_token=per_token_a), quant(w, per_token=per_token_b)
    assert_close(gemm(a, b, "triton", out_dtype=torch.bfloat16), gemm(a, b, "ref", out_dtype=torch.bfloat16),
                 atol_bound(a, b))


@pytest.mark.parametrize("recipe", ["4over6", "4over6_mse_448", "weights_16x16", "mixed_e"])
def test_recipes(recipe):
    gen = torch.Generator().manual_seed(11)
    x, w = torch.randn(40, 96, generator=gen), torch.randn(48, 96, generator=gen)
    if recipe == "4over6":
        a, b = quant(x, four_over_six="mae"), quant(w, four_over_six="mae")
    elif recipe == "4over6_mse_448":
        a, b = quant(x, four_over_six="mse", e4m3_max=448.0), quant(w)
    elif recipe == "weights_16x16":
        a, b = quant(x, per_token=True), quant(w, block="16x16")
    else:
        a, b = quant(x, four_over_six="mae"), quant(w, block="16x16")
    assert_close(gemm(a, b, "triton"), gemm(a, b, "ref"), atol_bound(a, b))


def test_golden_gemm_cases_ref_quantized(golden_dirs):
    """Every nvfp4_gemm golden case: operands quantized by the reference, multiplied by the kernel."""
    from safetensors import safe_open

    from nvfp4lab import conformance

    seen = set()
    for folder in golden_dirs:
        for path in sorted(folder.glob("nvfp4_gemm_*.safetensors")):
            if path.name in seen:
                continue
            seen.add(path.name)
            with safe_open(str(path), "pt") as f:
                case = json.loads(f.metadata()["case"])
                t = {key: f.get_tensor(key) for key in f.keys()}
            params = case["params"]
            a = quant(t["a"], **conformance._gemm_operand_kwargs(params["a_params"]))
            b = quant(t["b"], **conformance._gemm_operand_kwargs(params["b_params"]))
            got = gemm(a, b, "triton", out_dtype=conformance._DTYPES[params["out_dtype"]])
            assert_close(got, t["out"], case["atol"])
    assert len(seen) >= 10


def test_conformance_folder_triton_backend():
    pytest.importorskip("nvfp4lab.kernels.nvfp4_quantize", reason="the Triton quantizer is not in this tree yet")
    from nvfp4lab.conformance import default_folder, run_folder

    results = run_folder(default_folder(), backend="triton", pattern="nvfp4_gemm_*")
    assert results and all(r.passed for r in results), [r for r in results if not r.passed]


def test_ptx_decoder_in_kernel(emulated_asm):
    """The whole kernel with DECODE=1 (operand order, packing, output use) through the PTX emulator."""
    gen = torch.Generator().manual_seed(12)
    a = exact_operand(40, 160, gen, amax="token", scales=SCALES_1_2 + (0x00,))
    b = exact_operand(36, 160, gen, layout="swizzled")
    want = gemm(a, b, "ref", out_dtype=torch.float32)
    for decode in (0, 1):
        out = poisoned((40, 36), torch.float32, "cpu")
        G.run(a, b, out, decode=decode)
        assert_equal(out, want)


@pytest.mark.parametrize("k", [128, 96])  # 96: a partial K tile, zero-padded in the expanded B
def test_b_predecode_path(k):
    gen = torch.Generator().manual_seed(20 + k)
    a = exact_operand(40, k, gen, amax="token")
    b = exact_operand(72, k, gen, layout="swizzled", amax="token")
    want = gemm(a, b, "ref", out_dtype=torch.bfloat16)
    for cfg in (G.GemmConfig(32, 32, 64, 4, 4, 1, b_predecode=True), G.GemmConfig(16, 64, 128, 4, 4, 1, b_predecode=True)):
        out = poisoned((40, 72), torch.bfloat16, "cpu")
        G.run(a, b, out, config=cfg)
        assert_equal(out, want)


@pytest.mark.parametrize("split_k", [2, 3])
def test_split_k(split_k):
    """K split over CTAs (5 K tiles: uneven splits, one may be empty), partials summed by the epilogue kernel."""
    gen = torch.Generator().manual_seed(30 + split_k)
    a, b = exact_operand(20, 288, gen, amax="token"), exact_operand(40, 288, gen, amax="token")
    bias = torch.randn(40, generator=gen)
    old = torch.randn(20, 40, generator=gen).to(torch.bfloat16)
    want = old.clone()
    gemm(a, b, "ref", bias=bias, out=want, accumulate=True)
    for b_pre in (False, True):
        got = old.clone()
        G.run(a, b, got, bias=bias, accumulate=True, config=G.GemmConfig(16, 32, 64, 4, 4, 1, b_predecode=b_pre, split_k=split_k))
        assert_equal(got, want)


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
    s16 = run_ptx(G.E4M3X2_ASM_TEXT, 1, [pair])[0]
    assert np.array_equal(s16 & np.uint32(0xFFFF), np.array(e4m3[scale_bytes], dtype=np.float16).view(np.uint16))
    assert np.array_equal(s16 >> np.uint32(16), np.full(len(pair), np.float16(1.0).view(np.uint16)))
    out = run_ptx(G.STREAM_ASM_TEXT, 4, [words, s16 & np.uint32(0xFFFF)])
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
        cfg = G.GemmConfig(G.stream_block_m(m), bn, bk, 8, warps, 1, stream=True, split_k=split, a_pre=a_pre)
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
    assert not G._stream_counters(torch.device("cpu"), 1).any()
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
        free = G.stream_splits(base, 64, n, k, sms)
        assert free == non_empty(max(1, min(k_tiles, cdiv(2 * sms, tiles))), k_tiles)
        capped = G.stream_splits(dataclasses.replace(base, max_resident=2), 64, n, k, sms)
        assert capped == non_empty(max(1, min(k_tiles, cdiv(2 * sms, tiles), 2 * sms // tiles)), k_tiles)
        assert capped * tiles <= max(tiles, 2 * sms)  # one wave
        long = G.stream_splits(dataclasses.replace(base, max_resident=2, split_min_k_tiles=8), 64, n, k, sms)
        assert long <= capped and (long == 1 or k_tiles // long >= 8)
        for s in (1, 3, 1000):
            explicit = dataclasses.replace(base, split_k=s, max_resident=2, split_min_k_tiles=8)
            assert G.stream_splits(explicit, 64, n, k, sms) == non_empty(min(s, k_tiles), k_tiles)
    # the case that motivated the cap: 112 output tiles with 2 programs per SM: 3 splits start a second wave
    assert G.stream_splits(base, 64, 14336, 4096, sms) == 3
    assert G.stream_splits(dataclasses.replace(base, max_resident=2), 64, 14336, 4096, sms) == 2
    row64 = next(cfg for max_m, cfg in G._DENSE_RULES["H200"]["stream"] if max_m == 64)
    assert G.stream_splits(row64, 64, 14336, 4096, sms) * cdiv(14336, row64.block_n) <= row64.max_resident * sms


@pytest.mark.parametrize("m", [5, 24, 40])  # one M per stream row of the dense rules (up to 16, 32, 64 rows)
def test_stream_rule_rows_default_dispatch(m, monkeypatch):
    """The GPU's default path for few rows, run by the interpreter: nvfp4lab.nvfp4_gemm with no config,
    choose_config answering as on an H200 (on CPU it picks the interpreter's tiles), so each stream row of
    the dense rules (M 17..32 included) runs as the GPU runs it. N = 200 (a partial tile), K = 544 (4.25
    tiles of 128: splits of uneven length), bias, per-token A, per-row swizzled B, bf16 accumulate."""
    choose, launch, used = G.choose_config, G._launch_stream, []

    def as_on_h200(m_, n_, k_, device, grouped=False):
        with monkeypatch.context() as mp:
            mp.setattr(G, "_interpreting", lambda: False)
            mp.setattr(G, "_gpu_key", lambda dev: "H200")
            return choose(m_, n_, k_, torch.device("cuda"), grouped)

    monkeypatch.setattr(G, "choose_config", as_on_h200)
    monkeypatch.setattr(G, "_launch_stream", lambda *args: used.append(args[-2]) or launch(*args))
    row = next(cfg for max_m, cfg in G._DENSE_RULES["H200"]["stream"] if m <= max_m)
    assert row.block_m == G.stream_block_m(m)
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


@pytest.mark.parametrize("k", [128, 96])  # 96: a partial expansion tile, zero-padded on both sides
def test_dequant_mm_path(k):
    """Both operands expanded to FP16 q * s, one fp32-output matmul, the epilogue kernel."""
    gen = torch.Generator().manual_seed(50 + k)
    a = exact_operand(40, k, gen, amax="token", layout="swizzled")
    b = exact_operand(72, k, gen, amax="token")
    bias = torch.randn(72, generator=gen).to(torch.bfloat16)
    old = torch.randn(40, 72, generator=gen).to(torch.bfloat16)
    want = old.clone()
    gemm(a, b, "ref", bias=bias, out=want, accumulate=True)
    for block_k in (64, 128):
        got = old.clone()
        G.run(a, b, got, bias=bias, accumulate=True, config=G.GemmConfig(32, 32, block_k, dequant_mm=True))
        assert_equal(got, want)


def test_dense_only_configs_fall_back_for_grouped():
    """A stream / dequant_mm config given to a grouped GEMM runs the grouped kernel instead."""
    gen = torch.Generator().manual_seed(55)
    sizes = [3, 0, 5]
    a = exact_operand(sum(sizes), 128, gen, amax="token")
    b_list = [exact_operand(16, 128, gen) for _ in sizes]
    want = _per_expert_reference(a, b_list, sizes)
    for cfg in (G.GemmConfig(16, 64, 128, stream=True, split_k=2), G.GemmConfig(32, 32, 64, dequant_mm=True)):
        out = poisoned((sum(sizes), 16), torch.float32, "cpu")
        G.run(a, moe.stack_weights(b_list), out, offs=torch.tensor(sizes).cumsum(0), num_experts=3, config=cfg)
        assert_equal(out, want)


# ------------------------------------------------------------------------------- grouped, CPU tier
def _per_expert_reference(a, b_list, sizes, bias=None, out_dtype=torch.float32):
    """The definition: one dense reference GEMM per expert on the expert's rows."""
    rows, r0 = [], 0
    for e, size in enumerate(sizes):
        sub = ref.gemm._rows(a, _compact(a), a.rowwise_amax if a.rowwise_amax.numel() == 1
                             else a.rowwise_amax[r0:r0 + size], r0, r0 + size)
        bias_e = None if bias is None else (bias[e] if bias.dim() == 2 else bias)
        rows.append(gemm(sub, b_list[e], "ref", out_dtype=out_dtype, bias=bias_e))
        r0 += size
    return torch.cat(rows)


@pytest.mark.parametrize("amax_a,amax_b", [("token", "tensor"), ("tensor", "token")])
def test_grouped_equals_per_expert(amax_a, amax_b):
    gen = torch.Generator().manual_seed(13)
    sizes, n, k = [13, 0, 40, 7, 0], 24, 96
    a = exact_operand(sum(sizes), k, gen, amax=amax_a)
    b_list = [exact_operand(n, k, gen, amax=amax_b) for _ in sizes]
    bias = torch.randn(len(sizes), n, generator=gen)
    offs = torch.tensor(sizes).cumsum(0)
    want = _per_expert_reference(a, b_list, sizes, bias)
    got = nvfp4lab.nvfp4_grouped_gemm(a, b_list, offs, bias=bias, out=poisoned((sum(sizes), n), torch.float32, "cpu"),
                                      backend="triton")
    assert_equal(got, want)
    assert_equal(nvfp4lab.nvfp4_grouped_gemm(a, b_list, offs, bias=bias, out_dtype=torch.float32, backend="ref"), want)


def test_grouped_stacked_weights_swizzled_accumulate():
    """b as one (E, N, K) tensor (one amax), swizzled scales over E*N rows, int32 offs, bf16 accumulate."""
    gen = torch.Generator().manual_seed(14)
    sizes, e, n, k = [0, 33, 31], 3, 40, 64
    a = exact_operand(sum(sizes), k, gen, amax="token", layout="padded")
    b = exact_operand(e * n, k, gen, layout="swizzled", shape=(e, n, k))
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    old = torch.randn(sum(sizes), n, generator=gen).to(torch.bfloat16)
    got, want = old.clone(), old.clone()
    nvfp4lab.nvfp4_grouped_gemm(a, b, offs, bias=bias, out=got, accumulate=True, backend="triton")
    nvfp4lab.nvfp4_grouped_gemm(a, b, offs, bias=bias, out=want, accumulate=True, backend="ref")
    assert_equal(got, want)


def test_grouped_list_of_activations_quantized():
    """a as a list of per-split tensors (each its own amax), b as a list: equals per-expert GEMMs."""
    gen = torch.Generator().manual_seed(15)
    sizes, n, k = [20, 0, 37], 40, 128
    xs = [torch.randn(s, k, generator=gen) * (i + 1) for i, s in enumerate(sizes)]
    a_list = [quant(x) for x in xs]
    b_list = [quant(torch.randn(n, k, generator=gen)) for _ in sizes]
    got = nvfp4lab.nvfp4_grouped_gemm(a_list, b_list, backend="triton")
    for i, (a_e, b_e) in enumerate(zip(a_list, b_list)):
        r0 = sum(sizes[:i])
        assert_close(got[r0:r0 + sizes[i]], gemm(a_e, b_e, "ref"), atol_bound(a_e, b_e))


@pytest.mark.parametrize("amax_a,b_amax,bias_dim,out_dtype", [
    ("token", "expert", 2, torch.float32), ("tensor", "row", 1, torch.bfloat16), ("token", "one", 0, torch.float16)])
def test_grouped_dequant_mm_host_splits(amax_a, b_amax, bias_dim, out_dtype):
    """With host split sizes, a dequant_mm config runs one cuBLAS-style GEMM per expert on the expanded
    operands and the epilogue per expert: equal to the per-expert definition for every amax / bias mode,
    zero-size experts (first, middle and last) and a partial expansion tile (K = 96)."""
    gen = torch.Generator().manual_seed(31)
    sizes, n, k = [0, 21, 0, 40, 7, 0], 24, 96
    e = len(sizes)
    a = exact_operand(sum(sizes), k, gen, amax=amax_a)
    if b_amax == "one":
        b = exact_operand(e * n, k, gen, layout="swizzled", shape=(e, n, k))
        b_list = [NVFP4Tensor(shape=torch.Size((n, k)), dtype=b.dtype, config=b.config,
                              rowwise_data=b.rowwise_data[i * n:(i + 1) * n],
                              rowwise_scale=_compact(b)[i * n:(i + 1) * n], rowwise_amax=b.rowwise_amax)
                  for i in range(e)]
        b_list = [dataclasses.replace(t, config=dataclasses.replace(t.config, scale_layout="compact")) for t in b_list]
    else:
        b_list = [exact_operand(n, k, gen, amax="token" if b_amax == "row" else "tensor") for _ in sizes]
        b = moe.stack_weights(b_list)
    bias = None if bias_dim == 0 else torch.randn(*((e, n) if bias_dim == 2 else (n,)), generator=gen)
    bias_list = None if bias is None else (bias if bias_dim == 2 else bias.expand(e, n))
    want = _per_expert_reference(a, b_list, sizes, bias_list, out_dtype)
    offs = torch.tensor(sizes).cumsum(0)
    for block_k in (64, 128):
        out = poisoned((sum(sizes), n), out_dtype, "cpu")
        G.run(a, b, out, bias=bias, offs=offs, num_experts=e, splits=sizes,
              config=G.GemmConfig(32, 32, block_k, dequant_mm=True))
        assert_equal(out, want)


def test_grouped_dequant_mm_accumulate_strided_out():
    gen = torch.Generator().manual_seed(32)
    sizes, n, k = [33, 0, 31], 40, 64
    a = exact_operand(sum(sizes), k, gen, amax="token", layout="padded")
    b_list = [exact_operand(n, k, gen) for _ in sizes]
    b = moe.stack_weights(b_list)
    offs = torch.tensor(sizes).cumsum(0)
    old = torch.randn(n, sum(sizes), generator=gen).to(torch.bfloat16).t()  # strided (column-major) out
    got, want = old.clone(memory_format=torch.preserve_format), old.clone()
    assert got.stride() == old.stride()
    nvfp4lab.nvfp4_grouped_gemm(a, b, offs, out=want, accumulate=True, backend="ref")
    G.run(a, b, got, accumulate=True, offs=offs, num_experts=len(sizes), splits=sizes,
          config=G.GemmConfig(32, 32, 64, dequant_mm=True))
    assert_equal(got, want)


def test_grouped_ptx_decoder_in_kernel(emulated_asm):
    gen = torch.Generator().manual_seed(16)
    sizes, n, k = [9, 0, 30], 24, 64
    a = exact_operand(sum(sizes), k, gen, amax="token")
    b_list = [exact_operand(n, k, gen) for _ in sizes]
    stacked = moe.stack_weights(b_list)
    num_experts = len(b_list)
    want = _per_expert_reference(a, b_list, sizes)
    for cfg in (None, G.GemmConfig(32, 32, 64, 4, 4, 1, b_predecode=True)):
        out = poisoned((sum(sizes), n), torch.float32, "cpu")
        G.run(a, stacked, out, offs=torch.tensor(sizes).cumsum(0), num_experts=num_experts, decode=1, config=cfg)
        assert_equal(out, want)


# ------------------------------------------------------------------------------- API and plumbing
def test_empty_shapes():
    gen = torch.Generator().manual_seed(17)
    a, b = exact_operand(0, 64, gen), exact_operand(16, 64, gen)
    assert gemm(a, b, "triton").shape == (0, 16)
    sizes = [0, 0]
    a = exact_operand(0, 64, gen)
    out = nvfp4lab.nvfp4_grouped_gemm(a, [b, b], torch.tensor(sizes).cumsum(0), backend="triton")
    assert out.shape == (0, 16)


def test_input_errors():
    gen = torch.Generator().manual_seed(18)
    a, b = exact_operand(16, 64, gen), exact_operand(16, 64, gen)
    with pytest.raises(ValueError, match="share K"):
        gemm(a, exact_operand(16, 32, gen), "triton")
    with pytest.raises(ValueError, match="bias must have shape"):
        gemm(a, b, "triton", bias=torch.zeros(15))
    with pytest.raises(ValueError, match="accumulate=True needs out"):
        gemm(a, b, "triton", accumulate=True)
    offs = torch.tensor([16, 16])
    with pytest.raises(ValueError, match="offs is required"):
        nvfp4lab.nvfp4_grouped_gemm(a, [b, b], backend="triton")
    with pytest.raises(ValueError, match=r"offs must have shape \(E,\)"):
        nvfp4lab.nvfp4_grouped_gemm(a, [b, b], torch.tensor([16]), backend="triton")
    with pytest.raises(TypeError, match="offs must have dtype"):
        nvfp4lab.nvfp4_grouped_gemm(a, [b, b], offs.float(), backend="triton")
    with pytest.raises(ValueError, match=r"logical shape \(E, N, K\)"):
        nvfp4lab.nvfp4_grouped_gemm(a, b, offs, backend="triton")
    with pytest.raises(ValueError, match="bias must have shape"):
        nvfp4lab.nvfp4_grouped_gemm(a, [b, b], offs, bias=torch.zeros(3, 16), backend="triton")
    with pytest.raises(ValueError, match="offs must be None"):
        nvfp4lab.nvfp4_grouped_gemm([a], [b], offs[:1], backend="triton")
    with pytest.raises(ValueError, match="nondecreasing"):
        nvfp4lab.nvfp4_grouped_gemm(a, [b, b], torch.tensor([10, 12]), backend="ref")
    for bad in ([16], [10, 7], [17, -1]):
        with pytest.raises(ValueError, match=r"m_splits must hold E = 2 sizes >= 0 summing to M = 16"):
            nvfp4lab.nvfp4_grouped_gemm(a, [b, b], offs, m_splits=bad, backend="triton")
    with pytest.raises(TypeError, match="m_splits must be a list or tuple of ints"):
        nvfp4lab.nvfp4_grouped_gemm(a, [b, b], offs, m_splits=torch.tensor([0, 16]), backend="triton")


def test_custom_ops_trace_with_fake_impls():
    gen = torch.Generator().manual_seed(19)
    a, b = exact_operand(32, 64, gen, amax="token"), exact_operand(32, 64, gen)
    bias = torch.randn(32, generator=gen)
    offs = torch.tensor([10, 32])
    stacked = moe.stack_weights([b, b])

    def fn(x_a, x_b, bias):
        y = G.nvfp4_gemm(x_a, x_b, out_dtype=torch.float32, bias=bias)
        return y + G.nvfp4_grouped_gemm(x_a, stacked, offs, 2, out_dtype=torch.float32)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    assert_equal(compiled(a, b, bias), fn(a, b, bias))
    args = (*G._operand(a), *G._operand(b), bias, 64, torch.bfloat16)
    torch.library.opcheck(torch.ops.nvfp4lab.nvfp4_gemm.default, args, test_utils=("test_schema", "test_faketensor"))


def test_config_table_rows():
    """Every row of every GPU table: BLOCK_K a multiple of 64 (the decoder's tiling), powers of two."""
    for rows in G._CONFIGS.values():
        assert rows[-1][0] >= 1 << 40
        for _, cfg in rows:
            assert cfg.block_k % 64 == 0
            for v in (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps):
                assert v & (v - 1) == 0
    assert G.choose_config(16, 4096, 4096, torch.device("cpu")).block_k % 64 == 0
    for rule in G._DENSE_RULES.values():
        for max_m, cfg in rule["stream"]:
            assert cfg.stream and cfg.block_m >= max_m and cfg.block_m % 16 == 0 and cfg.block_k % 128 == 0
            assert cfg.block_n % (16 * cfg.num_warps) == 0
    if torch.cuda.is_available():
        for m, bm in ((1, 16), (16, 16), (20, 32), (64, 64)):
            cfg = G.choose_config(m, 4096, 4096, torch.device("cuda"))
            assert cfg.stream and cfg.block_m == bm
        assert G.choose_config(16, 4096, 4096, torch.device("cuda"), grouped=True).split_k > 1


_COMPILE_SM90 = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from nvfp4lab.kernels import nvfp4_gemm as G

fn = G._nvfp4_gemm_kernel
pointers = {"a_ptr": "*u8", "a_scale_ptr": "*u8", "a_amax_ptr": "*fp32", "b_ptr": "*u8", "b_scale_ptr": "*u8",
            "b_amax_ptr": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*bf16", "offs_ptr": "*i32", "ws_ptr": "*fp32"}
for decode, rows in ((1, (G._HOPPER[0], G._HOPPER[-1])), (0, (G._HOPPER[-1],))):
    for _, cfg in rows:
        constexprs = dict(A_SWIZZLED=False, B_SWIZZLED=True, A_AMAX_ROWS=True, B_AMAX_MODE=0, BIAS_MODE=1,
                          ACCUMULATE=False, OUT_BF16=True, GROUPED=cfg.block_m > 16, E_POW2=8, EVEN_K=decode == 0,
                          DECODE=decode, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                          GROUP_M=cfg.group_m, B_PRE=cfg.b_predecode, SPLIT_K=1 if cfg.block_m > 16 else 3)
        if cfg.b_predecode:
            pointers["b_ptr"] = "*fp16"
        sig = {name: pointers.get(name, "constexpr" if name in constexprs else ("fp32" if name == "inv_e" else "i32"))
               for name in fn.arg_names}
        attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in pointers}
        src = triton.compiler.ASTSource(fn=fn, signature=sig, attrs=attrs,
                                        constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
        c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=False))
        assert len(c.asm["cubin"]) > 0 and c.metadata.shared > 0
        pointers["b_ptr"] = "*u8"
        print("ok", decode, cfg)
fn_x = G._expand_kernel
ptr_x = {"b_ptr": "*u8", "b_scale_ptr": "*u8", "out_ptr": "*fp16"}
cx = dict(B_SWIZZLED=True, DECODE=1, BLOCK_R=64, BLOCK_K=64)
sig = {name: ptr_x.get(name, "constexpr" if name in cx else "i32") for name in fn_x.arg_names}
src = triton.compiler.ASTSource(fn=fn_x, signature=sig, attrs={(fn_x.arg_names.index(n),): [["tt.divisibility", 16]] for n in ptr_x},
                                constexprs={(fn_x.arg_names.index(k),): v for k, v in cx.items()})
assert len(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["cubin"]) > 0
print("ok expand")
fn_e = G._split_k_epilogue_kernel
ptr_e = {"ws_ptr": "*fp32", "a_amax_ptr": "*fp32", "b_amax_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16"}
ce = dict(SPLIT_K=3, A_AMAX_ROWS=True, B_AMAX_MODE=2, BIAS_MODE=1, ACCUMULATE=True, OUT_BF16=True, BLOCK_M=32, BLOCK_N=32)
sig = {name: ptr_e.get(name, "constexpr" if name in ce else ("fp32" if name == "inv_e" else "i32")) for name in fn_e.arg_names}
src = triton.compiler.ASTSource(fn=fn_e, signature=sig, constexprs={(fn_e.arg_names.index(k),): v for k, v in ce.items()})
assert len(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["cubin"]) > 0
print("ok split-k epilogue")
fn_s = G._stream_kernel
ptr_s = {"a_ptr": "*fp16", "a_scale_ptr": "*u8", "a_amax_ptr": "*fp32", "b_ptr": "*i32", "b_scale_ptr": "*u8",
         "b_amax_ptr": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*bf16", "ws_ptr": "*fp32", "count_ptr": "*i32"}
for _, cfg in G._HOPPER_DENSE["stream"]:
    cs = dict(A_SWIZZLED=False, B_SWIZZLED=True, A_AMAX_ROWS=True, B_AMAX_MODE=2, BIAS_MODE=1, ACCUMULATE=True,
              OUT_BF16=True, EVEN_K=False, DECODE=1, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, V=cfg.block_k // 128,
              WARPS=cfg.num_warps, A_PRE=cfg.a_pre, SPLIT=True)
    sig = {name: ptr_s.get(name, "constexpr" if name in cs else ("fp32" if name == "inv_e" else "i32"))
           for name in fn_s.arg_names}
    src = triton.compiler.ASTSource(fn=fn_s, signature=sig, attrs={(fn_s.arg_names.index(n),): [["tt.divisibility", 16]] for n in ptr_s},
                                    constexprs={(fn_s.arg_names.index(k),): v for k, v in cs.items()})
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=False)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    assert len(c.asm["cubin"]) > 0 and "local_alloc %b_val" not in c.asm["ttgir"]
    print("ok stream", cfg.block_m)
fn_x = G._stream_expand_kernel
ptr_x = {"a_ptr": "*i32", "a_scale_ptr": "*u8", "out_ptr": "*fp16"}
cx = dict(A_SWIZZLED=True, DECODE=1, ROWS=16)
sig = {name: ptr_x.get(name, "constexpr" if name in cx else "i32") for name in fn_x.arg_names}
src = triton.compiler.ASTSource(fn=fn_x, signature=sig, attrs={(fn_x.arg_names.index(n),): [["tt.divisibility", 16]] for n in ptr_x},
                                constexprs={(fn_x.arg_names.index(k),): v for k, v in cx.items()})
assert len(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["cubin"]) > 0
print("ok stream expand")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU tier runs the kernels themselves")
def test_compiles_for_sm90(tmp_path):
    """The PTX decoder with the smallest (split-K) and largest (B expansion) tiles, the portable one,
    the expansion and split-K epilogue kernels, and the stream kernel's table rows (B decoded straight
    into the wgmma register operand: no shared-memory round trip) compile to sm_90 cubins (no GPU)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SM90], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("no ptxas on this machine")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("ok") == 5 + len(G._HOPPER_DENSE["stream"]) + 1, proc.stdout


# ------------------------------------------------------------------------------------ GPU tier
GPU_SHAPES = [(4096, 4096, 4096), (16, 4096, 4096), (64, 14336, 4096), (333, 1000, 2048), (2048, 7168, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [0, 1])
@pytest.mark.parametrize("m,n,k", GPU_SHAPES)
def test_gpu_exact_large(m, n, k, decode):
    gen = torch.Generator().manual_seed(m + n + k)
    a = exact_operand(m, k, gen, amax="token", device="cuda")
    b = exact_operand(n, k, gen, layout="swizzled", device="cuda")
    want = gemm(a, b, "ref", out_dtype=torch.bfloat16)
    out = poisoned((m, n), torch.bfloat16)
    G.run(a, b, out, decode=decode)
    assert_equal(out, want)


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [0, 1])
def test_gpu_subnormal_scales(decode):
    gen = torch.Generator().manual_seed(21)
    a = exact_operand(1024, 2048, gen, scales=SCALES_SUBNORMAL, device="cuda")
    b = exact_operand(1536, 2048, gen, scales=SCALES_SUBNORMAL, amax="token", device="cuda")
    out = poisoned((1024, 1536), torch.float32)
    G.run(a, b, out, decode=decode)
    assert_equal(out, gemm(a, b, "ref", out_dtype=torch.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 64, 256, 4096])
def test_gpu_every_table_config(m):
    """Each row of the GPU's table with both decoders, on exact operands with edge masks."""
    gen = torch.Generator().manual_seed(m)
    n, k = 1000, 1056
    a = exact_operand(m + 3, k, gen, amax="token", device="cuda")
    b = exact_operand(n, k, gen, device="cuda")
    want = gemm(a, b, "ref", out_dtype=torch.float32)
    for _, cfg in G._CONFIGS[G._gpu_key(torch.device("cuda"))]:
        for decode in (0, 1):
            out = poisoned((m + 3, n), torch.float32)
            G.run(a, b, out, config=cfg, decode=decode)
            assert_equal(out, want)


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
    table = G.choose_config(m, n, k, torch.device("cuda"))
    assert table.stream
    runs = [(table, 0), (table, 1)]
    runs += [(G.GemmConfig(G.stream_block_m(m), bn, bk, 8, w, st, stream=True, split_k=sp, a_pre=pre), 1)
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
    cfg = G.choose_config(m, n, k, torch.device("cuda"))
    assert cfg.stream and cfg.block_m == G.stream_block_m(m)
    out = poisoned((m, n), torch.bfloat16)
    G.run(a, b, out)
    assert_equal(out, gemm(a, b, "ref", out_dtype=torch.bfloat16))


@pytest.mark.gpu
def test_gpu_dequant_mm():
    gen = torch.Generator().manual_seed(70)
    m, n, k = 333, 1000, 1056
    a = exact_operand(m, k, gen, amax="token", device="cuda")
    b = exact_operand(n, k, gen, amax="token", device="cuda", layout="swizzled")
    bias = torch.randn(n, device="cuda")
    want = gemm(a, b, "ref", bias=bias, out_dtype=torch.bfloat16)
    rule = G._DENSE_RULES[G._gpu_key(torch.device("cuda"))]["dequant"]
    for decode in (0, 1):
        out = poisoned((m, n), torch.bfloat16)
        G.run(a, b, out, bias=bias, config=rule, decode=decode)
        assert_equal(out, want)


@pytest.mark.gpu
@pytest.mark.parametrize("per_token", [False, True])
def test_gpu_quantized_data(per_token):
    gen = torch.Generator().manual_seed(22)
    x = torch.randn(1024, 4096, generator=gen).to("cuda", torch.bfloat16)
    w = torch.randn(2048, 4096, generator=gen).to("cuda", torch.bfloat16)
    a, b = quant(x, per_token=per_token), quant(w)
    bias = torch.randn(2048, device="cuda")
    assert_close(gemm(a, b, "triton", bias=bias), gemm(a, b, "ref", bias=bias), atol_bound(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("decode", [0, 1])
def test_gpu_grouped(decode):
    gen = torch.Generator().manual_seed(23)
    sizes, n, k = [700, 0, 1, 300, 2048, 0, 129, 512], 2048, 1024
    a = exact_operand(sum(sizes), k, gen, amax="token", device="cuda")
    b_list = [exact_operand(n, k, gen, device="cuda") for _ in sizes]
    stacked = moe.stack_weights(b_list)
    num_experts = len(b_list)
    bias = torch.randn(len(sizes), n, device="cuda")
    out = poisoned((sum(sizes), n), torch.bfloat16)
    G.run(a, stacked, out, bias=bias, offs=torch.tensor(sizes, device="cuda").cumsum(0), num_experts=num_experts,
          decode=decode)
    assert_equal(out, _per_expert_reference(a, b_list, sizes, bias, torch.bfloat16))


@pytest.mark.gpu
def test_gpu_grouped_host_splits_default_dispatch(monkeypatch):
    """Large experts with host split sizes take the per-expert dequantize + cuBLAS path by default,
    also inside a CUDA graph and under torch.compile; equal to the per-expert definition."""
    gen = torch.Generator().manual_seed(25)
    sizes, n, k = [512, 0, 700, 836], 2048, 1056
    a = exact_operand(sum(sizes), k, gen, amax="token", device="cuda")
    b_list = [exact_operand(n, k, gen, amax="token", device="cuda") for _ in sizes]
    stacked = moe.stack_weights(b_list)
    bias = torch.randn(len(sizes), n, device="cuda")
    offs = torch.tensor(sizes, device="cuda").cumsum(0)
    want = _per_expert_reference(a, b_list, sizes, bias, torch.bfloat16)
    calls = []
    real = G._launch_grouped_dequant_mm
    monkeypatch.setattr(G, "_launch_grouped_dequant_mm", lambda *args: calls.append(1) or real(*args))
    out = poisoned((sum(sizes), n), torch.bfloat16)
    nvfp4lab.nvfp4_grouped_gemm(a, stacked, offs, bias=bias, out=out, m_splits=sizes, backend="triton")
    assert calls == [1]
    assert_equal(out, want)
    graph = torch.cuda.CUDAGraph()
    out.fill_(float("nan"))
    with torch.cuda.graph(graph):
        nvfp4lab.nvfp4_grouped_gemm(a, stacked, offs, bias=bias, out=out, m_splits=sizes, backend="triton")
    graph.replay()
    torch.cuda.synchronize()
    assert_equal(out, want)
    compiled = torch.compile(lambda x, y: nvfp4lab.nvfp4_grouped_gemm(x, y, offs, bias=bias, m_splits=sizes,
                                                                      backend="triton"), fullgraph=True)
    assert_equal(compiled(a, stacked), want)


@pytest.mark.gpu
def test_gpu_cuda_graph_and_compile():
    gen = torch.Generator().manual_seed(24)
    a = exact_operand(256, 1024, gen, amax="token", device="cuda")
    b = exact_operand(512, 1024, gen, device="cuda")
    want = gemm(a, b, "ref")
    out = poisoned((256, 512), torch.bfloat16)
    gemm(a, b, "triton", out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    out.fill_(float("nan"))
    with torch.cuda.graph(graph):
        gemm(a, b, "triton", out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert_equal(out, want)
    compiled = torch.compile(lambda x, y: G.nvfp4_gemm(x, y, out_dtype=torch.bfloat16), fullgraph=True)
    assert_equal(compiled(a, b), want)
