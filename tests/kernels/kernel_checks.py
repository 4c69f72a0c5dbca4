"""Checks the kernel tests share: bit-exact float comparison, operand outputs against expanded copies, kernels that
must not launch, the
golden conformance cases run through the Triton backend, and the host copy of the SR random bytes and of the
values SR rounds."""
import os
from pathlib import Path

import numpy as np
import torch

from nvfp4lab.conformance import default_folder, run_folder
from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.kernels.launch import Launch
from nvfp4lab.ref import codecs
from nvfp4lab.ref import gemm as ref_gemm
from nvfp4lab.ref import nvfp4 as ref_nvfp4

# the tensor fields of a quantize result, in the order the tests compare them
FIELDS = ("rowwise_data", "rowwise_scale", "rowwise_amax", "columnwise_data", "columnwise_scale", "columnwise_amax")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, nan_equal: bool = False) -> None:
    """Bit-exact equality; with ``nan_equal`` any NaN matches any NaN (NaN payloads and signs are not
    specified the same way by torch's CPU casts and the kernels)."""
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    same = _bits(got) == _bits(want)
    if nan_equal:
        same |= torch.isnan(got) & torch.isnan(want)
    if not bool(same.all()):
        idx = tuple((~same).nonzero()[0].tolist())
        raise AssertionError(f"{int((~same).sum())} mismatches, first at {idx}: got {got[idx].item()!r}, want {want[idx].item()!r}")


def assert_operand_of(launches, x, config, want_packed, columnwise: bool, context: str, seed=None) -> None:
    """``quantize_operands``' operand of one side of x (the other side not asked; outputs poisoned: NaN operand,
    0xFF codes) equals the expansion (``ref.gemm.expanded_operands``) of ``want_packed``'s copy of that side, NaN
    for NaN, and the side's cast ran as the recorded kernel (``launches``) with its OPERAND output."""
    before = len(launches)
    _, row, col = kq.quantize_operands(x, config, row_operand=not columnwise, col_operand=columnwise, seed=seed,
                                       poison=True)
    assert len(launches) == before + 1 and launches[-1]["OPERAND"], f"{context}: no OPERAND launch of the kernel"
    _, want_row, want_col = ref_gemm.expanded_operands(want_packed, not columnwise, columnwise)
    got, want = (col, want_col) if columnwise else (row, want_row)
    assert (row if columnwise else col) is None
    assert_same_bits(got.values.cpu(), want.values, nan_equal=True)
    assert_same_bits(got.amax.cpu(), want.amax.cpu(), nan_equal=True)


def sums_in_row_order(x, rows_per_part):
    """fp32 column sums of x, row by row within parts of ``rows_per_part`` rows, then part by part (on the CPU)."""
    xf = x.float().cpu()
    total = torch.zeros(xf.shape[1])
    for start in range(0, xf.shape[0], rows_per_part):
        part = torch.zeros(xf.shape[1])
        for row in xf[start:start + rows_per_part]:
            part = part + row
        total = total + part
    return total


def assert_field_equal(got: torch.Tensor, want: torch.Tensor, context: str) -> None:
    """Equal shape, dtype and bits (fp32 compared as int32), else an error naming how many elements differ and the
    first one."""
    assert got.shape == want.shape and got.dtype == want.dtype, (context, got.shape, want.shape, got.dtype, want.dtype)
    if got.dtype == torch.float32:
        got, want = got.view(torch.int32), want.view(torch.int32)
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        first = tuple(bad[0].tolist())
        raise AssertionError(f"{context}: {bad.shape[0]} of {got.numel()} differ, first at {first}: "
                             f"{got[first].item()} != {want[first].item()}")


def _wrap_launches(monkeypatch, module, kernel_name: str, on_launch) -> None:
    """Every launch goes through ``nvfp4lab.kernels.launch.Launch``: call ``on_launch(meta)`` before each
    launch of the named kernel of ``module``."""
    target = getattr(module, kernel_name)
    real_call = Launch.__call__

    def call(self, *args):
        if self.kernel is target:
            on_launch(self.meta)
        return real_call(self, *args)

    monkeypatch.setattr(Launch, "__call__", call)


def forbid_launches(monkeypatch, module, *kernel_names: str) -> None:
    """Fail the test if one of the named kernels of ``module`` is launched."""
    for name in kernel_names:
        def fail(meta, name=name):
            raise AssertionError(f"{name} launched for an empty input")
        _wrap_launches(monkeypatch, module, name, fail)


