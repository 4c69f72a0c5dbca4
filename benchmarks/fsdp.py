"""Benchmark and checks: FSDP2 on 2 GPUs with nvfp4lab modules, BF16 vs FP4 weight all-gather, checkpoints.

Model: a stack of Linear(8192 -> 8192) layers (8 of them; ``--quick``: 4 of 4096; ``--tiny``: 2 of 256),
no bias, each layer its own ``fully_shard`` unit plus the root; fp32 master weights,
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``; 8192 tokens per rank (``--quick``:
4096); one step = forward, backward, AdamW step. Configurations (same processes, one after the other):

  torch_bf16          torch.nn.Linear, BF16 all-gather, BF16 GEMMs
  te_default_bf16_ag  nvfp4lab.Linear (te_default recipe), BF16 all-gather, NVFP4 GEMMs
  te_default_fp4_ag   the same with nvfp4lab.fsdp.enable_fp4_all_gather: weights travel as NVFP4
  per_token_bf16_ag   nvfp4lab.Linear (per_token recipe), BF16 all-gather
  per_token_fp4_ag    the same with FP4 all-gather

Reported per configuration: step time (mean over the timed steps, slowest rank), all-gather bytes
per step per rank (sizes of FSDP's all-gather outputs, counted around the collective; every layer is
gathered in forward and again before backward), peak GPU memory of rank 0, ratios against torch_bf16.

Checks (one PASS/FAIL line each; exit status 1 if any fails), on each FP4 all-gather configuration's
trained model after its timing:

  gathered        every layer's FP4-gathered weight (all six fields of ``NVFP4GatheredWeight.quantized``)
                  equals quantizing the full weight (``full_tensor()`` cast to the param dtype) in one
                  process, on every rank
  ag_bytes        FP4 all-gather bytes = 9/32 of the BF16 all-gather bytes (16x16 weight blocks: only
                  the rowwise copy travels, 0.5 + 1/16 B per element against 2 B)
  dcp_load        DCP save of the sharded state dict; the recipes read back from the checkpoint
                  (``nvfp4lab.checkpoint.dcp_recipes``) are the model's; a fresh FSDP model built with
                  them (another init) loads it: its layers carry that recipe, the same weight shards and
                  give the same forward output
  dcp_refuse      loading the checkpoint into an FSDP model built with the other recipe raises ValueError
                  naming the layer and the fields that differ
  save_quantized  ``nvfp4lab.save_quantized`` of the full state dict gathered to rank 0 (loaded into a
                  plain model there) and of the checkpoint DCP-loaded into a plain model in this (parent)
                  process equal save_quantized of a plain model in one process holding the ranks' own
                  weight shards concatenated: same header (names, dtypes, shapes, offsets, metadata) and
                  the same data bytes

    python benchmarks/fsdp.py [--quick] [--out FILE]      # spawns its 2 processes itself (NCCL)
    python benchmarks/fsdp.py --device cpu --tiny          # smoke run of the script (gloo, CPU)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import nvfp4lab  # noqa: E402
from nvfp4lab import functional as F  # noqa: E402
from nvfp4lab.checkpoint import dcp_recipes  # noqa: E402
from nvfp4lab.dist_harness import AllGatherByteCounter, init_rank, spawn_ranks  # noqa: E402
from nvfp4lab.fsdp import NVFP4GatheredWeight, enable_fp4_all_gather  # noqa: E402

WORLD = 2
RECIPES = {"te_default": nvfp4lab.NVFP4Recipe.te_default(), "per_token": nvfp4lab.NVFP4Recipe.per_token()}
# name -> (recipe name or None for torch.nn.Linear, FP4 all-gather)
CONFIGS = {
    "torch_bf16": (None, False),
    "te_default_bf16_ag": ("te_default", False),
    "te_default_fp4_ag": ("te_default", True),
    "per_token_bf16_ag": ("per_token", False),
    "per_token_fp4_ag": ("per_token", True),
}
CHECKS = ("gathered", "ag_bytes", "dcp_load", "dcp_refuse", "save_quantized")  # in the module docstring's order
QFIELDS = ("rowwise_data", "rowwise_scale", "rowwise_amax", "columnwise_data", "columnwise_scale", "columnwise_amax")
PARAM_DTYPE = torch.bfloat16


def sizes(args):
    if args.tiny:
        return dict(layers=2, dim=256, tokens=64)
    if args.quick:
        return dict(layers=4, dim=4096, tokens=4096)
    return dict(layers=8, dim=8192, tokens=8192)


def other_recipe(recipe_name: str) -> str:
    return next(name for name in RECIPES if name != recipe_name)


def build(recipes, sz, device, backend, seed=0):
    """nn.Sequential of Linear(dim, dim) without bias: torch.nn.Linear when ``recipes`` is None, else
    nvfp4lab.Linear with recipes[i] for layer i."""
    torch.manual_seed(seed)
    layers = []
    for i in range(sz["layers"]):
        if recipes is None:
            layers.append(torch.nn.Linear(sz["dim"], sz["dim"], bias=False, device=device))
        else:
            layers.append(nvfp4lab.Linear(sz["dim"], sz["dim"], bias=False, device=device, recipe=recipes[i], backend=backend))
    return torch.nn.Sequential(*layers)


def build_fsdp(recipes, sz, device, backend, mesh, *, fp4, seed=0):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = build(recipes, sz, device, backend, seed)
    if fp4:
        enable_fp4_all_gather(model)
    policy = MixedPrecisionPolicy(param_dtype=PARAM_DTYPE, reduce_dtype=torch.float32)
    for layer in model:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()


# ------------------------------------------------------------------------------------- checks (ranks)
def check_gathered(model, recipe, x, backend) -> tuple:
    """Every layer's FP4-gathered weight against quantizing its full weight here, alone."""
    expected = []
    for layer in model:
        full = layer.weight.full_tensor().to(PARAM_DTYPE)  # what FSDP's BF16 all-gather would hand the layer
        expected.append(F.quantize_weight(full, recipe, columnwise=True, backend=backend))
        del full
    seen, bad = [], []

    def hook_for(i):
        def hook(module, args):
            w = module.weight
            if not isinstance(w, NVFP4GatheredWeight):
                bad.append(f"layer {i}: got {type(w).__name__}")
                return
            seen.append(i)
            q = w.quantized
            for field in QFIELDS:
                got, want = getattr(q, field), getattr(expected[i], field)
                if got is None or want is None or not torch.equal(got, want):
                    bad.append(f"layer {i} {field}")
        return hook

    handles = [layer.register_forward_pre_hook(hook_for(i)) for i, layer in enumerate(model)]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    if seen != list(range(len(model))):
        bad.append(f"layers checked {seen}")
    return not bad, f"{len(seen)} layers, all of {', '.join(QFIELDS)}" if not bad else "; ".join(bad[:6])


