"""The benchmark scripts run end to end (``--smoke``: tiny shapes under the interpreter, on CPU), so
the GPU batch does not fail on a script error. Their correctness checks against the reference run too."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_script(script, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


@pytest.mark.parametrize("script", ["dequantize.py", "mxfp8.py"])
def test_benchmark_smoke_run(script, tmp_path):
    out = tmp_path / "results.json"
    proc = run_script(script, "--smoke", "--quick", "--out", str(out))
    assert "MISMATCH" not in proc.stdout
    lines = proc.stdout.strip().splitlines()
    results = json.loads(out.read_text())["results"]
    assert results and all(row["us"] > 0 and row["copy_GBps"] > 0 for row in results)
    # the summary table comes last: one line per result after its header and rule
    assert lines[-len(results) - 2].lstrip().startswith("op")
    assert [line.split()[0] for line in lines[-len(results):]] == [row["op"].split()[0] for row in results]


def test_linear_benchmark_moe_smoke_run(tmp_path):
    # CPU: eager timing only (the CUDA-graph timer needs a GPU); the MoE step of both target presets runs
    out = tmp_path / "results.json"
    proc = run_script("linear.py", "--device", "cpu", "--tiny", "--quick", "--cases", "moe", "--presets", "te_default,per_token",
                      "--breakdown", "4", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [row["preset"] for row in rows] == ["bf16 nn.Linear", "te_default", "per_token"]
    assert all("error" not in row and row["step_ms"] > 0 and row["eager_ms"] > 0 for row in rows)
    # --breakdown: one profiled step per preset, its costliest ops and the time per kind (CPU: reference ops,
    # whose GEMMs are aten matmuls and whose quantize functions are not separate ops)
    for row in rows[1:]:
        top, totals = row["breakdown"]["top"], row["breakdown"]["totals"]
        assert len(top) == 4 and all(ms > 0 for _, _, ms in top)
        assert set(totals) == {"quantize", "operands", "epilogue", "GEMM", "other"} and totals["GEMM"] > 0
        assert f"MoE 8x 224->64, 256 tok / {row['preset']}: kernel ms per kind" in proc.stdout


def test_grouped_quantize_benchmark_moe_smoke_run(tmp_path):
    """--moe: the MoE step's three grouped quantizes (te_default), full ops (the weights and x also as the forward's
    BF16 operands) and, for x and dy, the amax pass and the cast alone; CPU: eager timing under the interpreter."""
    out = tmp_path / "results.json"
    proc = run_script("grouped_quantize.py", "--moe", "--device", "cpu", "--tiny", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [row["op"] for row in rows] == ["W full", "W op", "x full", "x amax", "x cast", "x op", "dy full",
                                           "dy amax", "dy cast"]
    assert all(row["us"] > 0 and "prev_us" not in row for row in rows)
    assert "MoE step's grouped quantizes, te_default, 8 x (224 -> 64), 256 tokens" in proc.stdout


def test_linear_benchmark_timeline(tmp_path):
    """--timeline: every kernel (CPU: top-level op) of one eager step per preset in launch order, with its duration
    and the gap before it, in the JSON rows and printed under a header per preset."""
    out = tmp_path / "results.json"
    proc = run_script("linear.py", "--device", "cpu", "--tiny", "--quick", "--cases", "linear", "--presets", "te_default",
                      "--timeline", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert "timeline" not in rows[0]  # the BF16 row
    events = rows[1]["timeline"]
    assert len(events) > 3 and all(isinstance(name, str) and us > 0 for name, us, _ in events)
    names = [name for name, _, _ in events]
    assert names[0] != names[-1] and any("_LinearFunctionBackward" in name for name in names)  # forward, then backward
    header = f"Linear 256->256, 256 tok / te_default: one eager step, {len(events)} kernels (CPU: ops) in launch order"
    assert header in proc.stdout


def test_linear_benchmark_shapes(tmp_path):
    """--linear-shapes: one Linear case per M x K x N, each against its own BF16 row; a malformed list is refused
    with the option's name."""
    out = tmp_path / "results.json"
    run_script("linear.py", "--device", "cpu", "--quick", "--cases", "linear", "--presets", "te_default",
               "--linear-shapes", "64x32x48,32x64x32", "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [(row["case"], row["preset"]) for row in rows] == [
        ("Linear 32->48, 64 tok", "bf16 nn.Linear"), ("Linear 32->48, 64 tok", "te_default"),
        ("Linear 64->32, 32 tok", "bf16 nn.Linear"), ("Linear 64->32, 32 tok", "te_default")]
    assert all("error" not in row and row["step_ms"] > 0 for row in rows)
    bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "linear.py"), "--device", "cpu", "--linear-shapes", "64x32"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--linear-shapes" in bad.stderr and "MxKxN" in bad.stderr


