"""Helpers of the NVFP4 GEMM kernel tests (test_nvfp4_gemm*.py): exact operands, bitwise and
tolerance comparisons, the per-expert definition of a grouped GEMM, and a PTX emulator for the GEMM's
inline-asm decoders (which the Triton interpreter cannot run).

"Exact" operands are built from random codes and scales drawn from a narrow set: every product and
every partial sum is a multiple of a common unit below 2^24 units, so any fp32 summation order gives
the exact sum and the kernel must equal the reference bit for bit (all output dtypes). Quantized
operands are compared within the golden tolerance |got - ref| <= atol + 2^-7 |ref|, with atol the
worst-case fp32 summation error of either side (so any correct order passes). NaN never passes.
"""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

import nvfp4lab
from nvfp4lab import ref
from nvfp4lab.config import NVFP4QuantConfig
from nvfp4lab.tensors import NVFP4Tensor

RTOL = 2.0 ** -7
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SCALES_1_2 = (0x38, 0x40)  # 1.0, 2.0: products are multiples of 1/4 up to 144
SCALES_SUBNORMAL = tuple(range(1, 8))  # m * 2^-9
DEV = "cuda" if torch.cuda.is_available() else "cpu"
# tests that run no Triton kernel (they need no interpreter on a GPU machine)
NO_TRITON_NEEDED = {"test_ptx_decoder_every_byte_and_scale", "test_stream_ptx_decoder_every_code_and_scale",
                    "test_input_errors", "test_config_table_rows", "test_stream_splits_rule"}


def skip_cpu_tier_without_interpreter(request):
    """CPU-tier tests run Triton on CPU tensors, i.e. under the interpreter (tests/conftest.py sets it
    when there is no GPU); on a GPU machine without TRITON_INTERPRET=1 only the gpu tier applies."""
    if ("gpu" not in request.keywords and request.function.__name__ not in NO_TRITON_NEEDED
            and torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"):
        pytest.skip("CPU-tier kernel test: needs TRITON_INTERPRET=1 on a machine with a GPU")


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


def compact(t):
    return ref.swizzle.compact_scales(t.rowwise_scale, t.scale_layout, t.m, t.k // 16)


def atol_bound(a, b):
    """Worst-case |fp32 sum - exact| of both implementations, times |alpha|: (K+1) 2^-22 sum|p|."""
    a_abs = ref.gemm.block_dequantized(a.rowwise_data, compact(a)).abs().double()
    b_abs = ref.gemm.block_dequantized(b.rowwise_data, compact(b)).abs().double()
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


def per_expert_reference(a, b_list, sizes, bias=None, out_dtype=torch.float32):
    """The definition: one dense reference GEMM per expert on the expert's rows."""
    rows, r0 = [], 0
    for e, size in enumerate(sizes):
        sub = ref.gemm._rows(a, compact(a), a.rowwise_amax if a.rowwise_amax.numel() == 1
                             else a.rowwise_amax[r0:r0 + size], r0, r0 + size)
        bias_e = None if bias is None else (bias[e] if bias.dim() == 2 else bias)
        rows.append(gemm(sub, b_list[e], "ref", out_dtype=out_dtype, bias=bias_e))
        r0 += size
    return torch.cat(rows)



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


def decode_ref_f16(code, scale):
    """fp16 bits of e2m1(code) * scale (exact)."""
    v = np.float32(E2M1[code & 7]) * np.float32(scale)
    v = -v if code & 8 else v
    return np.array(v, dtype=np.float16).view(np.uint16)


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