def check_dcp(model, recipe_name, ckpt, x, sz, device, backend, mesh) -> list:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    recipe = RECIPES[recipe_name]
    dcp.save(get_model_state_dict(model), checkpoint_id=ckpt)
    recorded = dcp_recipes(ckpt)
    problems = []
    if recorded != {str(i): recipe for i in range(sz["layers"])}:
        problems.append(f"recorded recipes {sorted(recorded)} differ from the model's")
    fresh = build_fsdp([recorded.get(str(i), recipe) for i in range(sz["layers"])], sz, device, backend, mesh, fp4=True, seed=1)
    state = get_model_state_dict(fresh)
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(fresh, state)
    for i, (a, b) in enumerate(zip(model, fresh)):
        if b.recipe != recipe:
            problems.append(f"layer {i} recipe {b.recipe}")
        if not torch.equal(a.weight.to_local(), b.weight.to_local()):
            problems.append(f"layer {i} weight shard differs")
    with torch.no_grad():
        if not torch.equal(model(x), fresh(x)):
            problems.append("forward outputs differ")
    del fresh, state
    load = (not problems, f"{sz['layers']} layers: recipe {recipe_name} recorded and restored, same shards and output"
            if not problems else "; ".join(problems[:6]))

    other = build_fsdp([RECIPES[other_recipe(recipe_name)]] * sz["layers"], sz, device, backend, mesh, fp4=True, seed=1)
    state = get_model_state_dict(other)
    try:
        dcp.load(state, checkpoint_id=ckpt)
        set_model_state_dict(other, state)
        refuse = (False, f"a {other_recipe(recipe_name)} model loaded the {recipe_name} checkpoint")
    except ValueError as exc:
        message = str(exc)
        ok = "layer '0'" in message and "the saved recipe differs" in message and "per_token_activations" in message
        refuse = (ok, message.split("; this layer has recipe")[0])
    except CheckpointException as exc:  # a BaseException: DCP refused before any recipe was compared
        refuse = (False, f"CheckpointException: {str(exc)[:300]}")
    del other, state
    return [("dcp_load", *load), ("dcp_refuse", *refuse)]


