"""nvfp4lab modules under FSDP2 (``fully_shard``) and DDP, 2 processes (gloo on CPU, NCCL on 2 GPUs).

One spawn per device runs every scenario (module-scoped fixture); the tests check its results against
single-process runs made here. The reference for data-parallel training is the same step run in one
process: each rank's batch goes through the model on its own (its own activation/gradient amax, as
on that rank), the per-rank gradients are averaged ((g0 + g1) / 2) and AdamW steps. Tolerances:

* DDP and FSDP2 (BF16 all-gather) vs that reference: bitwise. With 2 ranks each reduction is one
  addition (commutative) and a division by 2 (exact), so the reduction order cannot change a bit.
* FP4 all-gather vs BF16 all-gather training: bitwise (the gathered NVFP4 weight is the
  quantization of the same full weight, so every GEMM sees the same operands).
* the FP4-gathered weight vs quantizing the full weight in one process: bitwise.

The recipe is TE's default without stochastic rounding (16x16 weights, RHT on the wgrad operands,
swizzled scales), so runs are deterministic. Sizes are multiples of 32 (16 rows per shard).

Checkpoints (what ``benchmarks/fsdp.py`` checks on 2 GPUs), on a Linear stack with FP4 all-gather under
BF16 mixed precision, for te_default and per_token: the gathered weight against quantizing the full
weight here; DCP save, the recipes read back (``nvfp4lab.checkpoint.dcp_recipes``) and load into a
fresh FSDP model built with them; refusal of a model with another recipe (one whose extra-state JSON
is as long, one whose is not); ``save_quantized`` of the full state dict gathered to rank 0 and of
the checkpoint DCP-loaded into a plain model here, against ``save_quantized`` of the ranks' shards
concatenated in one process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

import nvfp4lab
from nvfp4lab import GroupedLinear, Linear, MXFP8Recipe, NVFP4Recipe
from nvfp4lab import functional as F
from nvfp4lab.checkpoint import dcp_recipes
from nvfp4lab.dist_harness import AllGatherByteCounter, init_rank, spawn_ranks
from nvfp4lab.fsdp import NVFP4ShardedWeight, enable_fp4_all_gather

WORLD = 2
TOKENS = 32  # per rank and step
STEPS = 3
LR = 1e-2
RECIPE = NVFP4Recipe.te_default(stochastic_rounding=False)
QFIELDS = ("rowwise_data", "rowwise_scale", "rowwise_amax", "columnwise_data", "columnwise_scale", "columnwise_amax")
# weight configs whose FP4 all-gather is checked against one-process quantization: 16x16 blocks
# (columnwise copy rebuilt after the gather), 1x16 blocks and 4over6 weights (both copies travel),
# and every scale layout
GATHER_RECIPES = {
    "te_default": RECIPE,
    "weight_1x16": RECIPE.replace(weight_2d=False),
    "4over6_weights": NVFP4Recipe.four_over_six("weights", stochastic_rounding=False),
    "compact": RECIPE.replace(scale_layout="compact"),
    "padded_dequantized": RECIPE.replace(scale_layout="padded", backward="dequantized"),
    "per_token": NVFP4Recipe.per_token(stochastic_rounding=False),
}
# the checkpoint scenario's recipes, and per recipe the ones a model built to refuse its checkpoint has:
# the other preset (extra-state JSON as long) and the same one with compact scales (JSON one byte shorter)
STACK_RECIPES = {"te_default": RECIPE, "per_token": GATHER_RECIPES["per_token"]}
REFUSING_RECIPES = {name: [STACK_RECIPES[other] for other in STACK_RECIPES if other != name] + [recipe.replace(scale_layout="compact")]
                    for name, recipe in STACK_RECIPES.items()}


class MLP(nn.Module):
    """Linear -> relu -> GroupedLinear (2 experts, tokens split in halves) -> relu -> Linear."""

    def __init__(self, recipe=RECIPE, backend=None, device=None):
        super().__init__()
        kw = dict(recipe=recipe, backend=backend, device=device)
        self.fc1 = Linear(64, 128, **kw)
        self.experts = GroupedLinear(2, 128, 64, **kw)
        self.fc2 = Linear(64, 64, **kw)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        n = h.shape[0]
        h = self.experts(h, [n // 2, n - n // 2])
        return self.fc2(torch.relu(h))


def _stack(recipe, device=None):
    """Linear(64 -> 128) -> Linear(128 -> 64), with bias; ``recipe``: one for both layers or one per layer."""
    recipes = recipe if isinstance(recipe, (list, tuple)) else [recipe, recipe]
    return nn.Sequential(Linear(64, 128, recipe=recipes[0], device=device), Linear(128, 64, recipe=recipes[1], device=device))


def _loss(model, x, y):
    return (model(x).float() - y).square().mean()


def _cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj


def _qfields(q) -> dict:
    return {f: getattr(q, f).detach().cpu().clone() for f in QFIELDS if getattr(q, f) is not None}


# ----------------------------------------------------------------------------- the worker side
def _rank_batch(data, step, rank, device):
    x, y = data[step]
    rows = slice(rank * TOKENS, (rank + 1) * TOKENS)
    return x[rows].to(device), y[rows].to(device)


def _train(model, data, rank, device, *, steps=STEPS, micro=1, no_sync=None, on_step=None):
    """AdamW (for-loop implementation, as in the reference) for ``steps`` steps of ``micro``
    micro-batches each; returns this rank's micro-batch losses."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
    losses = []
    for step in range(steps):
        if on_step is not None:
            on_step(step)
        x, y = _rank_batch(data, step, rank, device)
        for i, (xm, ym) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
            sync = no_sync() if (no_sync is not None and i < micro - 1) else contextlib.nullcontext()
            with sync:
                loss = _loss(model, xm, ym)
                loss.backward()
            losses.append(loss.detach().cpu())
        opt.step()
        opt.zero_grad()
    return losses


