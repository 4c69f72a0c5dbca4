"""Where the host time of eager calls goes on a GPU machine: cProfile of one public op or of an eager
Linear / GroupedLinear training step (te_default), top functions by own time. Diagnostic, not a
benchmark (benchmarks/host.py measures).

    python tools/host_profile.py linear 4096 2048 2048      # tokens, in, out
    python tools/host_profile.py moe 8192 7168 2048
    python tools/host_profile.py quantize                  # row+col RHT+SR on 128 x 256
    python tools/host_profile.py --sync linear 4096 2048 2048   # where a step waits for the GPU
    python tools/host_profile.py --torch linear 4096 2048 2048  # torch.profiler: eager and compiled step

``--torch`` prints torch.profiler tables (self CPU time and CUDA time per op / kernel, call counts) of
the eager step and of the ``torch.compile``d module's step.

``--ablate`` times the eager step (wall, GPU included) beside the same step with every warm Triton launch stubbed
out, then with the cuBLASLt calls stubbed too, its forward alone under ``no_grad`` and the BF16 step: what the launches
and cuBLAS calls cost on this host, and what remains (Python, allocations, autograd).

    python tools/host_profile.py --ablate linear 4096 2048 2048

``--sync`` runs one call under ``torch.cuda.set_sync_debug_mode("warn")`` and prints the stack of every
host synchronization instead of profiling.

``--cpu`` is a proxy that needs no GPU: the same calls on CPU tensors (Triton backend under the interpreter)
with every Triton launch stubbed out and the GPU's GEMM paths forced (expanded operands, the dgrad from W's
rowwise copy), at the given sizes (small ones keep the CPU twins of the cuBLAS products cheap). It prints the
host time per call and the Python function calls per call, then the profile: what the Python path costs
apart from launches, for trying host-path changes without the device (timings still come from host.py).

    python tools/host_profile.py --cpu linear 128 256 256
"""
from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

if "--cpu" in sys.argv:  # Triton reads it when the package's kernels are defined
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["NVFP4LAB_BACKEND"] = "triton"

import torch  # noqa: E402

import nvfp4lab  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from host import build, median, step_of, wall_ms  # noqa: E402  (the benchmark's own step: the same module, data and optimizer)


def _step(kind: str, tokens: int, k: int, n: int, device: str = "cuda"):
    module, x, dy, splits = build(kind, tokens, k, n, True, torch.device(device))
    if splits is not None and sum(splits) != tokens:  # the --cpu proxy's small token counts: even splits
        splits = [tokens // len(splits)] * (len(splits) - 1) + [tokens - tokens // len(splits) * (len(splits) - 1)]
    return step_of(module, x, dy, splits)


def _stub_launches() -> None:
    """The --cpu proxy: no Triton launch runs (outputs stay uninitialized), the GEMMs take the GPU's expanded paths."""
    import triton.runtime.interpreter as interpreter

    from nvfp4lab import ops
    from nvfp4lab.kernels import launch

    launch.Launch.__call__ = lambda self, *args: None
    interpreter.InterpretedFunction.run = lambda self, *args, **kwargs: None
    ops.gemm_expand_rule = lambda device, backend=None: (0, 0, 0)


def _torch_profile(kind: str, tokens: int, k: int, n: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    module, x, dy, splits = build(kind, tokens, k, n, True, torch.device("cuda"))
    for label, forward in (("eager", module), ("compile", torch.compile(module))):
        fn = step_of(module, x, dy, splits, forward)
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
        table = prof.key_averages()
        print(f"== {label} step, {kind} {tokens} x {k} -> {n}: 10 steps, by self CPU time")
        print(table.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70))
        print(f"== {label}: by CUDA time")
        print(table.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))


def _wall_ms(fn, device: torch.device, steps: int = 60, rounds: int = 5) -> float:
    """Median over rounds of the benchmark's wall time per step (``host.wall_ms``, the first round warming up more)."""
    return median([wall_ms(fn, device, steps, warmup=10 if i == 0 else 0) for i in range(rounds)])


