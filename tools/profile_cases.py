"""Run named kernel cases once each (after a warm-up) so that Nsight Compute can profile them.

    ncu --clock-control none -k regex:<kernels> --section ... python tools/profile_cases.py CASE [CASE ...]

Cases call the public ops on 8192 x 8192 bf16 (GEMM: the shapes named in the case). Not a benchmark: it
prints nothing but the case names; the figures come from the profiler.
"""
from __future__ import annotations

import sys

import torch

import nvfp4lab as nl

M = K = 8192


def _x():
    torch.manual_seed(0)
    return torch.randn(M, K, device="cuda", dtype=torch.bfloat16)


def _gemm_case(m, n, k, per_token=False):
    a_hp = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b_hp = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    a = nl.quantize_nvfp4(a_hp, per_token=per_token)
    b = nl.quantize_nvfp4(b_hp, per_token=per_token)
    return lambda: nl.nvfp4_gemm(a, b)


def cases():
    x = _x()
    amax = x.abs().amax().float().reshape(1)
    q_rowcol = nl.quantize_nvfp4(x, columnwise=True)
    mx_both = nl.quantize_mxfp8(x, columnwise=True)
    return {
        "nv_row": lambda: nl.quantize_nvfp4(x, amax=amax),
        "nv_rowcol": lambda: nl.quantize_nvfp4(x, columnwise=True, amax=amax, columnwise_amax=amax),
        "nv_rowcol_full": lambda: nl.quantize_nvfp4(x, columnwise=True),
        "nv_pertoken": lambda: nl.quantize_nvfp4(x, columnwise=True, per_token=True),
        "nv_rht": lambda: nl.quantize_nvfp4(x, columnwise=True, rht=True),
        "nv_4over6": lambda: nl.quantize_nvfp4(x, columnwise=True, four_over_six="mae"),
        "deq_col": lambda: nl.dequantize_nvfp4(q_rowcol, which="columnwise", dtype=torch.bfloat16),
        "deq_row": lambda: nl.dequantize_nvfp4(q_rowcol, which="rowwise", dtype=torch.bfloat16),
        "mx_row": lambda: nl.quantize_mxfp8(x),
        "mx_col": lambda: nl.quantize_mxfp8(x, rowwise=False, columnwise=True),
        "mx_both": lambda: nl.quantize_mxfp8(x, columnwise=True),
        "mx_deq_col": lambda: nl.dequantize_mxfp8(mx_both, which="columnwise", dtype=torch.bfloat16),
        "gemm_m16": _gemm_case(16, 4096, 4096),
        "gemm_m64": _gemm_case(64, 4096, 4096),
        "gemm_m64_wide": _gemm_case(64, 14336, 4096),
        "gemm_m256": _gemm_case(256, 4096, 4096),
        "gemm_8192": _gemm_case(8192, 8192, 8192),
    }


def main(names):
    table = cases()
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {sorted(table)}")
    for name in names or sorted(table):
        table[name]()  # warm-up: compiles
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(name)
        table[name]()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print("case", name, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
