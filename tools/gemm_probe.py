"""Stream-kernel diagnostics on a GPU (not a benchmark of record: benchmarks/gemm.py is).

    python tools/gemm_probe.py                 # variants at a few decode shapes, us and x cuBLAS BF16
    python tools/gemm_probe.py --free          # the same with the decode replaced by a bit reinterpretation
                                               # (wrong values: the load + MMA pipeline alone)
    python tools/gemm_probe.py --one NAME M N K   # run one variant 3 times (for ncu -s 2 -c 1)

A first probe (before the 2-D loads) found the kernel at 26% of DRAM bandwidth with half-used sectors
and 4-way shared-memory conflicts on the cp.async writes (ncu: SpeedOfLight, MemoryWorkloadAnalysis,
SourceCounters); --free separates the decode's cost from the load + MMA pipeline's.
"""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import gemm as B  # noqa: E402  (benchmarks/gemm.py: puts src on the path)

G = B.G
opt_flags = B.opt_flags
from nvfp4lab.kernels.nvfp4_gemm_details import stream  # noqa: E402

FREE = "--free" in sys.argv

if FREE:
    f16_halves = stream.f16_halves

    @triton.jit
    def _decode_free(w, sc, ROWS: tl.constexpr, DECODE: tl.constexpr):
        h = f16_halves(w)  # [ROWS, t, u, e]: the same register layout as the real decoder's output
        v = tl.join(tl.join(h, h), tl.join(h, h))
        v = tl.permute(v, (0, 2, 5, 4, 1, 3))
        return tl.reshape(v, (ROWS, 128))

    stream.stream_decode = _decode_free  # before any compilation in this process (the kernel reads the global)


def S(bm, bn, bk=128, w=4, st=3, cps=2, reg=None, pre=True):
    return G.GemmConfig(bm, bn, bk, 8, w, st, maxnreg=reg, stream=True, a_pre=pre, split_k=0, ctas_per_sm=cps)


def configs(m):
    """The table's rows and a few neighbours (names: block_n, V sub-tiles, stages, programs per SM)."""
    bm = opt_flags.stream_block_m(m)
    if m <= 32:
        return {"table": opt_flags.choose_config(m, 4096, 4096, torch.device("cuda")), "n64v2st3c4": S(bm, 64, 256, cps=4),
                "inA": S(bm, 128, reg=128 if bm == 16 else None, pre=False)}
    return {"table": opt_flags.choose_config(m, 4096, 4096, torch.device("cuda")), "n64st4c4": S(bm, 64, st=4, cps=4)}


SHAPES = [(16, 14336, 4096), (16, 4096, 4096), (64, 14336, 4096), (64, 4096, 4096)]


def _warm(job):
    """Compile one (M, config) in a spawned worker (it re-runs this module's top level: --free too)."""
    m, name = job
    os.environ.pop("TRITON_INTERPRET", None)
    a = B.quantize(torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16))
    b = B.quantize(torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16))
    out = torch.empty(m, 4096, device="cuda", dtype=torch.bfloat16)
    try:
        G.run(a, b, out, config=configs(m)[name])
        torch.cuda.synchronize()
    except Exception as exc:
        return f"{name} M={m}: {type(exc).__name__}: {str(exc)[:100]}"
    return None


def main():
    os.environ.pop("TRITON_INTERPRET", None)
    gen = torch.Generator(device="cuda").manual_seed(0)
    if "--one" in sys.argv:
        i = sys.argv.index("--one")
        name, m, n, k = sys.argv[i + 1], *map(int, sys.argv[i + 2:i + 5])
        a = B.quantize(torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen))
        b = B.quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen))
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            G.run(a, b, out, config=configs(m)[name])
        torch.cuda.synchronize()
        return
    print(f"{'free decode' if FREE else 'real decode'}: {torch.cuda.get_device_name()}, triton {triton.__version__}")
    import concurrent.futures as cf
    import multiprocessing as mp
    jobs = [(m, name) for m in sorted({m for m, _, _ in SHAPES}) for name in configs(m)]
    with cf.ProcessPoolExecutor(8, mp_context=mp.get_context("spawn")) as pool:
        print("compile errors:", [e for e in pool.map(_warm, jobs) if e], flush=True)
    for n, k in sorted({(n, k) for _, n, k in SHAPES}):
        copies = B._copies(n * k * 9 // 16)
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(copies)]
        bs = [B.quantize(w) for w in ws]
        for m in [m for m, n2, k2 in SHAPES if (n2, k2) == (n, k)]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
            a = B.quantize(x)
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in bs]
            cub = B.time_graph([lambda w=w: torch.mm(x, w.t()) for w in ws], replays=10) * 1e3
            res = []
            for name, cfg in configs(m).items():
                try:
                    t = B.time_graph([lambda b=b, o=o: G.run(a, b, o, config=cfg) for b, o in zip(bs, outs)],
                                     replays=10) * 1e3
                    res.append(f"{name}={t:.1f}({cub / t:.2f}x)")
                except Exception as exc:
                    res.append(f"{name}=ERR {type(exc).__name__}: {str(exc)[:80]}")
            print(f"M={m:3d} N={n:5d} K={k}: cuBLAS {cub:.1f} us | " + " ".join(res), flush=True)
        del ws, bs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
