"""NVFP4 GEMM (kernels/nvfp4_gemm.py: dispatch, fused-decode and dequant paths, grouped GEMM, custom ops)
against the reference GEMM (ref/gemm.py); the weight-stream path is in test_nvfp4_gemm_stream.py.

Exact operands must give the reference's bits; quantized ones must agree within the golden tolerance
(see gemm_checks.py). The PTX decoder (DECODE=1) cannot run in the interpreter; its text is run by a
small PTX emulator, alone (every byte, every scale) and inside the kernel by standing in for the
interpreter's inline asm.
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

import nvfp4lab
from nvfp4lab import moe, ref
from nvfp4lab.kernels import nvfp4_gemm as G
from nvfp4lab.kernels.nvfp4_gemm_details import dequant_mm, fused, opt_flags
from nvfp4lab.tensors import NVFP4Tensor

from .gemm_checks import (
    SCALES_1_2,
    SCALES_SUBNORMAL,
    assert_close,
    assert_equal,
    atol_bound,
    compact,
    decode_ref_f16,
    emulated_asm,
    exact_operand,
    gemm,
    per_expert_reference,
    poisoned,
    quant,
    run_ptx,
    skip_cpu_tier_without_interpreter,
)

__all__ = ["emulated_asm"]  # a fixture


@pytest.fixture(autouse=True)
def _cpu_tier_needs_interpreter(request):
    skip_cpu_tier_without_interpreter(request)


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
    out = run_ptx(fused.DECODE_ASM_TEXT, 4, [words, pair01, pair23, tab, tab, tab, tab])
    # $0, $1: low nibbles of bytes (0,1), (2,3); $2, $3: high nibbles of bytes (0,1), (2,3)
    for reg, nibble, bytes_ in ((0, 0, (0, 1)), (1, 0, (2, 3)), (2, 1, (0, 1)), (3, 1, (2, 3))):
        for half, byte_pos in enumerate(bytes_):
            got = (out[reg] >> np.uint32(16 * half)) & np.uint32(0xFFFF)
            codes = (words >> np.uint32(8 * byte_pos + 4 * nibble)) & np.uint32(0xF)
            sc = np.array([e4m3[s if byte_pos < 2 else t] for s, t in scales], dtype=np.float32)
            want = np.array([decode_ref_f16(int(c), v) for c, v in zip(codes, sc)], dtype=np.uint16)
            assert np.array_equal(got.astype(np.uint16), want), f"register ${reg}, byte {byte_pos}"



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


@pytest.fixture
def scaled_mm_calls(monkeypatch):
    """The products the dequant_mm path ran with cuBLAS' epilogue (True) or without (False: fp32 product and the
    epilogue kernel), in call order; with the kept cuBLASLt batches dropped, so that each product is planned anew."""
    calls = []
    real = dequant_mm._scaled_mm
    monkeypatch.setattr(dequant_mm, "_BATCHES", {})

    def spy(a16, b16, out, bias=None):
        run = real(a16, b16, out, bias)
        calls.append(run is not None)
        return run
    monkeypatch.setattr(dequant_mm, "_scaled_mm", spy)
    real_mm = dequant_mm._mm_f32
    monkeypatch.setattr(dequant_mm, "_mm_f32", lambda *args, **kwargs: calls.append(False) or real_mm(*args, **kwargs))
    return calls


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("amax_a,amax_b,out_dtype,bias_dtype,cublas", [
    ("tensor", "tensor", torch.bfloat16, None, True), ("tensor", "tensor", torch.bfloat16, torch.bfloat16, True),
    ("tensor", "tensor", torch.float32, torch.float32, True), ("tensor", "tensor", torch.float32, torch.bfloat16, False),
    ("tensor", "tensor", torch.float16, None, False), ("token", "tensor", torch.bfloat16, None, False),
    ("tensor", "token", torch.bfloat16, None, False)])
def test_dequant_mm_cublas_epilogue(amax_a, amax_b, out_dtype, bias_dtype, cublas, device, scaled_mm_calls):
    """Where alpha is one number (A and B per tensor) and the output is bf16 / fp32 (with a bias: of the output's
    dtype, into 16-byte aligned rows), the dequant_mm path expands the operands to BF16 and scales (and adds the
    bias) in cuBLAS' epilogue (on the CPU its PyTorch twin) with the alpha kernel's value; other outputs / biases,
    per-token amaxes and a bias into 2-byte aligned rows take the fp32 product and the epilogue kernel. Equal to the
    reference either way (exact operands), misaligned / strided output rows included."""
    gen = torch.Generator().manual_seed(71)
    m, n, k = (333, 1000, 1056) if device == "cuda" else (40, 72, 96)
    a = exact_operand(m, k, gen, amax=amax_a, device=device, layout="swizzled")
    b = exact_operand(n, k, gen, amax=amax_b, device=device)
    bias = None if bias_dtype is None else (torch.randn(n, generator=gen) * 100).to(device, bias_dtype)
    want = gemm(a, b, "ref", out_dtype=out_dtype, bias=bias)
    rule = G.GemmConfig(32, 32, 64, dequant_mm=True) if device == "cpu" else None
    for contiguous in (True, False):
        out = poisoned((m, n), out_dtype, device) if contiguous else poisoned((m, n + 3), out_dtype, device)[:, 1:n + 1]
        scaled_mm_calls.clear()
        G.run(a, b, out, bias=bias, config=rule or opt_flags.DENSE_RULES["default"]["dequant"])
        assert_equal(out, want)
        if not cublas or (bias is not None and not contiguous):
            assert scaled_mm_calls and True not in scaled_mm_calls
        elif contiguous or device == "cpu":  # (cuBLASLt may have no algorithm for 2-byte aligned rows)
            assert scaled_mm_calls == [True]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("a_per_expert,b_per_expert", [(False, False), (False, True), (True, True)])
def test_alpha_kernel_like_ref(a_per_expert, b_per_expert, device):
    """alpha[e] of the alpha kernel is the reference's alpha of expert e's amaxes (apply_alpha of acc = 1): the
    rescaled one where fl(amax_a * amax_b) overflows for finite amaxes, inf like the reference's; a zero after the
    last entry (cuBLAS' beta)."""
    gen = torch.Generator().manual_seed(72)
    e = 37
    a_amax = torch.rand(e if a_per_expert else 1, generator=gen) * 10
    b_amax = torch.rand(e if b_per_expert else 1, generator=gen) * 10
    a_amax[0], b_amax[0] = 1e20, 1e19  # overflow: the rescaled alpha
    if b_per_expert:
        b_amax[-1] = float("inf")
    inv_e = G.gemm_inv(448.0, 256.0)
    alpha = dequant_mm._alphas(a_amax.to(device), b_amax.to(device), e, a_per_expert, b_per_expert, inv_e).cpu()
    a_each, b_each = a_amax.expand(e), b_amax.expand(e)
    want = ref.gemm.apply_alpha(torch.ones(e, 1), a_each, b_each, 448.0, 256.0).diagonal()
    assert torch.equal(alpha[:-1].view(torch.int32), want.view(torch.int32))
    assert alpha[-1].item() == 0.0 and torch.isinf(a_each * b_each).any()


def test_dense_only_configs_fall_back_for_grouped():
    """A stream / dequant_mm config given to a grouped GEMM runs the grouped kernel instead."""
    gen = torch.Generator().manual_seed(55)
    sizes = [3, 0, 5]
    a = exact_operand(sum(sizes), 128, gen, amax="token")
    b_list = [exact_operand(16, 128, gen) for _ in sizes]
    want = per_expert_reference(a, b_list, sizes)
    for cfg in (G.GemmConfig(16, 64, 128, stream=True, split_k=2), G.GemmConfig(32, 32, 64, dequant_mm=True)):
        out = poisoned((sum(sizes), 16), torch.float32, "cpu")
        G.run(a, moe.stack_weights(b_list), out, offs=torch.tensor(sizes).cumsum(0), num_experts=3, config=cfg)
        assert_equal(out, want)

# ------------------------------------------------------------------------------- grouped, CPU tier
@pytest.mark.parametrize("amax_a,amax_b", [("token", "tensor"), ("tensor", "token")])
def test_grouped_equals_per_expert(amax_a, amax_b):
    gen = torch.Generator().manual_seed(13)
    sizes, n, k = [13, 0, 40, 7, 0], 24, 96
    a = exact_operand(sum(sizes), k, gen, amax=amax_a)
    b_list = [exact_operand(n, k, gen, amax=amax_b) for _ in sizes]
    bias = torch.randn(len(sizes), n, generator=gen)
    offs = torch.tensor(sizes).cumsum(0)
    want = per_expert_reference(a, b_list, sizes, bias)
    got = nvfp4lab.nvfp4_grouped_gemm(a, b_list, offs, bias=bias, out=poisoned((sum(sizes), n), torch.float32, "cpu"),
                                      backend="triton")
    assert_equal(got, want)
    assert_equal(nvfp4lab.nvfp4_grouped_gemm(a, b_list, offs, bias=bias, out_dtype=torch.float32, backend="ref"), want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("amax_a", ["tensor", "token"])
@pytest.mark.parametrize("dequant", [False, True], ids=["default", "dequant_mm"])
def test_alpha_of_huge_amaxes_like_ref(amax_a, dequant, device):
    """fl(amax_a * amax_b) overflows for 1e20 * 1e19 (TE: inf, and NaN where acc = 0): the epilogue
    forms alpha from amax / 2^64 each and scales back, bit for bit as the reference; zeros stay zero.
    On the dequant_mm path with A per tensor, cuBLAS' epilogue takes alpha = fl(fl(alpha_low * 2^64) * 2^64)
    (dequant_mm's docstring): the same bits."""
    gen = torch.Generator().manual_seed(43)
    a = exact_operand(48, 64, gen, amax=amax_a, device=device)
    b = exact_operand(40, 64, gen, device=device)
    a.rowwise_amax = torch.full_like(a.rowwise_amax, 1e20)
    if amax_a == "token":
        a.rowwise_amax[::5] = 3e38  # results past fp32's range: inf, as the exact result
    b.rowwise_amax = torch.tensor([1e19], device=device)
    a.rowwise_data[:16] = 0  # zero rows: exactly 0 (not NaN)
    config = G.GemmConfig(32, 32, 64, dequant_mm=True) if dequant else None
    for out_dtype in (torch.float32, torch.bfloat16):
        want = gemm(a, b, "ref", out_dtype=out_dtype)
        assert_equal(G.run(a, b, poisoned((48, 40), out_dtype, device), config=config), want)
        assert not want.isnan().any() and (want[:16] == 0).all()
        if out_dtype == torch.float32 and amax_a == "tensor":
            assert want.isfinite().all()


def _normalized_sizes(offs: list, m: int) -> list:
    """The rows each expert owns for arbitrary offs (the kernel's rule): [end_{e-1}, end_e) with end_e
    the running maximum of offs[0..e] clipped to [0, M]."""
    ends, top = [], 0
    for o in offs:
        top = max(top, o)
        ends.append(min(max(top, 0), m))
    return [e - s for s, e in zip([0] + ends[:-1], ends)]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("offs", [[32, 16, 48], [16, 32, 40], [8, 64, 80], [-8, 24, 24], [48, 0, 0]],
                         ids=["decreasing", "short", "past_m", "negative", "first_takes_all"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_grouped_kernel_writes_every_row_for_any_device_offs(offs, accumulate, device):
    """Device offs are not checked (a host sync); whatever they hold, every output row is defined: the
    experts' (running-max) ranges get their GEMMs, rows past them zeros (or out as it was)."""
    gen = torch.Generator().manual_seed(41)
    m, n, k, e = 48, 24, 64, 3
    a = exact_operand(m, k, gen, amax="token", device=device)
    b_list = [exact_operand(n, k, gen, device=device) for _ in range(e)]
    bias = torch.randn(e, n, generator=gen).to(device)
    sizes = _normalized_sizes(offs, m)
    covered = sum(sizes)
    old = torch.randn(m, n, generator=gen).to(device)
    out = old.clone() if accumulate else poisoned((m, n), torch.float32, device)
    # the op itself (host offs) refuses these offs; the launcher below is what a GPU call runs unchecked
    G.nvfp4_grouped_gemm(a, moe.stack_weights(b_list), torch.tensor(offs, device=device), e, bias=bias, out=out,
                         accumulate=accumulate)
    want = per_expert_reference(ref.gemm._rows(a, compact(a), a.rowwise_amax[:covered], 0, covered), b_list, sizes, bias)
    if accumulate:
        want = want + old[:covered]
    assert_equal(out[:covered], want)
    assert_equal(out[covered:], old[covered:] if accumulate else torch.zeros(m - covered, n, device=device))


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
    ("token", "expert", 2, torch.float32), ("tensor", "row", 1, torch.bfloat16), ("token", "one", 0, torch.float16),
    ("tensor", "expert", 0, torch.bfloat16), ("tensor", "one", 0, torch.float32)])  # the last two: cuBLAS' epilogue
def test_grouped_dequant_mm_host_splits(amax_a, b_amax, bias_dim, out_dtype):
    """With host split sizes, a dequant_mm config runs one cuBLAS-style GEMM per expert on the expanded
    operands and one epilogue over all rows (experts straddling its row tiles): equal to the per-expert
    definition for every amax / bias mode, zero-size experts (first, middle and last) and a partial
    expansion tile (K = 96)."""
    gen = torch.Generator().manual_seed(31)
    sizes, n, k = [0, 21, 0, 40, 7, 0], 24, 96
    e = len(sizes)
    a = exact_operand(sum(sizes), k, gen, amax=amax_a)
    if b_amax == "one":
        b = exact_operand(e * n, k, gen, layout="swizzled", shape=(e, n, k))
        b_list = [NVFP4Tensor(shape=torch.Size((n, k)), dtype=b.dtype, config=b.config,
                              rowwise_data=b.rowwise_data[i * n:(i + 1) * n],
                              rowwise_scale=compact(b)[i * n:(i + 1) * n], rowwise_amax=b.rowwise_amax)
                  for i in range(e)]
        b_list = [dataclasses.replace(t, config=dataclasses.replace(t.config, scale_layout="compact")) for t in b_list]
    else:
        b_list = [exact_operand(n, k, gen, amax="token" if b_amax == "row" else "tensor") for _ in sizes]
        b = moe.stack_weights(b_list)
    bias = None if bias_dim == 0 else torch.randn(*((e, n) if bias_dim == 2 else (n,)), generator=gen)
    bias_list = None if bias is None else (bias if bias_dim == 2 else bias.expand(e, n))
    want = per_expert_reference(a, b_list, sizes, bias_list, out_dtype)
    offs = torch.tensor(sizes).cumsum(0)
    for block_k in (64, 128):
        out = poisoned((sum(sizes), n), out_dtype, "cpu")
        G.run(a, b, out, bias=bias, offs=offs, num_experts=e, splits=sizes,
              config=G.GemmConfig(32, 32, block_k, dequant_mm=True))
        assert_equal(out, want)


@pytest.mark.gpu
def test_gpu_grouped_cublas_batch_repeats_with_new_operands(scaled_mm_calls):
    """The grouped dequant_mm path keeps its cuBLASLt plans and view offsets per shape (``cublaslt.Batch``): calls
    with new operands, biases and outputs, of new shapes (planned anew) and of the shapes of the call before (run
    from the kept batch), each equal the per-expert definition bit for bit (exact operands, per-expert bias)."""
    gen = torch.Generator().manual_seed(33)
    sizes, n, k = [256, 0, 384, 128], 256, 512
    offs = torch.tensor(sizes, device="cuda").cumsum(0)
    for pad, planned in ((0, [True] * 3), (8, [True] * 3), (8, [])):
        a = exact_operand(sum(sizes), k, gen, device="cuda")
        b_list = [exact_operand(n, k, gen, device="cuda") for _ in sizes]
        bias = (torch.randn(len(sizes), n, generator=gen) * 100).to("cuda", torch.bfloat16)
        want = per_expert_reference(a, b_list, sizes, bias, torch.bfloat16)
        out = poisoned((sum(sizes), n + pad), torch.bfloat16, "cuda")[:, pad:]
        scaled_mm_calls.clear()
        G.run(a, moe.stack_weights(b_list), out, bias=bias, offs=offs, num_experts=len(sizes), splits=sizes,
              config=G.GemmConfig(32, 32, 64, dequant_mm=True))
        assert scaled_mm_calls == planned
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
    want = per_expert_reference(a, b_list, sizes)
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
    args = (*G.operand_args(a), *G.operand_args(b), bias, 64, torch.bfloat16)
    torch.library.opcheck(torch.ops.nvfp4lab.nvfp4_gemm.default, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("a_kind, b_kind, out_dtype", [
    (("tensor", "compact", 448.0), ("tensor", "swizzled", 448.0), torch.bfloat16),
    (("token", "swizzled", 256.0), ("token", "padded", 448.0), torch.float32),
])
def test_compile_fullgraph_equals_eager_and_reference(a_kind, b_kind, out_dtype, monkeypatch):
    """torch.compile (fullgraph, aot_eager: the op's implementation runs) gives the eager and the
    reference GEMM's bits (exact operands), on the plan's path and, with a strided bias, the generic one."""
    gen = torch.Generator().manual_seed(43)
    a = exact_operand(48, 128, gen, amax=a_kind[0], layout=a_kind[1], e4m3_max=a_kind[2])
    b = exact_operand(40, 128, gen, amax=b_kind[0], layout=b_kind[1], e4m3_max=b_kind[2])
    bias = torch.randn(40, generator=gen)
    generic, real_launch = [], G._launch
    monkeypatch.setattr(G, "_launch", lambda *args, **kwargs: generic.append(1) or real_launch(*args, **kwargs))
    fn = lambda x, y, bias_: G.nvfp4_gemm(x, y, out_dtype=out_dtype, bias=bias_)  # noqa: E731
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    want = gemm(a, b, "ref", out_dtype=out_dtype, bias=bias)
    assert_equal(fn(a, b, bias), want)
    assert_equal(compiled(a, b, bias), want)
    assert generic == []
    strided_bias = torch.empty(80)[::2]  # the generic path (it makes the bias contiguous)
    strided_bias.copy_(bias)
    assert_equal(compiled(a, b, strided_bias), want)
    assert generic == [1]


def test_config_table_rows():
    """Every row of every GPU table: BLOCK_K a multiple of 64 (the decoder's tiling), powers of two."""
    for rows in opt_flags.CONFIGS.values():
        assert rows[-1][0] >= 1 << 40
        for _, cfg in rows:
            assert cfg.block_k % 64 == 0
            for v in (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps):
                assert v & (v - 1) == 0
    assert opt_flags.choose_config(16, 4096, 4096, torch.device("cpu")).block_k % 64 == 0
    for rule in opt_flags.DENSE_RULES.values():
        for max_m, cfg in rule["stream"]:
            assert cfg.stream and cfg.block_m >= max_m and cfg.block_m % 16 == 0 and cfg.block_k % 128 == 0
            assert cfg.block_n % (16 * cfg.num_warps) == 0
    if torch.cuda.is_available():
        for m, bm in ((1, 16), (16, 16), (20, 32), (64, 64)):
            cfg = opt_flags.choose_config(m, 4096, 4096, torch.device("cuda"))
            assert cfg.stream and cfg.block_m == bm


_COMPILE_SM90 = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from nvfp4lab.kernels.nvfp4_gemm_details import dequant_mm, fused, opt_flags, stream

fn = fused.nvfp4_gemm_kernel
pointers = {"a_ptr": "*u8", "a_scale_ptr": "*u8", "a_amax_ptr": "*fp32", "b_ptr": "*u8", "b_scale_ptr": "*u8",
            "b_amax_ptr": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*bf16", "offs_ptr": "*i32"}
for decode, rows in ((1, (opt_flags.HOPPER[0], opt_flags.HOPPER[-1])), (0, (opt_flags.HOPPER[-1],))):
    for _, cfg in rows:
        constexprs = dict(A_SWIZZLED=False, B_SWIZZLED=True, A_AMAX_ROWS=True, B_AMAX_MODE=0, BIAS_MODE=1,
                          ACCUMULATE=False, OUT_BF16=True, GROUPED=cfg.block_m > 16, E_POW2=8, EVEN_K=decode == 0,
                          DECODE=decode, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                          GROUP_M=cfg.group_m, B_PRE=cfg.b_predecode, EPI_PR3045=decode == 1)  # both epilogue orders
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
fn_x = fused.expand_kernel
ptr_x = {"a_ptr": "*u8", "a_scale_ptr": "*u8", "a_out_ptr": "*fp16", "b_ptr": "*u8", "b_scale_ptr": "*u8",
         "b_out_ptr": "*fp16", "alpha_ptr": "*fp32", "alpha_a_amax_ptr": "*fp32", "alpha_b_amax_ptr": "*fp32"}
for natural in (False, True):  # the GEMM's permuted order, and K order (next to NVFP4Operand inputs), + alphas
    cx = dict(A_SWIZZLED=False, B_SWIZZLED=True, DECODE=1, BLOCK_R=64, BLOCK_K=64, NATURAL=natural, ALPHA=natural,
              A_PER_EXPERT=natural, B_PER_EXPERT=False, ALPHA_BLOCK=16)
    sig = {name: ptr_x.get(name, "constexpr" if name in cx else ("fp32" if name == "inv_e" else "i32"))
           for name in fn_x.arg_names}
    src = triton.compiler.ASTSource(fn=fn_x, signature=sig,
                                    attrs={(fn_x.arg_names.index(n),): [["tt.divisibility", 16]] for n in ptr_x},
                                    constexprs={(fn_x.arg_names.index(k),): v for k, v in cx.items()})
    assert len(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["cubin"]) > 0
print("ok expand")
fn_e = dequant_mm.epilogue_kernel
ptr_e = {"acc_ptr": "*fp32", "a_amax_ptr": "*fp32", "b_amax_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16"}
ce = dict(A_AMAX_ROWS=True, B_AMAX_MODE=2, BIAS_MODE=1, ACCUMULATE=True, OUT_BF16=True, BLOCK_M=32, BLOCK_N=32,
          EPI_PR3045=True)
sig = {name: ptr_e.get(name, "constexpr" if name in ce else ("fp32" if name == "inv_e" else "i32")) for name in fn_e.arg_names}
src = triton.compiler.ASTSource(fn=fn_e, signature=sig, constexprs={(fn_e.arg_names.index(k),): v for k, v in ce.items()})
assert len(triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["cubin"]) > 0
print("ok epilogue")
fn_s = stream.stream_kernel
ptr_s = {"a_ptr": "*fp16", "a_scale_ptr": "*u8", "a_amax_ptr": "*fp32", "b_ptr": "*i32", "b_scale_ptr": "*u8",
         "b_amax_ptr": "*fp32", "bias_ptr": "*fp32", "out_ptr": "*bf16", "ws_ptr": "*fp32", "count_ptr": "*i32"}
for i, (_, cfg) in enumerate(opt_flags.HOPPER_DENSE["stream"]):
    cs = dict(A_SWIZZLED=False, B_SWIZZLED=True, A_AMAX_ROWS=True, B_AMAX_MODE=2, BIAS_MODE=1, ACCUMULATE=True,
              OUT_BF16=True, EVEN_K=False, DECODE=1, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, V=cfg.block_k // 128,
              WARPS=cfg.num_warps, A_PRE=cfg.a_pre, SPLIT=True, EPI_PR3045=i == 0)
    sig = {name: ptr_s.get(name, "constexpr" if name in cs else ("fp32" if name == "inv_e" else "i32"))
           for name in fn_s.arg_names}
    src = triton.compiler.ASTSource(fn=fn_s, signature=sig, attrs={(fn_s.arg_names.index(n),): [["tt.divisibility", 16]] for n in ptr_s},
                                    constexprs={(fn_s.arg_names.index(k),): v for k, v in cs.items()})
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=False)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    assert len(c.asm["cubin"]) > 0 and "local_alloc %b_val" not in c.asm["ttgir"]
    print("ok stream", cfg.block_m)
fn_x = stream.stream_expand_kernel
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
    """The PTX decoder with the smallest and largest (B expansion) tiles, the portable one, the expansion
    and epilogue kernels, and the stream kernel's table rows (B decoded straight
    into the wgmma register operand: no shared-memory round trip) compile to sm_90 cubins (no GPU)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SM90], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("no ptxas on this machine")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("ok") == 5 + len(opt_flags.HOPPER_DENSE["stream"]) + 1, proc.stdout


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
    for _, cfg in opt_flags.CONFIGS[opt_flags.gpu_key(torch.device("cuda"))]:
        for decode in (0, 1):
            out = poisoned((m + 3, n), torch.float32)
            G.run(a, b, out, config=cfg, decode=decode)
            assert_equal(out, want)


@pytest.mark.gpu
def test_gpu_dequant_mm():
    gen = torch.Generator().manual_seed(70)
    m, n, k = 333, 1000, 1056
    a = exact_operand(m, k, gen, amax="token", device="cuda")
    b = exact_operand(n, k, gen, amax="token", device="cuda", layout="swizzled")
    bias = torch.randn(n, device="cuda")
    want = gemm(a, b, "ref", bias=bias, out_dtype=torch.bfloat16)
    rule = opt_flags.DENSE_RULES[opt_flags.gpu_key(torch.device("cuda"))]["dequant"]
    for decode in (0, 1):
        out = poisoned((m, n), torch.bfloat16)
        G.run(a, b, out, bias=bias, config=rule, decode=decode)
        assert_equal(out, want)


@pytest.mark.gpu
def test_gpu_cublas_epilogue_default_dispatch_graph_and_compile(scaled_mm_calls):
    """A large per-tensor GEMM takes the dequant_mm path with cuBLAS' epilogue by default: eager, captured in a
    CUDA graph (its workspace and alpha from the graph's pool) and compiled; equal to the reference. Where alpha
    itself passes fp32's range (amax_a * amax_b * inv_e >= 2^128), the results are TE's: inf, NaN where acc = 0."""
    gen = torch.Generator().manual_seed(73)
    m, n, k = 1024, 1536, 1024
    a = exact_operand(m, k, gen, device="cuda")
    b = exact_operand(n, k, gen, layout="swizzled", device="cuda")
    want = gemm(a, b, "ref")
    assert_equal(gemm(a, b, "triton"), want)
    assert scaled_mm_calls == [True]
    out = poisoned((m, n), torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        G.nvfp4_gemm(a, b, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert_equal(out, want)
    compiled = torch.compile(lambda x, y: G.nvfp4_gemm(x, y, out_dtype=torch.bfloat16), fullgraph=True)
    assert_equal(compiled(a, b), want)
    a.rowwise_data[:8] = 0
    a.rowwise_amax.fill_(3e38)
    b.rowwise_amax.fill_(3e38)
    got = gemm(a, b, "triton", out_dtype=torch.float32)
    assert got[:8].isnan().all() and not got[8:].isfinite().any() and got[8:].isinf().any()


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
    assert_equal(out, per_expert_reference(a, b_list, sizes, bias, torch.bfloat16))


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
    want = per_expert_reference(a, b_list, sizes, bias, torch.bfloat16)
    calls = []
    real = dequant_mm.grouped_gemm
    monkeypatch.setattr(dequant_mm, "grouped_gemm", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
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


@pytest.mark.parametrize("a_kind, b_kind, bias_dtype, out_dtype", [
    (("tensor", "compact", 448.0), ("tensor", "swizzled", 448.0), None, torch.bfloat16),
    (("token", "swizzled", 256.0), ("token", "padded", 448.0), torch.bfloat16, torch.float32),
    (("tensor", "padded", 448.0), ("token", "compact", 256.0), torch.float32, torch.float16),
])
@pytest.mark.parametrize("path", ["fused", "dequant_mm"])
def test_eager_plan_equals_the_generic_path(a_kind, b_kind, bias_dtype, out_dtype, path, monkeypatch):
    """An eager GEMM without ``out`` runs through a cached plan (G._EagerGemm), as does the custom op:
    bit-equal to the generic launcher (G.run) for every amax kind, scale layout, E, bias and output dtype, on the first call
    (plan built) and the second (plan reused), with a 2-D amax (reshaped per call) and with misaligned
    data and amax (a plan of their own: Triton specializes pointers on alignment); on the fused kernel's
    path (the interpreter's choice) and on the dequant_mm path (the GPU's for large problems)."""
    if path == "dequant_mm":
        monkeypatch.setattr(opt_flags, "choose_config", lambda *args, **kwargs: G.GemmConfig(32, 32, 64, dequant_mm=True))
    gen = torch.Generator().manual_seed(41)
    a = exact_operand(48, 128, gen, amax=a_kind[0], layout=a_kind[1], e4m3_max=a_kind[2])
    b = exact_operand(40, 128, gen, amax=b_kind[0], layout=b_kind[1], e4m3_max=b_kind[2])
    bias = None if bias_dtype is None else torch.randn(40, generator=gen).to(bias_dtype)
    want = poisoned((48, 40), out_dtype, "cpu")
    G.run(a, b, want, bias=bias)
    G._EAGER_GEMMS.clear()
    for _ in range(2):
        assert_equal(G.nvfp4_gemm(a, b, out_dtype=out_dtype, bias=bias), want)
    plan = next(iter(G._EAGER_GEMMS.values()))
    assert len(G._EAGER_GEMMS) == 1 and (plan.launch is not None) == (path == "fused")
    # the custom op (a traced call's, here through the dispatcher) runs the same plan
    assert_equal(G._gemm_op.op(*G.operand_args(a), *G.operand_args(b), bias, 128, out_dtype), want)
    assert len(G._EAGER_GEMMS) == 1
    assert (plan.dequant is not None) == (path == "dequant_mm")
    a2 = dataclasses.replace(a, rowwise_amax=a.rowwise_amax.reshape(-1, 1))
    assert_equal(G.nvfp4_gemm(a2, b, out_dtype=out_dtype, bias=bias), want)
    shifted = torch.empty(a.rowwise_data.numel() + 1, dtype=torch.uint8)[1:].view(a.rowwise_data.shape)
    shifted.copy_(a.rowwise_data)
    b_amax = torch.cat([torch.zeros(1), b.rowwise_amax])[1:]
    a3, b3 = dataclasses.replace(a, rowwise_data=shifted), dataclasses.replace(b, rowwise_amax=b_amax)
    plans = len(G._EAGER_GEMMS)
    for _ in range(2):
        assert_equal(G.nvfp4_gemm(a3, b3, out_dtype=out_dtype, bias=bias), want)
    assert len(G._EAGER_GEMMS) == plans + 1


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("amax_a,amax_b", [("tensor", "tensor"), ("token", "token"), ("tensor", "token")])
@pytest.mark.parametrize("dequant", [True, False], ids=["dequant_mm", "dense"])
def test_grouped_wgrad_equals_per_expert_gemms(amax_a, amax_b, dequant, device):
    """MoE weight gradients from bulk columnwise copies (split e a (rows, m_e) matrix at rows * off_e):
    every expert's product over its own tokens, zero-size experts (first, middle, last) giving zeros;
    exact operands, so equal to the reference GEMM of each expert whatever the summation order."""
    gen = torch.Generator().manual_seed(41)
    sizes, n_a, n_b = [0, 32, 0, 96, 16, 0], 24, 40
    a_list = [exact_operand(n_a, max(m, 16), gen, amax=amax_a, device=device) for m in sizes]
    b_list = [exact_operand(n_b, max(m, 16), gen, amax=amax_b, device=device) for m in sizes]
    live = [i for i, m in enumerate(sizes) if m]

    def bulk(ts, rows):
        data = torch.cat([ts[i].rowwise_data.reshape(-1) for i in live])
        scale = torch.cat([ts[i].rowwise_scale.reshape(-1) for i in live])
        amax = torch.stack([t.rowwise_amax if t.rowwise_amax.numel() == rows else t.rowwise_amax.expand(1) for t in ts])
        return data, scale, amax.squeeze(-1) if amax.shape[-1] == 1 else amax

    a_data, a_scale, a_amax = bulk(a_list, n_a)
    b_data, b_scale, b_amax = bulk(b_list, n_b)
    offs = torch.tensor([0] + sizes, device=device).cumsum(0)
    configs = {True: {torch.float32: G.GemmConfig(32, 32, 64, dequant_mm=True),  # split-K expansion: partial tiles
                      torch.bfloat16: G.GemmConfig(32, 32, 128, dequant_mm=True)},
               False: {dt: G.GemmConfig(32, 32, 64, 4, 4, 1) for dt in (torch.float32, torch.bfloat16)}}
    for out_dtype, config in configs[dequant].items():
        out = poisoned((len(sizes), n_a, n_b), out_dtype, device)
        G.grouped_wgrad(a_data, a_scale, a_amax, 448.0, b_data, b_scale, b_amax, 448.0, offs, sizes, n_a, n_b, out,
                        config=config)
        for e, m in enumerate(sizes):
            if m == 0:
                assert torch.equal(out[e], torch.zeros_like(out[e]))
            else:
                assert_equal(out[e], gemm(a_list[e], b_list[e], "ref", out_dtype=out_dtype))
    if device == "cuda":  # the default path (cuBLAS on expanded operands where the shape asks for it)
        out = poisoned((len(sizes), n_a, n_b), torch.float32, device)
        G.grouped_wgrad(a_data, a_scale, a_amax, 448.0, b_data, b_scale, b_amax, 448.0, offs, sizes, n_a, n_b, out)
        for e, m in enumerate(sizes):
            if m:
                assert_equal(out[e], gemm(a_list[e], b_list[e], "ref", out_dtype=torch.float32))
