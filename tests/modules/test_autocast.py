"""nvfp4lab.autocast (nvfp4lab/autocasting.py) against passing the recipe explicitly: layers built without
a recipe take the context's, enabled=False runs every layer in high precision, contexts nest and restore,
and the state holds under torch.compile and CUDA-graph capture."""
import pytest
import torch

import nvfp4lab
from nvfp4lab import NVFP4BlockScaling, NVFP4PerTokenBlockScaling, NVFP4Recipe
from nvfp4lab.autocasting import autocast_enabled, autocast_recipe

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the Triton interpreter's x/0 warns

# RN recipes (no SR): two runs give the same bits whatever the random state
RECIPES = {
    "pr3045": NVFP4PerTokenBlockScaling(per_token_rht=True, per_token_weight_2d=True),
    "te-row-scaled": NVFP4BlockScaling(disable_rht=True, disable_stochastic_rounding=True, row_scaled_activation=True),
    "mxfp8": nvfp4lab.MXFP8Recipe(),
}


def _pair(recipe, backend="ref", grouped=False):
    """(layer without a recipe, layer with ``recipe``), sharing their parameters."""
    torch.manual_seed(0)
    if grouped:
        free = nvfp4lab.GroupedLinear(2, 64, 32, backend=backend)
        fixed = nvfp4lab.GroupedLinear(2, 64, 32, recipe=recipe, backend=backend)
        for name, p in free.named_parameters():
            setattr(fixed, name, p)
    else:
        free = nvfp4lab.Linear(64, 32, backend=backend)
        fixed = nvfp4lab.Linear(64, 32, recipe=recipe, backend=backend)
        fixed.weight, fixed.bias = free.weight, free.bias
    return free, fixed


def _step(layer, x, grouped=False):
    """Forward and backward; returns (y, dx, grads of the parameters), clearing them."""
    x = x.clone().requires_grad_(True)
    y = layer(x, [16, 32]) if grouped else layer(x)
    y.float().pow(2).sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad(set_to_none=True)
    return [y.detach(), x.grad, *grads]


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("name", list(RECIPES))
def test_context_recipe_equals_explicit_recipe(name, grouped):
    free, fixed = _pair(RECIPES[name], grouped=grouped)
    x = torch.randn(48, 64)
    with nvfp4lab.autocast(recipe=RECIPES[name]):
        got = _step(free, x, grouped)
        assert free.recipe == fixed.recipe
    want = _step(fixed, x, grouped)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert free.recipe == NVFP4Recipe.te_default()  # outside every context: TE's default NVFP4 recipe
    assert not torch.equal(_step(free, x, grouped)[0], want[0])


@pytest.mark.parametrize("grouped", [False, True])
def test_disabled_runs_every_layer_in_high_precision(grouped):
    free, fixed = _pair(RECIPES["pr3045"], grouped=grouped)
    torch.manual_seed(0)
    if grouped:
        plain = nvfp4lab.GroupedLinear(2, 64, 32)
        for name, p in free.named_parameters():
            setattr(plain, name, p)
    x = torch.randn(48, 64)
    with nvfp4lab.autocast(enabled=False, recipe=RECIPES["pr3045"]):
        got_free, got_fixed = _step(free, x, grouped), _step(fixed, x, grouped)
    xs = x.clone().requires_grad_(True)
    if grouped:
        parts = xs.split([16, 32])
        y = torch.cat([torch.nn.functional.linear(p, getattr(free, f"weight{i}"), getattr(free, f"bias{i}"))
                       for i, p in enumerate(parts)])
    else:
        y = torch.nn.functional.linear(xs, free.weight, free.bias)
    y.float().pow(2).sum().backward()
    want = [y.detach(), xs.grad, *[p.grad.clone() for p in free.parameters()]]
    for a, b, c in zip(got_free, got_fixed, want):
        assert torch.equal(a, c) and torch.equal(b, c)


def test_contexts_nest_and_restore():
    a, b = NVFP4Recipe.pr3045(), NVFP4Recipe.per_token()
    assert autocast_enabled() and autocast_recipe() == NVFP4Recipe.te_default()
    with nvfp4lab.autocast(recipe=a):
        with nvfp4lab.autocast(enabled=False):
            assert not autocast_enabled()
            with nvfp4lab.autocast(recipe=NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True)):
                assert autocast_enabled() and autocast_recipe() == b
            assert not autocast_enabled()
        assert autocast_enabled() and autocast_recipe() == a
        with nvfp4lab.autocast():  # as TE: recipe=None is the default recipe, not the outer one
            assert autocast_recipe() == NVFP4Recipe.te_default()
        with pytest.raises(KeyError):
            with nvfp4lab.autocast(enabled=False):
                raise KeyError("left by an exception")
        assert autocast_enabled() and autocast_recipe() == a
    assert autocast_enabled() and autocast_recipe() == NVFP4Recipe.te_default()


