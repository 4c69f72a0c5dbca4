"""Benchmark of the grouped (MoE) NVFP4 quantize (kernels/grouped_quantize.py) on CUDA.

For total tokens T, K and expert count E (uniform splits, and skewed: sizes ~ 1/(i+1), multiples of
16), times (median of do_bench, CUDA-graph replay) of quantize_grouped (two launches) vs a Python loop
of single quantizes per split and vs one single quantize of the whole (T, K) tensor. Recipe: per-tensor
1x16 rowwise + columnwise without RHT or SR. Targets: grouped/whole <= 1.15; loop/grouped >= 3 at E=32,
T=4096. ``--quick``: T in (4096, 16384), K 4096, E in (8, 32, 128); ``--out`` .json or .md;
``--parts`` also times the amax pass and the cast pass alone (grouped and whole); ``--totals``,
``--ks``: comma lists replacing the sweep's. Table last.

``--moe``: instead, the three grouped quantizes of ``benchmarks/linear.py``'s MoE step with te_default (8 experts,
7168 -> 2048, 8192 tokens in its uneven splits): the experts' weights (16x16, rowwise; packed, and as the BF16
operand the step's forward takes: "W op"), x (rowwise + RHT columnwise) and dy (rowwise SR + RHT SR columnwise), each
as the full op, its amax pass and its cast alone (x and dy), and x as the step's forward takes it ("x op": its rowwise
copy as the BF16 operand, from the cast, or for earlier versions from the packed cast and the expansion);
``--prev DIR`` adds the previous version staged in DIR (``tools/stage_gpu_inputs.py --prev``) in the same process,
best of 3 alternating rounds, with new/prev ratios. ``--device cpu --tiny``: a smoke run (tiny MoE, eager timing).
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import sys
import time
from pathlib import Path

# --tiny (a smoke run on the CPU) runs the kernels under the Triton interpreter, which has to be known before Triton
# is imported
if "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.kernels import grouped_quantize as gq
from nvfp4lab.kernels import nvfp4_quantize as kq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench  # noqa: E402  (benchmarks/_bench.py: load_prev)
import quantize as quantize_bench  # noqa: E402  (benchmarks/quantize.py: bench, graphed)
from linear import shapes as step_shapes  # noqa: E402  (benchmarks/linear.py: the MoE step's shapes)

graphed = quantize_bench.graphed


def bench(fn) -> float:
    """Median microseconds (quantize.bench gives milliseconds)."""
    return quantize_bench.bench(fn) * 1e3


def parts_us(x, offsets, config):
    """(amax us, cast us) of the grouped ops (offsets given) or of the whole-tensor passes (offsets None)."""
    modes = (kq.AMAX_TENSOR, kq.AMAX_TENSOR)
    if offsets is None:
        amax = lambda: kq.compute_amax(x, *modes, 0)  # noqa: E731
    else:
        amax = lambda: gq.grouped_amax(x, offsets, gq.G_SPLIT, gq.G_SPLIT, 0)  # noqa: E731
    row_amax, col_amax, *group_split = amax()
    args = (row_amax, col_amax, None, 0, True, True, False, False, -1, 0, config.e4m3_max, False)
    if offsets is None:
        cast = lambda: kq.cast_outputs(x, *args, "compact")  # noqa: E731
    else:
        cast = lambda: gq.grouped_cast(x, offsets, group_split[0], *args)  # noqa: E731
    return bench(graphed(amax)), bench(graphed(cast))


def split_sizes(total, experts, skewed):
    blocks = total // 16
    w = [1.0 / (i + 1) for i in range(experts)] if skewed else [1.0] * experts
    sizes = [int(blocks * v / sum(w)) for v in w]
    sizes[0] += blocks - sum(sizes)
    return [s * 16 for s in sizes]


MOE_ROUNDS = 3  # alternating rounds of this version and the previous one with --moe --prev


def moe_quantizes(lib, x, dy, weights, offsets) -> dict:
    """name -> callable of the MoE step's grouped quantizes with ``lib`` (nvfp4lab or its previous version):
    full ops, amax passes, casts alone (amaxes and group splits precomputed), te_default, compact scales."""
    gq = lib.kernels.grouped_quantize
    recipe = lib.NVFP4Recipe.te_default()
    quantize_weights = lib.functional.quantize_grouped_weights
    fns = {"W full": lambda: quantize_weights(weights, recipe, columnwise=False)}
    # the BF16 operand the step's forward takes (versions before ``operand=`` expand the packed stack)
    if "operand" in inspect.signature(quantize_weights).parameters:
        fns["W op"] = lambda: quantize_weights(weights, recipe, columnwise=False, operand=True)
    else:
        fns["W op"] = lambda: lib.ops.nvfp4_operand(quantize_weights(weights, recipe, columnwise=False)[0])
    for name, t, tensor in (("x", x, "input"), ("dy", dy, "grad")):
        config = dataclasses.replace(recipe.tensor_config(tensor, rowwise=True, columnwise=True), scale_layout="compact")
        sr = config.stochastic_rounding
        row_mode, col_mode = gq._amax_modes(config)
        mask = config.rht_sign_mask if config.rht else 0
        row_amax, col_amax, group_split = gq.grouped_amax(t, offsets, row_mode, col_mode, mask)
        fns[f"{name} full"] = (lambda t=t, config=config, sr=sr:
                               gq.quantize_grouped(t, offsets, config, seed=77 if sr else None))
        fns[f"{name} amax"] = (lambda t=t, row_mode=row_mode, col_mode=col_mode, mask=mask:
                               gq.grouped_amax(t, offsets, row_mode, col_mode, mask))
        fns[f"{name} cast"] = (lambda t=t, ra=row_amax, ca=col_amax, gs=group_split, config=config, sr=sr, mask=mask:
                               gq.grouped_cast(t, offsets, gs, ra, ca, None, 77, True, True, False, False,
                                               mask if config.rht else -1, 0, config.e4m3_max, sr))
        if name == "x":  # x as the step's forward takes it: its rowwise copy as the grouped GEMM's BF16 operand
            fns["x op"] = x_operand_fn(lib, t, offsets, config)
    return fns


def x_operand_fn(lib, x, offsets, config):
    """x's grouped quantize with its rowwise copy as the BF16 operand: written by the cast (versions with
    ``quantize_nvfp4_grouped_operands``), else the packed quantize and the expansion of its rowwise copy."""
    gq = lib.kernels.grouped_quantize
    if hasattr(lib.ops, "quantize_nvfp4_grouped_operands"):
        return lambda: gq.quantize_grouped_operand(x, offsets, config)
    row_config = dataclasses.replace(config, columnwise=False, rht=False)

    def packed_then_expanded():
        bulk = gq.quantize_grouped(x, offsets, config)
        rows = lib.NVFP4Tensor.from_parts(x.shape, x.dtype, row_config,
                                          rowwise=(bulk.rowwise_data, bulk.rowwise_scale, bulk.rowwise_amax[:1]))
        return bulk, lib.ops.nvfp4_operand(rows)
    return packed_then_expanded


def eager_us(fn, iters: int = 1) -> float:
    """Mean wall microseconds of ``fn`` after one warm-up call (CPU smoke runs: the interpreter)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e6 / iters