def test_linear_benchmark_against_previous_version(tmp_path):
    """--prev DIR: the previous version staged there (here this commit, by tools/stage_gpu_inputs.py) is timed beside
    this one in alternating rounds, in its own columns; a folder without one is refused with the option's name."""
    spec = importlib.util.spec_from_file_location("stage_gpu_inputs", REPO / "tools" / "stage_gpu_inputs.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    stage.stage_prev("HEAD", tmp_path / "prev" / "nvfp4lab_prev")
    out = tmp_path / "results.json"
    proc = run_script("linear.py", "--device", "cpu", "--quick", "--cases", "linear", "--presets", "te_default",
                      "--linear-shapes", "64x32x48", "--prev", str(tmp_path / "prev"), "--out", str(out))
    bf16, row = json.loads(out.read_text())["rows"]
    assert "prev_ms" not in bf16 and "error" not in row
    assert row["prev_ms"] > 0 and row["prev_eager_ms"] > 0
    assert row["prev_ratio"] == pytest.approx(row["step_ms"] / row["prev_ms"])
    assert "new/prev" in proc.stdout.splitlines()[-4]  # the table: header, rule, BF16 row, te_default row
    bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "linear.py"), "--device", "cpu", "--prev",
                          str(tmp_path / "nothing")], capture_output=True, text=True)
    assert bad.returncode == 2 and "--prev" in bad.stderr


def test_fsdp_benchmark_smoke_run(tmp_path):
    """benchmarks/fsdp.py on 2 gloo processes (CPU, 2 layers of 256): every configuration is timed and
    every check of the FP4 all-gather configurations runs and passes (gathered weight, all-gather bytes,
    DCP load with the recipe, refusal of another recipe, save_quantized against one process)."""
    out = tmp_path / "results.json"
    proc = run_script("fsdp.py", "--device", "cpu", "--tiny", "--out", str(out))
    data = json.loads(out.read_text())
    rows = data["results"]
    assert list(rows) == ["torch_bf16", "te_default_bf16_ag", "te_default_fp4_ag", "per_token_bf16_ag", "per_token_fp4_ag"]
    assert all(row["step_ms"] > 0 and row["all_gather_bytes"] > 0 for row in rows.values())
    assert rows["te_default_fp4_ag"]["all_gather_bytes"] < rows["te_default_bf16_ag"]["all_gather_bytes"]
    checks = [(c["config"], c["check"], c["ok"]) for c in data["checks"]]
    kinds = ["gathered", "ag_bytes", "dcp_load", "dcp_refuse", "save_quantized"]
    assert checks == [(config, kind, True) for config in ("te_default_fp4_ag", "per_token_fp4_ag") for kind in kinds]
    assert "FAIL" not in proc.stdout and proc.stdout.count("\nPASS ") == len(checks)
    assert "10 checks passed, 0 failed" in proc.stdout


def test_stream_probe_smoke():
    """tools/stream_probe.py (the issue-6 time split of the stream GEMM): its rebuilt loop's partials equal the
    reference block products under the interpreter, and every mode runs."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "stream_probe.py"), "--smoke"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "max rel err 0.00e+00" in proc.stdout and "every mode ran" in proc.stdout


def test_host_profile_cpu_proxy():
    """tools/host_profile.py --cpu (the host path with launches stubbed, on the GPU's GEMM paths) profiles a Linear
    step and reports its host time and Python function calls per call."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "host_profile.py"), "--cpu", "linear", "64", "64", "64"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "us per call" in proc.stdout and "Python function calls per call" in proc.stdout


def test_host_profile_ablation_rows():
    """tools/host_profile.py --ablate times the step beside its variants (here on the CPU proxy): every row printed."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "host_profile.py"), "--cpu", "--ablate", "linear", "64",
                           "64", "64"], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = [line.rsplit(None, 1) for line in proc.stdout.splitlines()[-5:]]
    assert [label.strip() for label, _ in rows] == ["BF16 step", "step", "forward, no_grad", "step, Triton launches stubbed",
                                                    "step, launches and cuBLASLt stubbed"]
    assert all(float(ms) > 0 for _, ms in rows)


def test_plan_ab_forces_the_plan_fields():
    """tools/plan_ab.py (issue 21's A/B of Linear plan choices) on the CPU: each forced variant's plan is the one the
    step used (the key the Linear builds), with the forced fields."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "plan_ab.py"), "--device", "cpu", "--shapes", "64x64x64",
                           "--presets", "te_default", "--variants", "today,packed,dyrow,dyboth"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = {line.split()[1]: line for line in proc.stdout.splitlines() if line.startswith("  te_default")}
    assert list(lines) == ["today", "packed", "dyrow", "dyboth"]
    assert "dy_row_op=True dy_col_op=False" in lines["dyrow"] and "dy_row_op=True dy_col_op=True" in lines["dyboth"]
    assert "dy_row_op=False dy_col_op=False" in lines["packed"]
    assert all("forced plan still in _GEMM_PLANS: yes" in lines[name] for name in ("packed", "dyrow", "dyboth"))