def _fsdp_model(init, mesh, device, *, fp4, recipe=RECIPE, mp_policy=None):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = MLP(recipe=recipe, device=device)
    model.load_state_dict(init)
    wrapped = enable_fp4_all_gather(model) if fp4 else []
    kw = dict(mesh=mesh, mp_policy=mp_policy or MixedPrecisionPolicy())
    for layer in (model.fc1, model.experts, model.fc2):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model, wrapped


def _capture_gathered(model, store, key_prefix):
    """Forward pre-hooks that clone the weight each layer receives (inside forward, where FSDP's
    gathered buffers are valid)."""
    from nvfp4lab.fsdp import NVFP4GatheredWeight

    def hook_for(name, weight_name):
        def hook(module, args):
            w = getattr(module, weight_name)
            entry = {"type": type(w).__name__}
            if isinstance(w, NVFP4GatheredWeight):
                entry.update(_qfields(w.quantized))
            store.append((f"{key_prefix}{name}", entry))
        return hook

    return [model.fc1.register_forward_pre_hook(hook_for("fc1", "weight")),
            model.experts.register_forward_pre_hook(hook_for("experts.weight1", "weight1"))]


def _worker(rank, world, port, device_type, spec, results):
    device = init_rank(rank, world, port, device_type)
    try:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy
        from torch.nn.parallel import DistributedDataParallel as DDP

        mesh = init_device_mesh(device_type, (world,))
        init, data = spec["init"], spec["data"]
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        out = {}

        # DDP: 2 micro-batches per step, the first under no_sync (the weight cache serves the second)
        model = MLP(device=device)
        model.load_state_dict(init)
        ddp = DDP(model, device_ids=[rank] if device_type == "cuda" else None)
        out["ddp_losses"] = _train(ddp, data, rank, device, micro=2, no_sync=ddp.no_sync)
        out["ddp_params"] = _cpu(model.state_dict())

        # FSDP2, BF16 (param dtype) all-gather: the modules quantize the gathered weight every forward
        model, _ = _fsdp_model(init, mesh, device, fp4=False)
        with AllGatherByteCounter() as bf16_bytes:
            out["fsdp_losses"] = _train(model, data, rank, device)
        out["fsdp_bytes"] = bf16_bytes.bytes
        out["fsdp_params"] = _cpu(get_model_state_dict(model, options=full))

        # FSDP2, FP4 all-gather; the full weights before each step and the gathered ones inside it
        model, out["fp4_wrapped"] = _fsdp_model(init, mesh, device, fp4=True)
        captured, full_weights = [], []

        def record_full_weights(step):
            full_weights.append({"fc1": _cpu(model.fc1.weight.full_tensor()),
                                 "experts.weight1": _cpu(model.experts.weight1.full_tensor())})

        hooks = _capture_gathered(model, captured, "")
        with AllGatherByteCounter() as fp4_bytes:
            out["fp4_losses"] = _train(model, data, rank, device, on_step=record_full_weights)
        for h in hooks:
            h.remove()
        out["fp4_bytes"] = fp4_bytes.bytes
        out["fp4_captured"], out["fp4_full_weights"] = captured, full_weights
        out["fp4_local_type"] = type(model.fc1.weight.to_local()).__name__
        out["fp4_params"] = _cpu(get_model_state_dict(model, options=full))

        # state dicts of the FP4 model: DCP save/load and full-state-dict load into fresh models
        x0, _ = _rank_batch(data, 0, rank, device)
        with torch.no_grad():
            out["trained_out"] = _cpu(model(x0))
        dcp.save(get_model_state_dict(model), checkpoint_id=spec["ckpt"])
        fresh, _ = _fsdp_model(spec["other_init"], mesh, device, fp4=True)
        sharded = get_model_state_dict(fresh)
        dcp.load(sharded, checkpoint_id=spec["ckpt"])
        set_model_state_dict(fresh, sharded)
        out["dcp_params"] = _cpu(get_model_state_dict(fresh, options=full))
        full_sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        fresh, _ = _fsdp_model(spec["other_init"], mesh, device, fp4=True)
        set_model_state_dict(fresh, full_sd, options=StateDictOptions(full_state_dict=True))
        with torch.no_grad():
            out["loaded_out"] = _cpu(fresh(x0))

        # mixed precision (bf16 params in forward): FP4 vs BF16 all-gather
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for name, fp4 in (("mp_bf16", False), ("mp_fp4", True)):
            model, _ = _fsdp_model(init, mesh, device, fp4=fp4, mp_policy=policy)
            out[f"{name}_losses"] = _train(model, data, rank, device, steps=2)
            out[f"{name}_params"] = _cpu(get_model_state_dict(model, options=full))

        # gathered weight per weight config (one forward each); rank 1's shard holds the amax
        from torch.distributed.fsdp import fully_shard

        out["gathered"] = {}
        for name, recipe in GATHER_RECIPES.items():
            layer = Linear(64, 64, recipe=recipe, device=device)
            with torch.no_grad():
                layer.weight.copy_(spec["gather_weight"])
            enable_fp4_all_gather(layer)
            fully_shard(layer, mesh=mesh)
            got = []
            layer.register_forward_pre_hook(lambda m, a: got.append(_qfields(m.weight.quantized)))
            layer(torch.randn(32, 64, device=device, requires_grad=True))
            out["gathered"][name] = got[0]

        # backward="high_precision": dgrad reads the dequantized gathered weight
        layer = Linear(64, 64, recipe=RECIPE.replace(backward="high_precision"), device=device)
        with torch.no_grad():
            layer.weight.copy_(spec["gather_weight"])
        enable_fp4_all_gather(layer)
        fully_shard(layer, mesh=mesh)
        x = spec["hp_x"][rank].to(device).requires_grad_(True)
        layer(x).backward(spec["hp_dy"][rank].to(device))
        out["hp_dx"] = _cpu(x.grad)

        # errors: a shard that is not whole 16-row blocks (48 rows over 2 ranks); wrapping too late
        layer = Linear(64, 48, recipe=RECIPE, device=device)
        enable_fp4_all_gather(layer, shard_group_size=1)  # 48 = 3 blocks of 16 on one rank: accepted
        fully_shard(layer, mesh=mesh)
        try:
            layer(torch.randn(16, 64, device=device))
            out["bad_rows"] = None
        except ValueError as err:
            out["bad_rows"] = str(err)
        try:
            enable_fp4_all_gather(_fsdp_model(init, mesh, device, fp4=False)[0])
            out["too_late"] = None
        except ValueError as err:
            out["too_late"] = str(err)

        out["stack"] = {name: _stack_scenario(name, spec, mesh, rank, device) for name in STACK_RECIPES}
        results[rank] = out
    finally:
        dist.destroy_process_group()


