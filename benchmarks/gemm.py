"""NVFP4 GEMM benchmark (CUDA): cuBLAS BF16, naive dequantize + cuBLAS, and nvfp4lab's Triton kernel.

    python benchmarks/gemm.py                 # all shapes (square 2048..16384, LLM shapes, grouped)
    python benchmarks/gemm.py --quick         # 8192^3, 4096^3, M=1/16/64/256 at a few (N,K), grouped
    python benchmarks/gemm.py --paths         # dequant+cuBLAS vs the fused kernel at M >= 128
    python benchmarks/gemm.py --variants      # M = 1/16/64, N = 4096/14336: stream-kernel variants, the fused
                                              # kernel's row and cuBLAS BF16 in one run, us and x cuBLAS (sets the
                                              # stream rows of opt_flags.DENSE_RULES; compiles in a process pool first)
    python benchmarks/gemm.py --sweep         # also time candidate block configs (prints the best)
    python benchmarks/gemm.py --out res.json  # write every measurement as JSON

Timing: each method is captured once in a CUDA graph over R copies of its operands (R chosen so that
the copies exceed 256 MB, so small-M shapes stream their weights from HBM and not from L2, as in a real
model), replayed, and timed with CUDA events; the time per GEMM is the median over replays / R. The
naive baseline (dequantize both operands to BF16, then torch.mm) runs eagerly: the reference
dequantizer creates small device tensors, which a graph capture does not allow.
Operands are quantized with the reference quantizer (``backend="ref"``) from bf16 normal data.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout

import nvfp4lab  # noqa: E402
from nvfp4lab import moe  # noqa: E402
from nvfp4lab.kernels import nvfp4_gemm as G  # noqa: E402
from nvfp4lab.kernels.nvfp4_gemm_details import opt_flags  # noqa: E402

SQUARE = [2048, 4096, 8192, 16384]
LLM_M = [1, 16, 64, 256, 4096, 16384]
LLM_NK = [(4096, 4096), (14336, 4096), (4096, 14336), (7168, 2048)]
GROUPED = [  # (experts, tokens per expert or explicit sizes, N, K)
    (8, [2048] * 8, 4096, 4096),
    (8, [4096, 3072, 2560, 2048, 1792, 1536, 1024, 384], 4096, 4096),
    (8, [512] * 8, 14336, 4096),
]
ROTATE_BYTES = 256 << 20
DEVICE = "cuda"


def _bytes(*ts):
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def _nvfp4_bytes(t):
    return _bytes(t.rowwise_data, t.rowwise_scale, t.rowwise_amax)


def time_graph(fns, replays=20):
    """Median ms per call of ``fns`` (a list of R callables doing the same work on different data)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:  # compile / warm up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(fns))
    del graph
    times.sort()
    return times[len(times) // 2]


def time_eager(fns, replays=10):
    """Median ms per call without a CUDA graph (for baselines whose ops cannot be captured)."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for fn in fns:
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(fns))
    times.sort()
    return times[len(times) // 2]


def _copies(per_copy_bytes, limit=32):
    return max(1, min(limit, -(-ROTATE_BYTES // max(per_copy_bytes, 1))))


def _dequantizer(t):
    """nvfp4lab's dequantize (its Triton kernel when this tree has it, else the reference ops)."""
    try:
        nvfp4lab.dequantize_nvfp4(t, dtype=torch.bfloat16)
        return nvfp4lab.dequantize_nvfp4
    except (ImportError, ModuleNotFoundError):
        return lambda x, dtype: nvfp4lab.dequantize_nvfp4(x, dtype=dtype, backend="ref")


def quantize(x, **kw):
    return nvfp4lab.quantize_nvfp4(x, backend="ref", **kw)


def make_operands(m, n, k, copies, gen):
    sets = []
    for _ in range(copies):
        x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16, generator=gen)
        a_t, a_p, b = quantize(x), quantize(x, per_token=True), quantize(w)
        sets.append(dict(x=x, w=w, a_tensor=a_t, a_token=a_p, b=b))
    return sets