def save_gathered(model, name, recipe_name, sz, device, backend, rank, workdir) -> None:
    """Rank 0: save_quantized of the full state dict in a plain model; every rank: its own shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        plain = build([RECIPES[recipe_name]] * sz["layers"], sz, device, backend, seed=2)
        plain.load_state_dict(full)  # the recipe entries are checked here too
        nvfp4lab.save_quantized(plain, workdir / f"{name}_gathered.safetensors")
        del plain
    del full
    # torch.save writes the shards' high-precision values (plain tensors, not the FP4 all-gather wrapper)
    torch.save({f"{i}.weight": layer.weight.to_local().detach().cpu() for i, layer in enumerate(model)},
               workdir / f"{name}_shards_rank{rank}.pt")


# ------------------------------------------------------------------------------------------ the ranks
def worker(rank, world, port, args, results):
    device = init_rank(rank, world, port, args.device)
    cuda = device.type == "cuda"
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (world,))
        sz = sizes(args)
        warmup, iters = (1, 2) if args.tiny else ((2, 5) if args.quick else (3, 20))
        gen = torch.Generator(device="cpu").manual_seed(1 + rank)
        x = torch.randn(sz["tokens"], sz["dim"], generator=gen).to(device, PARAM_DTYPE)
        rows, checks = {}, []
        for name in args.configs:
            recipe_name, fp4 = CONFIGS[name]
            recipes = None if recipe_name is None else [RECIPES[recipe_name]] * sz["layers"]
            model = build_fsdp(recipes, sz, device, args.backend, mesh, fp4=fp4)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def step():
                loss = model(x).float().square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            for _ in range(warmup):
                step()
            with AllGatherByteCounter() as counter:
                step()
            sync(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            for _ in range(iters):
                step()
            if cuda:
                torch.cuda.synchronize()
            elapsed = torch.tensor([(time.perf_counter() - t0) * 1e3 / iters], device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step ends when the slowest rank's does
            rows[name] = dict(step_ms=elapsed.item(), all_gather_bytes=counter.bytes,
                              peak_gb=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)
            del opt
            if fp4:
                t0 = time.perf_counter()
                checks.append((name, "gathered", *check_gathered(model, RECIPES[recipe_name], x, args.backend)))
                ckpt = str(args.workdir / f"{name}_dcp")
                checks += [(name, *c) for c in check_dcp(model, recipe_name, ckpt, x, sz, device, args.backend, mesh)]
                save_gathered(model, name, recipe_name, sz, device, args.backend, rank, args.workdir)
                sync(device)
                rows[name]["check_s"] = time.perf_counter() - t0
            del model
            if cuda:
                torch.cuda.empty_cache()
        results[rank] = dict(rows=rows, checks=checks)
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------ the parent process
def safetensors_parts(path: Path) -> tuple:
    """(header as parsed JSON, data bytes) of a safetensors file. The header holds every tensor's name,
    dtype, shape and byte offsets and the metadata; its metadata map is written in a per-process hash
    order, so two processes' files of the same content differ as whole files but not in these parts."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def check_save_quantized(name, recipe_name, sz, device, backend, workdir) -> tuple:
    """save_quantized of the gathered model and of the DCP-loaded plain model vs the one-process one."""
    import torch.distributed.checkpoint as dcp

    shards = [torch.load(workdir / f"{name}_shards_rank{r}.pt") for r in range(WORLD)]
    reference = build([RECIPES[recipe_name]] * sz["layers"], sz, device, backend, seed=3)
    reference.load_state_dict({key: torch.cat([s[key] for s in shards]) for key in shards[0]})
    del shards
    nvfp4lab.save_quantized(reference, workdir / f"{name}_reference.safetensors")
    del reference
    ckpt = workdir / f"{name}_dcp"
    recorded = dcp_recipes(ckpt)
    loaded = build([recorded[str(i)] for i in range(sz["layers"])], sz, device, backend, seed=4)
    state = loaded.state_dict()
    dcp.load(state, checkpoint_id=str(ckpt), no_dist=True)
    loaded.load_state_dict(state)
    nvfp4lab.save_quantized(loaded, workdir / f"{name}_dcp_loaded.safetensors")
    del loaded, state
    want = safetensors_parts(workdir / f"{name}_reference.safetensors")
    differ = [kind for kind in ("gathered", "dcp_loaded") if safetensors_parts(workdir / f"{name}_{kind}.safetensors") != want]
    if differ:
        return False, f"differs from one-process save_quantized: {differ}"
    return True, (f"gathered (rank 0) and DCP-loaded files equal the one-process file: same header, "
                  f"{len(want[1])} data bytes identical")


