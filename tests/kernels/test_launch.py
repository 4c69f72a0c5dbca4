"""The host path, guarded by counting instead of timing: Triton launches, torch ops and custom-op
dispatches of one eager quantize call and of one Linear step (Triton backend, under the interpreter),
and the dispatcher path whenever a call is traced (fake tensors, make_fx, torch.compile). And every
launch the library makes, built for sm_90 by Triton's code generator (which the interpreter skips)."""
import json
import os
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import nvfp4lab
from nvfp4lab.kernels import launch

triton = pytest.importorskip("triton")

# ops that only reinterpret metadata (no allocation, no kernel)
_METADATA_OPS = {"view", "reshape", "_reshape_alias", "as_strided", "slice", "select", "detach", "t", "transpose",
                 "expand", "unsqueeze", "squeeze", "alias", "_unsafe_view", "split", "split_with_sizes", "permute",
                 "lift_fresh", "unbind", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size",
                 "numel", "size", "stride", "dim"}


class _Count(TorchDispatchMode):
    """Counts the torch ops that run (allocations and kernels; metadata-only ops left out) and the
    nvfp4lab custom ops that went through the dispatcher."""

    def __init__(self, in_kernel: list):
        super().__init__()
        self.in_kernel = in_kernel  # the interpreter's own tensor copies while a kernel runs are not counted
        self.torch_ops = Counter()
        self.custom_ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if self.in_kernel:
            pass
        elif name.startswith("nvfp4lab::"):
            self.custom_ops[name] += 1
        elif func.__name__.split(".")[0] not in _METADATA_OPS:
            self.torch_ops[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def count(monkeypatch):
    """Runs a callable once and returns (Triton launches, Counter of torch ops, Counter of custom ops)."""
    interpreter = pytest.importorskip("triton.runtime.interpreter")
    launches, in_kernel = [], []
    real_run = interpreter.InterpretedFunction.run

    def counting_run(self, *args, **kwargs):
        launches.append(self.fn.__name__)
        in_kernel.append(1)
        try:
            return real_run(self, *args, **kwargs)
        finally:
            in_kernel.pop()

    monkeypatch.setattr(interpreter.InterpretedFunction, "run", counting_run)

    def run(fn):
        fn()  # warm-up: lazily built state (the amax scratch, compiled kernels) is not per call
        launches.clear()
        with _Count(in_kernel) as mode:
            fn()
        return list(launches), mode.torch_ops, mode.custom_ops

    return run


def _total(counter):
    return sum(counter.values())


@pytest.mark.parametrize("options, max_launches, max_torch_ops", [
    (dict(), 2, 6),  # amax + cast; 4 outputs (2 of them empty) + 2 amax outputs (1 empty)
    (dict(columnwise=True), 2, 6),
    (dict(columnwise=True, block="16x16"), 2, 6),
    (dict(columnwise=True, rht=True), 2, 6),
    (dict(columnwise=True, rht=True, stochastic_rounding=True, seed=7), 2, 6),
    (dict(columnwise=True, per_token=True), 3, 8),  # + one launch for the per-token tables of both copies
    (dict(columnwise=True, four_over_six="mae"), 2, 6),
])
def test_quantize_host_path(count, options, max_launches, max_torch_ops):
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    launches, torch_ops, custom_ops = count(lambda: nvfp4lab.quantize_nvfp4(x, backend="triton", **options))
    assert _total(custom_ops) == 0, f"eager calls must not go through the dispatcher: {custom_ops}"
    assert len(launches) <= max_launches, launches
    assert _total(torch_ops) <= max_torch_ops, torch_ops
    assert "zeros" not in torch_ops and "zero_" not in torch_ops and "fill_" not in torch_ops, torch_ops


def test_sr_seed_drawn_on_the_host_in_eager():
    """Without a seed, an eager SR cast takes its seed from the host generator (no kernel), so that
    torch.manual_seed repeats it; a CUDA generator or a traced call draws it on the device."""
    from nvfp4lab.kernels.nvfp4_quantize_details.cast import draw_seed

    x = torch.randn(32, 64)
    torch.manual_seed(3)
    seed_tensor, seed = draw_seed(x)
    torch.manual_seed(3)
    assert seed_tensor is None and seed == draw_seed(x)[1]
    assert draw_seed(x, torch.Generator().manual_seed(5))[1] == draw_seed(x, torch.Generator().manual_seed(5))[1]


def test_sr_seed_traced_on_the_cpu_stays_a_tensor():
    """A traced SR cast of a CPU tensor draws its seed as a tensor from the same generator (a host int would break
    the graph): torch.compile(fullgraph) of an SR quantize without a seed compiles, and repeats the eager bits
    after the same torch.manual_seed."""
    from nvfp4lab.kernels.nvfp4_quantize_details.cast import draw_seed

    x = torch.randn(32, 64)
    torch.manual_seed(4)
    seed_tensor, seed = draw_seed(x, traced=True)
    torch.manual_seed(4)
    assert seed == 0 and seed_tensor.dtype == torch.int64 and int(seed_tensor) == draw_seed(x)[1]

    def fn(inp):
        return nvfp4lab.quantize_nvfp4(inp, columnwise=True, rht=True, stochastic_rounding=True, backend="triton")

    torch.manual_seed(5)
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(x.bfloat16())
    torch.manual_seed(5)
    want = fn(x.bfloat16())
    for field in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field


@pytest.mark.parametrize("name, call, max_launches", [
    ("dequantize", lambda q, w: nvfp4lab.dequantize_nvfp4(q, backend="triton"), 1),
    ("gemm", lambda q, w: nvfp4lab.nvfp4_gemm(q, w, backend="triton"), 3),
])
def test_dequantize_gemm_host_path(count, name, call, max_launches):
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    q = nvfp4lab.quantize_nvfp4(x, backend="triton")
    w = nvfp4lab.quantize_nvfp4(torch.randn(48, 64), backend="triton")
    launches, torch_ops, custom_ops = count(lambda: call(q, w))
    assert _total(custom_ops) == 0, custom_ops
    assert 1 <= len(launches) <= max_launches, launches
    assert dict(torch_ops) == {"empty": 1}, torch_ops  # the output only


def test_gemm_eager_plan_skips_the_op_wrapper(count, monkeypatch):
    """An eager nvfp4_gemm without out launches from its cached plan: neither the custom op's Python
    wrapper nor the generic launcher is called."""
    from nvfp4lab.kernels import nvfp4_gemm as G

    q = nvfp4lab.quantize_nvfp4(torch.randn(32, 64, dtype=torch.bfloat16), backend="triton")
    w = nvfp4lab.quantize_nvfp4(torch.randn(48, 64), backend="triton")
    wrapped = []
    real_impl, real_launch = G._gemm_op.impl, G._launch
    monkeypatch.setattr(G._gemm_op, "impl", lambda *args: wrapped.append("op") or real_impl(*args))
    monkeypatch.setattr(G, "_launch", lambda *args, **kwargs: wrapped.append("_launch") or real_launch(*args, **kwargs))
    launches, _, _ = count(lambda: nvfp4lab.nvfp4_gemm(q, w, backend="triton"))
    assert launches == ["nvfp4_gemm_kernel"] and wrapped == []


def test_grouped_dequant_gemm_one_epilogue(count):
    """The grouped GEMM with host split sizes on the expand + matmul path: one expansion and one
    epilogue launch whatever the number of experts, one matmul per non-empty expert."""
    from nvfp4lab import moe
    from nvfp4lab.kernels import nvfp4_gemm as G

    sizes = [16, 0, 24, 8, 16]
    a = nvfp4lab.quantize_nvfp4(torch.randn(sum(sizes), 64), backend="triton", per_token=True)
    b = moe.stack_weights([nvfp4lab.quantize_nvfp4(torch.randn(32, 64), backend="triton") for _ in sizes])
    offs = torch.tensor(sizes).cumsum(0)
    out = torch.empty(sum(sizes), 32, dtype=torch.bfloat16)
    launches, torch_ops, _ = count(lambda: G.run(a, b, out, offs=offs, num_experts=len(sizes), splits=sizes,
                                                 config=G.GemmConfig(32, 32, 64, dequant_mm=True)))
    assert Counter(launches) == {"expand_kernel": 1, "grouped_epilogue_kernel": 1}, launches
    assert torch_ops["mm"] == 4, torch_ops


@pytest.mark.parametrize("options", [dict(columnwise=True), dict(columnwise=True, rht=True, stochastic_rounding=True)])
def test_grouped_quantize_host_path(count, options):
    """An eager grouped quantize runs from its cached plan: the amax pass (the post-RHT one for RHT casts of bf16 x)
    and the cast (2 launches, or 3 with SR's split row / column casts), no dispatch, and its buffers only (two
    zeroed amax buffers, the group splits, four outputs)."""
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    sizes = [16, 0, 32, 16]
    offsets = torch.tensor([0, 16, 16, 48, 64])
    launches, torch_ops, custom_ops = count(lambda: nvfp4lab.quantize_nvfp4_grouped_bulk(
        x, sizes, split_offsets=offsets, backend="triton", seed=5, **options))
    assert _total(custom_ops) == 0, custom_ops
    amax_kernel = "_grouped_amax_rht_col_kernel" if options.get("rht") else "_grouped_amax_kernel"
    assert Counter(launches)[amax_kernel] == 1 and len(launches) <= 3, launches
    assert torch_ops["zeros"] + torch_ops["zero_"] <= 2 and _total(torch_ops) <= 9, torch_ops


def test_grouped_linear_step_host_path(count):
    """One training step of nvfp4lab.GroupedLinear (4 experts, te_default, Triton backend, an SGD step
    so that the weights are quantized again): no dispatch; launches: grouped amax + cast of the four
    weights (read in place from the layer's packed storage: no stack, no unswizzle), of x and of dy
    (6), fprop and dgrad grouped GEMMs (2), 4 per-expert wgrad GEMMs; bounded torch ops."""
    torch.manual_seed(0)
    layer = nvfp4lab.GroupedLinear(4, 128, 128, bias=False, dtype=torch.bfloat16, backend="triton")
    x = torch.randn(64, 128, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(64, 128, dtype=torch.bfloat16)
    splits = [16, 8, 24, 16]
    opt = torch.optim.SGD(layer.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=False)
        layer(x, splits).backward(dy)
        opt.step()

    launches, torch_ops, custom_ops = count(step)
    assert _total(custom_ops) == 0, custom_ops
    # amax passes: the weights' (16x16), x's and dy's (post-RHT)
    amax = Counter(launches)
    assert (amax["_grouped_amax_kernel"], amax["_grouped_amax_rht_col_kernel"]) == (1, 2), amax
    assert "_unswizzle_kernel" not in launches and "stack" not in torch_ops, (Counter(launches), torch_ops)
    assert len(launches) <= 12, Counter(launches)
    assert _total(torch_ops) <= 60, torch_ops


def _linear_training_step():
    """One training step of a small nvfp4lab.Linear (te_default, Triton backend) as a callable."""
    torch.manual_seed(0)
    layer = nvfp4lab.Linear(64, 48, bias=True, backend="triton")
    x = torch.randn(32, 64, requires_grad=True)
    dy = torch.randn(32, 48)

    def step():
        layer.zero_grad(set_to_none=True)
        layer(x).backward(dy)
        with torch.no_grad():  # an optimizer step: the weight changes, so it is quantized again
            layer.weight.add_(layer.weight.grad, alpha=-1e-3)

    return step


def test_linear_step_host_path(count):
    """One training step of nvfp4lab.Linear (te_default, Triton backend): no dispatch, 10 launches
    (amax + cast for each of x, W and dy; the bias gradient from the column sums of dy's amax pass; 3 GEMMs, one
    launch each at this size) and a bounded number of torch ops (outputs, the zero-filled padding of the padded scale
    layouts at this small size, the weight update)."""
    launches, torch_ops, custom_ops = count(_linear_training_step())
    assert _total(custom_ops) == 0, custom_ops
    assert Counter(launches)["column_sums_kernel"] == 1, Counter(launches)
    assert len(launches) <= 10, Counter(launches)
    assert _total(torch_ops) <= 26, torch_ops


def test_traced_calls_go_through_the_dispatcher():
    """make_fx with fake tensors records the custom ops (their fake implementations run; no kernel):
    one op per quantize (amax pass and cast inside it), one per GEMM."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w):
        q = nvfp4lab.quantize_nvfp4(x, backend="triton", columnwise=True)
        qw = nvfp4lab.quantize_nvfp4(w, backend="triton", rht=True, stochastic_rounding=True, seed=3)
        return q.rowwise_data, q.columnwise_scale, nvfp4lab.nvfp4_gemm(q, qw, backend="triton")

    graph = make_fx(f, tracing_mode="fake")(torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(48, 64))
    targets = [str(node.target) for node in graph.graph.nodes
               if node.op == "call_function" and str(node.target).startswith("nvfp4lab.")]
    assert targets == ["nvfp4lab.nvfp4_quantize.default"] * 2 + ["nvfp4lab.nvfp4_gemm.default"], targets


def test_tracing_rules():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(4)
    assert not launch.tracing(x)
    assert not launch.tracing(torch.nn.Parameter(x))
    with FakeTensorMode() as mode:
        assert launch.tracing(mode.from_tensor(x))


def test_linear_step_host_path_dgrad_from_the_rowwise_weight(count, dgrad_from_rowwise):
    """The same step where dgrad reads W's rowwise copy transposed (the GPU's path for large Linears, forced here):
    W's cast writes no columnwise copy, dgrad expands dy and W (one launch each) into one product with cuBLAS' epilogue
    (the alpha vector written by the expansion launch: no alpha kernel), wgrad likewise dy's columnwise copy and x's
    (x^T's operand made ahead of dy's cast); the bias gradient from dy's amax pass; no dispatch."""
    launches, torch_ops, custom_ops = count(_linear_training_step())
    assert _total(custom_ops) == 0, custom_ops
    assert Counter(launches)["expand_kernel"] == 4 and Counter(launches)["alpha_kernel"] == 0, Counter(launches)
    assert len(launches) <= 12, Counter(launches)
    assert _total(torch_ops) <= 40, torch_ops  # the CPU twin of cuBLASLt's product adds 5 each (casts, mm, scale, copy)


def test_launch_rejects_meta_names_the_kernel_does_not_take():
    """Triton's interpreter ignores a keyword the kernel does not take, a GPU compile fails on it: a Launch refuses
    such a meta on the CPU too, and takes the kernel's constexprs and Triton's launch options."""
    from nvfp4lab.kernels.nvfp4_quantize_details.amax import zero_kernel

    with pytest.raises(ValueError, match=r"zero_kernel: meta names \['DIRECT'\]"):
        launch.Launch(zero_kernel, (1,), dict(BLOCK=16, DIRECT=True))
    launch.Launch(zero_kernel, (1,), dict(BLOCK=16, PDL=False, num_warps=1, enable_fp_fusion=False))


# ------------------------------------------------------------------ every launched kernel builds for sm_90
# The interpreter runs a kernel's Python; only Triton's code generator applies its rules (globals that are not
# constexpr, names rebound with another type or shape, ...), and GPU-only constexprs (HW: inline PTX, PDL) are never
# interpreted. So the library's calls run here on the CPU with their GPU-side paths forced, every launch is recorded
# (kernel, argument types, constexprs) and a child process without the interpreter builds each one's TTIR for sm_90.
_BUILD_SCRIPT = r"""
import importlib, json, sys
from tests.kernels.kernel_checks import sm90_frontend
failures = {}
for module, name, sig, meta, warps in json.loads(sys.stdin.read()):
    fn = getattr(importlib.import_module(module), name)
    variants = [meta]
    if meta.get("HW") is False:  # the GPU's path (inline PTX) too
        variants.append(dict(meta, HW=True))
    if meta.get("DECODE") == 0:  # the GEMM kernels' PTX decode
        variants.append(dict(meta, DECODE=1))
    for variant in variants:
        if "PDL" in fn.arg_names:  # as launched on Hopper (programmatic dependent launch)
            variant = dict(variant, PDL=True)
        try:
            sm90_frontend(fn, sig, variant, warps)
        except Exception as exc:  # report every kernel, not only the first failure
            failures[f"{name} {sorted(variant.items())}"] = str(exc).strip().splitlines()[-1][:300]
print(json.dumps(failures))
"""
_POINTER_TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int64: "*i64",
                  torch.int32: "*i32", torch.int16: "*i16", torch.int8: "*i8", torch.uint8: "*u8",
                  torch.float8_e4m3fn: "*fp8e4nv", torch.float8_e5m2: "*fp8e5"}
