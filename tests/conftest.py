"""Test setup: Triton kernels run under the interpreter when no GPU is present.

TRITON_INTERPRET must be set before Triton is imported, so it is set here, at collection time.
GPU tests carry the ``gpu`` marker and are deselected by default (``pytest -m gpu`` selects them).
"""
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:  # the GPU tier: every direct launch checks that its arguments keep the first call's specialization
    from nvfp4lab.kernels.launch import Launch

    Launch.verify = True

SHARED_GOLDEN = Path(__file__).resolve().parents[1].parent / "shared" / "golden"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def golden_dirs():
    from nvfp4lab.conformance import default_folder

    dirs = [default_folder()]
    if SHARED_GOLDEN.is_dir():
        dirs.append(SHARED_GOLDEN)
    return dirs


@pytest.fixture
def dgrad_from_rowwise(monkeypatch):
    """Every dense and grouped GEMM counted as one that expands its operands (the GPU's large-M paths), so that
    Linears and GroupedLinears with 16x16 weights read W's rowwise copy transposed for dgrad
    (``functional.dgrad_reads_rowwise``) on the CPU too."""
    import sys

    from nvfp4lab import ops

    functional_linear = sys.modules["nvfp4lab.functional.linear"]
    monkeypatch.setattr(ops, "gemm_expand_rule", lambda *args, **kwargs: (0, 0, 0))  # every size takes it
    functional_linear._clear_path_caches()
    yield
    functional_linear._clear_path_caches()
