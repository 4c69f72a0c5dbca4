"""nvfp4lab.Linear / GroupedLinear / convert: drop-in behaviour, weight cache, dtypes, MoE grouping,
torch.compile, CUDA graphs, and short training runs against BF16.

GEMM numerics per preset are checked in tests/functional/test_linear.py; here the modules must equal
the functional path and train.
"""
import copy
import sys
import warnings

import pytest
import torch
from torch import nn

from nvfp4lab import GroupedLinear, Linear, MXFP8Recipe, NVFP4Recipe, convert, ops
from nvfp4lab import functional as F
from nvfp4lab.kernels.nvfp4_quantize_details import opt_flags

PRESETS = {
    "te_default": NVFP4Recipe.te_default(),
    "per_token": NVFP4Recipe.per_token(),
    "per_token_gradients": NVFP4Recipe.per_token(gradients=True),
    "four_over_six": NVFP4Recipe.four_over_six(),
    "mxfp8": MXFP8Recipe(),
}
DEVICES = [
    pytest.param(("cpu", "ref"), id="cpu-ref"),
    pytest.param(("cuda", "triton"), id="cuda-triton", marks=pytest.mark.gpu),
]


def _grads(module):
    return [p.grad.clone() for p in module.parameters()]


# ------------------------------------------------------------------------------ drop-in Linear
def test_linear_is_an_nn_linear_with_the_same_state_dict():
    torch.manual_seed(0)
    ref = nn.Linear(64, 32)
    lin = Linear(64, 32)
    assert isinstance(lin, nn.Linear)
    # plus the recipe as extra state (tests/test_checkpoint.py); a plain nn.Linear skips it with strict=False
    assert list(lin.state_dict()) == [*ref.state_dict(), "_extra_state"] and list(ref.state_dict()) == ["weight", "bias"]
    lin.load_state_dict(ref.state_dict())
    assert torch.equal(lin.weight, ref.weight) and torch.equal(lin.bias, ref.bias)
    back = nn.Linear(64, 32)
    back.load_state_dict(lin.state_dict(), strict=False)
    assert torch.equal(back.weight, ref.weight)
    # round trip through a saved file-like buffer into a fresh Linear gives the same output
    import io

    buf = io.BytesIO()
    torch.save(lin.state_dict(), buf)
    buf.seek(0)
    lin2 = Linear(64, 32, recipe=NVFP4Recipe.te_default())
    lin2.load_state_dict(torch.load(buf))
    x = torch.randn(16, 64)
    assert torch.equal(lin2(x), lin(x))
    assert Linear(64, 32, bias=False).bias is None


def test_from_linear_shares_parameters():
    ref = nn.Linear(64, 48).to(torch.bfloat16)
    ref.eval()
    lin = Linear.from_linear(ref, NVFP4Recipe.per_token())
    assert lin.weight is ref.weight and lin.bias is ref.bias
    assert not lin.training and lin.recipe == NVFP4Recipe.per_token()
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert torch.equal(lin(x), F.linear(x, ref.weight, ref.bias, recipe=NVFP4Recipe.per_token()))


def test_linear_rejects_bad_arguments():
    with pytest.raises(ValueError, match="in_features must be a multiple of 16"):
        Linear(40, 32)
    with pytest.raises(ValueError, match="out_features must be a multiple of 32"):
        Linear(64, 48, recipe=MXFP8Recipe())
    with pytest.raises(TypeError, match="recipe must be"):
        Linear(64, 32, recipe="nvfp4")
    with pytest.raises(ValueError, match=r"x.shape\[-1\]"):
        Linear(64, 32)(torch.randn(4, 32))


def test_linear_refuses_a_non_tensor_input():
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        Linear(32, 32)([[1.0] * 32])
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        GroupedLinear(2, 32, 32)([[1.0] * 32], [1, 0])


@pytest.mark.parametrize("preset", ["te_default", "per_token", "mxfp8"])
@pytest.mark.parametrize("features", [(0, 32), (32, 0), (0, 0)])
def test_linear_with_zero_features_is_nn_linear(preset, features):
    # an empty contraction gives the bias (nn.Linear's result); empty outputs give empty gradients
    lin = Linear(*features, recipe=PRESETS[preset])
    x = torch.randn(4, 3, features[0], requires_grad=True)
    y = lin(x)
    y.sum().backward()
    assert torch.equal(y, lin.bias.detach().expand(4, 3, features[1]))
    assert x.grad.shape == x.shape and lin.weight.grad.shape == lin.weight.shape
    g = GroupedLinear(2, *features, recipe=PRESETS[preset])
    assert g(torch.randn(5, features[0]), [2, 3]).shape == (5, features[1])


@pytest.mark.parametrize("backend", ["ref", "triton"])
@pytest.mark.parametrize("preset", ["te_default", "per_token", "mxfp8"])
def test_linear_on_meta_tensors_propagates_shapes(preset, backend):
    """A model on the meta device runs fwd + bwd with either backend: every op gives its outputs' shapes."""
    lin = Linear(32, 64, device="meta", recipe=PRESETS[preset], backend=backend)
    x = torch.empty(2, 16, 32, device="meta", requires_grad=True)
    y = lin(x)
    y.sum().backward()
    assert y.device.type == "meta" and y.shape == (2, 16, 64) and x.grad.shape == x.shape
    assert lin.weight.grad.device.type == "meta" and lin.weight.grad.shape == lin.weight.shape
    grouped = GroupedLinear(2, 32, 64, device="meta", recipe=PRESETS[preset], backend=backend)
    xg = torch.empty(48, 32, device="meta", requires_grad=True)
    yg = grouped(xg, [16, 32])
    yg.sum().backward()
    assert yg.device.type == "meta" and yg.shape == (48, 64) and xg.grad.shape == xg.shape
    assert all(w.grad.device.type == "meta" and w.grad.shape == w.shape for w in grouped.weights)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_linear_module_equals_functional_path(preset):
    """fwd and bwd of the module (with its weight cache) equal nvfp4lab.functional.linear bit for bit."""
    recipe = PRESETS[preset]
    torch.manual_seed(0)
    lin = Linear(64, 32, recipe=recipe)
    x = torch.randn(2, 32, 64, requires_grad=True)
    dy = torch.randn(2, 32, 32)
    y = lin(x)
    torch.manual_seed(3)
    y.backward(dy)
    w = lin.weight.detach().clone().requires_grad_(True)
    b = lin.bias.detach().clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    y2 = F.linear(x2, w, b, recipe=recipe)
    torch.manual_seed(3)
    y2.backward(dy)
    assert torch.equal(y, y2) and torch.equal(x.grad, x2.grad)
    assert torch.equal(lin.weight.grad, w.grad) and torch.equal(lin.bias.grad, b.grad)


