"""cuBLASLt through ctypes: a BF16 x BF16 GEMM whose epilogue applies a device alpha and writes the output.

``out (M, N) = alpha * (a16 (M, K) @ b16 (N, K)^T) [+ bias (N,)]`` with fp32 accumulation, alpha, the scaling and the
bias addition in fp32 and one rounding to ``out``'s dtype (bf16 or fp32). alpha (and beta, a zero) are read from device memory
(``CUBLASLT_POINTER_MODE_DEVICE``): no host synchronization, and one pass fewer than an fp32 product followed by an
epilogue kernel. In cuBLAS' column-major terms this is D (N x M, ld = out's row stride) = op_T(b16) (N x K) @ a16^T
(K x M), both operands K-major ("TN"), or either one given column-major (a transposed view: "NN", "TT").
Operands are BF16 because cuBLASLt has no FP16-input kernel with a BF16
output; an alpha vector (``ALPHA_DEVICE_VECTOR`` pointer modes) has no kernel for 16-bit inputs on Hopper either.

:func:`plan` builds (and caches per shape, strides, dtypes and pointer alignments) the descriptors and the
heuristic's algorithm; it returns None where cuBLASLt cannot be used (library not found, no algorithm for the
problem), and the caller takes its other path. :func:`matmul_torch` is the same product in plain PyTorch (fp32
products of the exact 16-bit values), used on the CPU and by the tests as the path's twin. Workspace: allocated per
call from PyTorch's caching allocator (stream- and CUDA-graph-safe), of the size the heuristic asks for.

The library is the one PyTorch loaded (``libcublasLt.so.<major>``, or the ``nvidia`` wheels' copy); constants from
cublasLt.h / library_types.h (stable across CUDA 12 and 13).
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import threading
from typing import Optional

import torch

_CUDA_R_32F, _CUDA_R_16BF = 0, 14
_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_DESC_POINTER_MODE, _DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER, _DESC_BIAS_DATA_TYPE = 2, 3, 4, 7, 8, 26
_EPILOGUE_BIAS = 4
_POINTER_MODE_DEVICE = 1
_PREF_MAX_WORKSPACE_BYTES = 1
_PREF_MIN_ALIGNMENT = {"a": 5, "b": 6, "c": 7, "d": 8}
_MAX_WORKSPACE = 32 << 20
_DTYPES = {torch.bfloat16: _CUDA_R_16BF, torch.float32: _CUDA_R_32F}


class _HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _candidates():
    """The library's sonames, then the copies in the ``nvidia`` wheels beside torch."""
    yield from ("libcublasLt.so.13", "libcublasLt.so.12")
    site = os.path.dirname(os.path.dirname(torch.__file__))
    yield from sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcublasLt.so*")), reverse=True)


@functools.lru_cache(maxsize=None)
def _library():
    """The loaded cuBLASLt with its functions' signatures, or None."""
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        vp, u64, i64, sz, i32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t, ctypes.c_int
        pvp = ctypes.POINTER(vp)
        signatures = {
            "cublasLtCreate": [pvp],
            "cublasLtMatmulDescCreate": [pvp, i32, i32],
            "cublasLtMatmulDescSetAttribute": [vp, i32, vp, sz],
            "cublasLtMatrixLayoutCreate": [pvp, i32, u64, u64, i64],
            "cublasLtMatmulPreferenceCreate": [pvp],
            "cublasLtMatmulPreferenceSetAttribute": [vp, i32, vp, sz],
            "cublasLtMatmulAlgoGetHeuristic": [vp, vp, vp, vp, vp, vp, vp, i32, ctypes.POINTER(_HeuristicResult),
                                               ctypes.POINTER(i32)],
            "cublasLtMatmul": [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, sz, vp],
        }
        for fn, argtypes in signatures.items():
            getattr(lib, fn).argtypes = argtypes
            getattr(lib, fn).restype = i32
        return lib
    return None


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed with status {status}")


