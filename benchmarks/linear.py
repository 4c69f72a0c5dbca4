"""Benchmark: fwd+bwd step of nvfp4lab.Linear and GroupedLinear per recipe preset vs BF16 nn.Linear.

Cases (same run, same process):
  linear  Linear(K -> N) over M tokens for each M x K x N of ``--linear-shapes`` (default: issue 21's three,
          8192 x 8192 x 8192, 8192 x 4096 x 4096, 4096 x 2048 x 2048)
  moe     GroupedLinear(8 experts, 7168 -> 2048), 8192 tokens in uneven splits (multiples of 64)

For each preset the table gives the fwd+bwd step time (weights re-quantized every step, i.e. one
micro-batch per optimizer step; ``--cached-weights`` keeps them cached), its ratio to the BF16 step,
and the split between quantize time (the step's quantize calls: x, W and dy, both copies each, timed
alone) and GEMM time (its three GEMMs on pre-quantized operands, timed alone); "other" is the rest
(autograd, bias grad, padding, launch gaps). MXFP8 GEMMs are emulated (dequantize + fp32 matmul).
Parameters and activations are bf16. Targets (issue 21, graph-replayed step vs BF16 in the same run): te_default
and per_token <= 1.10x at 8192^3, <= 1.20x at 8192 x 4096 x 4096, <= 1.5x at 4096 x 2048 x 2048; four_over_six
<= 1.3x at 8192^3; the MoE step (te_default, per_token) <= 1.4x.
On CUDA every time is a CUDA-graph replay (GPU time, no host launch cost; ``--eager`` turns that off),
the MoE step included (GroupedLinear keeps its split offsets on the device, so the step copies nothing
from the host; a step that cannot be captured is timed eagerly and says so under its row); the step is
also timed eagerly, in its own columns, since the MoE case is host-bound when eager.

    python benchmarks/linear.py            # full run on CUDA
    python benchmarks/linear.py --quick    # fewer iterations
    python benchmarks/linear.py --out results.json
    python benchmarks/linear.py --device cpu --tiny --quick   # smoke run of the script on CPU
    python benchmarks/linear.py --quick --breakdown 12         # + each preset's top kernels (one eager step)
    python benchmarks/linear.py --quick --timeline             # + every kernel of one eager step in launch order
    python benchmarks/linear.py --quick --prev .gpu/prev       # + the previous version, alternating, same process

``--breakdown N`` profiles one eager step per preset (torch.profiler; CUDA kernels on a GPU, CPU ops
otherwise) and prints its N costliest kernels and the kernel time per kind (quantize: amax / cast / table
kernels; operands: the expansion of GEMM operands to FP16; GEMM: cuBLAS and the Triton GEMM kernels;
epilogue: the fp32 epilogue kernel of the dequant path; other): the split of the step as it runs, where
the quantize / GEMM columns of the table time the same calls alone.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import _bench  # noqa: E402
import nvfp4lab  # noqa: E402
from nvfp4lab.functional.linear import quantized_gemm, quantize_tensor  # noqa: E402

# each preset's recipe from a version of the package (this one, or the previous one of ``--prev``)
PRESET_RECIPES = {
    "te_default": lambda lib: lib.NVFP4Recipe.te_default(),
    "per_token": lambda lib: lib.NVFP4Recipe.per_token(),
    "per_token_grads": lambda lib: lib.NVFP4Recipe.per_token(gradients=True),
    "four_over_six": lambda lib: lib.NVFP4Recipe.four_over_six(),
    "mxfp8_emulated": lambda lib: lib.MXFP8Recipe(),
}
PRESETS = {name: recipe(nvfp4lab) for name, recipe in PRESET_RECIPES.items()}
PREV_ROUNDS = 3  # alternating rounds of this version's and the previous one's step with --prev
# issue 21's targets: (case, M x K x N or None for MoE) -> {preset: ratio to the BF16 step}
_TE_PT = ("te_default", "per_token")
TARGETS = {("linear", (8192, 8192, 8192)): dict.fromkeys(_TE_PT, 1.10) | {"four_over_six": 1.3},
           ("linear", (8192, 4096, 4096)): dict.fromkeys(_TE_PT, 1.20),
           ("linear", (4096, 2048, 2048)): dict.fromkeys(_TE_PT, 1.5),
           ("moe", None): dict.fromkeys(_TE_PT, 1.4)}


def timer(device: torch.device):
    def time_ms(fn, warmup: int, iters: int) -> float:
        for _ in range(warmup):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize(device)
            return start.elapsed_time(end) / iters
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters

    return time_ms


def graphed_timer(device: torch.device, time_ms):
    """Mean GPU time of ``fn`` captured once in a CUDA graph and replayed: no host launch cost,
    which otherwise dominates (and makes irreproducible) the many small launches of the MoE case."""
    def graph_ms(fn, warmup: int, iters: int) -> float:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up (compiles, allocator pools) off the capture, as torch requires
            for _ in range(max(warmup, 2)):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
        except Exception as err:  # noqa: BLE001 - reported in the row's timing column, then timed eagerly
            graph_ms.failures.append(f"{type(err).__name__}: {err}"[:120])
            torch.cuda.synchronize(device)
            return time_ms(fn, warmup, iters)
        return time_ms(graph.replay, 2, iters)

    graph_ms.failures = []
    return graph_ms


LINEAR_SHAPES = "8192x8192x8192,8192x4096x4096,4096x2048x2048"


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'MxKxN,...' -> [(tokens, in_features, out_features), ...]"""
    out = []
    for item in (t for t in text.split(",") if t):
        dims = item.lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"--linear-shapes: {item!r} is not MxKxN with positive integers")
        out.append(tuple(int(d) for d in dims))
    return out


