"""Host time of one eager MoE GroupedLinear step (te_default, 8 x (7168 -> 2048), 8192 tokens) on a GPU: the
time spent in the main calls per step, the profiler's op table, and the Python cost of a Triton launch, a custom
op, torch.mm and small quantize / dequantize calls. Diagnostic, not a benchmark: timings of host work only.

    python tools/moe_host_profile.py
"""
import time, collections, functools
import torch, triton, triton.language as tl
import nvfp4lab as nl
from nvfp4lab import GroupedLinear, NVFP4Recipe, ops
import importlib; FL = importlib.import_module("nvfp4lab.functional.linear")

dev = torch.device("cuda")
splits = [1152, 896, 1088, 960, 1216, 832, 1024, 1024]
x = torch.randn(sum(splits), 7168, device=dev, dtype=torch.bfloat16, requires_grad=True)
dy = torch.randn(sum(splits), 2048, device=dev, dtype=torch.bfloat16)
mod = GroupedLinear(8, 7168, 2048, bias=False, device=dev, dtype=torch.bfloat16, recipe=NVFP4Recipe.te_default())
acc = collections.defaultdict(float); cnt = collections.Counter()
def wrap(owner, name, label):
    fn = getattr(owner, name)
    @functools.wraps(fn)
    def w(*a, **k):
        t = time.perf_counter(); r = fn(*a, **k); acc[label] += time.perf_counter() - t; cnt[label] += 1; return r
    setattr(owner, name, w)
wrap(FL, "quantize_weight", "quantize_weight (8/step)")
wrap(FL, "stack_grouped_weights", "stack_grouped_weights")
wrap(FL, "_grouped_quantize", "grouped quantize (x, dy)")
wrap(ops, "nvfp4_grouped_gemm", "grouped gemm (fprop, dgrad)")
wrap(ops, "nvfp4_gemm", "nvfp4_gemm (wgrad x8)")
wrap(FL, "_grouped_forward", "FWD total")
wrap(FL, "_grouped_backward", "BWD total")
def step():
    for p in mod.parameters():
        p.grad = None
    x.grad = None
    mod.clear_weight_cache()
    mod(x, splits).backward(dy)
for _ in range(3): step()
torch.cuda.synchronize(); acc.clear(); cnt.clear()
N = 10
t0 = time.perf_counter()
for _ in range(N): step()
t1 = time.perf_counter(); torch.cuda.synchronize()
print(f"eager step host {1e3*(t1-t0)/N:.2f} ms")
for k in acc: print(f"  {k:32s} {1e3*acc[k]/N:7.2f} ms/step  calls/step {cnt[k]/N:.0f}")
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    step(); torch.cuda.synchronize()
ev = prof.key_averages()
kern = [e for e in ev if e.device_type.name == "CUDA"]
print("GPU kernels per step:", sum(e.count for e in kern))
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))

# launch micro-costs
@triton.jit
def _k(p, n, A: tl.constexpr):
    pass
buf = torch.zeros(16, device=dev)
for _ in range(10): _k[(1,)](buf, 16, A=1)
torch.cuda.synchronize(); t=time.perf_counter()
for _ in range(1000): _k[(1,)](buf, 16, A=1)
print(f"triton launch, 2 args: {(time.perf_counter()-t)*1e3:.1f} us")
@triton.jit
def _k30(p0,p1,p2,p3,p4,p5,p6,p7,i0,i1,i2,i3,i4,i5,i6,i7,i8,i9,f0, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, D: tl.constexpr, E: tl.constexpr):
    pass
args = [buf]*8 + [16]*10 + [0.5]
for _ in range(10): _k30[(1,)](*args, A=1, B=2, C=3, D=True, E=4)
torch.cuda.synchronize(); t=time.perf_counter()
for _ in range(1000): _k30[(1,)](*args, A=1, B=2, C=3, D=True, E=4)
print(f"triton launch, 19 args + 5 constexpr: {(time.perf_counter()-t)*1e3:.1f} us")
t=time.perf_counter()
for _ in range(1000): torch.empty(100, device=dev)
print(f"torch.empty: {(time.perf_counter()-t)*1e3:.1f} us")
a16 = torch.randn(64, 64, device=dev, dtype=torch.float16)
t=time.perf_counter()
for _ in range(1000): torch.mm(a16, a16)
print(f"torch.mm small: {(time.perf_counter()-t)*1e3:.1f} us")
xs = torch.randn(128, 128, device=dev, dtype=torch.bfloat16)
q = nl.quantize_nvfp4(xs)
for _ in range(10): nl.dequantize_nvfp4(q, dtype=torch.bfloat16)
torch.cuda.synchronize(); t=time.perf_counter()
for _ in range(1000): nl.dequantize_nvfp4(q, dtype=torch.bfloat16)
print(f"nl.dequantize_nvfp4 128x128: {(time.perf_counter()-t)*1e3:.1f} us")
for _ in range(10): nl.quantize_nvfp4(xs)
torch.cuda.synchronize(); t=time.perf_counter()
for _ in range(1000): nl.quantize_nvfp4(xs)
print(f"nl.quantize_nvfp4 128x128: {(time.perf_counter()-t)*1e3:.1f} us")
