"""Benchmark: what eager users pay on the host, and the training step in eager, compiled and graph modes.

Part 1, host microseconds per call of every public op on tiny tensors (GPU work negligible): the median of
ROUNDS means of back-to-back calls after a warm-up (alternating with the previous version's op), beside torch.mm and ``x.abs().amax()`` of the same size, with each op's
Triton launches, allocations and aten ops per call and its floor (those launches and allocations at the cost of
one torch.empty and one Triton launch, timed in the same run); with the
previous version of the package (a copy importable as ``nvfp4lab_prev``, e.g. ``.gpu/prev``) in the
same process when present; part 2 times its steps too with ``--prev-steps``. The host's speed
drifts during a run (eager steps of one module measured 1.55-2.40 ms minutes apart on one machine), so
eager and compiled steps are medians of interleaved rounds (every variant and mode once per round).

Part 2, the Linear and GroupedLinear fwd+bwd+SGD step (te_default) against BF16 in the same mode:
eager (wall time per step, host included), torch.compile of the module in the default mode ("compile")
and in mode="reduce-overhead" ("compile_ro": Inductor's CUDA graphs around the module's forward and
backward, the optimizer eager), and CUDA-graph replay of the whole step. Cases: tokens x in -> out = 4096 x 2048 -> 2048, 8192 x 4096 -> 4096,
8192 x 8192 -> 8192, and MoE 8 x (7168 -> 2048) with 8192 tokens in uneven splits (BF16:
``torch._grouped_mm``).

    python benchmarks/host.py [--quick] [--no-compile] [--compile-modes compile] [--prev-steps] [--cases moe,8192 x 4096]
                              [--out host.json]
    python benchmarks/host.py --smoke       # the script itself on CPU (interpreter, tiny shapes)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE = "--smoke" in sys.argv
if SMOKE:
    import os

    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import nvfp4lab  # noqa: E402
from nvfp4lab.kernels.launch import Launch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import _bench  # noqa: E402

PREV_DIR = ROOT / ".gpu" / "prev"
ROUNDS = 5  # alternating rounds of the per-call table
MOE_SPLITS = [1152, 896, 1088, 960, 1216, 832, 1024, 1024]
CASES = [("linear", 4096, 2048, 2048), ("linear", 8192, 4096, 4096), ("linear", 8192, 8192, 8192),
         ("moe", 8192, 7168, 2048)]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_us(fn, device, calls: int, warmup: int = 20) -> float:
    """Mean host time of one call: ``calls`` back-to-back calls, timed on the host clock, then one sync."""
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    sync(device)
    return (t1 - t0) * 1e6 / calls


def op_calls(lib, device):
    """(name, fn) of every public op of ``lib`` (nvfp4lab or its previous version) on tiny inputs."""
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(128, 256, generator=g).to(device=device, dtype=torch.bfloat16)
    w = torch.randn(256, 256, generator=g).to(device=device, dtype=torch.bfloat16)
    q = lib.quantize_nvfp4
    qa = q(x, rowwise=True, columnwise=True)
    qw = q(w, block="16x16", columnwise=True)
    mx = lib.quantize_mxfp8(x, rowwise=True, columnwise=True)
    splits = [32, 32, 64]
    xg = torch.randn(128, 256, generator=g).to(device=device, dtype=torch.bfloat16)
    qg = lib.quantize_nvfp4_grouped_bulk(xg, splits, per_token=False)
    wg = q(torch.randn(3, 256, 256, generator=g).to(device=device, dtype=torch.bfloat16).reshape(3 * 256, 256))
    wg.shape = torch.Size((3, 256, 256))
    offs = torch.tensor([32, 64, 128], dtype=torch.int32, device=device)
    ga = q(xg, per_token=True)
    return [
        ("quantize_nvfp4 rowwise", lambda: q(x)),
        ("quantize_nvfp4 row+col 1x16", lambda: q(x, columnwise=True)),
        ("quantize_nvfp4 row+col per-token", lambda: q(x, columnwise=True, per_token=True)),
        ("quantize_nvfp4 row+col 16x16", lambda: q(x, columnwise=True, block="16x16")),
        ("quantize_nvfp4 row + RHT col", lambda: q(x, columnwise=True, rht=True)),
        ("quantize_nvfp4 row+col RHT+SR", lambda: q(x, columnwise=True, rht=True, stochastic_rounding=True)),
        ("quantize_nvfp4 row+col SR", lambda: q(x, columnwise=True, stochastic_rounding=True)),
        ("quantize_nvfp4 row+col 4over6", lambda: q(x, columnwise=True, four_over_six="mae")),
        ("dequantize_nvfp4 rowwise", lambda: lib.dequantize_nvfp4(qa)),
        ("dequantize_nvfp4 columnwise", lambda: lib.dequantize_nvfp4(qa, which="columnwise")),
        ("nvfp4_gemm", lambda: lib.nvfp4_gemm(qa, qw)),
        ("quantize_mxfp8 row+col", lambda: lib.quantize_mxfp8(x, rowwise=True, columnwise=True)),
        ("dequantize_mxfp8 rowwise", lambda: lib.dequantize_mxfp8(mx)),
        ("swizzle_scales", lambda: lib.swizzle_scales(qa.rowwise_scale)),
        ("quantize_nvfp4_grouped_bulk 3 splits", lambda: lib.quantize_nvfp4_grouped_bulk(xg, splits)),
        ("nvfp4_grouped_gemm 3 experts", lambda: lib.nvfp4_grouped_gemm(ga, wg, offs)),
    ], qg


@triton.jit
def _fill_kernel(out_ptr, n, BLOCK: tl.constexpr):
    """The least a launch can do: one program storing zeros (host.py's floor of one Triton launch)."""
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=offs < n)