def shapes(tiny: bool, linear_shapes: str | None):
    """Linear shapes (``linear_shapes``, else issue 21's three; 256^3 with ``tiny``) and the MoE case."""
    if linear_shapes is None:
        linear_shapes = "256x256x256" if tiny else LINEAR_SHAPES
    moe = (8, 224, 64, [32] * 8) if tiny else (8, 7168, 2048, [1152, 896, 1088, 960, 1216, 832, 1024, 1024])
    return dict(linear=parse_shapes(linear_shapes), moe=moe)


def step_fn(module, x, dy, params, splits=None, fresh_weights=True):
    def step():
        for p in params:
            p.grad = None
        x.grad = None
        if fresh_weights and hasattr(module, "clear_weight_cache"):
            module.clear_weight_cache()
        y = module(x) if splits is None else module(x, splits)
        y.backward(dy)

    return step


# kernel (CUDA) or op (CPU, reference backend) names -> kind of work: the casts, the GEMM operands' expansion
# to FP16, the matmul itself (cuBLAS, the fused / stream kernels), the fp32 epilogue kernel
_KINDS = (("quantize", re.compile(r"amax|cast16|cast_row|cast_col|row_factor|four_over_six|pt_scales|(?<!de)quantiz", re.I)),
          ("operands", re.compile(r"expand_kernel", re.I)),
          ("epilogue", re.compile(r"epilogue_kernel", re.I)),
          ("GEMM", re.compile(r"gemm|stream_kernel|::(b|add)?mm$|matmul|sm90|cutlass|nvjet|xmma", re.I)))


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in _KINDS if pattern.search(name)), "other")


def _profiled_step(step, device: torch.device):
    """torch.profiler's record of one eager ``step`` (CUDA kernels on a GPU, CPU ops otherwise), after one
    unprofiled call that compiles and caches."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    step()
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        step()
        if cuda:
            torch.cuda.synchronize(device)
    return prof


def kernel_breakdown(step, device: torch.device, top: int) -> dict:
    """Self time of each kernel (CUDA) or op (CPU) of one eager ``step``: the ``top`` costliest, and the
    totals per kind, in ms."""
    cuda = device.type == "cuda"
    prof = _profiled_step(step, device)
    kernels = []
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", 0) if cuda else event.self_cpu_time_total
        if us > 0 and (not cuda or str(event.device_type).endswith("CUDA")):
            kernels.append((event.key, event.count, us / 1e3))
    kernels.sort(key=lambda k: -k[2])
    totals = {kind: 0.0 for kind, _ in _KINDS} | {"other": 0.0}
    for name, _, ms in kernels:
        totals[kernel_kind(name)] += ms
    return dict(top=kernels[:top], totals=totals)


def kernel_timeline(step, device: torch.device) -> list:
    """Every kernel (CUDA) or top-level op (CPU) of one eager ``step`` in launch order: [name, duration us, gap us
    since the previous one ended] (torch.profiler). Kernel durations are GPU time; the gaps of an eager step are
    mostly its host's launch path, which a CUDA-graph replay does not have."""
    cuda = device.type == "cuda"
    prof = _profiled_step(step, device)
    events = [e for e in prof.events() if (e.device_type.name == "CUDA") == cuda and (cuda or e.cpu_parent is None)
              and e.time_range.end > e.time_range.start]
    events.sort(key=lambda e: e.time_range.start)
    out, prev_end = [], None
    for e in events:
        start, end = e.time_range.start, e.time_range.end
        out.append([e.name, end - start, 0.0 if prev_end is None else start - prev_end])
        prev_end = end
    return out