@functools.lru_cache(maxsize=None)
def _handle(device_index: int) -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    with torch.cuda.device(device_index):
        _check(_library().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    return handle


def _set(setter, obj, attr: int, value: int, ctype) -> None:
    v = ctype(value)
    _check(setter(obj, attr, ctypes.byref(v), ctypes.sizeof(v)), f"set attribute {attr}")


def alignment(ptr: int) -> int:
    """The largest power of two <= 256 that divides the address (cuBLASLt's alignment preferences)."""
    return min(ptr & -ptr, 256) if ptr else 256


class Plan:
    """Descriptors and algorithm of one problem; ``__call__`` runs it on the current stream."""

    __slots__ = ("lib", "handle", "desc", "layouts", "algo", "workspace", "device_index", "lock")

    def __init__(self, lib, handle, desc, layouts, algo, workspace: int, device_index: int):
        self.lib, self.handle, self.desc, self.layouts = lib, handle, desc, layouts
        self.algo, self.workspace, self.device_index = algo, workspace, device_index
        self.lock = threading.Lock()  # the bias pointer is an attribute of the shared descriptor

    def __call__(self, a16: torch.Tensor, b16: torch.Tensor, alpha: torch.Tensor, out: torch.Tensor,
                 alpha_index: int = 0, bias: Optional[torch.Tensor] = None) -> None:
        """out = alpha[alpha_index] * (a16 @ b16^T) [+ bias] on the current stream, for tensors with the plan's shapes,
        strides, alignments and bias dtype. ``alpha`` (fp32, contiguous) ends with a zero: cuBLAS' beta."""
        ws = torch.empty(self.workspace, dtype=torch.uint8, device=out.device) if self.workspace else None
        la, lb, ld = self.layouts
        alpha_ptr = alpha.data_ptr()
        args = (self.handle, self.desc, alpha_ptr + 4 * alpha_index, b16.data_ptr(), la, a16.data_ptr(), lb,
                alpha_ptr + 4 * (alpha.numel() - 1), out.data_ptr(), ld, out.data_ptr(), ld, ctypes.byref(self.algo),
                None if ws is None else ws.data_ptr(), self.workspace,
                torch._C._cuda_getCurrentRawStream(self.device_index))
        if bias is None:
            status = self.lib.cublasLtMatmul(*args)
        else:
            with self.lock:
                _set(self.lib.cublasLtMatmulDescSetAttribute, self.desc, _DESC_BIAS_POINTER, bias.data_ptr(),
                     ctypes.c_uint64)
                status = self.lib.cublasLtMatmul(*args)
        _check(status, "cublasLtMatmul")


class Batch:
    """The plans of a fixed sequence of products on views of base tensors (a16, b16, out and an optional bias), with
    each view's byte offset from its base: a call takes the bases, allocates one workspace and runs every product in
    order on the current stream, without re-deriving views, strides or plans. Built by :func:`batch`; valid for bases
    of the shapes, strides, dtypes and pointer low bits (mod 256) it was built for."""

    __slots__ = ("runs", "workspace", "device_index", "lib")

    def __init__(self, runs: list, workspace: int, device_index: int, lib):
        self.runs, self.workspace, self.device_index, self.lib = runs, workspace, device_index, lib

    def __call__(self, a16: torch.Tensor, b16: torch.Tensor, out: torch.Tensor, alpha: torch.Tensor,
                 bias: Optional[torch.Tensor] = None) -> None:
        """Every product: out view = alpha[e] * (a16 view @ b16 view^T) [+ bias view]; ``alpha`` as :meth:`Plan.__call__`'s."""
        ws = torch.empty(self.workspace, dtype=torch.uint8, device=out.device) if self.workspace else None
        ws_ptr = None if ws is None else ws.data_ptr()
        a_ptr, b_ptr, out_ptr, alpha_ptr = a16.data_ptr(), b16.data_ptr(), out.data_ptr(), alpha.data_ptr()
        beta_ptr = alpha_ptr + 4 * (alpha.numel() - 1)
        bias_ptr = bias.data_ptr() if bias is not None else 0
        stream = torch._C._cuda_getCurrentRawStream(self.device_index)
        matmul = self.lib.cublasLtMatmul
        for plan, algo, a_off, b_off, out_off, e, bias_off in self.runs:
            la, lb, ld = plan.layouts
            args = (plan.handle, plan.desc, alpha_ptr + 4 * e, b_ptr + b_off, la, a_ptr + a_off, lb, beta_ptr,
                    out_ptr + out_off, ld, out_ptr + out_off, ld, algo, ws_ptr, self.workspace, stream)
            if bias_off is None:
                status = matmul(*args)
            else:
                with plan.lock:
                    _set(self.lib.cublasLtMatmulDescSetAttribute, plan.desc, _DESC_BIAS_POINTER, bias_ptr + bias_off,
                         ctypes.c_uint64)
                    status = matmul(*args)
            _check(status, "cublasLtMatmul")


def batch(products: list, plans: list, a16: torch.Tensor, b16: torch.Tensor, out: torch.Tensor,
          bias: Optional[torch.Tensor] = None) -> Batch:
    """The :class:`Batch` of ``products`` ((a16 view, b16 view, out view, alpha index, bias view or None), views of the
    given bases, in run order) and their ``plans`` (:func:`plan` of each)."""
    runs, workspace = [], 0
    for (a_v, b_v, out_v, e, bias_v), p in zip(products, plans):
        workspace = max(workspace, p.workspace)
        runs.append((p, ctypes.byref(p.algo), a_v.data_ptr() - a16.data_ptr(), b_v.data_ptr() - b16.data_ptr(),
                     out_v.data_ptr() - out.data_ptr(), e, None if bias_v is None else bias_v.data_ptr() - bias.data_ptr()))
    return Batch(runs, workspace, out.device.index, _library())


@functools.lru_cache(maxsize=4096)
def _make_plan(device_index: int, m: int, n: int, k: int, lda: int, ldb: int, ldo: int, out_dtype: torch.dtype,
               aligns: tuple, bias_dtype: Optional[torch.dtype] = None, a_cols: bool = False,
               b_cols: bool = False) -> Optional[Plan]:
    lib = _library()
    handle = _handle(device_index)
    vp = ctypes.c_void_p
    desc = vp()
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _CUDA_R_32F), "cublasLtMatmulDescCreate")
    set_desc = lib.cublasLtMatmulDescSetAttribute
    # row-major b16 (N, K) is cuBLAS' K x N, used transposed; a column-major one is its N x K as it is (a16 alike)
    _set(set_desc, desc, _DESC_TRANSA, _OP_N if b_cols else _OP_T, ctypes.c_int32)
    _set(set_desc, desc, _DESC_TRANSB, _OP_T if a_cols else _OP_N, ctypes.c_int32)
    _set(set_desc, desc, _DESC_POINTER_MODE, _POINTER_MODE_DEVICE, ctypes.c_int32)
    if bias_dtype is not None:
        _set(set_desc, desc, _DESC_EPILOGUE, _EPILOGUE_BIAS, ctypes.c_uint32)
        _set(set_desc, desc, _DESC_BIAS_DATA_TYPE, _DTYPES[bias_dtype], ctypes.c_int32)
    layouts = []
    shape_b, shape_a = (n, k) if b_cols else (k, n), (m, k) if a_cols else (k, m)
    for dtype, (rows, cols), ld in ((_CUDA_R_16BF, shape_b, ldb), (_CUDA_R_16BF, shape_a, lda),
                                    (_DTYPES[out_dtype], (n, m), ldo)):
        layout = vp()
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), dtype, rows, cols, ld), "cublasLtMatrixLayoutCreate")
        layouts.append(layout)
    pref = vp()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
    set_pref = lib.cublasLtMatmulPreferenceSetAttribute
    _set(set_pref, pref, _PREF_MAX_WORKSPACE_BYTES, _MAX_WORKSPACE, ctypes.c_uint64)
    for which, value in zip("abcd", aligns):
        _set(set_pref, pref, _PREF_MIN_ALIGNMENT[which], value, ctypes.c_uint32)
    result, count = _HeuristicResult(), ctypes.c_int(0)
    la, lb, ld = layouts
    status = lib.cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref, 1, ctypes.byref(result),
                                                ctypes.byref(count))
    if status != 0 or count.value < 1 or result.state != 0:
        return None
    algo = (ctypes.c_uint64 * 8)(*result.algo)
    return Plan(lib, handle, desc, tuple(layouts), algo, int(result.workspace_size), device_index)