def record_launches(monkeypatch, module, kernel_name: str, calls: list | None = None) -> list:
    """Let the named kernel of ``module`` run as usual for this test, recording each launch's constexprs
    and launch options (num_warps, ...) in the returned list (``calls``: append to that list instead,
    e.g. one list for two kernels): which path the launcher chose."""
    calls = [] if calls is None else calls
    _wrap_launches(monkeypatch, module, kernel_name, calls.append)
    return calls


def set_plan_flags(monkeypatch, opt_flags, quantize_module, cast_module, **values) -> None:
    """Set ``opt_flags`` attributes (launch thresholds) for the test and drop the quantize plans cached under
    the previous values (the eager plans of ``quantize_module``, ``cast_module.cast_plan``)."""
    for name, value in values.items():
        monkeypatch.setattr(opt_flags, name, value)
    monkeypatch.setattr(quantize_module, "_EAGER_PLANS", {})
    cast_module.cast_plan.cache_clear()


def gpu_golden_folders() -> list[Path]:
    """The shipped subset, plus the full golden set staged for the GPU run when it is there."""
    staged = Path(os.environ.get("NVFP4LAB_GOLDEN", Path(__file__).resolve().parents[2] / ".gpu" / "golden"))
    return [default_folder()] + ([staged] if staged.is_dir() else [])


def assert_conformance(folders, pattern: str, **run_kwargs) -> None:
    """Every golden case matching ``pattern`` in every folder passes through the Triton backend."""
    for folder in folders:
        results = run_folder(folder, backend="triton", pattern=pattern, **run_kwargs)
        assert results, f"no {pattern.rstrip('*').rstrip('_')} case in {folder}"
        failed = [f"{r.name}: {r.detail}" for r in results if not r.passed]
        assert not failed, failed


def host_philox(seed: int, counters: np.ndarray, stream: int) -> np.ndarray:
    """Philox4x32-10 as ``tl.philox(seed, lo, hi, stream, 0)``: (N,) int64 counters -> (N, 4) uint32 words."""
    m32 = np.uint64(0xFFFFFFFF)
    c = [counters.astype(np.uint64) & m32, counters.astype(np.uint64) >> np.uint64(32),
         np.full(counters.shape, stream, np.uint64), np.zeros(counters.shape, np.uint64)]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    a, b = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        p0, p2 = a * c[0], b * c[2]
        c = [(p2 >> np.uint64(32)) ^ c[1] ^ k0, p2 & m32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & m32]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m32, (k1 + np.uint64(0xBB67AE85)) & m32
    return np.stack(c, axis=-1).astype(np.uint32)