def test_weight_cache_quantizes_once_per_weight_version(monkeypatch):
    calls = []
    real = F.quantize_weight

    def counting(weight, recipe, **kw):
        calls.append(kw["columnwise"])
        return real(weight, recipe, **kw)

    monkeypatch.setattr(F, "quantize_weight", counting)
    torch.manual_seed(0)
    lin = Linear(64, 32)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    x = torch.randn(16, 64, requires_grad=True)
    for _ in range(3):  # three micro-batches: one quantization (rowwise + columnwise)
        lin(x).sum().backward()
    assert calls == [True]
    y_before = lin(x.detach())  # no grad needed: the cached copy still serves
    assert calls == [True]
    opt.step()  # in-place update bumps the parameter's version
    y_after = lin(x.detach())
    assert calls == [True, False] and not torch.equal(y_before, y_after)
    assert torch.equal(y_after, F.linear(x.detach(), lin.weight, lin.bias))
    with torch.no_grad():
        lin.weight.data = lin.weight.data.clone()  # same version, new storage
    lin(x.detach())
    assert len(calls) == 3
    lin.clear_weight_cache()
    lin(x.detach())
    assert len(calls) == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_param_dtypes_and_leading_shapes(dtype):
    torch.manual_seed(0)
    lin = Linear(64, 32, dtype=dtype)
    x = torch.randn(2, 3, 8, 64, dtype=dtype, requires_grad=True)
    y = lin(x)
    assert y.shape == (2, 3, 8, 32) and y.dtype == dtype
    y.float().sum().backward()
    assert x.grad.dtype == dtype and lin.weight.grad.dtype == dtype and lin.bias.grad.dtype == dtype
    ref = nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
    assert (y.float() - ref).norm() / ref.norm() < 0.25  # NVFP4 is coarse; a wrong layout gives ~1.4
    assert lin(torch.randn(64, dtype=dtype)).shape == (32,)


def test_autocast_sets_the_output_dtype():
    torch.manual_seed(0)
    lin = Linear(64, 32)  # fp32 parameters
    x = torch.randn(16, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.float32 and lin.weight.grad.dtype == torch.float32
    # under autocast x is quantized from its bf16 cast, like TE
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_auto = lin(x.detach())
    assert torch.equal(y_auto, F.linear(x.detach().bfloat16(), lin.weight, lin.bias))


# --------------------------------------------------------------------------------- GroupedLinear
def _grouped_and_experts(recipe, num=4, k=64, n=32, bias=True, device="cpu", backend=None):
    torch.manual_seed(0)
    grouped = GroupedLinear(num, k, n, bias=bias, recipe=recipe, device=device, backend=backend)
    experts = [Linear(k, n, bias=bias, recipe=recipe, device=device, backend=backend) for _ in range(num)]
    with torch.no_grad():
        for i, e in enumerate(experts):
            e.weight.copy_(getattr(grouped, f"weight{i}"))
            if bias:
                e.bias.copy_(getattr(grouped, f"bias{i}"))
    return grouped, experts


@pytest.mark.parametrize("device_backend", DEVICES)
@pytest.mark.parametrize("splits_as", ["list", "tensor"])
def test_grouped_linear_equals_per_expert_linear(splits_as, device_backend):
    # stochastic rounding off: separate modules' backward passes run in autograd's order, so SR bits
    # would be drawn in another order; every other option is the te_default one
    device, backend = device_backend
    recipe = NVFP4Recipe.te_default(stochastic_rounding=False)
    grouped, experts = _grouped_and_experts(recipe, device=device, backend=backend)
    splits = [16, 0, 40, 8]  # an empty expert, and splits that need token padding
    x = torch.randn(64, 64, device=device, requires_grad=True)
    dy = torch.randn(64, 32, device=device)
    m_splits = splits if splits_as == "list" else torch.tensor(splits, device=device)
    y = grouped(x, m_splits)
    y.backward(dy)
    xe = x.detach().clone().requires_grad_(True)
    ye = torch.cat([e(part) for e, part in zip(experts, xe.split(splits))])
    ye.backward(dy)

    def same(a, b):  # the same ops on the same data: equal bits (GPU: allow GEMM accumulation order)
        if device == "cpu":
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=2**-7, atol=2**-10 * b.abs().max().item())

    same(y, ye)
    same(x.grad, xe.grad)
    for i, e in enumerate(experts):
        if splits[i] == 0:  # an expert without tokens gets a zero weight gradient, in both
            assert torch.equal(e.weight.grad, torch.zeros(32, 64, device=device))
        same(getattr(grouped, f"weight{i}").grad, e.weight.grad)
        same(getattr(grouped, f"bias{i}").grad, e.bias.grad)


GROUPED_PRESETS = {
    "te_default": NVFP4Recipe.te_default(stochastic_rounding=False),
    "per_token": NVFP4Recipe.per_token(stochastic_rounding=False),
    "per_token_gradients": NVFP4Recipe.per_token(gradients=True, stochastic_rounding=False),
    "four_over_six": NVFP4Recipe.four_over_six(stochastic_rounding=False),
}