def available() -> bool:
    """Whether cuBLASLt could be loaded."""
    return _library() is not None


def _leading(t: torch.Tensor) -> Optional[tuple]:
    """(column-major?, leading dimension) of a 2-D operand with unit stride along one dimension, else None."""
    if t.stride(-1) == 1:
        return False, t.stride(0)
    if t.stride(0) == 1:
        return True, t.stride(1)
    return None


def supports(a16: torch.Tensor, b16: torch.Tensor, out: torch.Tensor, bias: Optional[torch.Tensor] = None) -> bool:
    """Whether the tensors' dtypes and strides are the plan's: BF16 operands with unit stride along one dimension
    (row- or column-major), a bf16 / fp32 ``out`` with unit stride along its last dimension; a bias of ``out``'s
    dtype, contiguous and 16-byte aligned, only where ``out``'s rows are 16-byte aligned (address and row stride).
    There cuBLAS' bias epilogue rounds fl(fl(alpha * acc) + bias) once, as the reference; for 2-byte aligned rows it
    picks kernels whose bias epilogue rounds otherwise (figures in benchmarks/RESULTS.md)."""
    return (out.dtype in _DTYPES and a16.dtype == b16.dtype == torch.bfloat16 and out.stride(-1) == 1
            and _leading(a16) is not None and _leading(b16) is not None
            and (bias is None or (bias.dtype == out.dtype and bias.is_contiguous() and bias.data_ptr() % 16 == 0
                                  and out.data_ptr() % 16 == 0 and out.stride(0) * out.element_size() % 16 == 0)))


