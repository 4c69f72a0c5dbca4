"""Benchmark: FSDP2 training step on 2 GPUs, BF16 vs FP4 weight all-gather.

Model: a stack of Linear(8192 -> 8192) layers (8 of them; ``--quick``: 4 of 4096), no bias, each layer
its own ``fully_shard`` unit plus the root; fp32 master weights, ``MixedPrecisionPolicy(param_dtype=
bf16, reduce_dtype=fp32)``; 8192 tokens per rank (``--quick``: 4096); one step = forward, backward,
AdamW step. Configurations (same processes, one after the other):

  torch_bf16        torch.nn.Linear, BF16 all-gather, BF16 GEMMs
  nvfp4lab_bf16_ag  nvfp4lab.Linear (te_default recipe), BF16 all-gather, NVFP4 GEMMs
  nvfp4lab_fp4_ag   the same with nvfp4lab.fsdp.enable_fp4_all_gather: weights travel as NVFP4

Reported per configuration: step time (mean over the timed steps, slowest rank), all-gather bytes
per step per rank (sizes of FSDP's all-gather outputs, counted around the collective; every layer is
gathered in forward and again before backward) and peak GPU memory of rank 0.

    python benchmarks/fsdp.py [--quick] [--out FILE]      # spawns its 2 processes itself
    python benchmarks/fsdp.py --device cpu --tiny          # smoke run of the script (gloo, CPU)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from nvfp4lab.dist_harness import AllGatherByteCounter, init_rank, spawn_ranks  # noqa: E402

WORLD = 2
CONFIGS = ("torch_bf16", "nvfp4lab_bf16_ag", "nvfp4lab_fp4_ag")


def sizes(args):
    if args.tiny:
        return dict(layers=2, dim=256, tokens=64)
    if args.quick:
        return dict(layers=4, dim=4096, tokens=4096)
    return dict(layers=8, dim=8192, tokens=8192)


def build(config, sz, device, backend):
    import nvfp4lab
    from nvfp4lab.fsdp import enable_fp4_all_gather

    torch.manual_seed(0)
    layers = []
    for _ in range(sz["layers"]):
        if config == "torch_bf16":
            layers.append(torch.nn.Linear(sz["dim"], sz["dim"], bias=False, device=device))
        else:
            layers.append(nvfp4lab.Linear(sz["dim"], sz["dim"], bias=False, device=device,
                                          recipe=nvfp4lab.NVFP4Recipe.te_default(), backend=backend))
    model = torch.nn.Sequential(*layers)
    if config == "nvfp4lab_fp4_ag":
        enable_fp4_all_gather(model)
    return model


def worker(rank, world, port, args, results):
    cuda = args.device == "cuda"
    device = init_rank(rank, world, port, args.device)
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (world,))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        sz = sizes(args)
        warmup, iters = (1, 2) if args.tiny else ((2, 5) if args.quick else (3, 20))
        gen = torch.Generator(device="cpu").manual_seed(1 + rank)
        x = torch.randn(sz["tokens"], sz["dim"], generator=gen).to(device, torch.bfloat16)
        out = {}
        for config in args.configs:
            model = build(config, sz, device, args.backend)
            for layer in model:
                fully_shard(layer, mesh=mesh, mp_policy=policy)
            fully_shard(model, mesh=mesh, mp_policy=policy)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def step():
                loss = model(x).float().square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            def sync():
                if cuda:
                    torch.cuda.synchronize()
                dist.barrier()

            for _ in range(warmup):
                step()
            with AllGatherByteCounter() as counter:
                step()
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            for _ in range(iters):
                step()
            if cuda:
                torch.cuda.synchronize()
            elapsed = torch.tensor([(time.perf_counter() - t0) * 1e3 / iters], device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends when the slowest rank's does
            out[config] = dict(step_ms=elapsed.item(), all_gather_bytes=counter.bytes,
                               peak_gb=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)
            del model, opt
            if cuda:
                torch.cuda.empty_cache()
        if rank == 0:
            results.update(out)
    finally:
        dist.destroy_process_group()


def table(rows, sz) -> str:
    base = rows.get("torch_bf16")
    head = f"{'config':<18} {'step ms':>9} {'vs torch':>9} {'AG MiB/step':>12} {'vs torch':>9} {'peak GiB':>9}"
    lines = [f"FSDP2, 2 ranks: {sz['layers']} x Linear({sz['dim']}, {sz['dim']}), {sz['tokens']} tokens/rank, "
             "bf16 params in compute", head, "-" * len(head)]
    for name in CONFIGS:
        r = rows.get(name)
        if r is None:
            continue
        t_ratio = f"{r['step_ms'] / base['step_ms']:.2f}x" if base else "-"
        b_ratio = f"{r['all_gather_bytes'] / base['all_gather_bytes']:.3f}x" if base else "-"
        peak = "-" if r["peak_gb"] is None else f"{r['peak_gb']:.2f}"
        lines.append(f"{name:<18} {r['step_ms']:>9.2f} {t_ratio:>9} {r['all_gather_bytes'] / 2**20:>12.1f} {b_ratio:>9} {peak:>9}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 layers of 4096, 4096 tokens, fewer steps")
    parser.add_argument("--out", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="2 layers of 256 (to smoke-test the script on CPU)")
    parser.add_argument("--backend", default=None, choices=[None, "ref", "triton"], help="nvfp4lab.ops backend (default: auto)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list from {list(CONFIGS)}")
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {list(CONFIGS)}")
    if args.device == "cuda" and torch.cuda.device_count() < WORLD:
        parser.error(f"needs {WORLD} CUDA devices, found {torch.cuda.device_count()} (use --device cpu --tiny for a smoke run)")
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    rows = spawn_ranks(worker, args, world=WORLD)
    sz = sizes(args)
    env = dict(torch=torch.__version__, python=platform.python_version(),
               device=torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu")
    if args.out:
        args.out.write_text(json.dumps(dict(env=env, sizes=sz, results=rows), indent=2))
    print(f"env: {env}")
    print(table(rows, sz))
    return 0


if __name__ == "__main__":
    sys.exit(main())