@pytest.mark.parametrize("device_backend", DEVICES)
@pytest.mark.parametrize("splits", [[32, 0, 48, 16, 0], [0, 24, 40, 0, 1]], ids=["aligned", "padded"])
@pytest.mark.parametrize("preset", list(GROUPED_PRESETS))
def test_grouped_linear_takes_the_grouped_path(preset, splits, device_backend, monkeypatch):
    # fprop and dgrad each run as one grouped GEMM; results equal the per-expert Linears (zero-size
    # experts included, and splits that need token padding for the columnwise copies)
    from nvfp4lab import ops

    calls = []
    real = ops.nvfp4_grouped_gemm
    monkeypatch.setattr(ops, "nvfp4_grouped_gemm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    device, backend = device_backend
    recipe = GROUPED_PRESETS[preset]
    grouped, experts = _grouped_and_experts(recipe, num=5, device=device, backend=backend)
    m = sum(splits)
    x = torch.randn(m, 64, device=device, requires_grad=True)
    dy = torch.randn(m, 32, device=device)
    for step in range(2):  # the second step reads the cached stacked weights
        for p in [x, *grouped.parameters(), *(p for e in experts for p in e.parameters())]:
            p.grad = None
        calls.clear()
        y = grouped(x, splits)
        assert len(calls) == 1
        y.backward(dy)
        assert len(calls) == 2
        xe = x.detach().clone().requires_grad_(True)
        ye = torch.cat([e(part) for e, part in zip(experts, xe.split(splits))])
        ye.backward(dy)

        def close(a, b):
            torch.testing.assert_close(a, b, rtol=2**-7, atol=2**-10 * max(b.abs().max().item(), 1e-6))

        close(y, ye)
        close(x.grad, xe.grad)
        for i, e in enumerate(experts):
            if splits[i] == 0:
                assert torch.equal(getattr(grouped, f"weight{i}").grad, torch.zeros(32, 64, device=device))
            close(getattr(grouped, f"weight{i}").grad, e.weight.grad)
            close(getattr(grouped, f"bias{i}").grad, e.bias.grad)
    assert "grouped" in grouped._quantized_weights  # the stacked weights of all experts, cached


@pytest.mark.parametrize("save_operand", [False, True])
@pytest.mark.parametrize("backend", ["ref", "triton"])
@pytest.mark.parametrize("preset", ["te_default", "per_token", "four_over_six"])
def test_grouped_linear_dgrad_from_the_rowwise_weight_copy(preset, backend, save_operand, dgrad_from_rowwise,
                                                           monkeypatch):
    """Where the grouped dgrad reads the stacked weights' rowwise copy transposed (16x16 weights), the layer still
    equals the per-expert Linears bit for bit, and it quantizes no columnwise weight copy. With
    ``save_weight_operand`` the forward makes the weights' BF16 operand once (by the cast itself where that pays,
    here forced; 4over6 has no such cast and expands its packed stack) and dgrad takes it: no expansion in backward,
    no packed cache. As the grouped GEMMs expand their operands here, x's cast writes x's rowwise operand (not for
    4over6 activations)."""
    monkeypatch.setattr(opt_flags, "OPERAND_CAST_MIN_ELEMENTS", 0)
    calls = []
    for name in ("nvfp4_operand", "quantize_nvfp4_grouped_operands"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _real=real, _name=name, **kw: calls.append(
            (_name, kw["config"].columnwise if "config" in kw else kw.get("transposed", False))) or _real(*a, **kw))
    recipe = GROUPED_PRESETS[preset]
    grouped, experts = _grouped_and_experts(recipe, num=4, backend=backend)
    grouped.save_weight_operand = save_operand
    splits = [16, 0, 40, 8]
    x = torch.randn(64, 64, requires_grad=True)
    dy = torch.randn(64, 32)
    grouped(x, splits).backward(dy)
    x_cast = [] if preset == "four_over_six" else [("quantize_nvfp4_grouped_operands", True)]  # columnwise for dW
    if save_operand:
        assert "grouped" not in grouped._quantized_weights
        made = "nvfp4_operand" if preset == "four_over_six" else "quantize_nvfp4_grouped_operands"
        assert calls == [(made, False)] + x_cast
    else:
        ((_, (row_stack, col_stack)),) = [v for name, v in grouped._quantized_weights.items() if name == "grouped"]
        assert row_stack is not None and col_stack is None
        assert calls == x_cast + [("nvfp4_operand", True)]
    xe = x.detach().clone().requires_grad_(True)
    torch.cat([e(part) for e, part in zip(experts, xe.split(splits))]).backward(dy)
    assert torch.equal(x.grad, xe.grad)
    for i, e in enumerate(experts):
        assert torch.equal(getattr(grouped, f"weight{i}").grad, e.weight.grad)


@pytest.mark.parametrize("splits", [[32, 0, 48, 16], [0, 24, 40, 1]], ids=["aligned", "padded"])
def test_grouped_linear_reuses_its_split_offsets(splits, monkeypatch):
    # the device offsets (and the padded-row index) are built on the first call with some splits and
    # then reused: no host->device copy per step. Results equal the functional call, which builds them.
    from nvfp4lab import ops

    copies, offsets_used = [], []
    real_copy, real_quantize = ops.host_ints_on_device, ops.quantize_nvfp4_grouped_bulk
    weight_offsets = [0, 32, 64, 96, 128]  # the 4 experts' weight rows (quantized as one grouped call)

    def recording_copy(values, *a, **kw):
        if list(values) != weight_offsets:
            copies.append(1)
        return real_copy(values, *a, **kw)

    monkeypatch.setattr(ops, "host_ints_on_device", recording_copy)

    def recording_quantize(x, sections, **kw):
        if list(sections) != [32] * 4:  # the tokens' calls (x, dy), not the weights'
            offsets_used.append(kw.get("split_offsets"))
        return real_quantize(x, sections, **kw)

    monkeypatch.setattr(ops, "quantize_nvfp4_grouped_bulk", recording_quantize)
    recipe = NVFP4Recipe.te_default()  # stochastic rounding on: both runs re-seed before each step
    grouped = GroupedLinear(4, 64, 32, recipe=recipe)
    m = sum(splits)
    dy = torch.randn(m, 32)

    def step(call):
        x = torch.randn(m, 64, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
        for p in grouped.parameters():
            p.grad = None
        copies.clear()
        offsets_used.clear()
        torch.manual_seed(7)
        call(x).backward(dy)
        return [x.grad.clone()] + _grads(grouped), list(copies), list(offsets_used)

    first, first_copies, first_offsets = step(lambda x: grouped(x, splits))
    second, second_copies, second_offsets = step(lambda x: grouped(x, splits))
    assert first_copies == [1] and second_copies == []  # one copy for the layout, then none
    assert len(second_offsets) == 2 and all(o is first_offsets[0] for o in first_offsets + second_offsets)
    assert len(grouped._split_layouts) == 1
    grouped.clear_weight_cache()  # keeps the split layouts
    assert len(grouped._split_layouts) == 1
    uncached, uncached_copies, _ = step(lambda x: F.grouped_linear(x, splits, grouped.weights, grouped.biases, recipe=recipe))
    assert uncached_copies == [1]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert all(torch.equal(a, b) for a, b in zip(first, uncached))


@pytest.mark.parametrize("recipe", [MXFP8Recipe(), NVFP4Recipe.te_default(backward="dequantized")], ids=["mxfp8", "dequantized"])
def test_grouped_linear_falls_back_to_the_per_expert_loop(recipe, monkeypatch):
    from nvfp4lab import ops

    calls = []
    real = ops.nvfp4_grouped_gemm
    monkeypatch.setattr(ops, "nvfp4_grouped_gemm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    grouped, experts = _grouped_and_experts(recipe, num=3, k=64, n=64)
    splits = [32, 0, 32]
    x = torch.randn(64, 64, requires_grad=True)
    y = grouped(x, splits)
    y.sum().backward()
    assert calls == []
    assert len(grouped._split_layouts) == 0  # no device offsets: the loop splits on the host
    xe = x.detach().clone().requires_grad_(True)
    ye = torch.cat([e(part) for e, part in zip(experts, xe.split(splits))])
    ye.sum().backward()
    assert torch.equal(y, ye) and torch.equal(x.grad, xe.grad)


def test_grouped_linear_forward_with_te_default_and_params():
    grouped, experts = _grouped_and_experts(NVFP4Recipe.te_default(), num=3, bias=False)
    assert [n for n, _ in grouped.named_parameters()] == ["weight0", "weight1", "weight2"]
    x = torch.randn(2, 24, 64)  # leading dims flatten into the 48 tokens
    y = grouped(x, [16, 16, 16])
    assert y.shape == (2, 24, 32)
    ye = torch.cat([e(p) for e, p in zip(experts, x.reshape(48, 64).split(16))])
    assert torch.equal(y.reshape(48, 32), ye)


def test_grouped_linear_rejects_a_non_bool_save_weight_operand():
    with pytest.raises(TypeError, match="save_weight_operand must be a bool"):
        GroupedLinear(2, 64, 32, save_weight_operand=1)
    w = torch.randn(32, 64)
    with pytest.raises(TypeError, match="save_weight_operand must be a bool"):
        F.grouped_linear(torch.randn(32, 64), [16, 16], [w, w], save_weight_operand="yes")


def test_grouped_linear_rejects_bad_splits():
    g = GroupedLinear(2, 64, 32)
    x = torch.randn(32, 64)
    with pytest.raises(ValueError, match="m_splits must sum to M = 32"):
        g(x, [16, 8])
    with pytest.raises(ValueError, match="m_splits must have 2 entries"):
        g(x, [32])
    with pytest.raises(ValueError, match="m_splits must be >= 0"):
        g(x, [40, -8])
    with pytest.raises(TypeError, match="m_splits must be"):
        g(x, torch.tensor([16.0, 16.0]))
    with pytest.raises(ValueError, match="num_gemms must be a positive int"):
        GroupedLinear(0, 64, 32)


# ------------------------------------------------------------------------------------ convert
class _Block(nn.Module):
    def __init__(self, d=64, vocab=50):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.head = nn.Linear(d, vocab)  # 50 outputs: not a multiple of 16
        self.gate = nn.Linear(d, 8)

    def forward(self, tokens):
        h = self.embed(tokens)
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1) @ v
        h = h + self.proj(att)
        h = h + self.mlp(self.norm(h))
        return self.head(h)


def test_convert_transformer_like_model():
    torch.manual_seed(0)
    model = _Block()
    reference = copy.deepcopy(model)
    qkv_weight = model.qkv.weight
    report = convert(model, NVFP4Recipe.per_token(), filter=lambda name, m: name != "proj")
    assert report.converted == ["qkv", "mlp.0", "mlp.2"]
    assert dict(report.skipped) == {
        "proj": "rejected by filter",
        "head": "out_features=50 not a multiple of 16",
        "gate": "out_features=8 not a multiple of 16",
    }
    assert "converted 3 nn.Linear" in str(report)
    assert type(model.qkv) is Linear and model.qkv.weight is qkv_weight and type(model.proj) is nn.Linear
    assert [k for k in model.state_dict() if not k.endswith("._extra_state")] == list(reference.state_dict())
    tokens = torch.randint(0, 50, (2, 16))
    out, ref = model(tokens), reference(tokens)
    assert (out - ref).norm() / ref.norm() < 0.2
    out.sum().backward()
    assert model.qkv.weight.grad is not None and model.embed.weight.grad is not None
    # a second convert finds nothing new to do
    again = convert(model, NVFP4Recipe.per_token())
    assert again.converted == ["proj"]


def test_convert_shared_layer_and_root():
    lin = nn.Linear(32, 32)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    report = convert(model)
    assert report.converted == ["0"] and model[0] is model[2] and isinstance(model[2], Linear)
    root = convert(nn.Linear(32, 32))
    assert root.converted == [] and "from_linear" in root.skipped[0][1]
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        convert("model")


def test_convert_skips_linears_whose_parent_reads_the_weight():
    """nn.MultiheadAttention passes out_proj.weight to F.multi_head_attention_forward and never calls
    out_proj: converting it would report a layer that never runs quantized."""
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
    reference = copy.deepcopy(model)
    report = convert(model, backend="ref")
    assert report.converted == ["linear1", "linear2"]
    assert [name for name, _ in report.skipped] == ["self_attn.out_proj"]
    assert "reads out_proj.weight directly" in report.skipped[0][1] and "self_attn.out_proj" in str(report)
    assert type(model.self_attn.out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear
    x = torch.randn(2, 16, 32)
    assert (model(x) - reference(x)).norm() / reference(x).norm() < 0.2
    mha = nn.MultiheadAttention(32, 4)
    assert convert(mha).converted == [] and [n for n, _ in convert(mha).skipped] == ["out_proj"]


def test_convert_lab_minilm_converts_all_its_linears():
    """The lab's model (BERT-style attention with nn.Linear q/k/v/output layers): nothing is skipped."""
    from nvfp4lab.lab import capture

    model, _ = capture.load_model(capture.default_model_path(), torch.device("cpu"))
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    report = convert(model)
    assert report.skipped == [] and report.converted == linears and len(linears) == 6 * 6 + 1  # + the pooler


# ------------------------------------------------------------------------------- torch.compile
def test_torch_compile_fullgraph_linear_stack_cpu():
    """Dynamo captures a Linear stack in one graph (fullgraph) and AOT autograd traces its backward;
    aot_eager keeps eager kernels, so results (SR bits included) equal eager ones exactly."""
    torch.manual_seed(0)
    model = nn.Sequential(Linear(64, 64), nn.GELU(), Linear(64, 32, recipe=NVFP4Recipe.per_token()))
    _assert_aot_eager_compile_equals_eager(model, torch.randn(32, 64, requires_grad=True))


def _assert_aot_eager_compile_equals_eager(model, x, *args, backend="aot_eager", symbolic_tokens=False):
    """A fwd+bwd step of ``model(x, *args)`` compiled (fullgraph, aot_eager or the given backend) equals the eager
    step: output, x.grad and the parameter grads, SR bits included (same seed before each step).
    ``symbolic_tokens``: x's first dim traced as a symbolic size."""
    torch.manual_seed(1)
    y = model(x, *args)
    y.square().sum().backward()
    grads, gx = _grads(model), x.grad.clone()
    model.zero_grad(set_to_none=True)
    x.grad = None
    if symbolic_tokens:
        torch._dynamo.maybe_mark_dynamic(x, 0)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    torch.manual_seed(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yc = compiled(x, *args)
        yc.square().sum().backward()
    # Dynamo skips an lru_cache wrapper it meets (and warns): the package calls its caches in eager mode only
    assert not [str(w.message) for w in caught if "lru_cache" in str(w.message)]
    assert torch.equal(yc, y) and torch.equal(x.grad, gx)
    assert all(torch.equal(a, b) for a, b in zip(_grads(model), grads))


def test_torch_compile_fullgraph_grouped_linear():
    """Dynamo captures GroupedLinear's grouped path in one graph (the split offsets are built inside
    the traced graph, not kept by the module); aot_eager keeps eager kernels: results equal eager ones."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # Triton kernels (interpreted on CPU)
    torch.manual_seed(0)
    grouped = GroupedLinear(3, 64, 32, recipe=NVFP4Recipe.per_token(), device=device, backend="triton")
    x = torch.randn(64, 64, device=device, requires_grad=True)
    _assert_aot_eager_compile_equals_eager(grouped, x, [16, 8, 40])  # 8 and 40 need token padding
    assert len(grouped._split_layouts) == 1  # the eager call's


def _aot_graphs_backend(graphs: list):
    """An aot_eager-like torch.compile backend that keeps the forward and backward FX graphs it runs."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def keep(gm, _example_inputs):
        graphs.append(gm.graph)
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=keep, bw_compiler=keep)


def _custom_op_calls(graph, name: str) -> list:
    """The argument tuples of every call of the op ``nvfp4lab::name`` in an FX graph."""
    op = getattr(torch.ops.nvfp4lab, name).default
    return [node.args for node in graph.nodes if node.op == "call_function" and node.target is op]


@pytest.mark.parametrize("symbolic_tokens", [False, True], ids=["static", "symbolic_tokens"])
@pytest.mark.parametrize("grouped", [False, True], ids=["linear", "grouped"])
def test_torch_compile_takes_the_expanded_gemm_paths(dgrad_from_rowwise, grouped, symbolic_tokens, monkeypatch):
    """Where the GEMMs expand their operands (forced here; the GPU's large-M paths), a compiled step takes the eager
    step's paths, with a static or a symbolic token count: W quantized rowwise only (16x16) and read transposed for
    dgrad (dense Linear: the expansion op in backward, with x^T's for wgrad; GroupedLinear: W's operand cast in forward and saved), x and
    dy cast straight to BF16 operands (dense Linear, forced too; GroupedLinear: x's rows). Same results as eager, bit
    for bit."""
    monkeypatch.setattr(ops, "takes_operands_by_rule", lambda *args, **kwargs: True)
    monkeypatch.setattr(opt_flags, "OPERAND_CAST_MIN_ELEMENTS", 0)
    sys.modules["nvfp4lab.functional.linear"]._clear_path_caches()
    device = "cuda" if torch.cuda.is_available() else "cpu"  # Triton kernels (interpreted on CPU)
    torch.manual_seed(0)
    if grouped:
        model = GroupedLinear(3, 64, 32, device=device, backend="triton")
        args = ([16, 32, 16],)
    else:
        model = Linear(64, 48, device=device, backend="triton")
        args = ()
    graphs = []
    _assert_aot_eager_compile_equals_eager(model, torch.randn(64, 64, device=device, requires_grad=True), *args,
                                           backend=_aot_graphs_backend(graphs), symbolic_tokens=symbolic_tokens)
    forward, backward = graphs
    if grouped:  # W's operand made in the forward by the grouped cast itself (forced to pay), kept for dgrad
        assert len(_custom_op_calls(forward, "nvfp4_grouped_gemm")) == 1
        assert not _custom_op_calls(backward, "nvfp4_expand_rowwise")
        # W (16x16 blocks), then x (1x16 with its columnwise copy), each with row_operand (the last arg)
        quantizes = _custom_op_calls(forward, "nvfp4_grouped_quantize")  # (x, offsets, seed_tensor, seed, block, ...)
        assert [(q[4], q[-1]) for q in quantizes] == [("16x16", True), ("1x16", True)]
        return
    # W^T's operand (dgrad) and x^T's (wgrad), expanded ahead of dy's cast; the GEMMs expand nothing
    expansions = _custom_op_calls(backward, "nvfp4_expand_rowwise")  # (data, scale, amax, layout, k)
    assert [tuple(e[0].meta["val"].shape) for e in expansions] == [(48, 32), (64, 32)]
    quantizes = _custom_op_calls(forward, "nvfp4_quantize")
    weight = [q for q in quantizes if q[5] == "16x16"]  # (x, amax, columnwise_amax, seed_tensor, seed, block, rowwise, columnwise, ...)
    assert len(weight) == 1 and weight[0][6:8] == (True, False)
    # (row_operand, col_operand), trailing defaults (False) left out of the call
    operand_flags = [tuple(q[20:22]) + (False,) * (22 - max(len(q), 20))
                     for q in quantizes + _custom_op_calls(backward, "nvfp4_quantize") if q[5] == "1x16"]
    assert sorted(operand_flags) == [(True, False), (True, True)]  # x: its fprop operand; dy: both GEMMs' operands


def test_gemm_path_rule_under_symbolic_sizes():
    """The path rule compares sizes only, so torch.compile traces it with symbolic sizes (dynamic shapes) and
    guards on them: a compiled function gives the eager answer on both sides of the rule's bounds."""
    rule = (64, 128, 1 << 20)

    def takes(a):
        m, k = a.shape
        dense = ops.takes_expanded_by_rule(m, 512, k, rule)
        grouped = ops.takes_expanded_by_rule(m, 512, k, rule, 4)
        return a.sum() + (1.0 if dense else 0.0) + (2.0 if grouped else 0.0)

    compiled = torch.compile(takes, fullgraph=True, dynamic=True, backend="eager")
    for m, k in ((64, 4096), (128, 4096), (256, 32), (512, 8192), (1024, 4096)):
        a = torch.zeros(m, k)
        want = (m > 64 and m >= 128 and m * 512 * k >= 1 << 20) + 2 * (m // 4 >= 128 and m // 4 * 512 * k >= 1 << 20)
        assert float(compiled(a)) == float(takes(a)) == want, (m, k)


@pytest.mark.gpu
def test_torch_compile_inductor_gpu():
    recipe = NVFP4Recipe.te_default(stochastic_rounding=False)
    torch.manual_seed(0)
    model = nn.Sequential(Linear(256, 256, recipe=recipe), nn.GELU(), Linear(256, 128, recipe=recipe)).cuda()
    x = torch.randn(4, 64, 256, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = model(x)
    y.float().square().sum().backward()
    grads, gx = _grads(model), x.grad.clone()
    model.zero_grad(set_to_none=True)
    x.grad = None
    compiled = torch.compile(model, fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        yc = compiled(x)
    yc.float().square().sum().backward()
    torch.testing.assert_close(yc, y, rtol=2**-7, atol=1e-2)
    torch.testing.assert_close(x.grad, gx, rtol=2**-7, atol=1e-2)
    for a, b in zip(_grads(model), grads):
        torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-2 * b.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("grouped", [False, True], ids=["linear", "grouped"])
def test_torch_compile_inductor_gpu_expanded_paths(grouped):
    """At sizes whose GEMMs expand their operands on the GPU (the dgrad from W's rowwise copy; the dense Linear's
    operand casts start at 2^26 elements, not reached here), Inductor's compiled step (fullgraph, no SR) gives the
    eager step's values bit for bit."""
    recipe = NVFP4Recipe.te_default(stochastic_rounding=False)
    torch.manual_seed(0)
    if grouped:
        model = GroupedLinear(4, 2048, 1024, recipe=recipe, device="cuda", dtype=torch.bfloat16)
        args = ([1024, 512, 2048, 512],)
        assert F.dgrad_reads_rowwise(recipe, 4096, 1024, 2048, torch.device("cuda"), num_experts=4)
    else:
        model = Linear(2048, 1024, recipe=recipe, device="cuda", dtype=torch.bfloat16)
        args = ()
        assert F.dgrad_reads_rowwise(recipe, 4096, 1024, 2048, torch.device("cuda"))
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    y = model(x, *args)
    y.backward(dy)
    grads, gx = _grads(model), x.grad.clone()
    model.zero_grad(set_to_none=True)
    x.grad = None
    yc = torch.compile(model, fullgraph=True)(x, *args)
    yc.backward(dy)
    assert torch.equal(yc, y) and torch.equal(x.grad, gx)
    assert all(torch.equal(a, b) for a, b in zip(_grads(model), grads))


@pytest.mark.gpu
def test_torch_compile_reduce_overhead_gpu():
    """mode="reduce-overhead" (Inductor's CUDA graphs around forward and backward) runs the quantized
    layers (no allocation of theirs outlives the recorded graphs) and gives the eager step's values."""
    recipe = NVFP4Recipe.te_default(stochastic_rounding=False)
    torch.manual_seed(0)
    model = nn.Sequential(Linear(256, 256, recipe=recipe), nn.GELU(), Linear(256, 128, recipe=recipe)).cuda()
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    y = model(x)
    y.float().square().sum().backward()
    grads = _grads(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(3):  # warm-up, recording, replay
        model.zero_grad(set_to_none=True)
        yc = compiled(x)
        yc.float().square().sum().backward()
    torch.testing.assert_close(yc, y, rtol=2**-7, atol=1e-2)
    for a, b in zip(_grads(model), grads):
        torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-2 * b.abs().max().item())


# ------------------------------------------------------------------------------ CUDA graphs
def _graphed_training(recipe, steps=5, d=128):
    torch.manual_seed(0)
    model = nn.Sequential(Linear(d, d, recipe=recipe), nn.GELU(), Linear(d, 64, recipe=recipe)).cuda()
    eager = copy.deepcopy(model)
    data = [(torch.randn(256, d, device="cuda"), torch.randn(256, 64, device="cuda")) for _ in range(3 + steps)]

    def loss_fn(m, x, t):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):  # graphs need no autocast cache
            return (m(x).float() - t).square().mean()

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    static_x, static_t = data[0][0].clone(), data[0][1].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up steps, as torch.cuda.graph requires
        for x, t in data[:3]:
            static_x.copy_(x)
            static_t.copy_(t)
            opt.zero_grad(set_to_none=True)
            loss_fn(model, static_x, static_t).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model, static_x, static_t)
        static_loss.backward()
        opt.step()
    graphed = []
    for x, t in data[3:]:
        static_x.copy_(x)
        static_t.copy_(t)
        graph.replay()
        graphed.append(static_loss.item())
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.05)
    eager_losses = []
    for x, t in data:
        eager_opt.zero_grad(set_to_none=True)
        loss = loss_fn(eager, x, t)
        loss.backward()
        eager_opt.step()
        eager_losses.append(loss.item())
    return graphed, eager_losses[3:], model, eager


@pytest.mark.gpu
def test_cuda_graph_capture_of_a_training_step():
    recipe = NVFP4Recipe.te_default(stochastic_rounding=False)  # deterministic: compare with eager
    graphed, eager, model, eager_model = _graphed_training(recipe)
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=1e-3, atol=0)
    for a, b in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
def test_cuda_graph_capture_with_stochastic_rounding():
    graphed, eager, _, _ = _graphed_training(NVFP4Recipe.te_default())
    assert all(torch.isfinite(torch.tensor(graphed)))
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=0.1, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,k,n", [(512, 256, 128), (4096, 2048, 1024)])  # Triton GEMMs; cuBLAS on expanded operands
@pytest.mark.parametrize("preset", ["te_default", "per_token"])
def test_make_graphed_callables_gives_the_eager_bits(preset, tokens, k, n):
    """torch.cuda.make_graphed_callables (PyTorch's route for host-bound small layers): forward and backward
    replays give the eager layer's y, dx and dW bit for bit over SGD steps (the weight is quantized inside the
    captured forward, so each replay sees the updated weight). SR off: the same bits in both."""
    recipe = GRAPH_PRESETS[preset]
    torch.manual_seed(0)
    layer = Linear(k, n, recipe=recipe).to("cuda", torch.bfloat16)
    eager = copy.deepcopy(layer)
    sample = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(layer, (sample,))
    for step in range(3):
        x_graph = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        x_eager = x_graph.detach().clone().requires_grad_()
        dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
        y_graph = graphed(x_graph)
        y_graph.backward(dy)
        y_eager = eager(x_eager)
        y_eager.backward(dy)
        assert torch.equal(y_graph, y_eager), step
        assert torch.equal(x_graph.grad, x_eager.grad), step
        for a, b in ((layer.weight, eager.weight), (layer.bias, eager.bias)):
            assert torch.equal(a.grad, b.grad), step
        with torch.no_grad():  # SGD, consuming the replayed grads before the next replay
            for m in (layer, eager):
                for p in m.parameters():
                    p.add_(p.grad, alpha=-0.05)
                    p.grad = None


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,k,n", [(512, 256, 128), (4096, 2048, 1024)])
def test_a_captured_forward_draws_the_gradients_sr_seed(tokens, k, n):
    """In a captured layer (make_graphed_callables), dy's stochastic-rounding seed is drawn by the forward graph, off
    the backward's critical path: two backward replays after one forward replay give the same dx and dW bit for bit,
    and the next forward replay draws a new seed (new bits for the same x and dy)."""
    torch.manual_seed(0)
    layer = Linear(k, n, recipe=NVFP4Recipe.te_default()).to("cuda", torch.bfloat16)
    sample = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(layer, (sample,))
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)

    def backward(y):
        return [g.clone() for g in torch.autograd.grad(y, (x, layer.weight), dy, retain_graph=True)]

    y = graphed(x)
    first, again = backward(y), backward(y)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    fresh = backward(graphed(x))
    assert not torch.equal(fresh[1], first[1]) and not torch.equal(fresh[0], first[0])


# MoE: an empty expert, and splits that need token padding for the columnwise copies (sum 256)
GRAPH_SPLITS = [40, 0, 72, 24, 120]
GRAPH_PRESETS = {  # stochastic rounding off: replays and eager steps then run the same bits
    "te_default": NVFP4Recipe.te_default(stochastic_rounding=False),
    "per_token": NVFP4Recipe.per_token(stochastic_rounding=False),
    "four_over_six": NVFP4Recipe.four_over_six(stochastic_rounding=False),
}


def _grouped_graph_vs_eager(recipe, caller, monkeypatch, replays=3, k=128, n=64):
    """Captures one GroupedLinear training step (forward, loss, backward into .grad) after warm-up
    steps on a side stream, replays it on new data copied into the static input and target, and runs
    an eager step of an identical module on the same data. Returns (name, replayed, eager) for y, the
    loss, x.grad and every parameter's grad, per replay. caller: "module" (its split cache) or
    "functional" (grouped_linear without a cache: the offsets are then built in the capture, by fills)."""
    from nvfp4lab import ops

    torch.manual_seed(0)
    model = GroupedLinear(len(GRAPH_SPLITS), k, n, recipe=recipe).cuda()
    eager = copy.deepcopy(model)
    names = ["y", "loss", "x.grad"] + [f"{name}.grad" for name, _ in model.named_parameters()]
    tokens = sum(GRAPH_SPLITS)
    data = [(torch.randn(tokens, k, device="cuda"), torch.randn(tokens, n, device="cuda")) for _ in range(2 + replays)]

    def step(m, x, t):
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            if caller == "module":
                y = m(x, GRAPH_SPLITS)
            else:
                y = F.grouped_linear(x, GRAPH_SPLITS, m.weights, m.biases, recipe=m.recipe)
        loss = (y.float() - t).square().mean()
        loss.backward()
        return y, loss

    def load(x, t):
        with torch.no_grad():
            static_x.copy_(x)
            static_t.copy_(t)

    static_x = data[0][0].clone().requires_grad_(True)
    static_t = data[0][1].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernel compiles, the module's split and weight caches
        for x, t in data[:2]:
            load(x, t)
            static_x.grad = None
            model.zero_grad(set_to_none=True)
            step(model, static_x, static_t)
    torch.cuda.current_stream().wait_stream(side)
    static_x.grad = None
    model.zero_grad(set_to_none=True)  # the captured backward allocates the grads in the graph's pool
    copies_in_capture = []
    real_copy = ops.host_ints_on_device
    monkeypatch.setattr(ops, "host_ints_on_device", lambda *a, **kw: copies_in_capture.append(1) or real_copy(*a, **kw))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y, static_loss = step(model, static_x, static_t)
    monkeypatch.setattr(ops, "host_ints_on_device", real_copy)
    if caller == "module":
        assert copies_in_capture == [] and len(model._split_layouts) == 1  # the warm-up's layout is reused
    else:
        assert copies_in_capture, "without a cache the functional call builds its offsets in the capture"
    results = []
    for x, t in data[2:]:
        load(x, t)
        graph.replay()
        replayed = [static_y.clone(), static_loss.clone(), static_x.grad.clone()] + _grads(model)
        x_eager = x.clone().requires_grad_(True)
        eager.zero_grad(set_to_none=True)
        y, loss = step(eager, x_eager, t)
        results.append(list(zip(names, replayed, [y, loss, x_eager.grad] + _grads(eager))))
    return results


@pytest.mark.gpu
@pytest.mark.parametrize("caller", ["module", "functional"])
@pytest.mark.parametrize("preset", list(GRAPH_PRESETS))
def test_cuda_graph_capture_of_a_grouped_linear_training_step(preset, caller, monkeypatch):
    for replay in _grouped_graph_vs_eager(GRAPH_PRESETS[preset], caller, monkeypatch):
        for name, got, want in replay:
            assert torch.equal(got, want), name


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["te_default", "four_over_six"])
def test_cuda_graph_capture_where_dgrad_reads_the_rowwise_weight(preset, monkeypatch, dgrad_from_rowwise):
    """The dgrad from the stacked weights' rowwise copy transposed (forced at this size) captures and replays with
    the eager step's bits."""
    for replay in _grouped_graph_vs_eager(GRAPH_PRESETS[preset], "module", monkeypatch):
        for name, got, want in replay:
            assert torch.equal(got, want), name