def plan(a16: torch.Tensor, b16: torch.Tensor, out: torch.Tensor, bias: Optional[torch.Tensor] = None) -> Optional[Plan]:
    """The cached plan for ``out = alpha * (a16 @ b16^T) [+ bias]`` (a16 (M, K), b16 (N, K) BF16, row- or
    column-major; out (M, N) bf16 / fp32 with unit column stride; bias (N,) as ``supports`` says, on a CUDA device), or None where
    cuBLASLt is not available or has no algorithm for it."""
    if not supports(a16, b16, out, bias) or _library() is None:
        return None
    m, k = a16.shape
    n = b16.shape[0]
    aligns = tuple(alignment(t.data_ptr()) for t in (b16, a16, out, out))
    (a_cols, lda), (b_cols, ldb) = _leading(a16), _leading(b16)
    return _make_plan(out.device.index, m, n, k, lda, ldb, out.stride(0), out.dtype, aligns,
                      None if bias is None else bias.dtype, a_cols, b_cols)


def matmul_torch(a16: torch.Tensor, b16: torch.Tensor, alpha: torch.Tensor, out: torch.Tensor,
                 alpha_index: int = 0, bias: Optional[torch.Tensor] = None) -> None:
    """The plan's product in plain PyTorch: fp32 products of the exact 16-bit values, fp32 sums, times
    alpha[alpha_index] in fp32, plus the bias in fp32, one rounding to ``out``'s dtype."""
    res = (a16.float() @ b16.float().t()) * alpha[alpha_index]
    out.copy_(res if bias is None else res + bias.float())
