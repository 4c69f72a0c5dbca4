"""MXFP8 quantize / dequantize kernel bandwidth vs a device-to-device copy of the same bytes (CUDA only).

    PYTHONPATH=src python benchmarks/mxfp8.py [--quick] [--tune] [--out FILE]

Quantize (bf16 input, E4M3, both directions from one read, and rowwise only) is measured with both fp8
roundings of the kernel: "soft" (integer encoders, the default) and "hw" (cvt.rn.satfinite). Dequantize
reads rowwise or columnwise copies into bf16. 8192 x 8192 adds swizzled scales, fp32 input, E5M2 and the
whole public op (allocation and scale zero-fill included). Each variant at 8192 x 8192 is checked bit for
bit against the reference before it is timed.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import _bench  # noqa: E402
from nvfp4lab import ref  # noqa: E402
from nvfp4lab.config import MXFP8QuantConfig  # noqa: E402
from nvfp4lab.kernels import mxfp8 as mk  # noqa: E402

_DT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_CASTS = ("soft",) if _bench.SMOKE else ("soft", "hw")  # the interpreter has no exact float8 cast


def _outputs(m, k, rowwise, columnwise, layout):
    row_shape, col_shape = mk.scale_shapes(m, k, layout)
    u8 = dict(dtype=torch.uint8, device=_bench.DEVICE)
    return (torch.empty(m, k, **u8) if rowwise else None, torch.zeros(row_shape, **u8) if rowwise else None,
            torch.empty(m, k, **u8) if columnwise else None, torch.zeros(col_shape, **u8) if columnwise else None)


def quant_case(results, m, k, *, cast, rowwise=True, columnwise=True, layout="compact", in_dtype=torch.bfloat16,
               fmt="e4m3", verify=False, tile=None, public_op=False):
    x = torch.randn(m, k, device=_bench.DEVICE).to(in_dtype)
    cfg = MXFP8QuantConfig(rowwise=rowwise, columnwise=columnwise, fp8_format=fmt, scale_layout=layout)
    outs = _outputs(m, k, rowwise, columnwise, layout)
    block_rows, block_cols, warps = tile or (None, None, None)

    if public_op:  # the whole op: output allocation and zero-filled scale buffers included
        def fn():
            mk.quantize_mxfp8(x, cfg, fp8_cast=cast)
    else:
        def fn():
            mk.launch_mxfp8_quantize(x, *outs, fp8_format=fmt, scale_layout=layout, fp8_cast=cast,
                                     block_rows=block_rows, block_cols=block_cols, num_warps=warps)

    if verify:
        fn()
        want = ref.mxfp8.quantize(x, cfg)
        got = dict(zip(("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"), outs))
        for part, tensor in got.items():
            if tensor is not None and not torch.equal(tensor, getattr(want, part)):
                raise SystemExit(f"MISMATCH vs reference: {part} ({cast}, {layout}, {fmt}, {in_dtype})")
    ms = _bench.bench_ms(fn)
    moved = x.numel() * x.element_size() + sum(t.numel() for t in outs if t is not None)
    direction = "both" if rowwise and columnwise else ("row" if rowwise else "col")
    name = f"mxfp8 quant {direction} {cast}"
    if layout != "compact":
        name += f" {layout[:4]}"
    if in_dtype != torch.bfloat16:
        name += f" {_DT[in_dtype]}in"
    if fmt != "e4m3":
        name += f" {fmt}"
    if public_op:
        name += " (op)"
    if tile:
        name += f" {block_rows}x{block_cols}w{warps}"
    extra = dict(kind="quantize", cast=cast, direction=direction, layout=layout, in_dtype=_DT[in_dtype], fmt=fmt)
    if tile:
        extra["tile"] = list(tile)
    _bench.record(results, name, m, k, ms, moved, **extra)


def dequant_case(results, m, k, *, which, layout="compact", dtype=torch.bfloat16, fmt="e4m3", verify=False, tile=None):
    x = torch.randn(m, k, device=_bench.DEVICE, dtype=torch.bfloat16)
    cfg = MXFP8QuantConfig(rowwise=which == "rowwise", columnwise=which == "columnwise", fp8_format=fmt, scale_layout=layout)
    q = mk.quantize_mxfp8(x, cfg)
    data, scale = getattr(q, f"{which}_data"), getattr(q, f"{which}_scale")
    out = torch.empty(m, k, dtype=dtype, device=_bench.DEVICE)
    block_rows, block_cols, warps = tile or (None, None, None)

    def fn():
        mk.launch_mxfp8_dequantize(data, scale, out, fp8_format=fmt, scale_layout=layout, colwise=which == "columnwise",
                                   block_rows=block_rows, block_cols=block_cols, num_warps=warps)

    if verify:
        fn()
        want = ref.mxfp8.dequantize(q, dtype, which)
        view = torch.int32 if dtype == torch.float32 else torch.int16
        if not torch.equal(out.view(view), want.view(view)):
            raise SystemExit(f"MISMATCH vs reference: dequantize {which} {layout} {fmt} {dtype}")
    ms = _bench.bench_ms(fn)
    moved = data.numel() + scale.numel() + out.numel() * out.element_size()
    name = f"mxfp8 dequant {which[:3]} ->{_DT[dtype]}"
    if layout != "compact":
        name += f" {layout[:4]}"
    if tile:
        name += f" {block_rows}x{block_cols}w{warps}"
    extra = dict(kind="dequantize", direction=which, layout=layout, out_dtype=_DT[dtype], fmt=fmt)
    if tile:
        extra["tile"] = list(tile)
    _bench.record(results, name, m, k, ms, moved, **extra)


def main():
    args = _bench.parse_args(__doc__.splitlines()[0])
    results: list = []
    print(f"cases at {_bench.BASE[0]} x {_bench.BASE[1]} (each checked against the reference first)")
    for cast in _CASTS:
        quant_case(results, *_bench.BASE, cast=cast, verify=True)
        quant_case(results, *_bench.BASE, cast=cast, columnwise=False, verify=True)
        quant_case(results, *_bench.BASE, cast=cast, rowwise=False, verify=True)
        quant_case(results, *_bench.BASE, cast=cast, layout="swizzled", verify=True)
        quant_case(results, *_bench.BASE, cast=cast, layout="swizzled", public_op=True)
        quant_case(results, *_bench.BASE, cast=cast, in_dtype=torch.float32, verify=True)
        quant_case(results, *_bench.BASE, cast=cast, fmt="e5m2", verify=True)
    for which in ("rowwise", "columnwise"):
        dequant_case(results, *_bench.BASE, which=which, verify=True)
        dequant_case(results, *_bench.BASE, which=which, layout="swizzled", verify=True)
        dequant_case(results, *_bench.BASE, which=which, dtype=torch.float32, verify=True)
    if args.tune:
        print(f"tile shapes at {_bench.BASE[0]} x {_bench.BASE[1]} (BLOCK_ROWS x BLOCK_COLS, num_warps)")
        for cast, direction in [(cast, d) for cast in _CASTS for d in ("both", "row", "col")]:
            for tile in [(32, 256, 2), (32, 256, 4), (32, 64, 1), (32, 128, 1), (32, 256, 1), (32, 128, 2), (64, 128, 2)]:
                quant_case(results, *_bench.BASE, cast=cast, tile=tile, rowwise=direction != "col", columnwise=direction != "row")
        for which in ("rowwise", "columnwise"):
            for tile in [(32, 256, 4), (32, 512, 4), (64, 256, 8), (32, 512, 8), (64, 512, 8), (32, 128, 4)]:
                dequant_case(results, *_bench.BASE, which=which, tile=tile)
    print("sweep (bf16, E4M3, compact scales)")
    for m, k in _bench.shapes(args.quick):
        for cast in _CASTS:
            quant_case(results, m, k, cast=cast)
        dequant_case(results, m, k, which="rowwise")
        dequant_case(results, m, k, which="columnwise")
    _bench.finish(results, args.out, "MXFP8 quantize / dequantize")


if __name__ == "__main__":
    main()
