"""A/B probe of Linear plan choices (issue 21): the nvfp4lab.Linear fwd+bwd step (bias, bf16, weights re-quantized
every step) under plan / kernel variants, each captured in its own CUDA graph and replayed in alternating rounds in one
process, against BF16 nn.Linear in the same rounds.

Variants (a state applied before warm-up + capture, undone after capture; every one starts from cleared caches):
  today   the library's own plan
  packed  the backward plan's dy_row_op and dy_col_op forced False (dy's packed cast and the GEMMs' expansions)
  dyrow   dy_row_op forced True  (dgrad's dy operand straight from dy's cast)
  dycol   dy_col_op forced True  (wgrad's dy operand straight from dy's cast)
  dyboth  both
  rNN     maxnreg=NN on the stochastic-rounding cast_col_kernel (opt_flags.cast_col_meta patched), e.g. r72, r80
  opt:NAME=VALUE   the quantize opt_flags attribute NAME set to VALUE (a Python literal) during capture, e.g.
          opt:SR_ROW_OPERAND_MIN_ELEMENTS=1099511627776 (the rule's threshold out of reach)

    python tools/plan_ab.py [--shapes 4096x2048x2048,8192x4096x4096] [--presets te_default,per_token]
        [--variants today,packed,dyrow] [--rounds 5] [--iters 20] [--warm-jobs 6] [--device cuda|cpu]

A new shape or variant compiles its kernels first (minutes on a fresh machine, one process compiling at a time):
``--warm-jobs N`` first captures each (shape, preset, variant) once in N parallel processes (``--rounds 0``: capture
only), so the timed process finds Triton's cache warm. ``--device cpu``: no graphs, one eager step per variant (use a
tiny shape, e.g. --shapes 64x64x64), plan fields printed. Results: benchmarks/RESULTS.md, forty-fifth session.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import itertools
import statistics
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(1, str(ROOT / "benchmarks"))  # benchmarks/linear.py imports _bench

import torch  # noqa: E402

import nvfp4lab  # noqa: E402
# modules by import_module: `import a.b.c as X` would give nvfp4lab.functional's *function* `linear`
FL = importlib.import_module("nvfp4lab.functional.linear")
NQ = importlib.import_module("nvfp4lab.kernels.nvfp4_quantize")
CAST = importlib.import_module("nvfp4lab.kernels.nvfp4_quantize_details.cast")
opt_flags = importlib.import_module("nvfp4lab.kernels.nvfp4_quantize_details.opt_flags")
assert CAST.opt_flags is opt_flags and hasattr(FL, "_GEMM_PLANS") and hasattr(NQ, "_EAGER_PLANS")
from nvfp4lab.recipes import resolve_recipe  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_linear", ROOT / "benchmarks" / "linear.py")
BL = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(BL)  # step_fn, step_module, PRESET_RECIPES

DY_FORCE = {"packed": dict(dy_row_op=False, dy_col_op=False), "dyrow": dict(dy_row_op=True),
            "dycol": dict(dy_col_op=True), "dyboth": dict(dy_row_op=True, dy_col_op=True)}
_ORIG_CAST_COL_META = opt_flags.cast_col_meta


def log(*a):
    print(*a, flush=True)


def clear_caches():
    FL._clear_path_caches()
    CAST.cast_plan.cache_clear()
    NQ._EAGER_PLANS.clear()


def plan_key(mod, x):
    """_gemm_plan's key as _LinearFunction.forward -> _forward_gemm builds it: (recipe, m, n, k, x2.device, backend,
    need_dgrad, need_wgrad), m tokens, k -> n."""
    m, k = x.shape
    return (resolve_recipe(mod.recipe), m, mod.out_features, k, x.device, mod.backend, x.requires_grad,
            mod.weight.requires_grad)


class State:
    """One variant's state: apply() before warm-up, check() after the first step, undo() after capture."""

    def __init__(self, name):
        self.name, self.forced, self.key, self.nreg_calls, self.saved = name, None, None, 0, None
        if name.startswith("opt:"):
            attr, _, value = name[4:].partition("=")
            if not hasattr(opt_flags, attr):
                raise ValueError(f"opt_flags has no attribute {attr!r}")
            self.flag = (attr, ast.literal_eval(value))
        elif name not in DY_FORCE and name != "today" and not (name[:1] == "r" and name[1:].isdigit()):
            raise ValueError(f"unknown variant {name!r}")

    def apply(self, mod, x):
        if self.name.startswith("opt:"):  # before the plans are built: they read the flags
            self.saved = (self.flag[0], getattr(opt_flags, self.flag[0]))
            setattr(opt_flags, *self.flag)
        clear_caches()
        self.key = plan_key(mod, x)
        plan = FL._gemm_plan(*self.key)  # built and stored under the key the module's step will use
        if self.name in DY_FORCE:
            fields = dict(DY_FORCE[self.name])
            forced_ops = fields.get("dy_row_op", plan.dy_row_op) or fields.get("dy_col_op", plan.dy_col_op)
            # as _new_gemm_plan: beside a packed cast, or operand casts below the general operand size
            fields["dy_beside"] = not (forced_ops and FL.ops.operand_cast_pays(plan.dy_rows, self.key[2]))
            plan = self.forced = plan._replace(**fields)
            FL._GEMM_PLANS[self.key] = plan
        elif self.name[:1] == "r":
            nreg = int(self.name[1:])

            def capped(*args, **kw):
                meta = _ORIG_CAST_COL_META(*args, **kw)
                sr = kw["stochastic_rounding"] if "stochastic_rounding" in kw else args[5]
                if sr:
                    meta["maxnreg"] = nreg
                    self.nreg_calls += 1
                return meta

            opt_flags.cast_col_meta = capped
        return plan

    def check(self):
        """The plan the step used (the one under the key; for dy* also: the forced one, not rebuilt)."""
        plan = FL._GEMM_PLANS.get(self.key)
        same_mnk = [p for key, p in FL._GEMM_PLANS.items() if key[1:4] == self.key[1:4]]
        msg = f"dy_row_op={plan and plan.dy_row_op} dy_col_op={plan and plan.dy_col_op}"
        if plan is not None:
            msg += f" dy_beside={plan.dy_beside}"
        if len(same_mnk) != 1:  # the step built a plan under another key: the forcing missed it
            msg += f" | {len(same_mnk)} plans for this (m, n, k): KEY MISMATCH"
        if self.forced is not None:
            ok = plan is self.forced and all(p is self.forced for p in same_mnk)
            msg += f" | forced plan still in _GEMM_PLANS: {'yes' if ok else 'NO (rebuilt or other key)'}"
        elif plan is None:
            msg += " | NO plan under the computed key (key mismatch?)"
        if self.name[:1] == "r":
            msg += f" | cast_col_meta SR calls capped: {self.nreg_calls}"
        return msg

    def undo(self):
        opt_flags.cast_col_meta = _ORIG_CAST_COL_META
        if self.saved is not None:
            setattr(opt_flags, *self.saved)
        clear_caches()