_ALLOCATING = ("empty", "zeros", "full", "new_empty", "new_zeros", "new_full", "empty_like", "zeros_like", "empty_strided")


class _CountOps(TorchDispatchMode):
    """Counts the aten ops of a call, and among them the allocating factories (empty, zeros, ...)."""

    def __init__(self):
        super().__init__()
        self.ops = self.allocations = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.allocations += func.overloadpacket.__name__ in _ALLOCATING
        return func(*args, **(kwargs or {}))


def op_counts(fn) -> tuple[int, int, int]:
    """(Triton launches, allocating aten ops, aten ops) of one call of ``fn`` (warm: plans built)."""
    fn()
    launches = [0]
    real_call = Launch.__call__

    def counting(self, *args):
        launches[0] += 1
        return real_call(self, *args)

    Launch.__call__ = counting
    try:
        with _CountOps() as counter:
            fn()
    finally:
        Launch.__call__ = real_call
    return launches[0], counter.allocations, counter.ops


def part_ops(device, calls, prev):
    x = torch.randn(128, 256, device=device, dtype=torch.bfloat16)
    w = torch.randn(256, 256, device=device, dtype=torch.bfloat16)
    buf = torch.empty(128, device=device)
    fill = Launch(_fill_kernel, (1,), dict(BLOCK=128))  # a launch as the package's kernels make it (cached, direct)
    # the floors the ops are made of: one allocation, one Triton launch; an op's host time is at least
    # its launches and allocations times these
    base = [("torch.mm 128x256x256", lambda: torch.mm(x, w)), ("x.abs().amax()", lambda: x.abs().amax()),
            ("torch.empty(1024)", lambda: torch.empty(1024, device=device)),
            ("one Triton launch (nvfp4lab Launch)", lambda: fill(buf, 128))]
    mm_us = host_us(base[0][1], device, calls)
    rows = [dict(op=name, us=round(host_us(fn, device, calls), 1)) for name, fn in base]
    empty_us, launch_us = rows[2]["us"], rows[3]["us"]
    new, _ = op_calls(nvfp4lab, device)
    old = dict(op_calls(prev, device)[0]) if prev is not None else {}
    for name, fn in new:
        # this version and the previous one alternate, ROUNDS times each: the medians are compared
        times, prev_times = [], []
        for _ in range(ROUNDS):
            times.append(host_us(fn, device, calls))
            if name in old:
                prev_times.append(host_us(old[name], device, calls))
        row = dict(op=name, us=round(median(times), 1))
        row["launches"], row["allocations"], row["aten_ops"] = op_counts(fn)
        # what the call's launches and allocations cost at the floors above, before any Python of its own
        row["floor_us"] = round(row["launches"] * launch_us + row["allocations"] * empty_us, 1)
        if prev_times:
            row["prev_us"] = round(median(prev_times), 1)
        rows.append(row)
    print(f"\nHost time per call (us; median of {ROUNDS} means of {calls} calls, alternating with the previous "
          f"version; tiny tensors; torch.mm = {mm_us:.1f} us); launches, allocations and aten ops of one call; "
          "floor = launches x one launch + allocations x torch.empty")
    print(f"{'op':<40} {'nvfp4lab':>9} {'x mm':>6} {'launch':>6} {'alloc':>5} {'aten':>4} {'floor':>6} {'previous':>9} "
          f"{'new/prev':>9}")
    for row in rows:
        prev_us = row.get("prev_us")
        ratio = f"{row['us'] / prev_us:9.2f}" if prev_us else " " * 9
        prev_s = f"{prev_us:9.1f}" if prev_us else " " * 9
        counts = (f"{row['launches']:6d} {row['allocations']:5d} {row['aten_ops']:4d} {row['floor_us']:6.1f}"
                  if "launches" in row else " " * 24)
        print(f"{row['op']:<40} {row['us']:9.1f} {row['us'] / mm_us:6.2f} {counts} {prev_s} {ratio}", flush=True)
    return rows