def bf16_grouped(weights, splits):
    class Loop(torch.nn.Module):
        def forward(self, x, m_splits):
            return torch.cat([torch.nn.functional.linear(part, w) for part, w in zip(x.split(m_splits), weights)])

    return Loop()


def split_quantize_gemm(recipe, xs, weights, dys, backend, time_ms, warmup, iters):
    """(quantize ms, GEMM ms) of the calls one step makes, each group timed alone."""
    def quantize_all():
        out = []
        for x, w, dy in zip(xs, weights, dys):
            out.append((quantize_tensor(recipe, "input", x, rowwise=True, columnwise=True, backend=backend),
                        quantize_tensor(recipe, "weight", w, rowwise=True, columnwise=True, backend=backend),
                        quantize_tensor(recipe, "grad", dy, rowwise=True, columnwise=True, backend=backend)))
        return out

    quantized = quantize_all()

    def gemm_all():
        for qx, qw, qdy in quantized:
            quantized_gemm(qx, "rowwise", qw, "rowwise", out_dtype=torch.bfloat16, backend=backend)
            quantized_gemm(qdy, "rowwise", qw, "columnwise", out_dtype=torch.bfloat16, backend=backend)
            quantized_gemm(qdy, "columnwise", qx, "columnwise", out_dtype=torch.bfloat16, backend=backend)

    return time_ms(quantize_all, warmup, iters), time_ms(gemm_all, warmup, iters)


def step_module(lib, case, recipe_name, k, n, experts, device, dt, backend):
    """The Linear / GroupedLinear of ``case`` from ``lib`` (nvfp4lab or its previous version) with a preset's recipe."""
    recipe = PRESET_RECIPES[recipe_name](lib)
    if case == "linear":
        return lib.Linear(k, n, device=device, dtype=dt, recipe=recipe, backend=backend)
    return lib.GroupedLinear(experts, k, n, bias=False, device=device, dtype=dt, recipe=recipe, backend=backend)


def time_against_prev(step, prev_step, time_ms, eager_ms, warmup, iters) -> dict:
    """Best of PREV_ROUNDS alternating rounds of this version's step and the previous version's, graph-replayed
    (``time_ms``) and eager: the fields a row takes with ``--prev``."""
    new, old, new_eager, old_eager = [], [], [], []
    for _ in range(PREV_ROUNDS):
        new.append(time_ms(step, warmup, iters))
        old.append(time_ms(prev_step, warmup, iters))
        new_eager.append(eager_ms(step, warmup, iters))
        old_eager.append(eager_ms(prev_step, warmup, iters))
    return dict(step_ms=min(new), prev_ms=min(old), prev_ratio=min(new) / min(old), eager_ms=min(new_eager),
                prev_eager_ms=min(old_eager), prev_eager_ratio=min(new_eager) / min(old_eager))