def run_moe(args) -> int:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu --tiny)", file=sys.stderr)
        return 1
    prev = None
    if args.prev is not None:
        prev = _bench.load_prev(args.prev)
        if prev is None:
            print(f"--prev: no importable nvfp4lab_prev in {args.prev}", file=sys.stderr)
            return 1
    import nvfp4lab

    experts, k, n, splits = step_shapes(args.tiny, None)["moe"]
    tokens = sum(splits)
    torch.manual_seed(0)
    x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
    dy = torch.randn(tokens, n, device=device, dtype=torch.bfloat16)
    weights = [torch.randn(n, k, device=device, dtype=torch.bfloat16) / k**0.5 for _ in range(experts)]
    offsets = torch.cumsum(torch.tensor([0] + list(splits)), 0).to(device)
    cuda = device.type == "cuda"
    timed = (lambda fn: bench(graphed(fn))) if cuda else eager_us
    libs = [nvfp4lab] + ([prev] if prev is not None else [])
    fns = [moe_quantizes(lib, x, dy, weights, offsets) for lib in libs]
    best = [dict.fromkeys(fns[0], float("inf")) for _ in libs]
    for _ in range(MOE_ROUNDS if prev is not None and cuda else 1):
        for name in fns[0]:
            for i, lib_fns in enumerate(fns):
                best[i][name] = min(best[i][name], timed(lib_fns[name]))
    rows = []
    for name in fns[0]:
        row = dict(op=name, us=best[0][name])
        if prev is not None:
            row.update(prev_us=best[1][name], ratio=best[0][name] / best[1][name])
        rows.append(row)
    title = (f"MoE step's grouped quantizes, te_default, {experts} x ({k} -> {n}), {tokens} tokens "
             f"(splits {list(splits)}); {torch.cuda.get_device_name() if cuda else 'CPU (eager)'}; us"
             + (", CUDA-graph replay" if cuda else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name() if cuda else "cpu", title=title, rows=rows), f, indent=1)
    print(f"\n{title}")
    print(f"{'op':<8} {'us':>9}" + (f" {'prev us':>9} {'new/prev':>9}" if prev is not None else ""))
    for r in rows:
        print(f"{r['op']:<8} {r['us']:>9.1f}" + (f" {r['prev_us']:>9.1f} {r['ratio']:>8.3f}x" if prev is not None else ""))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out")
    p.add_argument("--parts", action="store_true")
    p.add_argument("--totals", help="comma list of total tokens (overrides the sweep's)")
    p.add_argument("--ks", help="comma list of K (overrides the sweep's)")
    p.add_argument("--moe", action="store_true", help="the MoE step's grouped quantizes instead of the sweep")
    p.add_argument("--prev", type=Path, default=None, metavar="DIR", help="with --moe: the previous version staged in DIR")
    p.add_argument("--device", default="cuda", help="with --moe: cpu for a smoke run (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="with --moe: the tiny MoE of linear.py --tiny")
    args = p.parse_args(argv)
    if args.moe:
        return run_moe(args)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 1
    totals = (4096, 16384) if args.quick else (4096, 16384, 65536)
    ks = (4096,) if args.quick else (2048, 4096, 7168)
    if args.totals:
        totals = tuple(int(v) for v in args.totals.split(","))
    if args.ks:
        ks = tuple(int(v) for v in args.ks.split(","))
    config = NVFP4QuantConfig(rowwise=True, columnwise=True)
    rows = []
    for k in ks:
        for total in totals:
            x = torch.randn(total, k, device="cuda", dtype=torch.bfloat16)
            whole = bench(graphed(lambda: kq.quantize(x, config)))
            whole_parts = parts_us(x, None, config) if args.parts else (float("nan"),) * 2
            for experts in (8, 32, 128):
                for skewed in (False, True):
                    sizes = split_sizes(total, experts, skewed)
                    offsets = torch.cumsum(torch.tensor([0] + sizes), 0).cuda()
                    grouped = bench(graphed(lambda: gq.quantize_grouped(x, offsets, config)))
                    starts = [0]
                    for s in sizes:
                        starts.append(starts[-1] + s)
                    parts = [x[a:b] for a, b in zip(starts[:-1], starts[1:]) if b > a]
                    g_parts = parts_us(x, offsets, config) if args.parts else (float("nan"),) * 2
                    loop = bench(lambda: [kq.quantize(t, config) for t in parts])  # eager, as a framework would
                    loop_graph = bench(graphed(lambda: [kq.quantize(t, config) for t in parts]))
                    rows.append(dict(T=total, K=k, E=experts, dist="skew" if skewed else "unif", grouped_us=grouped,
                                     whole_us=whole, loop_us=loop, loop_graph_us=loop_graph,
                                     vs_whole=grouped / whole, loop_speedup=loop / grouped,
                                     grouped_amax_us=g_parts[0], grouped_cast_us=g_parts[1],
                                     whole_amax_us=whole_parts[0], whole_cast_us=whole_parts[1]))
                    print(f"  T={total} K={k} E={experts} {rows[-1]['dist']}: grouped {grouped:.1f} us, whole {whole:.1f}, "
                          f"loop {loop:.1f} (graph {loop_graph:.1f}); amax/cast grouped {g_parts[0]:.1f}/{g_parts[1]:.1f} "
                          f"whole {whole_parts[0]:.1f}/{whole_parts[1]:.1f}", file=sys.stderr, flush=True)
            del x
    if args.out:
        with open(args.out, "w") as f:
            if args.out.endswith(".json"):
                json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)
            else:
                f.write("| T | K | E | dist | grouped_us | whole_us | loop_us | loop_graph_us | grouped/whole | loop/grouped |\n|" + "---|" * 10 + "\n")
                for r in rows:
                    f.write(f"| {r['T']} | {r['K']} | {r['E']} | {r['dist']} | {r['grouped_us']:.1f} | {r['whole_us']:.1f} | "
                            f"{r['loop_us']:.1f} | {r['loop_graph_us']:.1f} | {r['vs_whole']:.2f} | {r['loop_speedup']:.1f} |\n")
    print(f"\ngrouped NVFP4 quantize (1x16 row+col), {torch.cuda.get_device_name()}; targets grouped/whole <= 1.15, loop/grouped >= 3 at E=32 T=4096")
    print(f"{'T':>6} {'K':>5} {'E':>4} {'dist':>4} {'grouped':>8} {'whole':>8} {'loop':>8} {'loopG':>8} {'g/whole':>7} {'loop/g':>6}")
    for r in rows:
        print(f"{r['T']:>6} {r['K']:>5} {r['E']:>4} {r['dist']:>4} {r['grouped_us']:>8.1f} {r['whole_us']:>8.1f} {r['loop_us']:>8.1f} "
              f"{r['loop_graph_us']:>8.1f} {r['vs_whole']:>7.2f} {r['loop_speedup']:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