def all_gather_bytes_check(name, rows) -> tuple:
    recipe_name, _ = CONFIGS[name]
    base_name = f"{recipe_name}_bf16_ag" if f"{recipe_name}_bf16_ag" in rows else "torch_bf16"
    if base_name not in rows:
        return None
    fp4, bf16 = rows[name]["all_gather_bytes"], rows[base_name]["all_gather_bytes"]
    return fp4 * 32 == bf16 * 9 and fp4 > 0, f"{fp4} B vs {bf16} B ({base_name}): {fp4 / bf16:.5f} (want 9/32 = 0.28125)"


def _cells(rows):
    """(name, step ms, vs torch, all-gather MiB, vs torch, peak GiB) of every configuration that ran."""
    base = rows.get("torch_bf16")
    for name in CONFIGS:
        r = rows.get(name)
        if r is None:
            continue
        t_ratio = f"{r['step_ms'] / base['step_ms']:.2f}x" if base else "-"
        b_ratio = f"{r['all_gather_bytes'] / base['all_gather_bytes']:.3f}x" if base else "-"
        peak = "-" if r["peak_gb"] is None else f"{r['peak_gb']:.2f}"
        yield name, f"{r['step_ms']:.2f}", t_ratio, f"{r['all_gather_bytes'] / 2**20:.1f}", b_ratio, peak


def table(rows, sz) -> str:
    head = f"{'config':<20} {'step ms':>9} {'vs torch':>9} {'AG MiB/step':>12} {'vs torch':>9} {'peak GiB':>9}"
    lines = [f"FSDP2, 2 ranks: {sz['layers']} x Linear({sz['dim']}, {sz['dim']}), {sz['tokens']} tokens/rank, "
             "bf16 params in compute", head, "-" * len(head)]
    for name, step, t_ratio, mib, b_ratio, peak in _cells(rows):
        lines.append(f"{name:<20} {step:>9} {t_ratio:>9} {mib:>12} {b_ratio:>9} {peak:>9}")
    return "\n".join(lines)