def run_case(case, args, device, time_ms, eager_ms, linear_shape=None, prev=None):
    warmup, iters = (2, 5) if args.quick else (5, 20)
    dt = torch.bfloat16
    rows = []
    torch.manual_seed(0)
    if case == "linear":
        tokens, k, n = linear_shape
        splits, experts = None, 0
        x = torch.randn(tokens, k, device=device, dtype=dt, requires_grad=True)
        dy = torch.randn(tokens, n, device=device, dtype=dt)
        base = torch.nn.Linear(k, n, device=device, dtype=dt)
        label = f"Linear {k}->{n}, {tokens} tok"
    else:
        experts, k, n, splits = shapes(args.tiny, args.linear_shapes)["moe"]
        tokens = sum(splits)
        x = torch.randn(tokens, k, device=device, dtype=dt, requires_grad=True)
        dy = torch.randn(tokens, n, device=device, dtype=dt)
        ws = [torch.nn.Parameter(torch.randn(n, k, device=device, dtype=dt) / k**0.5) for _ in range(experts)]
        base = bf16_grouped(ws, splits)
        label = f"MoE {experts}x {k}->{n}, {tokens} tok"
    base_params = list(base.parameters()) if case == "linear" else ws
    bf16_ms = time_ms(step_fn(base, x, dy, base_params, splits), warmup, iters)
    bf16_eager_ms = eager_ms(step_fn(base, x, dy, base_params, splits), warmup, iters)
    rows.append(dict(case=label, preset="bf16 nn.Linear", step_ms=bf16_ms, ratio=1.0, quantize_ms=None, gemm_ms=None,
                     eager_ms=bf16_eager_ms, eager_ratio=1.0))
    presets = [p for p in args.presets.split(",") if p]
    for name in presets:
        recipe = PRESETS[name]
        row = dict(case=label, preset=name, target=TARGETS.get((case, linear_shape), {}).get(name))
        try:
            mod = step_module(nvfp4lab, case, name, k, n, experts, device, dt, args.backend)
            if case == "linear":
                xs, weights, dys = [x.detach()], [mod.weight.detach()], [dy]
            else:
                xs, dys = list(x.detach().split(splits)), list(dy.split(splits))
                weights = [w.detach() for w in mod.weights]
            step = step_fn(mod, x, dy, list(mod.parameters()), splits, fresh_weights=not args.cached_weights)
            step_eager_ms = eager_ms(step, warmup, iters)
            failures = len(getattr(time_ms, "failures", []))
            step_ms = time_ms(step, warmup, iters)
            if len(getattr(time_ms, "failures", [])) > failures:
                row["note"] = "step not capturable, timed eagerly: " + time_ms.failures[-1]
            if prev is not None:
                old = step_module(prev, case, name, k, n, experts, device, dt, args.backend)
                prev_step = step_fn(old, x, dy, list(old.parameters()), splits, fresh_weights=not args.cached_weights)
                row.update(time_against_prev(step, prev_step, time_ms, eager_ms, warmup, iters))
                step_ms, step_eager_ms = row["step_ms"], row["eager_ms"]
                del old, prev_step
            q_ms, g_ms = split_quantize_gemm(recipe, xs, weights, dys, args.backend, time_ms, warmup, iters)
            row.update(step_ms=step_ms, ratio=step_ms / bf16_ms, quantize_ms=q_ms, gemm_ms=g_ms,
                       eager_ms=step_eager_ms, eager_ratio=step_eager_ms / bf16_eager_ms)
            if args.breakdown:
                row["breakdown"] = kernel_breakdown(step, device, args.breakdown)
            if args.timeline:
                row["timeline"] = kernel_timeline(step, device)
        except Exception as err:  # keep going: one missing kernel should not hide the other rows
            row.update(error=f"{type(err).__name__}: {err}"[:160])
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def table(rows) -> str:
    head = (f"{'case':<32} {'preset':<16} {'step ms':>9} {'vs bf16':>8} {'quant ms':>9} {'gemm ms':>9} {'other ms':>9}"
            f" {'eager ms':>9} {'vs bf16':>8}")
    with_prev = any("prev_ms" in r for r in rows)
    if with_prev:
        head += f" {'prev ms':>9} {'new/prev':>9} {'prev eager':>10} {'new/prev':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['case']:<32} {r['preset']:<16} error: {r['error']}")
            continue
        other = None if r["quantize_ms"] is None else r["step_ms"] - r["quantize_ms"] - r["gemm_ms"]
        flag = ""
        if r.get("target"):
            flag = f"  {'ok' if r['ratio'] <= r['target'] else '> target'} ({r['target']}x)"
        lines.append(f"{r['case']:<32} {r['preset']:<16} {fmt(r['step_ms']):>9} {fmt(r['ratio'], '.2f') + 'x':>8} "
                     f"{fmt(r['quantize_ms']):>9} {fmt(r['gemm_ms']):>9} {fmt(other):>9} {fmt(r['eager_ms']):>9} "
                     f"{fmt(r['eager_ratio'], '.2f') + 'x':>8}"
                     + (f" {fmt(r.get('prev_ms')):>9} {fmt(r.get('prev_ratio'), '.3f') + 'x':>9} "
                        f"{fmt(r.get('prev_eager_ms')):>10} {fmt(r.get('prev_eager_ratio'), '.3f') + 'x':>9}" if with_prev else "")
                     + flag)
        if "note" in r:
            lines.append(f"    ({r['note']})")
    return "\n".join(lines)


