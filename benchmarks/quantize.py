"""Benchmark of the Triton NVFP4 quantize (kernels/nvfp4_quantize.py) on CUDA.

For each recipe and shape (bf16 x of M x K) it reports, all medians of ``triton.testing.do_bench``
(L2 flushed between runs):

* full_us    quantize() with the amax pass, replayed from a CUDA graph (pure GPU time)
* eager_us   the same quantize() call launched eagerly (adds Python/dispatch overhead)
* amax_us    the amax pass alone (graph);  cast_us  the cast kernel alone with amax given (graph)
* GB/s       minimum bytes / full time: read x once, write data + compact scales of each output
* %copy      time of a device-to-device copy moving the same bytes / our time (full, and cast only)
* ref_*      torch.compile(ref.nvfp4.quantize) eager and CUDA-graph replay, and our speed-up over each

Usage (from the repo root):  PYTHONPATH=src python benchmarks/quantize.py [--quick] [--out FILE]
``--quick`` runs 8192x8192 only, ``--shapes MxK,...`` the given shapes (to split the sweep across runs);
``--out`` writes .json or .md; ``--tile BMxBKxWARPS`` gives every kernel that tile (the explicit
block_m / block_k / num_warps of ``quantize``; ``cast16_kernel`` takes BK, WARPS and BM / 16 row groups;
``cast_row_kernel``, the rowwise-only bf16 cast, all three);
``--no-baseline`` skips the torch.compile reference; ``--tile-sweep [LIST]`` times every recipe at
8192x8192 for each tile of LIST (default: a grid of common tiles) instead of the sweep, to pick the
defaults of ``nvfp4_quantize_details.opt_flags``. Per-token cast_us includes the small
``pt_scales_kernel`` launch, which runs inside the cast op, and per-tensor rowwise-only bf16 cast_us
the one-program ``row_factor_table_kernel`` launch. The table is printed last.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time

import torch
import torch._dynamo
import triton
import triton.testing

from nvfp4lab import NVFP4QuantConfig
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.ref import nvfp4 as ref_nvfp4

SWEEP_TILES = ("32x64x4", "32x128x4", "64x64x4", "64x128x4", "64x128x8", "128x64x8", "128x128x8", "64x256x8")
RECIPES = {
    "tensor-1x16-row": dict(rowwise=True),
    "tensor-1x16-rowcol": dict(rowwise=True, columnwise=True),
    "tensor-1x16-col": dict(rowwise=False, columnwise=True),
    "rht+sr-col": dict(rowwise=False, columnwise=True, rht=True, stochastic_rounding=True),
    "tensor-16x16-rowcol": dict(block="16x16", rowwise=True, columnwise=True),
    "rht(col)+row": dict(rowwise=True, columnwise=True, rht=True),
    "rht+sr": dict(rowwise=True, columnwise=True, rht=True, stochastic_rounding=True),
    "pertoken-rowcol": dict(per_token=True, rowwise=True, columnwise=True),
    "4over6-mae256-rowcol": dict(four_over_six="mae", e4m3_max=256, rowwise=True, columnwise=True),
}
MS = (1024, 4096, 8192, 16384, 32768)
DEVICE = "cuda"
QUICK_SHAPE = (8192, 8192)
KS = (2048, 4096, 8192)


def bench(fn) -> float:
    """Median milliseconds."""
    return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))


def graphed(fn):
    """Capture fn() in a CUDA graph (after warm-up on a side stream); returns replay()."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def min_bytes(m: int, k: int, config: NVFP4QuantConfig, x_bytes: int) -> int:
    per_side = m * k // 2 + m * k // 16  # packed E2M1 + compact E4M3 scales
    return m * k * x_bytes + per_side * (int(config.rowwise) + int(config.columnwise))


def parse_tile(text: str) -> dict:
    """'BMxBKxWARPS' -> the block_m / block_k / num_warps arguments of the quantize ops."""
    bm, bk, warps = (int(v) for v in text.lower().split("x"))
    return dict(block_m=bm, block_k=bk, num_warps=warps)