def _stack_scenario(name, spec, mesh, rank, device):
    """FP4 all-gather Linear stack under BF16 mixed precision: train, capture the gathered weights,
    DCP save / recipes / load / refusals, save_quantized of the full state dict on rank 0."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    ckpt = f"{spec['ckpt']}-stack-{name}"

    def fsdp_stack(recipe, init):
        model = _stack(recipe, device)
        model.load_state_dict(init)
        enable_fp4_all_gather(model)
        for layer in model:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model

    model = fsdp_stack(STACK_RECIPES[name], spec["stack_init"])
    _train(model, spec["data"], rank, device, steps=2)
    out = {"full": [_cpu(layer.weight.full_tensor()) for layer in model], "gathered": []}
    hooks = [layer.register_forward_pre_hook(lambda m, a: out["gathered"].append(_qfields(m.weight.quantized))) for layer in model]
    with torch.no_grad():
        model(_rank_batch(spec["data"], 0, rank, device)[0])
    for h in hooks:
        h.remove()

    dcp.save(get_model_state_dict(model), checkpoint_id=ckpt)
    out["recorded"] = dcp_recipes(ckpt)
    fresh = fsdp_stack([out["recorded"].get(str(i)) for i in range(2)], spec["other_stack_init"])
    state = get_model_state_dict(fresh)
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(fresh, state)
    out["loaded_recipes"] = [layer.recipe for layer in fresh]
    out["loaded_params"] = _cpu(get_model_state_dict(fresh, options=full))
    out["trained_params"] = _cpu(get_model_state_dict(model, options=full))
    out["refusals"] = []
    for recipe in REFUSING_RECIPES[name]:
        other = fsdp_stack(recipe, spec["other_stack_init"])
        state = get_model_state_dict(other)
        try:
            dcp.load(state, checkpoint_id=ckpt)
            set_model_state_dict(other, state)
            out["refusals"].append(None)
        except ValueError as err:
            out["refusals"].append(str(err))
        except CheckpointException as err:  # a BaseException: DCP refused before the recipe check
            out["refusals"].append(f"CheckpointException: {err}")

    full_state = get_model_state_dict(model, options=full)  # on rank 0 only (cpu_offload)
    if rank == 0:
        plain = _stack(STACK_RECIPES[name], device)
        plain.load_state_dict(full_state)
        nvfp4lab.save_quantized(plain, f"{ckpt}-gathered.safetensors")
    out["shards"] = {f"{i}.{n}": _cpu(p.to_local()) for i, layer in enumerate(model) for n, p in layer.named_parameters()}
    return out


# ------------------------------------------------------------------------------ the parent side
def _reference_training(init, data, device, *, steps=STEPS, micro=1):
    """One process: each rank's micro-batches on their own, per-rank gradients averaged, AdamW."""
    model = MLP(device=device)
    model.load_state_dict(init)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=LR, foreach=False)
    losses = {r: [] for r in range(WORLD)}
    for step in range(steps):
        per_rank = []
        for rank in range(WORLD):
            opt.zero_grad(set_to_none=True)
            x, y = _rank_batch(data, step, rank, device)
            for xm, ym in zip(x.chunk(micro), y.chunk(micro)):
                loss = _loss(model, xm, ym)
                loss.backward()
                losses[rank].append(loss.detach().cpu())
            per_rank.append([p.grad.clone() for p in params])
        for p, *grads in zip(params, *per_rank):
            p.grad = sum(grads[1:], grads[0]) / WORLD
        opt.step()
    return losses, _cpu(model.state_dict())