def short_tb():
    return "".join(traceback.format_exc(limit=-3).splitlines(True)[-8:]).rstrip()


def capture(step, device, after_first=None):
    """benchmarks/linear.py graphed_timer's recipe: 3 eager warm-ups on a side stream, then capture (the graph's own
    private memory pool, as there); ``after_first()`` runs after the first warm-up step."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for i in range(3):
            step()
            if i == 0 and after_first is not None:
                after_first()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize(device)
    return graph


def replay_ms(graph, iters):
    graph.replay()  # one replay warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def make_module(preset, k, n, device):
    torch.manual_seed(1)
    return BL.step_module(nvfp4lab, "linear", preset, k, n, 0, device, torch.bfloat16, None)


def run_preset(preset, shape, variants, args, device, x, dy, bf16_graph):
    """{name: [ms per round] or None (err)} for BF16 + the variants of one preset."""
    m, k, n = shape
    graphs, keep = {"BF16": bf16_graph}, []
    for name in variants:
        state = None
        try:
            state = State(name)
            mod = make_module(preset, k, n, device)
            state.apply(mod, x)
            step = BL.step_fn(mod, x, dy, list(mod.parameters()))
            if device.type == "cuda":
                first = []
                graphs[name] = capture(step, device, lambda: first.append(state.check()))
                log(f"  {preset:<12} {name:<7} after 1st step: {first[0]}\n{'':22}after capture:  {state.check()}")
                keep.append(mod)
            else:
                step()
                log(f"  {preset:<12} {name:<7} after 1 eager step: {state.check()}")
        except Exception:  # noqa: BLE001 - one variant failing must not hide the others
            log(f"  {preset:<12} {name:<7} FAILED:\n{short_tb()}")
            graphs[name] = None
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        finally:
            if state is not None:
                state.undo()
    if device.type != "cuda" or not args.rounds:
        return {}
    times = {name: [] for name in graphs}
    for _ in range(args.rounds):
        for name, graph in graphs.items():  # BF16 first, then the variants in order
            if graph is None or times[name] is None:
                continue
            try:
                times[name].append(replay_ms(graph, args.iters))
            except Exception:  # noqa: BLE001
                log(f"  {preset} {name} replay FAILED:\n{short_tb()}")
                times[name] = None
    for name, graph in graphs.items():
        if graph is None:
            times[name] = None
    log(f"  {preset} per-round ms: " + "; ".join(
        f"{name} " + ("err" if t is None else " ".join(f"{v:.4f}" for v in t)) for name, t in times.items()))
    del graphs, keep
    return times


def table_row(label, preset, variants, times):
    med = {name: (statistics.median(t) if t else None) for name, t in times.items()}
    bf16, today = med.get("BF16"), med.get("today")
    cells = [label, preset, "err" if bf16 is None else f"{bf16:.4f}"]
    for name in variants:
        v = med.get(name)
        if v is None:
            cells.append("err")
        elif name == "today" or today is None:
            cells.append(f"{v:.4f}" + ("" if bf16 is None else f" ({v / bf16:.3f}x)"))
        else:
            cells.append(f"{v / today:.3f}x")
    return "| " + " | ".join(cells) + " |"


def warm(args, shapes, presets, variants) -> None:
    """Capture every (shape, preset, variant) once, ``args.warm_jobs`` processes at a time (``--rounds 0``), so that
    their kernels are in Triton's cache before the timed process starts."""
    def one(case):
        (m, k, n), preset, variant = case
        cmd = [sys.executable, __file__, "--shapes", f"{m}x{k}x{n}", "--presets", preset, "--variants", variant,
               "--rounds", "0", "--device", args.device]
        done = subprocess.run(cmd, capture_output=True, text=True)
        return f"{m}x{k}x{n} {preset} {variant}: rc {done.returncode}" + ("" if done.returncode == 0 else
                                                                          f"\n{done.stderr[-600:]}")

    with ThreadPoolExecutor(args.warm_jobs) as pool:
        for line in pool.map(one, itertools.product(shapes, presets, variants)):
            log(f"# warmed {line}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="4096x2048x2048,8192x4096x4096", help="MxKxN,... (M tokens, Linear K -> N)")
    p.add_argument("--presets", default="te_default,per_token")
    p.add_argument("--variants", default="today,packed,dyrow,dyboth")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds (0: capture only)")
    p.add_argument("--warm-jobs", type=int, default=0, help="capture every case in this many processes first")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args()
    shapes = BL.parse_shapes(args.shapes)
    presets = [s for s in args.presets.split(",") if s]
    variants = [s for s in args.variants.split(",") if s]
    unknown = [s for s in presets if s not in BL.PRESET_RECIPES]
    if unknown:
        p.error(f"unknown presets {unknown}; choose from {list(BL.PRESET_RECIPES)}")
    for v in variants:
        try:
            State(v)
        except ValueError as err:
            p.error(str(err))
    device = torch.device(args.device)
    if args.warm_jobs and device.type == "cuda":
        warm(args, shapes, presets, variants)
    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = "-"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    log(f"# torch {torch.__version__} | triton {tv} | {name} | nvfp4lab {nvfp4lab.__file__}")
    log(f"# rounds {args.rounds} x iters {args.iters}; cells: BF16 ms, today ms (vs BF16), others vs today "
        f"(median over rounds of per-replay ms)")
    for shape in shapes:
        m, k, n = shape
        label = f"{m}x{k}x{n}"
        log(f"\n## {label} (M x K x N, Linear {k}->{n}, {m} tok, bias, bf16)")
        torch.manual_seed(0)
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device=device, dtype=torch.bfloat16)
        base = torch.nn.Linear(k, n, device=device, dtype=torch.bfloat16)
        bf16_graph = None
        if device.type == "cuda":
            try:
                bf16_graph = capture(BL.step_fn(base, x, dy, list(base.parameters())), device)
            except Exception:  # noqa: BLE001
                log(f"  BF16 FAILED:\n{short_tb()}")
        rows = []
        for preset in presets:
            times = run_preset(preset, shape, variants, args, device, x, dy, bf16_graph)
            if device.type == "cuda":
                rows.append(table_row(label, preset, variants, times))
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if rows:
            log("\n| case | preset | BF16 | " + " | ".join(variants) + " |")
            log("|" + "---|" * (3 + len(variants)))
            for row in rows:
                log(row)
        del x, dy, base, bf16_graph
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
