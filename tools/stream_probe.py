"""Where the M <= 64 weight-stream GEMM spends its time (issue 6): the stream kernel's main loop rebuilt with
parts switched off, timed side by side with the production call, cuBLAS BF16 and a copy of the weight bytes.

Modes (same grid, tiles, K splits, pipeline depth and loads as :func:`nvfp4lab.kernels.nvfp4_gemm_details.stream.stream_kernel`;
each program stores its own partial, no split-K reduction, no epilogue, A read pre-decoded):
    load      B's code words and scales only (summed, so nothing is dead)
    decode    load + decode of B to FP16 (elementwise max kept, no MMA)
    mma       load + the MMA on a stand-in operand made from the words without decoding (2 ops per word)
    full      load + decode + MMA: the production loop

    python tools/stream_probe.py            # GPU, the issue-6 decode shapes: the table above
    python tools/stream_probe.py --shapes 16x4096x4096 --sweep 128x128x4x3x2x128,...   # other tiles, same modes
    python tools/stream_probe.py --shapes 64x14336x4096 --splits ""   # production calls over explicit K splits
    python tools/stream_probe.py --smoke    # CPU interpreter: the probe's "full" partials equal the reference
Results: benchmarks/RESULTS.md, eighth session.
"""
import argparse
import os
import sys

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from nvfp4lab.kernels import nvfp4_gemm as G  # noqa: E402
from nvfp4lab.kernels.nvfp4_gemm_details import common, opt_flags, stream  # noqa: E402

MODES = {"load": 1, "decode": 2, "mma": 3, "full": 0}