def bench_dense(m, n, k, gen, sweep=False):
    flops = 2.0 * m * n * k
    nvfp4_bytes = (m * k + n * k) * 9 // 16  # codes + scales: what the nvfp4 kernel streams per copy
    sets = make_operands(m, n, k, _copies(nvfp4_bytes), gen)
    res = dict(kind="dense", m=m, n=n, k=k, copies=len(sets))

    def tflops(ms):
        return flops / (ms * 1e-3) / 1e12

    res["cublas_bf16"] = tflops(time_graph([lambda s=s: torch.mm(s["x"], s["w"].t()) for s in sets]))
    deq = _dequantizer(sets[0]["b"])
    res["naive_dequant_mm"] = tflops(time_eager(
        [lambda s=s: torch.mm(deq(s["a_tensor"], dtype=torch.bfloat16), deq(s["b"], dtype=torch.bfloat16).t())
         for s in sets]))
    for amax in ("tensor", "token"):
        res[f"nvfp4_per_{amax}"] = tflops(time_graph(
            [lambda s=s: nvfp4lab.nvfp4_gemm(s[f"a_{amax}"], s["b"], backend="triton") for s in sets]))
    outs = [torch.empty(m, n, device=DEVICE, dtype=torch.bfloat16) for _ in sets]
    res["nvfp4_portable_decoder"] = tflops(time_graph(
        [lambda s=s, o=o: G.run(s["a_tensor"], s["b"], o, decode=0) for s, o in zip(sets, outs)]))
    res["config"] = str(opt_flags.choose_config(m, n, k, torch.device(DEVICE)))
    if sweep:
        res["sweep"] = sweep_configs(sets, outs, m, n, k, tflops)
    return res


def candidate_configs(m, n):
    """About ten alternatives per regime (each is a compile on first use)."""
    C = G.GemmConfig
    if m <= 64:  # the stream kernel (dense M <= 64)
        return list(stream_variant_configs(m).values())
    if m <= 1024:
        return [C(64, 128, 128, 8, 4, 4), C(128, 128, 128, 8, 8, 3), C(128, 128, 64, 8, 4, 4),
                C(64, 64, 128, 8, 4, 4), C(64, 128, 64, 8, 4, 4, b_predecode=True),
                C(128, 128, 64, 8, 8, 4, b_predecode=True), C(128, 256, 64, 8, 8, 4, b_predecode=True)]
    return [C(128, 256, 64, 8, 8, 4, b_predecode=True), C(128, 256, 64, 8, 8, 3, b_predecode=True),
            C(128, 128, 128, 8, 8, 4, b_predecode=True), C(128, 128, 64, 8, 8, 5, b_predecode=True),
            C(256, 128, 64, 8, 8, 3, b_predecode=True), C(128, 256, 128, 8, 8, 3, b_predecode=True),
            C(128, 128, 128, 8, 8, 3), C(128, 256, 64, 8, 8, 3), C(128, 256, 128, 8, 8, 2)]


def sweep_configs(sets, outs, m, n, k, tflops):
    rows = []
    for cfg in candidate_configs(m, n):
        for decode in (1,):
            try:
                t = tflops(time_graph([lambda s=s, o=o: G.run(s["a_tensor"], s["b"], o, config=cfg, decode=decode)
                                       for s, o in zip(sets, outs)], replays=10))
            except Exception as exc:  # out of resources etc.: report and go on
                rows.append(dict(config=str(cfg), decode=decode, error=f"{type(exc).__name__}: {str(exc)[:120]}"))
                continue
            rows.append(dict(config=str(cfg), decode=decode, tflops=t))
    ok = sorted((r for r in rows if "tflops" in r), key=lambda r: -r["tflops"])
    print(f"  sweep M={m} N={n} K={k}: best " + "; ".join(f"{r['tflops']:.0f} {r['config']} decode={r['decode']}" for r in ok[:3]),
          flush=True)
    return rows