def _spec(tmp_dir):
    torch.manual_seed(0)
    init = MLP().state_dict()
    other_init = MLP().state_dict()
    data = [(torch.randn(WORLD * TOKENS, 64), torch.randn(WORLD * TOKENS, 64)) for _ in range(STEPS)]
    gather_weight = torch.randn(64, 64)
    gather_weight[40, 7] = 40.0  # in rank 1's rows: rank 0 must quantize with it too
    return dict(init=init, other_init=other_init, data=data, gather_weight=gather_weight,
                hp_x=[torch.randn(32, 64) for _ in range(WORLD)], hp_dy=[torch.randn(32, 64) for _ in range(WORLD)],
                ckpt=str(tmp_dir / "dcp"), stack_init=_plain_stack_state(), other_stack_init=_plain_stack_state())


def _plain_stack_state() -> dict:
    """Initial weights of the Linear stack without a recipe entry (loads into a stack of any recipe)."""
    return {k: v for k, v in _stack(RECIPE).state_dict().items() if not k.endswith("_extra_state")}


def _run(device_type, tmp_dir):
    if device_type == "cuda":
        os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    spec = _spec(tmp_dir)
    results = spawn_ranks(_worker, device_type, spec, world=WORLD)
    out = {rank: results[rank] for rank in range(WORLD)}
    device = torch.device(device_type)
    reference = {micro: _reference_training(spec["init"], spec["data"], device, micro=micro) for micro in (1, 2)}
    # dgrad of the high-precision-backward layer, with the matmul on the device the ranks used
    recipe = RECIPE.replace(backward="high_precision")
    w_deq = F.quantize_weight(spec["gather_weight"], recipe, columnwise=False, backend="ref").dequantize(torch.float32)
    reference["hp_dx"] = [(dy.to(device) @ w_deq.to(device)).cpu() for dy in spec["hp_dy"]]
    reference["hp_dx_unquantized"] = [(dy.to(device) @ spec["gather_weight"].to(device)).cpu() for dy in spec["hp_dy"]]
    return spec, out, reference