@triton.jit
def _probe_kernel(a_ptr, b_ptr, b_scale_ptr, ws_ptr, M, N, K, per_split, stride_a, stride_b, b_cols4,
                  MODE: tl.constexpr, DECODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  V: tl.constexpr, WARPS: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    BK: tl.constexpr = 128 * V
    rows_b = stream.stream_rows(pid_n, N, BLOCK_N, WARPS)
    offs_m = tl.arange(0, BLOCK_M)
    k_first = pid_k * per_split
    k_last = tl.minimum(k_first + per_split, tl.cdiv(K, BK))
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_w = tl.zeros((BLOCK_N, 4, 4), dtype=tl.int32)
    acc_s = tl.zeros((BLOCK_N, 4, 2), dtype=tl.int32)
    acc_h = tl.zeros((BLOCK_N, 128), dtype=tl.float16)
    for k in range(k_first, k_last):
        for v in tl.static_range(V):
            kk = k * V + v
            b_w, b_sc = stream.stream_load(b_ptr, b_scale_ptr, rows_b, kk, stride_b, 0, b_cols4, K, True, True, BLOCK_N)
            if MODE == 1:
                acc_w += b_w
                acc_s += b_sc.to(tl.int32)
            elif MODE == 2:
                acc_h = tl.maximum(acc_h, stream.stream_decode(b_w, b_sc, BLOCK_N, DECODE))
            else:
                a_val = tl.load(a_ptr + offs_m[:, None] * stride_a + kk * 128 + tl.arange(0, 128)[None, :])
                if MODE == 3:  # the words' low bits as FP16 values, in stream_decode's register order
                    lo = (b_w & 0x3FF).to(tl.float16)
                    fake = tl.broadcast_to(lo[:, :, :, None, None, None], (BLOCK_N, 4, 4, 2, 2, 2))
                    b_val = tl.reshape(tl.permute(fake, (0, 2, 5, 4, 1, 3)), (BLOCK_N, 128))
                else:
                    b_val = stream.stream_decode(b_w, b_sc, BLOCK_N, DECODE)
                b_val = stream.stream_rows_back(b_val, BLOCK_N, WARPS)
                acc = tl.dot(b_val, tl.trans(a_val), acc)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    base = ws_ptr + pid_k.to(tl.int64) * M * N
    if MODE == 1:
        tl.store(base + offs_n, tl.sum(tl.reshape(acc_w, (BLOCK_N, 16)), 1) + tl.sum(tl.reshape(acc_s, (BLOCK_N, 8)), 1).to(tl.float32), mask=mask_n)
    elif MODE == 2:
        tl.store(base + offs_n, tl.max(acc_h, 1).to(tl.float32), mask=mask_n)
    else:
        out = tl.trans(acc)
        tl.store(base + offs_m[:, None] * N + offs_n[None, :], out, mask=(offs_m < M)[:, None] & mask_n[None, :])


def probe_args(a, b, m, n, k, cfg, device):
    """(grid, args, constexprs) of the probe for A, B (NVFP4Tensors, B swizzled), as the production launcher."""
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    splits = opt_flags.stream_splits(cfg, m, n, k, opt_flags.num_sms(device))
    per_split = triton.cdiv(triton.cdiv(k, bk), splits)
    a_op = common.operand(a.rowwise_data, a.rowwise_scale, "swizzled", a.rowwise_amax, k)
    b_op = common.operand(b.rowwise_data, b.rowwise_scale, "swizzled", b.rowwise_amax, k)
    a_w, b_w = common.words(a_op.data), common.words(b_op.data)
    b_sc, b_c4 = b_op.scale, b_op.cols4
    a16 = torch.empty((bm, common.roundup(k, bk)), dtype=torch.float16, device=device)
    decode = opt_flags.default_decode(device)
    stream.launch_a_expand_kernel((bm // 16, a16.shape[1] // 128), a_w, a_op, a16, m, k,
                                  dict(A_SWIZZLED=True, DECODE=decode, ROWS=16, num_warps=4))
    ws = torch.full((splits, m, n), float("nan"), dtype=torch.float32, device=device)
    grid = (triton.cdiv(n, bn), splits)
    extra = {} if cfg.maxnreg is None or SMOKE else {"maxnreg": cfg.maxnreg}
    return grid, (a16, b_w, b_sc, ws, m, n, k, per_split, a16.stride(0), b_w.stride(0), b_c4), dict(
        DECODE=decode, BLOCK_M=bm, BLOCK_N=bn, V=bk // 128, WARPS=cfg.num_warps, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **extra), ws


def smoke():
    import nvfp4lab
    from nvfp4lab.ref import gemm as ref_gemm
    torch.manual_seed(0)
    m, n, k = 5, 96, 512
    cfg = G.GemmConfig(16, 32, 128, 8, 1, 2, stream=True, a_pre=True, split_k=2)
    xa, xb = torch.randn(m, k), torch.randn(n, k)
    a = nvfp4lab.quantize_nvfp4(xa, backend="ref", scale_layout="swizzled")
    b = nvfp4lab.quantize_nvfp4(xb, backend="ref", scale_layout="swizzled")
    grid, args, kw, ws = probe_args(a, b, m, n, k, cfg, torch.device("cpu"))
    _probe_kernel[grid](*args, MODE=0, **kw)
    got = ws.sum(0) * 2.0**28  # the decoded operands carry 2^-14 each
    a_c = nvfp4lab.quantize_nvfp4(xa, backend="ref")
    b_c = nvfp4lab.quantize_nvfp4(xb, backend="ref")
    want = (ref_gemm.block_dequantized(a_c.rowwise_data, a_c.rowwise_scale)
            @ ref_gemm.block_dequantized(b_c.rowwise_data, b_c.rowwise_scale).t())
    err = ((got - want).abs() / want.abs().clamp_min(1e-3)).max().item()
    print(f"smoke: probe 'full' partials vs reference block products, max rel err {err:.2e}")
    assert err < 2**-7, err
    for mode in ("load", "decode", "mma"):
        _probe_kernel[grid](*args, MODE=MODES[mode], **kw)
    print("smoke: every mode ran")


def sweep(spec, a, bs, m, n, k, base, dev, bench):
    from dataclasses import replace
    for item in spec.split(","):
        bn, bk, w, st, cps, reg, *pre = (int(v) for v in item.split("x"))
        cfg = replace(base, block_n=bn, block_k=bk, num_warps=w, num_stages=st, ctas_per_sm=cps, maxnreg=reg or None,
                      a_pre=bool(pre[0]) if pre else base.a_pre)
        row = {}
        for mode in ("load", "mma", "full"):
            launches = []
            for b in bs:
                grid, pargs, kw, _ = probe_args(a, b, m, n, k, cfg, dev)
                launches.append(lambda grid=grid, pargs=pargs, kw=kw: _probe_kernel[grid](*pargs, MODE=MODES[mode], **kw))
            try:
                row[mode] = f"{bench.time_graph(launches, replays=10) * 1e3:7.1f}"
            except Exception as exc:  # a config that does not compile or fit
                row[mode] = f"{type(exc).__name__[:7]:>7}"
        outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in bs]
        row["prod"] = f"{bench.time_graph([lambda b=b, o=o: G.run(a, b, o, config=cfg) for b, o in zip(bs, outs)], replays=10) * 1e3:7.1f}"
        print(f"{m}x{n}x{k} {item:>22} splits {opt_flags.stream_splits(cfg, m, n, k, opt_flags.num_sms(dev)):3d} | "
              f"load {row['load']} mma {row['mma']} full {row['full']} prod {row['prod']} us", flush=True)


def split_sweep(spec, a, bs, m, n, k, base, dev, bench):
    """Production calls (G.run) with explicit K splits: the default config and, per item, others."""
    from dataclasses import replace
    cfgs = [("default", base)]
    for item in (spec or "").split(","):
        if item:
            bn, bk, w, st, cps, reg, pre = (int(v) for v in item.split("x"))
            cfgs.append((item, replace(base, block_n=bn, block_k=bk, num_warps=w, num_stages=st, maxnreg=reg or None,
                                       a_pre=bool(pre))))
    outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in bs]
    for name, cfg in cfgs:
        k_tiles = triton.cdiv(k, cfg.block_k)
        tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        cells = []
        for s in (1, 2, 3, 4, 5, 6, 8, 12, 16):
            if s > k_tiles:
                break
            c = replace(cfg, split_k=s)
            eff = opt_flags.stream_splits(c, m, n, k, opt_flags.num_sms(dev))
            t = bench.time_graph([lambda b=b, o=o: G.run(a, b, o, config=c) for b, o in zip(bs, outs)], replays=10) * 1e3
            cells.append(f"{eff}:{t:.1f}")
        dflt = opt_flags.stream_splits(cfg, m, n, k, opt_flags.num_sms(dev))
        print(f"{m}x{n}x{k} {name:>18} tiles {tiles:4d} default splits {dflt:2d} | splits:us " + " ".join(cells), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--shapes", default="16x14336x4096,16x4096x4096,64x4096x4096,64x14336x4096,1x4096x4096")
    p.add_argument("--sweep", default=None, help="comma-separated BNxBKxWARPSxSTAGESxCTAS_PER_SMxMAXNREG (0: none)[xA_PRE (0/1)] "
                   "configs timed in the 'load', 'mma' and 'full' modes instead of the default table")
    p.add_argument("--splits", default=None, help="time production calls over explicit K splits, for the default "
                   "config and the comma-separated BNxBKxWARPSxSTAGESxCPSxMAXNREGxA_PRE configs given ('' for none)")
    args = p.parse_args()
    if args.smoke:
        return smoke()
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    import gemm as bench  # time_graph, _copies, quantize (the benchmark's own helpers)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    print(f"{'M x N x K':>16} | {'cuBLAS':>7} {'prod':>7} {'full':>7} {'mma':>7} {'decode':>7} {'load':>7} "
          f"{'w-copy':>7} us | cuBLAS/prod  (cfg)")
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        copies = bench._copies(n * k * 9 // 16)
        ws_bf16 = [torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(copies)]
        bs = [bench.quantize(w, scale_layout="swizzled") for w in ws_bf16]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
        a = bench.quantize(x, scale_layout="swizzled")
        cfg = opt_flags.choose_config(m, n, k, dev)
        if args.splits is not None:
            split_sweep(args.splits, a, bs, m, n, k, cfg, dev, bench)
            continue
        if args.sweep:
            sweep(args.sweep, a, bs, m, n, k, cfg, dev, bench)
            continue
        row = {"cuBLAS": bench.time_graph([lambda w=w: torch.mm(x, w.t()) for w in ws_bf16], replays=10) * 1e3}
        outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in bs]
        row["prod"] = bench.time_graph([lambda b=b, o=o: G.run(a, b, o) for b, o in zip(bs, outs)], replays=10) * 1e3
        for mode in ("full", "mma", "decode", "load"):
            launches = []
            for b in bs:
                grid, pargs, kw, _ = probe_args(a, b, m, n, k, cfg, dev)
                launches.append(lambda grid=grid, pargs=pargs, kw=kw: _probe_kernel[grid](*pargs, MODE=MODES[mode], **kw))
            row[mode] = bench.time_graph(launches, replays=10) * 1e3
        nb = n * k * 9 // 16
        src = torch.empty(nb * copies, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        # a read-only stream would move half the bytes of this copy; report the copy time of the weight bytes / 2
        row["w-copy"] = bench.time_graph([lambda: dst.copy_(src)], replays=10) * 1e3 / copies / 2
        print(f"{shape:>16} | " + " ".join(f"{row[c]:7.1f}" for c in ("cuBLAS", "prod", "full", "mma", "decode", "load", "w-copy"))
              + f" | {row['cuBLAS'] / row['prod']:.2f}x  ({cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} "
              f"st{cfg.num_stages} splits {opt_flags.stream_splits(cfg, m, n, k, opt_flags.num_sms(dev))})", flush=True)
        del ws_bf16, bs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