# ------------------------------------------------------------------------------------- the step
class BF16Grouped(torch.nn.Module):
    """BF16 MoE layer on torch._grouped_mm (a loop of matmuls where that op is missing)."""

    def __init__(self, num, k, n, device):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(num, n, k, device=device, dtype=torch.bfloat16) * k ** -0.5)
        self._offs = {}  # device offsets per m_splits, made once (as GroupedLinear keeps its own)

    def forward(self, x, m_splits):
        if x.is_cuda and hasattr(torch, "_grouped_mm"):
            offs = self._offs.get(tuple(m_splits))
            if offs is None:
                offs = torch.tensor(m_splits, device=x.device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
                self._offs[tuple(m_splits)] = offs
            return torch._grouped_mm(x, self.weight.transpose(-2, -1), offs=offs)
        return torch.cat([part @ w.t() for part, w in zip(x.split(m_splits), self.weight)])


def build(kind, tokens, k, n, quantized, device, prev=None):
    lib = prev if prev is not None else nvfp4lab
    recipe = lib.NVFP4Recipe.te_default()
    splits = None
    if kind == "linear":
        module = (lib.Linear(k, n, bias=False, recipe=recipe) if quantized else torch.nn.Linear(k, n, bias=False))
    else:
        splits = MOE_SPLITS if not SMOKE else [16] * 8
        module = (lib.GroupedLinear(8, k, n, bias=False, recipe=recipe) if quantized else BF16Grouped(8, k, n, device))
    module = module.to(device=device, dtype=torch.bfloat16)
    x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, n, device=device, dtype=torch.bfloat16)
    return module, x, dy, splits


def step_of(module, x, dy, splits, forward=None):
    forward = forward if forward is not None else module
    opt = torch.optim.SGD(module.parameters(), lr=1e-6)

    def step():
        opt.zero_grad(set_to_none=False)
        y = forward(x) if splits is None else forward(x, splits)
        y.backward(dy)
        opt.step()

    return step


def wall_ms(step, device, iters, warmup=3):
    for _ in range(warmup):
        step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync(device)
    return (time.perf_counter() - t0) * 1e3 / iters


def graph_ms(step, device, iters):
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return wall_ms(graph.replay, device, iters)