@pytest.mark.gpu
def test_cuda_graph_capture_of_a_grouped_linear_step_with_stochastic_rounding(monkeypatch):
    # te_default rounds dy stochastically with seeds drawn on the device: replays and eager steps draw
    # different ones, so y, the loss and the bias grads (from dy itself) are exact, while dx and dW
    # differ by dy's rounding noise (SQNR ~17 dB: ~0.2 relative between two draws)
    for replay in _grouped_graph_vs_eager(NVFP4Recipe.te_default(), "module", monkeypatch):
        for name, got, want in replay:
            if name in ("y", "loss") or name.startswith("bias"):
                assert torch.equal(got, want), name
            else:
                assert torch.isfinite(got).all(), name
                assert (got - want).norm() <= 0.5 * want.norm(), name


# ----------------------------------------------------------------------------------- training
LOSS_FACTOR = 1.6  # a preset's final loss must be within 1.6x of BF16's (CPU: 1.04x MXFP8, 1.34-1.37x NVFP4;
#                    training only the last layer gives ~5x)


def _train_mlp(recipe, device, backend, steps=200, d=64, out=32, batch=64, noise=0.1):
    """4-layer MLP on a fixed synthetic regression (teacher tanh(x A) B + noise, fresh batch each step),
    Adam, autocast bf16. Returns (first loss, mean of the last 20 losses)."""
    g = torch.Generator().manual_seed(0)
    teacher_a = torch.randn(d, d, generator=g) / d**0.5
    teacher_b = torch.randn(d, out, generator=g) / d**0.5
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d), nn.GELU(), nn.Linear(d, d), nn.GELU(), nn.Linear(d, out))
    if recipe is not None:
        assert len(convert(model, recipe, backend=backend).converted) == 4
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(1)
    losses = []
    for step in range(steps):
        gs = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(batch, d, generator=gs)
        target = torch.tanh(x @ teacher_a) @ teacher_b + noise * torch.randn(batch, out, generator=gs)
        x, target = x.to(device), target.to(device)
        with torch.autocast(device, dtype=torch.bfloat16):
            pred = model(x)
        loss = (pred.float() - target).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses[0], sum(losses[-20:]) / 20