DEVICE_TYPES = [
    pytest.param("cpu", id="cpu-gloo"),
    pytest.param("cuda", id="cuda-nccl", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]),
]


@pytest.fixture(scope="module", params=DEVICE_TYPES)
def run(request, tmp_path_factory):
    return _run(request.param, tmp_path_factory.mktemp(f"fsdp-{request.param}"))


def _assert_same_losses(got, want):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), (i, g.item(), w.item())


def _assert_same_params(got: dict, want: dict):
    assert list(got) == list(want)
    for name in want:
        assert type(got[name]) is torch.Tensor, name  # plain tensors, no wrapper subclass
        assert torch.equal(got[name], want[name]), name


def _assert_matches_reference(out, name, reference_run):
    losses, params = reference_run
    for rank in range(WORLD):
        _assert_same_losses(out[rank][f"{name}_losses"], losses[rank])
    _assert_same_params(out[0][f"{name}_params"], params)


def test_ddp_matches_one_process_bitwise(run):
    spec, out, reference = run
    _assert_matches_reference(out, "ddp", reference[2])
    assert not torch.equal(reference[2][1]["fc1.weight"], spec["init"]["fc1.weight"])  # training moved the weights


def test_fsdp_bf16_all_gather_matches_one_process(run):
    _, out, reference = run
    _assert_matches_reference(out, "fsdp", reference[1])


def test_fsdp_fp4_all_gather_trains_like_bf16_all_gather(run):
    _, out, reference = run
    assert out[0]["fp4_wrapped"] == ["fc1.weight", "experts.weight0", "experts.weight1", "fc2.weight"]
    assert out[0]["fp4_local_type"] == "NVFP4ShardedWeight"
    for rank in range(WORLD):
        _assert_same_losses(out[rank]["fp4_losses"], out[rank]["fsdp_losses"])
    _assert_same_params(out[0]["fp4_params"], out[0]["fsdp_params"])
    _assert_same_params(out[0]["fp4_params"], reference[1][1])