def markdown(rows, sz, env) -> str:
    """The table as RESULTS.md keeps it."""
    lines = [f"FSDP2 on 2 x {env['device']} (`benchmarks/fsdp.py`, torch {env['torch']}), {sz['layers']} x Linear({sz['dim']}, "
             f"{sz['dim']}), {sz['tokens']} tokens per rank, {'gloo' if env['nccl'] is None else 'NCCL ' + env['nccl']}", "",
             "| config | step ms | vs torch | all-gather MiB / step | vs torch | peak GiB |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in _cells(rows)]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 layers of 4096, 4096 tokens, fewer steps")
    parser.add_argument("--out", type=Path, help="write the results as JSON to this file")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="2 layers of 256 (to smoke-test the script on CPU)")
    parser.add_argument("--backend", default=None, choices=[None, "ref", "triton"], help="nvfp4lab.ops backend (default: auto)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list from {list(CONFIGS)}")
    parser.add_argument("--markdown", action="store_true", help="also print the table as RESULTS.md keeps it")
    parser.add_argument("--workdir", type=Path, help="folder for the checkpoints and files of the checks (default: a temporary one, removed)")
    args = parser.parse_args(argv)
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {list(CONFIGS)}")
    if args.device == "cuda" and torch.cuda.device_count() < WORLD:
        parser.error(f"needs {WORLD} CUDA devices, found {torch.cuda.device_count()} (use --device cpu --tiny for a smoke run)")
    # NVLink multicast off (NCCL, PyTorch symmetric memory, NVSHMEM), before NCCL init; the ranks inherit it
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nvfp4lab-fsdp-") as tmp:
        args.workdir = args.workdir or Path(tmp)
        args.workdir.mkdir(parents=True, exist_ok=True)
        per_rank = spawn_ranks(worker, args, world=WORLD)
        rows, sz = per_rank[0]["rows"], sizes(args)
        # a check passes when it passes on every rank; the detail shown is rank 0's (or the first failing rank's)
        checks = {}
        for rank in range(WORLD):
            for name, check, ok, detail in per_rank[rank]["checks"]:
                prev = checks.get((name, check))
                if prev is None or (prev[0] and not ok):
                    checks[(name, check)] = (ok, detail if ok or rank == 0 else f"rank {rank}: {detail}")
        device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
        for name in args.configs:
            if CONFIGS[name][1]:
                bytes_check = all_gather_bytes_check(name, rows)
                if bytes_check is not None:
                    checks[(name, "ag_bytes")] = bytes_check
                checks[(name, "save_quantized")] = check_save_quantized(name, CONFIGS[name][0], sz, device, args.backend, args.workdir)
    wall_s = time.perf_counter() - t_start
    env = dict(torch=torch.__version__, python=platform.python_version(),
               device=torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu",
               nccl=str(torch.cuda.nccl.version()) if args.device == "cuda" else None)
    order = sorted(checks, key=lambda key: (list(CONFIGS).index(key[0]), CHECKS.index(key[1])))
    check_list = [dict(config=name, check=check, ok=checks[name, check][0], detail=checks[name, check][1]) for name, check in order]
    if args.out:
        args.out.write_text(json.dumps(dict(env=env, sizes=sz, results=rows, checks=check_list, wall_s=wall_s), indent=2))
    print(f"env: {env}")
    print(table(rows, sz))
    if args.markdown:
        print(markdown(rows, sz, env))
    for c in check_list:
        print(f"{'PASS' if c['ok'] else 'FAIL'} {c['config']} {c['check']}: {c['detail']}")
    failed = sum(not c["ok"] for c in check_list)
    print(f"{len(check_list) - failed} checks passed, {failed} failed; wall {wall_s:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
