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