def test_fp4_gathered_weight_is_the_full_weight_quantized_every_step(run):
    _, out, _ = run
    captured, full_weights = out[0]["fp4_captured"], out[0]["fp4_full_weights"]
    assert len(captured) == 2 * STEPS  # fc1 and experts.weight1, once per step
    for i, (name, got) in enumerate(captured):
        step = i // 2
        assert got["type"] == "NVFP4GatheredWeight", name
        want = F.quantize_weight(full_weights[step][name], RECIPE, columnwise=True, backend="ref")
        assert set(got) - {"type"} == set(QFIELDS)
        for field in QFIELDS:
            assert torch.equal(got[field], getattr(want, field)), (name, step, field)
    # the optimizer moved the weights, and the gathered weight followed (no stale copy)
    assert not torch.equal(captured[0][1]["rowwise_data"], captured[-2][1]["rowwise_data"])


@pytest.mark.parametrize("name", list(GATHER_RECIPES))
def test_fp4_gathered_weight_per_config_is_bit_identical(run, name):
    spec, out, _ = run
    recipe = GATHER_RECIPES[name]
    got = out[0]["gathered"][name]
    want = F.quantize_weight(spec["gather_weight"], recipe, columnwise=recipe.backward == "quantized", backend="ref")
    assert set(got) == {f for f in QFIELDS if getattr(want, f) is not None}
    for field in got:
        assert torch.equal(got[field], getattr(want, field)), field
    assert got["rowwise_amax"].item() == 40.0  # the global amax, on both ranks
    assert torch.equal(out[1]["gathered"][name]["rowwise_data"], got["rowwise_data"])