def bench_grouped(experts, sizes, n, k, gen):
    m = sum(sizes)
    flops = 2.0 * m * n * k
    res = dict(kind="grouped", experts=experts, sizes=sizes, m=m, n=n, k=k)

    def tflops(ms):
        return flops / (ms * 1e-3) / 1e12

    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(experts, n, k, device=DEVICE, dtype=torch.bfloat16, generator=gen)
    a = quantize(x, per_token=True)
    b_list = [quantize(w[e]) for e in range(experts)]
    b = moe.stack_weights(b_list)  # stacked once, outside the timing
    offs = torch.tensor(sizes, device=DEVICE).cumsum(0).to(torch.int32)
    res["nvfp4_grouped"] = tflops(time_graph([lambda: nvfp4lab.nvfp4_grouped_gemm(a, b, offs, backend="triton")]))
    # the same sizes known on the host: per-expert cuBLAS on expanded operands where the dense rule says so
    res["nvfp4_grouped_host_splits"] = tflops(time_graph(
        [lambda: nvfp4lab.nvfp4_grouped_gemm(a, b, offs, backend="triton", m_splits=list(sizes))]))
    assert _close(nvfp4lab.nvfp4_grouped_gemm(a, b, offs, backend="triton", m_splits=list(sizes)),
                  nvfp4lab.nvfp4_grouped_gemm(a, b, offs, backend="triton"))
    out = torch.empty(m, n, device=DEVICE, dtype=torch.bfloat16)
    for name, cfg in (("fused", G.GemmConfig(128, 128, 128, 8, 8, 3)),
                      ("expand_b", G.GemmConfig(128, 256, 64, 8, 8, 4, b_predecode=True))):
        res[f"nvfp4_grouped_{name}"] = tflops(time_graph(
            [lambda cfg=cfg: G.run(a, b, out, offs=offs, num_experts=experts, config=cfg)]))
    w_dense = quantize(w[0])
    res["nvfp4_dense_same_flops"] = tflops(time_graph([lambda: nvfp4lab.nvfp4_gemm(a, w_dense, backend="triton")]))
    res["grouped_over_dense_time"] = res["nvfp4_dense_same_flops"] / res["nvfp4_grouped"]
    res["host_splits_over_dense_time"] = res["nvfp4_dense_same_flops"] / res["nvfp4_grouped_host_splits"]
    res["cublas_bf16_dense"] = tflops(time_graph([lambda: torch.mm(x, w[0].t())]))
    wt = w.transpose(1, 2)  # (E, K, N), each expert's weight K-major
    try:  # probe outside any graph capture: an error inside a capture would poison the stream
        torch._grouped_mm(x, wt, offs=offs)
        torch.cuda.synchronize()
        grouped_mm_ok = True
    except Exception as exc:
        res["torch_grouped_mm_bf16"] = f"unavailable: {type(exc).__name__}"
        grouped_mm_ok = False
    if grouped_mm_ok:
        res["torch_grouped_mm_bf16"] = tflops(time_graph([lambda: torch._grouped_mm(x, wt, offs=offs)]))
    return res


def _close(got, want):
    """Sanity check of a timed variant against the default kernel (within the golden relative tolerance,
    plus a small absolute slack for fp32 summation order near zero)."""
    g, w = got.float(), want.float()
    return bool(((g - w).abs() <= 2.0 ** -7 * w.abs() + 1e-2 * w.abs().mean()).all())


