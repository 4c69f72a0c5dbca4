"""Cast-only times (amax given) of each training role, rowwise only / columnwise only / both, 8192^2 bf16 (GPU).

For the split rule of ``kernels.nvfp4_quantize_details.opt_flags.split_cast``: prints, per preset and role,
the row-only, column-only and row+col cast of one run side by side (CUDA-graph replay, triton.testing.do_bench
median); row+col is the library's own launch plan (two launches where the rule splits). RHT columnwise casts
include the RHT amax pass (its amax cannot be given from outside). Not a CI test.

    python tools/cast_parts.py
"""
import torch, triton
import nvfp4lab as nl
from nvfp4lab import NVFP4Recipe
M = K = 8192
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
t_amax = x.abs().amax().float().reshape(1)
r_amax = x.abs().amax(1).float(); c_amax = x.abs().amax(0).float()
def bench(fn):
    g = torch.cuda.CUDAGraph()
    fn(); torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(10): fn()
    return triton.testing.do_bench(g.replay, warmup=50, rep=300) * 100.0  # us per call
rows = []
for pname, recipe in (("te_default", NVFP4Recipe.te_default()), ("per_token", NVFP4Recipe.per_token())):
    for role in ("input", "weight", "grad"):
        res = {}
        for copies, (rw, cw) in (("row", (True, False)), ("col", (False, True)), ("both", (True, True))):
            cfg = recipe.tensor_config(role, rowwise=rw, columnwise=cw)
            amax = (r_amax if cfg.per_token else t_amax) if rw else None
            camax = (c_amax if cfg.per_token else t_amax) if cw else None
            if cw and cfg.rht:
                camax = None  # RHT amax differs: let the op compute it (includes the amax pass)
            try:
                res[copies] = bench(lambda: nl.quantize_nvfp4(x, config=cfg, amax=amax, columnwise_amax=camax))
            except Exception as e:
                res[copies] = float("nan"); print(pname, role, copies, "error", type(e).__name__, e)
        print(f"{pname:10s} {role:6s} block={cfg.block} rht={cfg.rht} sr={cfg.stochastic_rounding} pt={cfg.per_token}: "
              f"row {res['row']:7.1f} us  col {res['col']:7.1f} us  both {res['both']:7.1f} us  row+col as two launches {res['row']+res['col']:7.1f}", flush=True)
