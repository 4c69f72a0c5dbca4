"""Shared pieces of the bandwidth benchmarks: arguments, shapes, timing, the copy baseline, output.

Every kernel is timed with ``triton.testing.do_bench`` (median, L2 flushed between runs) and compared
with a device-to-device copy moving the same number of bytes (read + written), timed the same way in
the same run: ``pct_copy = kernel GB/s / copy GB/s``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# --smoke: run every code path once on tiny shapes under the Triton interpreter (CPU), to check the
# script itself; it has to be known before Triton is imported.
SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

SWEEP_M = (1024, 4096, 8192, 16384, 32768)
SWEEP_K = (2048, 4096, 8192)
TARGET_PCT = 85.0
DEVICE = "cpu" if SMOKE else "cuda"
BASE = (64, 128) if SMOKE else (8192, 8192)  # the shape of the variant and tuning rows


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="8192 x 8192 only")
    parser.add_argument("--tune", action="store_true", help="also time alternative tile shapes at 8192 x 8192")
    parser.add_argument("--out", type=Path, default=None, help="write all results to this file (.json or .csv)")
    parser.add_argument("--smoke", action="store_true", help="check the script on CPU (interpreter, tiny shapes); numbers mean nothing")
    args = parser.parse_args()
    if not SMOKE and not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU")
    return args


def shapes(quick: bool) -> list[tuple[int, int]]:
    """The sweep after the BASE-shape variants (BASE itself is measured by those)."""
    if SMOKE:
        return [] if quick else [(32, 64)]
    return [] if quick else [(m, k) for m in SWEEP_M for k in SWEEP_K if (m, k) != BASE]


def bench_ms(fn) -> float:
    if SMOKE:
        fn()
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def device_name() -> str:
    return "CPU (interpreter smoke run)" if SMOKE else torch.cuda.get_device_name()


_copy_cache: dict[int, float] = {}


def copy_gbps(moved_bytes: int) -> float:
    """GB/s of a D2D copy that reads and writes moved_bytes in total (so copies moved_bytes / 2)."""
    n = max(moved_bytes // 2, 1)
    if n not in _copy_cache:
        src = torch.empty(n, dtype=torch.uint8, device=DEVICE).random_(0, 256)
        dst = torch.empty_like(src)
        ms = bench_ms(lambda: dst.copy_(src))
        _copy_cache[n] = 2 * n / (ms * 1e-3) / 1e9
        del src, dst
    return _copy_cache[n]


def record(results: list, op: str, m: int, k: int, ms: float, moved_bytes: int, **extra) -> dict:
    gbps = moved_bytes / (ms * 1e-3) / 1e9
    ref = copy_gbps(moved_bytes)
    row = dict(op=op, M=m, K=k, us=round(ms * 1e3, 2), GBps=round(gbps, 1), copy_GBps=round(ref, 1),
               pct_copy=round(100 * gbps / ref, 1), **extra)
    results.append(row)
    print(f"  {op:<36} {m:>6} x {k:<6} {row['us']:>10.1f} us {row['GBps']:>8.1f} GB/s  {row['pct_copy']:>5.1f}% of copy", flush=True)
    return row


def finish(results: list, out: Path | None, title: str) -> None:
    """Write ``out`` (json or csv) and print the summary table last."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".csv":
            keys = sorted({key for row in results for key in row}, key=lambda key: list(results[0]).index(key) if key in results[0] else 99)
            lines = [",".join(keys)] + [",".join(str(row.get(key, "")) for key in keys) for row in results]
            out.write_text("\n".join(lines) + "\n")
        else:
            meta = dict(device=device_name(), torch=torch.__version__, triton=__import__("triton").__version__)
            out.write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    print()
    print(f"{title} on {device_name()} (median of do_bench; % of a D2D copy of the same bytes; target >= {TARGET_PCT:.0f}%)")
    header = f"{'op':<36} {'M':>6} {'K':>6} {'us':>10} {'GB/s':>8} {'copy GB/s':>10} {'% copy':>7}"
    print(header)
    print("-" * len(header))
    for row in results:
        flag = "" if row["pct_copy"] >= TARGET_PCT else "  <"
        print(f"{row['op']:<36} {row['M']:>6} {row['K']:>6} {row['us']:>10.1f} {row['GBps']:>8.1f} {row['copy_GBps']:>10.1f} {row['pct_copy']:>6.1f}%{flag}")


def load_prev(folder: Path):
    """The previous version of the package staged in ``folder`` (a copy importable as ``nvfp4lab_prev``, written
    by ``tools/stage_gpu_inputs.py --prev``), or None when it is absent or does not import (printed why)."""
    if not (Path(folder) / "nvfp4lab_prev").is_dir():
        return None
    sys.path.insert(0, str(folder))
    try:
        import nvfp4lab_prev
    except Exception as err:  # noqa: BLE001 - the caller leaves its previous-version columns out
        print(f"previous version not importable: {type(err).__name__}: {err}")
        return None
    return nvfp4lab_prev