# thresholds below which the GPU-side launch choices (split casts, cast_row / cast_col / cast_rowcol, the 1x16 4over6
# kernel, operand casts) do not happen at the tests' sizes
_GPU_PATHS = dict(SPLIT_CAST_MIN_ELEMENTS=dict.fromkeys(("rht", "rht_sr", "sr"), 0),
                  SPLIT_CAST_MIN_ELEMENTS_GRAPHED=dict.fromkeys(("rht", "rht_sr", "sr"), 0), CAST_ROW_MIN_ELEMENTS=0,
                  CAST_ROW_SPLIT_MIN_ELEMENTS=0, CAST_COL_MIN_ELEMENTS=0, CAST_ROWCOL_MIN_ELEMENTS=0,
                  FOUR_OVER_SIX_1X16_MIN_ELEMENTS=0, OPERAND_CAST_MIN_ELEMENTS=0, FPROP_OPERAND_CAST_MIN_ELEMENTS=0)


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return _POINTER_TYPES[value.dtype]
    if isinstance(value, float):
        return "fp32"
    return "i32" if -(1 << 31) <= value < (1 << 31) else "i64"


def _record_launches(monkeypatch) -> dict:
    """Record each launch's (module, kernel, argument types, constexprs, num_warps), once per distinct one."""
    import inspect
    records = {}
    real_call = launch.Launch.__call__

    def call(self, *args):
        fn = self.kernel.fn
        params = inspect.signature(fn).parameters
        runtime = [n for n, p in params.items() if "constexpr" not in str(p.annotation)]
        sig = {n: _arg_type(a) for n, a in zip(runtime, args)}
        meta = {k: v for k, v in self.meta.items() if k in params}
        record = [fn.__module__, fn.__name__, sig, meta, self.meta.get("num_warps", 4)]
        records[json.dumps(record, sort_keys=True)] = record
        return real_call(self, *args)

    monkeypatch.setattr(launch.Launch, "__call__", call)
    return records