@pytest.fixture(scope="module")
def bf16_losses():
    cache = {}

    def get(device):
        if device not in cache:
            cache[device] = _train_mlp(None, device, None)
        return cache[device]

    return get


@pytest.mark.parametrize("device_backend", DEVICES)
@pytest.mark.parametrize("preset", list(PRESETS))
def test_mlp_trains_within_factor_of_bf16(preset, device_backend, bf16_losses):
    device, backend = device_backend
    first_bf16, final_bf16 = bf16_losses(device)
    first, final = _train_mlp(PRESETS[preset], device, backend)
    assert abs(first - first_bf16) < 0.05 * first_bf16  # same seeds, same start
    assert final < 0.25 * first, f"{preset} did not train: {first:.4f} -> {final:.4f}"
    assert final < LOSS_FACTOR * final_bf16, f"{preset}: final loss {final:.4f} vs BF16 {final_bf16:.4f}"


def test_grouped_linear_keeps_its_weights_packed():
    # one (E, N, K) storage at construction and after moves and casts, the Parameter objects unchanged;
    # a replaced weight unpacks them, and the layer still gives the bits of the packed one
    layer = GroupedLinear(3, 32, 16, bias=False, recipe=NVFP4Recipe.te_default(stochastic_rounding=False))
    params = list(layer.parameters())
    assert F.packed_weights(layer.weights) is not None
    layer.to(torch.bfloat16)
    assert [p is q for p, q in zip(params, layer.parameters())] == [True] * 3
    packed = F.packed_weights(layer.weights)
    assert packed is not None and packed.dtype == torch.bfloat16
    x = torch.randn(48, 32, dtype=torch.bfloat16)
    splits = [16, 0, 32]
    y_packed = layer(x, splits)
    layer.weight1 = torch.nn.Parameter(layer.weight1.detach().clone())
    assert F.packed_weights(layer.weights) is None
    assert torch.equal(layer(x, splits), y_packed)
    assert layer.pack_weights() and F.packed_weights(layer.weights) is not None
    assert torch.equal(layer(x, splits), y_packed)