def cast_only_fn(x, config, tile):
    """The cast kernel with precomputed amaxes (what quantize() launches after the amax pass)."""
    t = kq.quantize(x, config, **tile)
    row_amax, col_amax = t.rowwise_amax, t.columnwise_amax
    seed_tensor, seed = kq.draw_seed(x) if config.stochastic_rounding else (None, 0)
    args = (
        x, row_amax, col_amax, seed_tensor, seed, config.rowwise, config.columnwise, config.block == "16x16",
        config.per_token, config.rht_sign_mask if config.rht else -1, kq.FOUR_OVER_SIX_CODES[config.four_over_six],
        config.e4m3_max, config.stochastic_rounding, config.scale_layout,
    )
    return lambda: kq.cast_outputs(*args, **tile)


def amax_only_fn(x, config, tile):
    row_mode, col_mode = kq.amax_modes(config, None, None)
    mask = config.rht_sign_mask if config.rht else 0
    return lambda: kq.compute_amax(x, row_mode, col_mode, mask, **tile)


def run_one(name, m, k, copy_cache, baseline, compiled_refs, tile):
    config = NVFP4QuantConfig(**RECIPES[name])
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    nbytes = min_bytes(m, k, config, x.element_size())
    if nbytes not in copy_cache:
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device=DEVICE)
        dst = torch.empty_like(src)
        copy_cache[nbytes] = bench(lambda: dst.copy_(src))  # reads + writes nbytes in all
        del src, dst
    copy_ms = copy_cache[nbytes]

    full = lambda: kq.quantize(x, config, **tile)  # noqa: E731
    eager_ms = bench(full)
    full_ms = bench(graphed(full))
    amax_ms = bench(graphed(amax_only_fn(x, config, tile)))
    cast_ms = bench(graphed(cast_only_fn(x, config, tile)))
    row = dict(
        recipe=name, M=m, K=k, full_us=full_ms * 1e3, eager_us=eager_ms * 1e3, amax_us=amax_ms * 1e3,
        cast_us=cast_ms * 1e3, GBps=nbytes / full_ms / 1e6, copy_us=copy_ms * 1e3,
        pct_copy_full=100 * copy_ms / full_ms, pct_copy_cast=100 * copy_ms / cast_ms,
    )
    if baseline:
        if name not in compiled_refs:
            # dynamic shapes: one compile per recipe; not with SR (torch.randint with a generator
            # argument cannot take symbolic sizes), which recompiles per shape
            dynamic = not config.stochastic_rounding
            compiled_refs[name] = torch.compile(lambda inp, cfg=config: ref_nvfp4.quantize(inp, cfg), dynamic=dynamic)
        ref_fn = compiled_refs[name]
        row["ref_eager_us"] = row["ref_graph_us"] = math.nan
        try:
            ref_fn(x)
            row["ref_eager_us"] = bench(lambda: ref_fn(x)) * 1e3
            row["ref_graph_us"] = bench(graphed(lambda: ref_fn(x))) * 1e3
        except Exception as exc:  # noqa: BLE001 - a failing baseline is reported, the sweep goes on
            print(f"  [{name} {m}x{k}] compiled reference failed: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
        row["speedup_eager"] = row["ref_eager_us"] / row["eager_us"]
        row["speedup_graph"] = row["ref_graph_us"] / row["full_us"]
    return row


COLUMNS = [
    ("recipe", "{:<21}"), ("tile", "{:>26}"), ("M", "{:>6}"), ("K", "{:>5}"), ("full_us", "{:>8.1f}"), ("eager_us", "{:>8.1f}"),
    ("amax_us", "{:>7.1f}"), ("cast_us", "{:>7.1f}"), ("GBps", "{:>6.0f}"), ("pct_copy_full", "{:>6.1f}"),
    ("pct_copy_cast", "{:>6.1f}"), ("ref_eager_us", "{:>9.1f}"), ("ref_graph_us", "{:>9.1f}"),
    ("speedup_eager", "{:>6.1f}"), ("speedup_graph", "{:>6.1f}"),
]
HEADERS = {"pct_copy_full": "%cpyF", "pct_copy_cast": "%cpyC", "speedup_eager": "xEagr", "speedup_graph": "xGrph"}


def format_table(rows) -> str:
    cols = [(c, f, int(re.search(r"\d+", f).group())) for c, f in COLUMNS if any(c in r for r in rows)]
    lines = [" ".join(HEADERS.get(c, c).ljust(w) if c == "recipe" else HEADERS.get(c, c).rjust(w) for c, _, w in cols)]
    for r in rows:
        lines.append(" ".join(f.format(r[c]) if c in r else " " * w for c, f, w in cols))
    return "\n".join(lines)


def markdown_table(rows) -> str:
    cols = [c for c, _ in COLUMNS if any(c in r for r in rows)]
    out = ["| " + " | ".join(HEADERS.get(c, c) for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(f"{r[c]:.1f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(out)


def run_meta(args, t0: float) -> dict:
    return dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                tile=args.tile or "default", seconds=round(time.time() - t0, 1))


def write_json(path: str, rows: list, args, t0: float) -> None:
    with open(path, "w") as f:
        json.dump(dict(meta=run_meta(args, t0), rows=rows), f, indent=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="8192x8192 only")
    parser.add_argument("--shapes", help="comma-separated MxK shapes replacing the sweep (to split it across runs)")
    parser.add_argument("--out", help="write results to this .json or .md file")
    parser.add_argument("--tile", help="BMxBKxWARPS tile of every kernel (default: opt_flags' choices)")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated subset of: " + ", ".join(RECIPES))
    parser.add_argument("--no-baseline", action="store_true", help="skip the torch.compile reference")
    parser.add_argument("--tile-sweep", nargs="?", const=",".join(SWEEP_TILES), default=None,
                        help="comma-separated BMxBKxWARPS tiles to time at 8192x8192 (no baseline)")
    args = parser.parse_args(argv)
    tiles = [args.tile]
    if args.tile_sweep:
        tiles = [t.strip() for t in args.tile_sweep.split(",") if t.strip()]
    try:
        for tile in tiles:
            if tile:
                parse_tile(tile)
    except ValueError:
        parser.error(f"tiles are BMxBKxWARPS; got {tiles}")
    if not torch.cuda.is_available():
        print("benchmarks/quantize.py needs a CUDA GPU", file=sys.stderr)
        return 1
    shapes = [QUICK_SHAPE] if args.quick else [(m, k) for m in MS for k in KS]
    if args.shapes:
        try:
            shapes = [tuple(int(v) for v in shape.lower().split("x")) for shape in args.shapes.split(",") if shape.strip()]
        except ValueError:
            parser.error(f"--shapes takes MxK,MxK,...; got {args.shapes!r}")
        if any(len(shape) != 2 for shape in shapes):
            parser.error(f"--shapes takes MxK,MxK,...; got {args.shapes!r}")
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown:
        parser.error(f"unknown recipes {unknown}; choose from {list(RECIPES)}")
    for limit in ("recompile_limit", "cache_size_limit"):  # the static-shape SR baseline recompiles per shape
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(64, getattr(torch._dynamo.config, limit)))
    rows, copy_cache, compiled_refs = [], {}, {}
    t0 = time.time()
    if args.tile_sweep:
        shapes = [QUICK_SHAPE]
    for tile in tiles:
        for name in recipes:
            for m, k in shapes:
                row = run_one(name, m, k, copy_cache, not (args.no_baseline or args.tile_sweep), compiled_refs,
                              parse_tile(tile) if tile else {})
                torch.cuda.empty_cache()  # release this shape's input and graph pools before the next
                if tile:
                    row["tile"] = tile
                rows.append(row)
                if args.out and args.out.endswith(".json"):  # after every row: a run cut short keeps its rows
                    write_json(args.out, rows, args, t0)
                print(f"  {name} {m}x{k} tile {tile or 'default'}: full {row['full_us']:.1f} us "
                      f"({row['pct_copy_full']:.0f}% of copy), cast {row['cast_us']:.1f} us, amax {row['amax_us']:.1f} us",
                      file=sys.stderr, flush=True)
    device = torch.cuda.get_device_name()
    meta = run_meta(args, t0)
    if args.out:
        if args.out.endswith(".json"):
            write_json(args.out, rows, args, t0)
        else:
            with open(args.out, "w") as f:
                f.write(f"# NVFP4 quantize benchmark\n\n{json.dumps(meta)}\n\n{markdown_table(rows)}\n")
    print(f"\nNVFP4 quantize, bf16 input, {device}, torch {torch.__version__}, triton {triton.__version__}, tile {meta['tile']}")
    print("full = amax pass + cast (CUDA graph); %cpyF/%cpyC = copy time of the same bytes / full or cast-only time")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
