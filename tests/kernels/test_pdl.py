"""Programmatic dependent launch: which launches take it, and that every kernel of the package waits for the prior grid
before it touches memory (a kernel launched with PDL that read first could see the previous kernel's writes unfinished)."""
import ast
import importlib
import inspect
import pkgutil
import textwrap

import pytest
import torch
import triton
import triton.language as tl

import nvfp4lab.kernels
from nvfp4lab.kernels import pdl, swizzle
from nvfp4lab.ref import swizzle as ref_swizzle


def _package_kernels() -> dict:
    """Every ``@triton.jit`` function named ``*_kernel`` defined in nvfp4lab.kernels."""
    found = {}
    for info in pkgutil.walk_packages(nvfp4lab.kernels.__path__, nvfp4lab.kernels.__name__ + "."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            fn = getattr(obj, "fn", None)
            if name.endswith("_kernel") and hasattr(obj, "arg_names") and getattr(fn, "__module__", "") == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


KERNELS = _package_kernels()


def test_the_kernel_walk_finds_the_launched_kernels():
    names = {name.rsplit(".", 1)[1] for name in KERNELS}
    assert {"cast16_kernel", "cast_row_kernel", "amax_kernel", "expand_kernel", "_swizzle_kernel"} <= names


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_waits_for_the_prior_grid_before_anything_else(name):
    kernel = KERNELS[name]
    assert kernel.arg_names[-1] == "PDL", "every kernel takes PDL last (Launch sets it from sm_90 on)"
    body = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn))).body[0].body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    assert ast.unparse(body[0]) == "wait_prior_grid(PDL)"


@triton.jit
def _no_pdl_kernel(x_ptr, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), tl.zeros([BLOCK], tl.int32))


def test_pdl_meta_only_on_sm90_and_later_for_kernels_that_wait():
    meta = {"BLOCK_COLS": 64, "num_warps": 4}
    on = pdl.pdl_meta(swizzle._swizzle_kernel, meta, (9, 0))
    assert on == {"BLOCK_COLS": 64, "num_warps": 4, "PDL": True, "launch_pdl": True}
    assert meta == {"BLOCK_COLS": 64, "num_warps": 4}  # the caller's meta is not changed
    assert pdl.pdl_meta(swizzle._swizzle_kernel, meta, (10, 0)) == on
    assert pdl.pdl_meta(swizzle._swizzle_kernel, meta, (8, 9)) is meta  # Ampere: no griddepcontrol
    assert pdl.pdl_meta(swizzle._swizzle_kernel, meta, None) is meta  # the interpreter
    assert pdl.pdl_meta(_no_pdl_kernel, meta, (9, 0)) is meta  # a kernel that does not wait


@pytest.mark.gpu
def test_gpu_chained_launches_take_pdl_and_see_each_others_writes():
    """A graph of 20 dependent swizzle / unswizzle launches, each reading what the one before wrote: the result is the
    reference's, and on sm_90+ the launches were compiled with PDL."""
    rows, cols = 300, 37
    scale = torch.randint(0, 256, (rows, cols), dtype=torch.uint8, device="cuda")
    want = ref_swizzle.swizzle_scales(scale.cpu())
    launch_s = swizzle.swizzle_launch(rows, cols)
    bufs = [torch.full((want.numel(),), 0xFF, dtype=torch.uint8, device="cuda") for _ in range(10)]
    backs = [torch.full((rows, cols), 0xFF, dtype=torch.uint8, device="cuda") for _ in range(10)]

    def chain():
        src = scale
        for buf, back in zip(bufs, backs):
            launch_s(src, buf, rows, cols, -(-cols // 4))
            swizzle.launch_unswizzle(buf, rows, cols, back)
            src = back

    chain()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for buf in bufs:
        buf.fill_(0xFF)
    for back in backs:
        back.fill_(0xFF)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(bufs[-1].cpu(), want.flatten())
    assert torch.equal(backs[-1].cpu(), scale.cpu())
    assert launch_s.handle.metadata.launch_pdl == (torch.cuda.get_device_capability()[0] >= 9)
