"""The benchmark scripts run end to end (``--smoke``: tiny shapes under the interpreter, on CPU), so
the GPU batch does not fail on a script error. Their correctness checks against the reference run too."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["dequantize.py", "mxfp8.py"])
def test_benchmark_smoke_run(script, tmp_path):
    out = tmp_path / "results.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--smoke", "--quick", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "MISMATCH" not in proc.stdout
    lines = proc.stdout.strip().splitlines()
    results = json.loads(out.read_text())["results"]
    assert results and all(row["us"] > 0 and row["copy_GBps"] > 0 for row in results)
    # the summary table comes last: one line per result after its header and rule
    assert lines[-len(results) - 2].lstrip().startswith("op")
    assert [line.split()[0] for line in lines[-len(results):]] == [row["op"].split()[0] for row in results]