def _library_calls():
    """Quantize calls of every recipe family (both copies, SR, RHT, per token, 4over6, PR 3045), the bias-gradient and
    operand casts, grouped quantize, MXFP8, dequantize, and a Linear / GroupedLinear training step per recipe."""
    from nvfp4lab import NVFP4QuantConfig, ops
    from nvfp4lab.recipes import from_recipe_name
    T = "triton"  # on the CPU the ops default to the reference
    torch.manual_seed(0)
    x = torch.randn(64, 128, dtype=torch.bfloat16)
    configs = [dict(rowwise=True), dict(rowwise=False, columnwise=True), dict(rowwise=True, columnwise=True),
               dict(block="16x16", rowwise=True, columnwise=True), dict(per_token=True, rowwise=True, columnwise=True),
               dict(rht=True, rowwise=True, columnwise=True), dict(rht=True, rowwise=False, columnwise=True),
               dict(per_token=True, numerics="te_pr3045", rowwise=True, columnwise=True),
               dict(per_token=True, numerics="te_pr3045", rht=True, rowwise=True, columnwise=True)]
    configs += [dict(c, stochastic_rounding=True) for c in configs]
    configs += [dict(four_over_six=mode, e4m3_max=e, rowwise=True, columnwise=True, **extra)
                for mode, e in (("mae", 256), ("mse", 448))
                for extra in (dict(), dict(block="16x16"), dict(per_token=True))]
    for kwargs in configs:
        config = NVFP4QuantConfig(**kwargs)
        q = ops.quantize_nvfp4(x, config=config, seed=3, backend=T)
        for which in ("rowwise", "columnwise"):
            if getattr(q, f"{which}_data") is not None:
                ops.dequantize_nvfp4(q, dtype=torch.bfloat16, which=which, backend=T)
        if config.rowwise and config.columnwise and not config.four_over_six and not config.broadcast_2d:
            ops.quantize_nvfp4_dbias(x, config=config, dbias_dtype=torch.bfloat16, seed=3, backend=T)
            for sides in ((True, True), (True, False), (False, True)):
                ops.quantize_nvfp4_operands(x, config=config, rowwise_operand=sides[0], columnwise_operand=sides[1],
                                            seed=3, backend=T)
        if not config.four_over_six and config.numerics != "te_pr3045":
            ops.quantize_nvfp4_grouped(x, [16, 32, 16], config=config, seed=3, backend=T)
    ops.dequantize_mxfp8(ops.quantize_mxfp8(x, rowwise=True, columnwise=True, backend=T), dtype=torch.bfloat16, backend=T)
    # the GEMM's GPU path (operands expanded to 16 bits, a matmul, the epilogue; per tensor and per token; its PTX
    # decode, which the interpreter cannot run, is built as a variant)
    from nvfp4lab.kernels import nvfp4_gemm
    for per_token in (False, True):
        config = NVFP4QuantConfig(rowwise=True, per_token=per_token)
        a = ops.quantize_nvfp4(x, config=config, backend=T)
        b = ops.quantize_nvfp4(x[:32], config=NVFP4QuantConfig(rowwise=True, scale_layout="swizzled"), backend=T)
        nvfp4_gemm.run(a, b, torch.empty(64, 32, dtype=torch.bfloat16), bias=torch.zeros(32, dtype=torch.bfloat16),
                       config=nvfp4_gemm.GemmConfig(32, 32, 64, dequant_mm=True), decode=0)
    for name in ("te", "nvfp4-pt-ptg-sr", "nvfp4-pr3045-rht-sr", "nvfp4-4o6mae", "nvfp4-w2d-4o6mse448", "mxfp8"):
        recipe = from_recipe_name(name)
        layer = nvfp4lab.Linear(128, 64, bias=True, dtype=torch.bfloat16, recipe=recipe, backend="triton")
        xr = x.clone().requires_grad_()
        layer(xr).backward(torch.randn(64, 64, dtype=torch.bfloat16))
        if name in ("te", "nvfp4-pt-ptg-sr"):
            grouped = nvfp4lab.GroupedLinear(3, 128, 64, bias=False, dtype=torch.bfloat16, recipe=recipe, backend="triton")
            grouped(xr, [16, 32, 16]).backward(torch.randn(64, 64, dtype=torch.bfloat16))


def test_every_launched_kernel_builds_for_sm90(monkeypatch, plan_flags):
    """Every kernel launch of the library's calls (``_library_calls``, run twice: with the default launch choices, then
    with the ones the GPU makes at its sizes forced and DIRECT amax passes) passes Triton's code generator for sm_90
    with the launch's own argument types and constexprs, the GPU's inline-PTX (HW, DECODE) and PDL variants included;
    the launches both runs share are built once."""
    import subprocess
    import sys
    from pathlib import Path

    from nvfp4lab.kernels import nvfp4_quantize as kq

    records = _record_launches(monkeypatch)
    _library_calls()
    default = len(records)
    plan_flags(**_GPU_PATHS)
    monkeypatch.setattr(kq, "keep_buffers", lambda device: False)
    _library_calls()
    assert default > 20 and len(records) > default, (default, len(records))
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join((str(root / "src"), str(root))))
    proc = subprocess.run([sys.executable, "-c", _BUILD_SCRIPT], input=json.dumps(list(records.values())), env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failures, failures