def sweep_paths(gen, out_path=None):
    """One-call comparison of the dense paths for M >= 128: fused vs dequant + cuBLAS (TFLOP/s; x = ratio to
    cuBLAS BF16). Used to set opt_flags.DENSE_RULES."""
    C = G.GemmConfig
    rows = []
    dev = torch.device(DEVICE)

    def tflops(m, n, k, ms):
        return 2.0 * m * n * k / (ms * 1e-3) / 1e12

    for m, n, k in [(256, 4096, 4096), (512, 4096, 4096), (256, 14336, 4096), (128, 4096, 4096)]:
        sets = make_operands(m, n, k, _copies((m * k + n * k) * 9 // 16, limit=4), gen)
        outs = [torch.empty(m, n, device=DEVICE, dtype=torch.bfloat16) for _ in sets]
        r = dict(m=m, n=n, k=k)
        r["cublas"] = tflops(m, n, k, time_graph([lambda s=s: torch.mm(s["x"], s["w"].t()) for s in sets]))
        old = opt_flags.choose_config(m, n, k, dev, grouped=True)
        r["fused_old"] = tflops(m, n, k, time_graph([lambda s=s, o=o: G.run(s["a_tensor"], s["b"], o, config=old)
                                                     for s, o in zip(sets, outs)]))
        want = outs[0].clone()
        for bk in (128,):
            c = C(128, 128, bk, dequant_mm=True)
            for amax in ("tensor", "token"):
                key = f"dq{bk}_{amax}"
                try:
                    t = tflops(m, n, k, time_graph([lambda s=s, o=o: G.run(s[f"a_{amax}"], s["b"], o, config=c)
                                                    for s, o in zip(sets, outs)]))
                    G.run(sets[0]["a_tensor"], sets[0]["b"], outs[0], config=c)
                    r[key] = t if _close(outs[0], want) else f"WRONG {t:.1f}"
                except Exception as exc:
                    r[key] = f"{type(exc).__name__}: {str(exc)[:100]}"
        # breakdown at this shape: expansion of both operands, the fp32-output GEMM, the epilogue
        a16 = torch.empty(m, k, device=DEVICE, dtype=torch.float16)
        b16 = torch.empty(n, k, device=DEVICE, dtype=torch.float16)
        try:
            r["mm_f16_f32out_only"] = tflops(m, n, k, time_graph([lambda: torch.mm(a16, b16.t(), out_dtype=torch.float32)]))
        except Exception as exc:
            r["mm_f16_f32out_only"] = f"{type(exc).__name__}: {str(exc)[:100]}"
        r["mm_f16_f16out_only"] = tflops(m, n, k, time_graph([lambda: torch.mm(a16, b16.t())]))
        print(f"paths M={m} N={n} K={k}: " + " ".join(f"{kk}={v:.1f}" if isinstance(v, float) else f"{kk}={v}"
                                                       for kk, v in r.items()), flush=True)
        rows.append(r)
        del sets, outs
        torch.cuda.empty_cache()
    if out_path:
        Path(out_path).write_text(json.dumps(rows, indent=1))
    return rows


def _stream_cfg(bm, bn, bk=128, w=4, st=3, cps=4, pre=True, reg=None):
    return G.GemmConfig(bm, bn, bk, 8, w, st, maxnreg=reg, stream=True, a_pre=pre, split_k=0, ctas_per_sm=cps)


def fused_config(m, n, k):
    """The fused kernel's table row (the row grouped GEMMs use), timed as the stream kernel's baseline."""
    return opt_flags.choose_config(m, n, k, torch.device(DEVICE), grouped=True)


def stream_variant_configs(m):
    bm = opt_flags.stream_block_m(m)
    if m <= 32:
        return {
            "s128st3c2r128": _stream_cfg(bm, 128, cps=2, reg=128), "s128st3c4r128": _stream_cfg(bm, 128, cps=4, reg=128),
            "s128st4c3r128": _stream_cfg(bm, 128, st=4, cps=3, reg=128), "s64v2st3c4": _stream_cfg(bm, 64, 256, cps=4),
            "s128v2st3c2r168": _stream_cfg(bm, 128, 256, cps=2, reg=168),
            "s128inA_c3r128": _stream_cfg(bm, 128, cps=3, reg=128, pre=False),  # Triton 3.6: in-loop A, M <= 32
            "s256w8st3c2": _stream_cfg(bm, 256, w=8, cps=2),
        }
    return {
        "s128st3c2": _stream_cfg(bm, 128, cps=2), "s128st3c3r168": _stream_cfg(bm, 128, cps=3, reg=168),
        "s64st4c4": _stream_cfg(bm, 64, st=4, cps=4), "s64v2st2c2": _stream_cfg(bm, 64, 256, st=2, cps=2),
        "s256w8st3c1": _stream_cfg(bm, 256, w=8, cps=1),
    }


VARIANT_SHAPES = [(m, n, 4096) for n in (4096, 14336) for m in (1, 16, 64)]


def _warm_one(job):
    """Compile (and run once) one configuration at one shape: process-pool worker (spawned)."""
    m, n, k, name, cfg = job
    os.environ.pop("TRITON_INTERPRET", None)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    a = quantize(torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16, generator=gen))
    b = quantize(torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16, generator=gen))
    out = torch.empty(m, n, device=DEVICE, dtype=torch.bfloat16)
    try:
        G.run(a, b, out, config=cfg)
        torch.cuda.synchronize()
        return name, m, n, None
    except Exception as exc:  # reported by the main process
        return name, m, n, f"{type(exc).__name__}: {str(exc)[:200]}"