def median(values):
    return sorted(values)[len(values) // 2]


COMPILE_MODES = {"compile": {}, "compile_ro": dict(mode="reduce-overhead")}


def part_steps(device, iters, compile_modes, prev, only_cases=None, rounds=3):
    """Each case's variants (and their compiled modules: ``compile_modes``, names of :data:`COMPILE_MODES`;
    the previous version's module in the default mode only) are built and warmed up first; then every eager
    and compiled step is timed once per round, ``rounds`` interleaved rounds (median), so that each ratio
    comes from measurements side by side (the host's speed drifts within a run). CUDA-graph replays first, of
    modules of their own."""
    rows = []
    cases = CASES if not SMOKE else [("linear", 64, 64, 64), ("moe", 128, 64, 32)]
    for kind, tokens, k, n in cases:
        name = f"{kind} {tokens} x {k} -> {n}" + (" x 8 experts" if kind == "moe" else "")
        if only_cases and not any(part in name for part in only_cases):
            continue
        row = dict(case=name)
        variants = [("nvfp4", True, None), ("bf16", False, None)]
        if prev is not None:
            variants.append(("prev", True, prev))
        built, steps = {}, {}
        torch._dynamo.reset()
        if device.type == "cuda":  # first, on modules of their own: reduce-overhead's CUDA graphs broke these captures
            for label, quantized, lib in variants:
                try:
                    row[f"{label}_graph"] = graph_ms(step_of(*build(kind, tokens, k, n, quantized, device, lib)), device,
                                                     iters)
                except Exception as err:  # noqa: BLE001 - reported in the row
                    row[f"{label}_graph_error"] = f"{type(err).__name__}: {err}"[:160]
        for label, quantized, lib in variants:
            module, x, dy, splits = build(kind, tokens, k, n, quantized, device, lib)
            built[label] = (module, x, dy, splits)
            steps[(label, "eager")] = step_of(module, x, dy, splits)
            for mode in compile_modes:
                if label == "prev" and mode != "compile":
                    continue
                compiled = step_of(module, x, dy, splits, torch.compile(module, **COMPILE_MODES[mode]))
                try:
                    wall_ms(compiled, device, 1, warmup=3)
                    steps[(label, mode)] = compiled
                except Exception as err:  # noqa: BLE001 - reported in the row
                    row[f"{label}_{mode}_error"] = f"{type(err).__name__}: {err}"[:160]
        times = {key: [] for key in steps}
        for _ in range(rounds):
            for key, step in steps.items():
                times[key].append(wall_ms(step, device, iters, warmup=1))
        for (label, mode), values in times.items():
            row[f"{label}_{mode}"] = median(values)
        for (label, mode) in times:
            if mode != "eager":
                row[f"{label}_{mode}_vs_eager"] = row[f"{label}_{mode}"] / row[f"{label}_eager"]
        del built, steps
        rows.append(row)
        print_step_row(row, flush=True)
    return rows


def print_step_row(row, flush=False):
    def get(key):
        return row.get(key)

    def fmt(v):
        return f"{v:8.3f}" if isinstance(v, float) else " " * 8

    def ratio(a, b):
        return f"{a / b:6.2f}x" if isinstance(a, float) and isinstance(b, float) else " " * 7

    print(f"\n{row['case']}")
    print(f"  {'mode':<8} {'nvfp4 ms':>8} {'bf16 ms':>8} {'vs bf16':>7} {'prev ms':>8} {'new/prev':>8}")
    for mode in ("eager", "compile", "compile_ro", "graph"):
        n, b, p = get(f"nvfp4_{mode}"), get(f"bf16_{mode}"), get(f"prev_{mode}")
        if n is None and b is None:
            continue
        print(f"  {mode:<8} {fmt(n)} {fmt(b)} {ratio(n, b)} {fmt(p)} {ratio(n, p)}")
    n_e, n_g = get("nvfp4_eager"), get("nvfp4_graph")
    if n_e and n_g:
        print(f"  eager / graph (nvfp4): {n_e / n_g:.2f}x")
    for label in ("nvfp4", "bf16", "prev"):
        ratios = [f"{mode} {row[f'{label}_{mode}_vs_eager']:.2f}x" for mode in ("compile", "compile_ro")
                  if f"{label}_{mode}_vs_eager" in row]
        if ratios:
            print(f"  {label} compiled / eager (same rounds): " + ", ".join(ratios))
    for key, value in row.items():
        if key.endswith("_error"):
            print(f"  {key}: {value}")
    sys.stdout.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and steps")
    parser.add_argument("--smoke", action="store_true", help="check the script on CPU; numbers mean nothing")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile modes")
    parser.add_argument("--compile-modes", default="compile,compile_ro",
                        help="comma-separated torch.compile modes of the steps: compile (default mode), compile_ro "
                             "(reduce-overhead); the previous version's steps (--prev-steps) take the default mode")
    parser.add_argument("--no-prev", action="store_true", help="do not load the previous version")
    parser.add_argument("--only", choices=("ops", "steps"), default=None)
    parser.add_argument("--prev-steps", action="store_true",
                        help="also time the previous version's steps (interleaved with this version's)")
    parser.add_argument("--cases", default=None,
                        help="comma-separated parts of the step cases' names to run (e.g. 'moe' or '4096 x 2048')")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    device = torch.device("cpu" if SMOKE else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU (or --smoke)")
    prev = None if args.no_prev or SMOKE else _bench.load_prev(PREV_DIR)
    calls = 3 if SMOKE else (100 if args.quick else 300)
    iters = 1 if SMOKE else (10 if args.quick else 30)
    import triton

    meta = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", torch=torch.__version__,
                triton=triton.__version__, previous=prev is not None)
    print("host benchmark:", meta)
    result = dict(meta=meta)
    if args.only in (None, "ops"):
        result["ops"] = part_ops(device, calls, prev)
    if args.only in (None, "steps"):
        only = [part.strip() for part in args.cases.split(",")] if args.cases else None
        modes = [] if args.no_compile or SMOKE else [m.strip() for m in args.compile_modes.split(",") if m.strip()]
        unknown = sorted(set(modes) - set(COMPILE_MODES))
        if unknown:
            parser.error(f"--compile-modes: unknown {unknown}, choose from {sorted(COMPILE_MODES)}")
        result["steps"] = part_steps(device, iters, modes, prev if args.prev_steps else None, only)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