def _ablate(kind: str, tokens: int, k: int, n: int, device: str) -> None:
    from nvfp4lab.kernels import launch
    from nvfp4lab.kernels.nvfp4_gemm_details import cublaslt

    dev = torch.device(device)
    module, x, dy, splits = build(kind, tokens, k, n, True, dev)
    if splits is not None and sum(splits) != tokens:  # the --cpu proxy's small token counts: even splits
        splits = [tokens // len(splits)] * (len(splits) - 1) + [tokens - tokens // len(splits) * (len(splits) - 1)]
    step = step_of(module, x, dy, splits)
    bf16 = step_of(*build(kind, tokens, k, n, False, dev))

    def forward():
        with torch.no_grad():
            module(x) if splits is None else module(x, splits)

    rows = [("BF16 step", _wall_ms(bf16, dev)), ("step", _wall_ms(step, dev)), ("forward, no_grad", _wall_ms(forward, dev))]
    call = launch.Launch.__call__
    launch.Launch.__call__ = lambda self, *args: None if self.handle is not None else call(self, *args)
    rows.append(("step, Triton launches stubbed", _wall_ms(step, dev)))
    runners = (cublaslt.Plan, cublaslt.Batch)
    saved = [r.__call__ for r in runners]
    for r in runners:
        r.__call__ = lambda self, *args, **kwargs: None
    rows.append(("step, launches and cuBLASLt stubbed", _wall_ms(step, dev)))
    for r, fn in zip(runners, saved):
        r.__call__ = fn
    launch.Launch.__call__ = call
    print(f"== {kind} {tokens} x {k} -> {n}, te_default, fwd + bwd + SGD (ms per step, median of 5 rounds)")
    for label, ms in rows:
        print(f"{label:40s} {ms:8.3f}")


def main(argv: list[str]) -> None:
    if "--ablate" in argv:  # with --cpu: the proxy's launches are stubbed in every row
        rest = [a for a in argv if a not in ("--ablate", "--cpu")]
        if "--cpu" in argv:
            _stub_launches()
        _ablate(rest[0], *(int(v) for v in rest[1:4]), "cpu" if "--cpu" in argv else "cuda")
        return
    check_sync = "--sync" in argv
    if "--torch" in argv:
        rest = [a for a in argv if a != "--torch"]
        _torch_profile(rest[0], *(int(v) for v in rest[1:4]))
        return
    cpu = "--cpu" in argv
    argv = [a for a in argv if a not in ("--sync", "--cpu")]
    kind = argv[0] if argv else "linear"
    device = "cpu" if cpu else "cuda"
    if cpu:
        _stub_launches()
    if kind == "quantize":
        x = torch.randn(128, 256, device=device, dtype=torch.bfloat16)

        def fn():
            nvfp4lab.quantize_nvfp4(x, columnwise=True, rht=True, stochastic_rounding=True)
        calls = 2000
    else:
        tokens, k, n = (int(v) for v in argv[1:4])
        fn, calls = _step(kind, tokens, k, n, device), 50
    for _ in range(5):
        fn()
    if cpu:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        print(f"== --cpu proxy, {' '.join(argv)}: {(time.perf_counter() - t0) / calls * 1e6:.1f} us per call")
    else:
        torch.cuda.synchronize()
    if check_sync:
        import traceback
        import warnings

        def show(message, category, filename, lineno, file=None, line=None):
            print(f"-- {message}")
            traceback.print_stack(limit=14)

        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        fn()
        torch.cuda.set_sync_debug_mode("default")
        print(f"== {' '.join(argv)}: one call checked for host synchronizations")
        return
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    if not cpu:
        torch.cuda.synchronize()
    stats = pstats.Stats(profile)
    print(f"== {' '.join(argv)}: {calls} calls, {stats.total_calls / calls:.0f} Python function calls per call")
    stats.sort_stats("tottime").print_stats(28)


if __name__ == "__main__":
    main(sys.argv[1:])