def stream_variants(gen, out_path=None, workers=8):
    """Stream-kernel variants vs cuBLAS BF16 and the fused kernel's row, same run, LLM decode shapes."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import time as _time
    jobs = []
    for m, n, k in VARIANT_SHAPES:  # N does not change a compilation: the stream variants once per M
        variants = list(stream_variant_configs(m).items()) if n == VARIANT_SHAPES[0][1] else []
        for name, cfg in variants + [("fused", fused_config(m, n, k))]:
            jobs.append((m, n, k, name, cfg))
    t0 = _time.time()
    errors = {}
    with cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        for name, m, n, err in pool.map(_warm_one, jobs):
            if err:
                errors[(name, m, n)] = err
    print(f"precompiled {len(jobs)} (shape, config) pairs in {_time.time() - t0:.0f} s; errors: {errors}", flush=True)
    wait_for = os.environ.get("GEMM_BENCH_WAIT_FOR")  # a file another job (the GPU tests) creates when done
    while wait_for and not os.path.exists(wait_for) and _time.time() - t0 < 240:
        _time.sleep(1)
    rows = []
    for n, k in sorted({(n, k) for _, n, k in VARIANT_SHAPES}):
        copies = _copies(n * k * 9 // 16)
        ws = [torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16, generator=gen) for _ in range(copies)]
        bs = [quantize(w) for w in ws]
        nb = n * k * 9 // 16
        src = torch.empty(nb * copies, dtype=torch.uint8, device=DEVICE)
        dst = torch.empty_like(src)
        copy_us = time_graph([lambda: dst.copy_(src)], replays=10) * 1e3 / copies  # per weight's bytes (read + write)
        for m in sorted({m for m, n2, _ in VARIANT_SHAPES if n2 == n}):
            x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16, generator=gen)
            a = quantize(x)
            outs = [torch.empty(m, n, device=DEVICE, dtype=torch.bfloat16) for _ in bs]
            r = dict(m=m, n=n, k=k, copy_us=copy_us)
            r["cublas_us"] = time_graph([lambda w=w: torch.mm(x, w.t()) for w in ws], replays=10) * 1e3
            fused = fused_config(m, n, k)
            r["fused_us"] = time_graph([lambda b=b, o=o: G.run(a, b, o, config=fused) for b, o in zip(bs, outs)],
                                       replays=10) * 1e3
            want = outs[0].clone()
            for name, cfg in stream_variant_configs(m).items():
                if (name, m, VARIANT_SHAPES[0][1]) in errors:
                    r[name] = errors[(name, m, VARIANT_SHAPES[0][1])][:60]
                    continue
                t = time_graph([lambda b=b, o=o: G.run(a, b, o, config=cfg) for b, o in zip(bs, outs)], replays=10) * 1e3
                r[name] = t if _close(outs[0], want) else f"WRONG {t:.1f}"
            cub = r["cublas_us"]
            best = min((v, kk) for kk, v in r.items() if isinstance(v, float) and kk.startswith("s"))
            print(f"M={m:3d} N={n:5d} K={k}: cuBLAS {cub:6.1f} us | fused {r['fused_us']:6.1f} us "
                  f"({cub / r['fused_us']:.2f}x) | best {best[1]} {best[0]:6.1f} us ({cub / best[0]:.2f}x) | "
                  f"weight copy {copy_us:.1f} us | " +
                  " ".join(f"{kk}={v:.1f}({cub / v:.2f}x)" if isinstance(v, float) else f"{kk}={v}"
                           for kk, v in r.items() if kk.startswith("s")), flush=True)
            rows.append(r)
        del ws, bs
        torch.cuda.empty_cache()
    if out_path:
        Path(out_path).write_text(json.dumps(rows, indent=1))
    return rows


def dense_shapes(quick):
    if quick:
        return [(8192, 8192, 8192), (4096, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (1, 14336, 4096),
                (16, 14336, 4096), (64, 14336, 4096), (256, 4096, 4096)]
    shapes = [(s, s, s) for s in SQUARE]
    shapes += [(m, n, k) for (n, k) in LLM_NK for m in LLM_M]
    return shapes


def print_table(results):
    print()
    print(f"{'shape':>22} {'cuBLAS':>7} {'deq+mm':>7} {'nvfp4':>7} {'tok':>7} {'x cuBLAS':>8} {'tok ovh':>7} {'portbl':>7}")
    for r in results:
        if r["kind"] == "dense":
            shape = f"{r['m']}x{r['n']}x{r['k']}"
            print(f"{shape:>22} {r['cublas_bf16']:7.0f} {r['naive_dequant_mm']:7.0f} {r['nvfp4_per_tensor']:7.0f} "
                  f"{r['nvfp4_per_token']:7.0f} {r['nvfp4_per_tensor'] / r['cublas_bf16']:8.2f} "
                  f"{(r['nvfp4_per_tensor'] / r['nvfp4_per_token'] - 1) * 100:6.1f}% {r['nvfp4_portable_decoder']:7.0f}")
    for r in results:
        if r["kind"] == "grouped":
            sizes = "uniform" if len(set(r["sizes"])) == 1 else "skewed"
            tg = r.get("torch_grouped_mm_bf16")
            tg = f"{tg:.0f}" if isinstance(tg, float) else "n/a"
            print(f"grouped E={r['experts']} {sizes} M={r['m']} N={r['n']} K={r['k']}: {r['nvfp4_grouped']:.0f} TFLOP/s "
                  f"(fused {r['nvfp4_grouped_fused']:.0f}, expand B {r['nvfp4_grouped_expand_b']:.0f}), "
                  f"dense same FLOPs {r['nvfp4_dense_same_flops']:.0f}, time ratio {r['grouped_over_dense_time']:.3f} "
                  f"(target <= 1.15); cuBLAS dense {r['cublas_bf16_dense']:.0f}, torch._grouped_mm bf16 {tg}")
            print(f"  with host m_splits (per-expert dequantize + cuBLAS when the dense rule applies): "
                  f"{r['nvfp4_grouped_host_splits']:.0f} TFLOP/s, time ratio to dense {r['host_splits_over_dense_time']:.3f}")
    print("TFLOP/s (2MNK/time). nvfp4 = per-tensor A, tok = per-token A; x cuBLAS = nvfp4 / cuBLAS BF16; "
          "tok ovh = per-token epilogue cost; portbl = portable (non-PTX) decoder.")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8192^3, 4096^3, M=1..256 at a few (N,K), one grouped case")
    parser.add_argument("--sweep", action="store_true", help="also time candidate block configs")
    parser.add_argument("--out", type=str, default=None, help="write results as JSON to this file")
    parser.add_argument("--only", choices=("square", "llm", "grouped"), default=None,
                        help="run one group of shapes (to split a long run)")
    parser.add_argument("--paths", action="store_true", help="compare the dense paths at M >= 128 (fused, dequant+cuBLAS)")
    parser.add_argument("--variants", action="store_true",
                        help="stream-kernel variants vs cuBLAS BF16 and the fused kernel at M = 1/16/64 (x times, us)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gemm.py needs a CUDA GPU")
    os.environ.pop("TRITON_INTERPRET", None)
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}",
          flush=True)
    if args.paths:
        sweep_paths(gen, args.out)
        return
    if args.variants:
        stream_variants(gen, args.out)
        return
    results = []
    shapes = dense_shapes(args.quick)
    if args.only == "square":
        shapes = [sh for sh in shapes if sh[0] == sh[1] == sh[2]]
    elif args.only == "llm":
        shapes = [sh for sh in shapes if not sh[0] == sh[1] == sh[2]]
    elif args.only == "grouped":
        shapes = []
    for m, n, k in shapes:
        r = bench_dense(m, n, k, gen, sweep=args.sweep and (m, n, k) in ((8192, 8192, 8192), (16, 4096, 4096), (256, 4096, 4096), (4096, 4096, 4096)))
        torch.cuda.empty_cache()
        print(f"dense {m}x{n}x{k}: " + ", ".join(f"{key} {v:.1f}" for key, v in r.items() if isinstance(v, float)), flush=True)
        results.append(r)
    for experts, sizes, n, k in ([] if args.only in ("square", "llm") else GROUPED[:1] if args.quick else GROUPED):
        r = bench_grouped(experts, sizes, n, k, gen)
        torch.cuda.empty_cache()
        print("grouped: " + ", ".join(f"{key} {v:.2f}" for key, v in r.items() if isinstance(v, float)), flush=True)
        results.append(r)
    if args.out:
        Path(args.out).write_text(json.dumps(dict(device=torch.cuda.get_device_name(), results=results), indent=1))
    print_table(results)


if __name__ == "__main__":
    main()
