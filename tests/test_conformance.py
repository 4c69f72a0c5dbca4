"""The golden conformance vectors: the shipped subset always, the full ../shared/golden and
../shared/golden_pr3045 (TE PR 3045's per-token numerics) when present."""
import json
import subprocess
import sys

import pytest
import torch

from nvfp4lab.conformance import default_folder, run_folder

from .conftest import SHARED_GOLDEN

SHARED_GOLDEN_PR3045 = SHARED_GOLDEN.parent / "golden_pr3045"


def _check(folder, backend="ref", pattern="*.safetensors"):
    results = run_folder(folder, backend=backend, pattern=pattern)
    failed = [f"{r.name}: {r.detail}" for r in results if not r.passed]
    assert results, f"no cases in {folder}"
    assert not failed, "\n".join(failed)
    return len(results)


def _ops_and_numerics(folder) -> set:
    from safetensors import safe_open

    found = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            case = json.loads(f.metadata()["case"])
        found.add((case["op"], case.get("params", {}).get("numerics", "te_main")))
    return found


def test_shipped_subset_covers_every_op():
    assert _ops_and_numerics(default_folder()) == {
        ("nvfp4_quantize", "te_main"), ("nvfp4_gemm", "te_main"), ("mxfp8_quantize", "te_main"), ("scale_swizzle", "te_main"),
        ("nvfp4_quantize", "te_pr3045"), ("nvfp4_dequantize", "te_pr3045"), ("nvfp4_gemm", "te_pr3045"),
    }
    assert _check(default_folder()) >= 38


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's x/0 warns (the IEEE result is meant)
def test_shipped_pr3045_cases_through_triton():
    assert _check(default_folder(), backend="triton", pattern="pr3045_*.safetensors") == 8


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("backend", ["ref", "triton"])
def test_full_shared_golden_pr3045_when_present(backend):
    """Every case of TE PR 3045's vectors on both backends (Triton: the interpreter on CPU)."""
    if not SHARED_GOLDEN_PR3045.is_dir():
        pytest.skip("../shared/golden_pr3045 is not beside this checkout; the shipped pr3045_* cases still ran")
    assert _check(SHARED_GOLDEN_PR3045, backend=backend) == len(list(SHARED_GOLDEN_PR3045.glob("*.safetensors")))


def test_full_shared_golden_when_present():
    if not SHARED_GOLDEN.is_dir():
        pytest.skip("../shared/golden is not beside this checkout (a user's clone); the shipped subset still ran")
    assert _check(SHARED_GOLDEN) == len(list(SHARED_GOLDEN.glob("*.safetensors")))


def test_cli_prints_summary_and_exit_code(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "nvfp4lab", "conformance"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.strip().splitlines()[-1].endswith(" passed, 0 failed")
    empty = subprocess.run([sys.executable, "-m", "nvfp4lab", "conformance", str(tmp_path)], capture_output=True, text=True)
    assert empty.returncode == 1
    assert "0 passed, 0 failed" in empty.stdout
    missing = subprocess.run([sys.executable, "-m", "nvfp4lab", "conformance", str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_cli_runs_without_the_safetensors_package():
    # a base install (torch only) reads the cases itself: safetensors blocked from import
    code = ("import sys; sys.modules['safetensors'] = None; from nvfp4lab.cli import main; "
            "sys.exit(main(['conformance']))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    n = len(list(default_folder().glob("*.safetensors")))
    assert run.stdout.strip().splitlines()[-1] == f"{n} passed, 0 failed"


def test_reader_matches_the_safetensors_package():
    from safetensors import safe_open

    from nvfp4lab.conformance import read_safetensors

    for path in sorted(default_folder().glob("*.safetensors"))[:8]:
        metadata, tensors = read_safetensors(path)
        with safe_open(str(path), "pt") as f:
            assert metadata == f.metadata() and sorted(tensors) == sorted(f.keys())
            for name, t in tensors.items():
                want = f.get_tensor(name)
                assert t.dtype == want.dtype and t.shape == want.shape and torch.equal(t.view(-1).view(torch.uint8),
                                                                                       want.view(-1).view(torch.uint8))


def test_cli_reports_a_mismatch(tmp_path):
    """A corrupted copy of a case must fail with the tensor name and index."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    src = sorted(default_folder().glob("nvfp4_quantize_*.safetensors"))[0]
    with safe_open(str(src), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["rowwise_scale"] = tensors["rowwise_scale"].clone()
    tensors["rowwise_scale"][0, 0] ^= 1
    save_file(tensors, str(tmp_path / src.name), metadata=meta)
    run = subprocess.run([sys.executable, "-m", "nvfp4lab", "conformance", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 1
    assert "rowwise_scale" in run.stdout and "(0, 0)" in run.stdout
    assert run.stdout.strip().splitlines()[-1] == "0 passed, 1 failed"
    assert json.loads(meta["case"])["op"] == "nvfp4_quantize"


def test_worker_processes_give_the_same_results_in_order(tmp_path):
    """``jobs`` > 1 runs the cases in spawned workers: the same results, a failing case included, in name order."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import save_file

    cases = sorted(default_folder().glob("nvfp4_quantize_*.safetensors"))[:3]
    for path in cases:
        shutil.copy(path, tmp_path / path.name)
    with safe_open(str(cases[1]), "pt") as f:  # the middle case corrupted: its failure must stay in its place
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    tensors["rowwise_data"] = tensors["rowwise_data"].clone()
    tensors["rowwise_data"][0, 0] ^= 1
    save_file(tensors, str(tmp_path / cases[1].name), metadata=meta)
    serial = run_folder(tmp_path)
    parallel = run_folder(tmp_path, jobs=2)
    assert [r.passed for r in serial] == [True, False, True]
    assert parallel == serial
    for bad in (0, -1):
        with pytest.raises(ValueError, match="jobs must be >= 1"):
            run_folder(tmp_path, jobs=bad)
    for bad in (1.5, True, "2"):
        with pytest.raises(TypeError, match="jobs must be an int"):
            run_folder(tmp_path, jobs=bad)


def _gpu_folder():
    import os
    from pathlib import Path

    folder = Path(os.environ.get("NVFP4LAB_GOLDEN", Path(__file__).resolve().parents[1] / ".gpu" / "golden"))
    return folder if folder.is_dir() else default_folder()


@pytest.mark.gpu
def test_reference_on_cuda_matches_golden():
    """The reference must give the same bits on a GPU (torch CUDA arithmetic, e.g. no reciprocal shortcuts)."""
    results = run_folder(_gpu_folder(), backend="ref", device="cuda")
    failed = [f"{r.name}: {r.detail}" for r in results if not r.passed]
    assert results and not failed, "\n".join(failed[:10])