def test_decorator_and_misuse():
    @nvfp4lab.autocast(enabled=False)
    def depth(n):
        assert not autocast_enabled()
        return 0 if n == 0 else 1 + depth(n - 1)  # recursive calls nest fresh contexts

    assert depth(3) == 3 and autocast_enabled()
    ctx = nvfp4lab.autocast()
    with ctx:
        with pytest.raises(RuntimeError, match="already active"):
            ctx.__enter__()
    with pytest.raises(TypeError, match="enabled must be a bool"):
        nvfp4lab.autocast(enabled=1)
    with pytest.raises(TypeError, match="recipe must be"):
        nvfp4lab.autocast(recipe="te")


def test_layer_state_follows_the_context():
    free, fixed = _pair(RECIPES["pr3045"])
    assert free.follows_autocast and not fixed.follows_autocast
    assert "recipe=autocast" in repr(free)
    with nvfp4lab.autocast(recipe=NVFP4Recipe.pr3045()):
        state = free.state_dict()  # the recipe active when the state_dict is taken
        assert fixed.recipe == NVFP4Recipe.pr3045(rht=True, weight_2d=True)  # its own, not the context's
    with pytest.raises(ValueError, match="saved recipe differs"):
        nvfp4lab.Linear(64, 32, recipe=NVFP4Recipe.per_token()).load_state_dict(state)
    nvfp4lab.Linear(64, 32, recipe=NVFP4Recipe.pr3045()).load_state_dict(state)
    free.load_state_dict(nvfp4lab.Linear(64, 32, recipe=NVFP4Recipe.per_token()).state_dict())  # takes any recipe
    assert free.follows_autocast


def test_convert_without_a_recipe_follows_the_context():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    fixed = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    fixed.load_state_dict(model.state_dict())
    nvfp4lab.convert(model, backend="ref")
    nvfp4lab.convert(fixed, RECIPES["te-row-scaled"], backend="ref")
    assert all(m.follows_autocast for m in model if isinstance(m, nvfp4lab.Linear))
    x = torch.randn(32, 64)
    with nvfp4lab.autocast(recipe=RECIPES["te-row-scaled"]):
        assert torch.equal(model(x), fixed(x))
    with nvfp4lab.autocast(enabled=False):
        assert torch.equal(model(x), torch.relu(x @ model[0].weight.t() + model[0].bias) @ model[2].weight.t() + model[2].bias)


def test_torch_compile_reads_the_context():
    """Compiled code guards on the autocast state: each state gives the eager result of the explicit recipe."""
    free, fixed_pr = _pair(RECIPES["pr3045"], backend="triton")
    fixed_default = nvfp4lab.Linear(64, 32, recipe=NVFP4Recipe.te_default(), backend="triton")
    fixed_default.weight, fixed_default.bias = free.weight, free.bias
    compiled = torch.compile(free, fullgraph=True)
    x = torch.randn(32, 64)
    with torch.no_grad():
        with nvfp4lab.autocast(recipe=RECIPES["pr3045"]):
            assert torch.equal(compiled(x), fixed_pr(x))
        with nvfp4lab.autocast(enabled=False):
            assert torch.equal(compiled(x), torch.nn.functional.linear(x, free.weight, free.bias))
        assert torch.equal(compiled(x), fixed_default(x))
        with nvfp4lab.autocast(recipe=RECIPES["pr3045"]):
            assert torch.equal(compiled(x), fixed_pr(x))


@pytest.mark.gpu
def test_gpu_cuda_graph_captures_the_context_at_capture_time():
    free, fixed = _pair(RECIPES["pr3045"], backend="triton")
    free, fixed = free.cuda(), fixed.cuda()
    fixed.weight, fixed.bias = free.weight, free.bias
    x = torch.randn(64, 64, device="cuda")
    with torch.no_grad(), nvfp4lab.autocast(recipe=RECIPES["pr3045"]):
        free(x)  # warm-up (kernel compilation)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            free(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = free(x)
    want = fixed(x).detach()
    with nvfp4lab.autocast(enabled=False):  # replay under another state: still the captured kernels
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, want)
    with torch.no_grad(), nvfp4lab.autocast(enabled=False):
        graph2 = torch.cuda.CUDAGraph()
        free(x)
        with torch.cuda.graph(graph2):
            y2 = free(x)
    graph2.replay()
    torch.cuda.synchronize()
    assert torch.equal(y2, torch.nn.functional.linear(x, free.weight, free.bias))