def host_sr_bytes(seed: int, rows: int, cols: int, stream: int) -> torch.Tensor:
    """The random byte of every element of a quantized (rows, cols) matrix (x rowwise, stream 0; x^T or
    RHT(x^T) columnwise, stream 1) under the SR bit mapping of ``cast16_kernel``: Philox block
    (r // 2) * (cols / 8) + c // 8, byte 8 (r % 2) + c % 8; byte b is byte b % 4 of word b // 4."""
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(cols, dtype=np.int64)[None, :]
    counter, byte = (r // 2) * (cols // 8) + c // 8, (r % 2) * 8 + c % 8
    words = host_philox(seed, counter.ravel(), stream)
    w = words[np.arange(counter.size), (byte.ravel() // 4)]
    return torch.from_numpy(((w >> (8 * (byte.ravel() % 4)).astype(np.uint32)) & 0xFF).astype(np.int32).reshape(rows, cols))


def assert_seed_read_from_device(cast, data: int, device) -> None:
    """A cast's SR seed read by the kernel from an int64 device tensor (graph capture, torch.compile) gives the bits
    of the same seed passed as an int, and another seed gives other codes: ``cast(seed_tensor, seed)`` returns the
    cast's outputs, its data at index ``data`` and its scales next."""
    from_int = cast(None, 77)
    from_tensor = cast(torch.tensor([77], dtype=torch.int64, device=device), 0)
    other = cast(torch.tensor([78], dtype=torch.int64, device=device), 0)
    assert torch.equal(from_int[data], from_tensor[data]) and torch.equal(from_int[data + 1], from_tensor[data + 1])
    assert not torch.equal(from_int[data], other[data])


def scaled_values(mat: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, e4m3_max: float) -> torch.Tensor:
    """x * enc of each element of mat (R, C), from the reference's own scale formulas, the (RN) scales (R, C / 16)
    and the outer amax ((1,) or (R,)): what stochastic rounding rounds."""
    s_enc = ref_nvfp4.global_encode_scale(amax.reshape(-1, 1), e4m3_max)
    enc = torch.clamp(1.0 / (codecs.e4m3_decode(scale) * (1.0 / s_enc)), max=codecs.FLT_MAX)
    return mat * enc.repeat_interleave(16, dim=1)


# Quantize test shapes: (shape, dtype, explicit tile). 16x16 and 48x80 are smaller than / not multiples of
# the default tiles; the 16x32 tile (every kernel; cast16_kernel takes BLOCK_K 32) makes 48x80 span 3x3
# programs with a partial last K tile.
TILE_16X32 = dict(block_m=16, block_k=32, num_warps=4)
QUANTIZE_CASES = {
    "16x16-bf16": ((16, 16), torch.bfloat16, {}),
    "48x80-bf16": ((48, 80), torch.bfloat16, {}),
    "32x64-fp16": ((32, 64), torch.float16, {}),
    "48x80-fp32": ((48, 80), torch.float32, {}),
}


# ------------------------------------------------------------------ inputs of the per-tensor cast tests
def normal_bf16_input(shape, seed):
    """bf16 randn rows spread over four decades."""
    g = torch.Generator().manual_seed(seed)
    m, k = shape
    x = torch.randn(m, k, generator=g) * 10.0 ** (torch.rand(m, 1, generator=g) * 4 - 2)
    return x.bfloat16()


def rht_exact_input(m, k, seed, block_scales=None):
    """bf16 (m, k) whose every 16-row block of a column lies within [2^-3, 2^3] times one power of two per
    block (``block_scales``: a (m / 16, k) tensor of them, else 1): each 16-term RHT sum is then exact in fp32,
    so any summation order gives the reference's bits."""
    g = torch.Generator().manual_seed(seed)
    mag = 2.0 ** (torch.rand(m, k, generator=g) * 6 - 3)
    x = mag * torch.where(torch.rand(m, k, generator=g) < 0.5, -1.0, 1.0)
    if block_scales is not None:
        x = x * block_scales.repeat_interleave(16, dim=0)
    return x.bfloat16()


def special_input(nan: bool = False):
    """Zeros (rows, blocks, -0.0), bf16 subnormals, a block far below the amax (scale 0), +-inf, values
    at bf16 max, and (``nan``) a NaN element, in (32, 64)."""
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(7))
    x[3] = 0.0
    x[4, 16:32] = -0.0
    x[5, :16] = 1e-30
    x[6, 32:48] = torch.tensor([1, -32767] * 8, dtype=torch.int16).view(torch.bfloat16).float()  # +-smallest subnormal
    x[7, 40] = -3e-39
    x[8, 0] = float("inf")
    x[9, 17] = float("-inf")
    if nan:
        x[10, 50] = float("nan")
    x[11, :16] = 3.3895e38
    x[12, 48:] = -3.3895e38
    return x.bfloat16()


def scale_code_input():
    """Blocks whose scales (with amax 2688: S_enc = 1) take every E4M3 code 0..126: block maxima at 6x
    each code's value and at 6x the midpoints between neighbouring codes (ties), the rest of the block
    random below it; (256, 64)."""
    values = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (values[:-1] + values[1:]) / 2
    targets = torch.cat([values, mids, torch.tensor([1e-4, 0.0])]) * 6
    g = torch.Generator().manual_seed(3)
    n = targets.numel()
    blocks = (torch.rand(n, 16, generator=g) * 2 - 1) * targets[:, None]
    blocks[torch.arange(n), torch.randint(0, 16, (n,), generator=g)] = targets * torch.where(
        torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    x = torch.zeros(256 * 4, 16)
    x[:n] = blocks
    return x.reshape(256, 64).bfloat16()


def sm90_frontend(fn, sig: dict, meta: dict, warps: int) -> None:
    """Build the TTIR of the Triton kernel ``fn`` (a ``JITFunction``: call it in a process without the interpreter)
    for sm_90, with the pointer / scalar types ``sig`` of its runtime parameters and the constexprs ``meta`` (the
    defaults of those not given): Triton's code generator and its typing rules, which the interpreter skips. Raises
    what the code generator raises."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    # every constexpr in the kernel's own parameter order (a constexpr's index must be its position in the signature)
    meta = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.default is not inspect.Parameter.empty},
            **meta}
    names = [n for n in fn.arg_names if n in sig or n in meta]
    sig = {n: sig.get(n, "constexpr") for n in names}
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in meta.items()})
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": warps, "enable_fp_fusion": False})
    ctx = triton._C.libtriton.ir.context()
    triton._C.libtriton.ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    args = dict(target=target, options=options, codegen_fns=backend.get_codegen_implementation(options),
                module_map=backend.get_module_map(), context=ctx)
    params = inspect.signature(src.make_ir).parameters
    src.make_ir(**{k: v for k, v in args.items() if k in params})