def test_fp4_all_gather_moves_fewer_bytes(run):
    _, out, _ = run
    # per step every layer is gathered twice (forward, and again before backward); biases travel
    # as fp32 in both runs. FP4 weights (16x16 blocks): 0.5 B data + 1/16 B scale per element.
    weights = [(128, 64), (64, 128), (64, 128), (64, 64)]
    biases = 128 + 64 + 64 + 64
    fp32 = 2 * STEPS * (4 * sum(n * k for n, k in weights) + 4 * biases)
    fp4 = 2 * STEPS * (sum(n * k // 2 + n * k // 16 for n, k in weights) + 4 * biases)
    assert out[0]["fsdp_bytes"] == fp32
    assert out[0]["fp4_bytes"] == fp4


def test_state_dict_round_trips(run):
    spec, out, _ = run
    trained = out[0]["fp4_params"]
    _assert_same_params(out[0]["dcp_params"], trained)  # DCP save, load into a differently initialized model
    for rank in range(WORLD):  # full-state-dict load into a fresh FSDP model: same outputs
        assert torch.equal(out[rank]["loaded_out"], out[rank]["trained_out"])
    plain = MLP()
    plain.load_state_dict(trained)  # the full state dict loads into an unsharded model
    assert torch.equal(plain.fc1.weight, trained["fc1.weight"])


def test_mixed_precision_fp4_matches_bf16_all_gather(run):
    _, out, _ = run
    for rank in range(WORLD):
        _assert_same_losses(out[rank]["mp_fp4_losses"], out[rank]["mp_bf16_losses"])
    _assert_same_params(out[0]["mp_fp4_params"], out[0]["mp_bf16_params"])
    assert not torch.equal(out[0]["mp_bf16_params"]["fc1.weight"], out[0]["fsdp_params"]["fc1.weight"])


def test_high_precision_backward_dgrad_uses_the_dequantized_weight(run):
    _, out, reference = run
    for rank in range(WORLD):
        assert torch.equal(out[rank]["hp_dx"], reference["hp_dx"][rank])
        assert not torch.equal(out[rank]["hp_dx"], reference["hp_dx_unquantized"][rank])


def test_fp4_all_gather_errors(run):
    _, out, _ = run
    for rank in range(WORLD):
        assert "multiple of 16 * shard group size (32)" in out[rank]["bad_rows"]
        assert "before fully_shard" in out[rank]["too_late"]


@pytest.mark.parametrize("name", list(STACK_RECIPES))
def test_stack_fp4_gathered_weight_under_mixed_precision_is_bit_identical(run, name):
    _, out, _ = run
    recipe = STACK_RECIPES[name]
    for rank in range(WORLD):
        stack = out[rank]["stack"][name]
        assert len(stack["gathered"]) == 2
        for full, got in zip(stack["full"], stack["gathered"]):
            # the full fp32 master weight cast to the param dtype: what a BF16 all-gather hands the layer
            want = F.quantize_weight(full.to(torch.bfloat16), recipe, columnwise=True, backend="ref")
            assert set(got) == set(QFIELDS)
            for field in QFIELDS:
                assert torch.equal(got[field], getattr(want, field)), (rank, field)


@pytest.mark.parametrize("name", list(STACK_RECIPES))
def test_dcp_records_and_restores_the_recipe(run, name):
    spec, out, _ = run
    recipe = STACK_RECIPES[name]
    for rank in range(WORLD):
        stack = out[rank]["stack"][name]
        assert stack["recorded"] == {"0": recipe, "1": recipe}
        assert stack["loaded_recipes"] == [recipe, recipe]
    trained = out[0]["stack"][name]["trained_params"]
    _assert_same_params(out[0]["stack"][name]["loaded_params"], trained)
    assert not torch.equal(trained["0.weight"], spec["stack_init"]["0.weight"])  # training moved the weights
    assert not torch.equal(spec["other_stack_init"]["0.weight"], spec["stack_init"]["0.weight"])  # loading did


@pytest.mark.parametrize("name", list(STACK_RECIPES))
def test_dcp_load_refuses_another_recipe_naming_the_fields(run, name):
    from nvfp4lab.modules.state import recipe_differences

    _, out, _ = run
    recipe = STACK_RECIPES[name]
    for rank in range(WORLD):
        refusals = out[rank]["stack"][name]["refusals"]
        assert len(refusals) == len(REFUSING_RECIPES[name])
        for other, message in zip(REFUSING_RECIPES[name], refusals):
            assert message is not None, other  # loaded
            assert message.startswith("layer '0' ("), message
            assert f"the saved recipe differs ({recipe_differences(recipe, other)})" in message


def _safetensors_content(path) -> tuple:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata(), {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (a safe_open handle)


@pytest.mark.parametrize("name", list(STACK_RECIPES))
def test_save_quantized_of_gathered_and_dcp_loaded_models_equals_one_process(run, name, tmp_path):
    import torch.distributed.checkpoint as dcp

    pytest.importorskip("safetensors")
    spec, out, _ = run
    ckpt = f"{spec['ckpt']}-stack-{name}"
    # one process, no FSDP: the ranks' own shards (rows) concatenated, quantized with the reference backend
    reference = _stack(STACK_RECIPES[name])
    shards = [out[rank]["stack"][name]["shards"] for rank in range(WORLD)]
    reference.load_state_dict({key: torch.cat([s[key] for s in shards]) for key in shards[0]})
    nvfp4lab.save_quantized(reference, tmp_path / "reference.safetensors")
    # the checkpoint DCP-loaded into a plain model here, built with the recipes it records
    loaded = _stack([dcp_recipes(ckpt)[str(i)] for i in range(2)])
    state = loaded.state_dict()
    dcp.load(state, checkpoint_id=ckpt, no_dist=True)
    loaded.load_state_dict(state)
    nvfp4lab.save_quantized(loaded, tmp_path / "dcp_loaded.safetensors")
    metadata, tensors = _safetensors_content(tmp_path / "reference.safetensors")
    assert sorted(tensors) == ["0.bias", "0.weight_amax", "0.weight_data", "0.weight_scale",
                               "1.bias", "1.weight_amax", "1.weight_data", "1.weight_scale"]
    for path in (f"{ckpt}-gathered.safetensors", tmp_path / "dcp_loaded.safetensors"):
        got_metadata, got = _safetensors_content(path)
        assert got_metadata == metadata
        assert list(got) == list(tensors)
        for key in tensors:
            assert got[key].dtype == tensors[key].dtype and torch.equal(got[key], tensors[key]), (path, key)


# ------------------------------------------------------------------------ single-process checks
def test_cache_is_bypassed_for_fsdp_managed_modules():
    """FSDP refills the gathered weight in place with its version counter preserved and, with a
    caching allocator, at the same address: the cache key cannot see the new values."""
    torch.manual_seed(0)
    outputs = {}
    for managed in (False, True):
        lin = Linear(64, 64, recipe=RECIPE, backend="ref")
        if managed:
            lin._is_fsdp_managed_module = True  # what fully_shard sets on every module it manages
        x = torch.randn(32, 64)
        lin(x)
        new_values = torch.randn(64, 64)
        with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(lin.weight):
            lin.weight.copy_(new_values)  # as FSDP's all-gather copy-out does
        fresh = Linear(64, 64, recipe=RECIPE, backend="ref")
        fresh.load_state_dict(lin.state_dict())
        outputs[managed] = (lin(x), fresh(x))
    stale, want = outputs[False]
    assert not torch.equal(stale, want)  # an unmanaged module serves its cached copy here
    got, want = outputs[True]
    assert torch.equal(got, want)


def test_enable_fp4_all_gather_wraps_nvfp4_weights_only():
    torch.manual_seed(0)
    model = nn.Sequential(MLP(), Linear(64, 64, recipe=MXFP8Recipe()), nn.Linear(64, 64))
    tied = nn.Module()
    tied.lin = Linear(64, 64, recipe=RECIPE)
    tied.other = nn.Linear(64, 64)
    tied.other.weight = tied.lin.weight  # shared with a layer that needs the high-precision weight
    reference = nn.Sequential(MLP(), Linear(64, 64, recipe=MXFP8Recipe()), nn.Linear(64, 64))
    reference.load_state_dict(model.state_dict())
    assert enable_fp4_all_gather(model, shard_group_size=2) == [
        "0.fc1.weight", "0.experts.weight0", "0.experts.weight1", "0.fc2.weight"]
    assert enable_fp4_all_gather(model, shard_group_size=2) == []  # already wrapped
    assert enable_fp4_all_gather(tied) == []
    assert isinstance(model[0].fc1.weight, NVFP4ShardedWeight) and isinstance(model[0].fc1.weight, nn.Parameter)
    assert type(model[1].weight) is nn.Parameter
    # without FSDP the wrapper is its high-precision weight: same outputs and gradients
    x = torch.randn(32, 64)
    y, y_ref = model(x), reference(x)
    assert torch.equal(y, y_ref)
    y.square().mean().backward()
    y_ref.square().mean().backward()
    assert torch.equal(model[0].fc1.weight.grad, reference[0].fc1.weight.grad)
    # state dicts hold plain tensors (torch.save writes the high-precision values)
    import io

    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert type(loaded["0.fc1.weight"]) is torch.Tensor
    assert torch.equal(loaded["0.fc1.weight"], reference.state_dict()["0.fc1.weight"])


def test_enable_fp4_all_gather_rejects_bad_input():
    with pytest.raises(ValueError, match=r"fc.weight: out_features \(48\) must be a multiple of 16 \* shard group size \(32\)"):
        model = nn.Module()
        model.fc = Linear(64, 48, recipe=RECIPE)
        enable_fp4_all_gather(model, shard_group_size=2)
    with pytest.raises(ValueError, match="shard_group_size must be a positive int"):
        enable_fp4_all_gather(Linear(64, 64), shard_group_size=0)
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        enable_fp4_all_gather("model")
    with pytest.raises(TypeError, match="recipe must be an NVFP4Recipe"):
        nvfp4lab.fsdp.weight_config(MXFP8Recipe())


def test_weight_config_uses_the_weight_roles():
    recipe = NVFP4Recipe.te_default()
    cfg = nvfp4lab.fsdp.weight_config(recipe)
    fprop, dgrad = recipe.config_for("weight_fprop"), recipe.config_for("weight_dgrad")
    assert cfg.rowwise and cfg.columnwise
    assert cfg == dataclasses.replace(fprop, columnwise=True) == dataclasses.replace(dgrad, rowwise=True)
    assert not nvfp4lab.fsdp.weight_config(recipe.replace(backward="dequantized")).columnwise
