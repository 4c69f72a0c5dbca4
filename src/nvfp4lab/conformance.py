"""Conformance check against a folder of golden vectors (format: shared/golden/README.md, with the
additions of shared/golden_pr3045/README.md).

Each ``*.safetensors`` case holds inputs, expected outputs and a JSON ``case`` header; this module
runs nvfp4lab on the inputs and compares as the case says (exact bytes, or a per-element tolerance).
``params.numerics`` ("te_main" when absent, or "te_pr3045") picks the numerics of every NVFP4 op.
The cases are read by :func:`read_safetensors` (the file format needs no package: a base install runs
the check).
"""
from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from . import ops
from .config import NVFP4QuantConfig
from .tensors import NVFP4Tensor

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


@dataclass
class CaseResult:
    name: str
    passed: bool
    detail: str = ""


def default_folder() -> Path:
    """The compact subset of the golden vectors shipped inside the package."""
    return Path(__file__).resolve().parent / "data" / "golden"


# safetensors dtype names of the tensors a case may hold
_FILE_DTYPES = {"U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
                "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
                "BOOL": torch.bool}


def read_safetensors(path) -> tuple[dict, dict]:
    """(metadata, tensors) of a safetensors file: an 8-byte little-endian header length, a JSON header
    (each tensor's dtype, shape and [begin, end) byte range after the header, plus ``__metadata__``),
    then the little-endian tensor bytes. CPU tensors."""
    raw = Path(path).read_bytes()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + header_len])
    body = memoryview(raw)[8 + header_len:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        dtype = _FILE_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}, which conformance cases do not use")
        begin, end = info["data_offsets"]
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if end > begin else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"])
    return metadata, tensors


def _first_mismatch(name: str, got: torch.Tensor, want: torch.Tensor) -> Optional[str]:
    if got is None:
        return f"{name}: missing output"
    got = got.cpu()
    if tuple(got.shape) != tuple(want.shape):
        return f"{name}: shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"{name}: dtype {got.dtype} != expected {want.dtype}"
    if want.dtype == torch.float32:
        g, w = got.view(torch.int32), want.view(torch.int32)
    else:
        g, w = got, want
    diff = (g != w).nonzero()
    if diff.numel() == 0:
        return None
    idx = tuple(diff[0].tolist())
    return f"{name}: {diff.shape[0]} mismatches, first at {idx}: got {got[idx].item()!r}, expected {want[idx].item()!r}"


def _nvfp4_kwargs(params: dict) -> dict:
    return dict(
        block=params["block"], rowwise=params["rowwise"], columnwise=params["columnwise"],
        per_token=params["per_token"], rht=params["rht"],
        rht_sign_mask=params["rht_sign_mask"] if params["rht"] else 0xD7E8,
        four_over_six=params.get("four_over_six"), e4m3_max=params.get("e4m3_max"),
        numerics=params.get("numerics", "te_main"),
    )