def breakdown_text(rows) -> str:
    lines = []
    for r in rows:
        if "breakdown" not in r:
            continue
        totals = r["breakdown"]["totals"]
        lines.append(f"{r['case']} / {r['preset']}: kernel ms per kind (one eager step) "
                     + ", ".join(f"{kind} {ms:.3f}" for kind, ms in totals.items()))
        for name, count, ms in r["breakdown"]["top"]:
            lines.append(f"    {ms:8.3f} ms  {count:4d}x  [{kernel_kind(name)}] {name[:90]}")
    return "\n".join(lines)


def timeline_text(rows) -> str:
    lines = []
    for r in rows:
        if "timeline" not in r:
            continue
        events = r["timeline"]
        lines.append(f"{r['case']} / {r['preset']}: one eager step, {len(events)} kernels (CPU: ops) in launch order "
                     f"(us; gap since the previous one ended), {sum(us for _, us, _ in events):.1f} us in all")
        for name, us, gap in events:
            lines.append(f"    {us:8.1f}  gap {gap:8.1f}  [{kernel_kind(name)}] {name[:90]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer warm-up and timed iterations")
    parser.add_argument("--out", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--presets", default=",".join(PRESETS), help=f"comma list from {list(PRESETS)}")
    parser.add_argument("--cases", default="linear,moe", help="comma list from linear,moe")
    parser.add_argument("--linear-shapes", default=None, metavar="MxKxN,...",
                        help=f"tokens x in_features x out_features of each Linear case (default {LINEAR_SHAPES}; "
                             "256x256x256 with --tiny)")
    parser.add_argument("--backend", default=None, choices=[None, "ref", "triton"], help="nvfp4lab.ops backend (default: auto)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (to smoke-test the script on CPU)")
    parser.add_argument("--cached-weights", action="store_true", help="keep quantized weights cached across steps")
    parser.add_argument("--eager", action="store_true", help="time eager launches only (no CUDA graphs)")
    parser.add_argument("--breakdown", type=int, default=0, metavar="N",
                        help="profile one eager step per preset and print its N costliest kernels and the time per kind")
    parser.add_argument("--prev", type=Path, default=None, metavar="DIR",
                        help="also time the previous version (nvfp4lab_prev staged in DIR by tools/stage_gpu_inputs.py "
                             f"--prev, e.g. .gpu/prev) in the same process: best of {PREV_ROUNDS} alternating rounds each")
    parser.add_argument("--timeline", action="store_true",
                        help="profile one eager step per preset and print every kernel in launch order with its gap")
    args = parser.parse_args(argv)
    unknown = [p for p in args.presets.split(",") if p and p not in PRESETS]
    if unknown:
        parser.error(f"unknown presets {unknown}; choose from {list(PRESETS)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available (use --device cpu --tiny for a smoke run)")
    eager_ms = timer(device)
    graphed = device.type == "cuda" and not args.eager
    time_ms = graphed_timer(device, eager_ms) if graphed else eager_ms
    try:
        linear_shapes = shapes(args.tiny, args.linear_shapes)["linear"]
    except ValueError as err:
        parser.error(str(err))
    prev = None
    if args.prev is not None:
        prev = _bench.load_prev(args.prev)
        if prev is None:
            parser.error(f"--prev: no importable nvfp4lab_prev in {args.prev}")
    rows = []
    for case in [c for c in args.cases.split(",") if c]:
        if case not in ("linear", "moe"):
            parser.error(f"unknown case {case!r}")
        for shape in linear_shapes if case == "linear" else [None]:
            rows.extend(run_case(case, args, device, time_ms, eager_ms, shape, prev))
    meta = dict(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        torch=torch.__version__, nvfp4lab=nvfp4lab.__version__, quick=args.quick, tiny=args.tiny,
        backend=args.backend or "auto", weights="cached" if args.cached_weights else "re-quantized every step",
        timing="CUDA-graph replay (eager in its own columns)" if graphed else "eager",
        previous=None if prev is None else f"{args.prev} (best of {PREV_ROUNDS} alternating rounds)",
    )
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    if args.out:
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=2))
    print(f"# {meta['device']} | torch {meta['torch']} | triton {meta.get('triton', '-')} | backend {meta['backend']} | "
          f"weights {meta['weights']} | timing {meta['timing']} | targets: issue 21's")
    if args.breakdown:
        print(breakdown_text(rows))
    if args.timeline:
        print(timeline_text(rows))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