def _tolerance_problem(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> Optional[str]:
    """Per element |got - want| <= atol + rtol * |want| (NaN fails), after matching shape and dtype."""
    got = got.cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{name}: shape/dtype {tuple(got.shape)}/{got.dtype} != {tuple(want.shape)}/{want.dtype}"
    g, w = got.double(), want.double()
    bad = ((g - w).abs() > atol + rtol * w.abs()) | torch.isnan(g)
    if not bad.any():
        return None
    idx = tuple(bad.nonzero()[0].tolist())
    return (f"{name}: {int(bad.sum())} elements out of tolerance, first at {idx}: "
            f"got {g[idx].item():.8g}, expected {w[idx].item():.8g}")


def _dequantize_case(tensors: dict, params: dict, device: str, backend: str) -> torch.Tensor:
    """nvfp4_dequantize: the stored (data, scale, amax) triple as the rowwise copy of an (R, C) tensor
    (a columnwise triple of x is the rowwise one of x^T), dequantized to ``params.out_dtype``."""
    data, scale, amax = (tensors[k].to(device) for k in ("data", "scale", "amax"))
    rows, cols = data.shape[0], data.shape[1] * 2
    config = NVFP4QuantConfig(block=params["block"], per_token=params["per_token"], rht=False,
                              four_over_six=params.get("four_over_six"), e4m3_max=params.get("e4m3_max"),
                              numerics=params.get("numerics", "te_main"))
    t = NVFP4Tensor.from_parts(torch.Size((rows, cols)), _DTYPES[params["out_dtype"]], config, rowwise=(data, scale, amax))
    return ops.dequantize_nvfp4(t, dtype=_DTYPES[params["out_dtype"]], backend=backend)


def run_case(path: Path, backend: str, device: str) -> CaseResult:
    metadata, tensors = read_safetensors(path)
    case = json.loads(metadata["case"])
    op, params = case["op"], case.get("params", {})
    problems: list[str] = []
    if op == "nvfp4_quantize":
        kwargs = _nvfp4_kwargs(params)
        q = ops.quantize_nvfp4(tensors["x"].to(device), backend=backend, **kwargs)
        for side in ("rowwise", "columnwise"):
            if params[side]:
                for part in ("data", "scale", "amax"):
                    key = f"{side}_{part}"
                    problems.append(_first_mismatch(key, getattr(q, key), tensors[key]))
    elif op == "mxfp8_quantize":
        axis = params["axis"]
        q = ops.quantize_mxfp8(tensors["x"].to(device), rowwise=axis == "rowwise", columnwise=axis == "columnwise", backend=backend)
        problems.append(_first_mismatch("data", getattr(q, f"{axis}_data"), tensors["data"]))
        problems.append(_first_mismatch("scale", getattr(q, f"{axis}_scale"), tensors["scale"]))
    elif op == "scale_swizzle":
        got = ops.swizzle_scales(tensors["scale"].to(device), backend=backend).flatten()
        problems.append(_first_mismatch("swizzled", got, tensors["swizzled"]))
        back = ops.unswizzle_scales(got, *tensors["scale"].shape, backend=backend)
        problems.append(_first_mismatch("unswizzled", back, tensors["scale"]))
    elif op == "nvfp4_gemm":
        qa = ops.quantize_nvfp4(tensors["a"].to(device), backend=backend, **_gemm_operand_kwargs(params["a_params"]))
        qb = ops.quantize_nvfp4(tensors["b"].to(device), backend=backend, **_gemm_operand_kwargs(params["b_params"]))
        got = ops.nvfp4_gemm(qa, qb, out_dtype=_DTYPES[params["out_dtype"]], backend=backend)
        problems.append(_tolerance_problem("out", got, tensors["out"], case["rtol"], case["atol"]))
    elif op == "nvfp4_dequantize":
        got = _dequantize_case(tensors, params, device, backend)
        problems.append(_tolerance_problem("out", got, tensors["out"], case["rtol"], case["atol"]))
    else:
        return CaseResult(path.name, False, f"unknown op {op!r}")
    problems = [p for p in problems if p]
    return CaseResult(path.name, not problems, "; ".join(problems))


def _gemm_operand_kwargs(params: dict) -> dict:
    kwargs = _nvfp4_kwargs(params)
    kwargs["rowwise"], kwargs["columnwise"] = True, False
    return kwargs


def _checked_case(path: Path, backend: str, device: str) -> CaseResult:
    try:
        return run_case(path, backend, device)
    except Exception as exc:  # a crash is a failed case, reported with its cause
        return CaseResult(path.name, False, f"raised {type(exc).__name__}: {exc}")


def run_folder(folder, backend: str = "ref", device: str = "cpu", pattern: str = "*.safetensors",
               jobs: int = 1) -> list[CaseResult]:
    """Every case of ``folder`` (sorted by name), each a :class:`CaseResult`. ``jobs`` > 1 runs the cases in that
    many worker processes (spawned: each compiles its own Triton kernels, which is what a cold cache spends its time
    on); the results come back in the same order."""
    if isinstance(jobs, bool) or not isinstance(jobs, int):
        raise TypeError(f"jobs must be an int, got {type(jobs).__name__} {jobs!r}")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1 (worker processes), got {jobs}")
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"conformance folder not found: {folder}")
    paths = sorted(folder.glob(pattern))
    if jobs == 1 or len(paths) < 2:
        return [_checked_case(path, backend, device) for path in paths]
    context = multiprocessing.get_context("spawn")  # CUDA cannot be used in forked children
    with concurrent.futures.ProcessPoolExecutor(min(jobs, len(paths)), mp_context=context) as pool:
        return list(pool.map(_checked_case, paths, [backend] * len(paths), [device] * len(paths)))
