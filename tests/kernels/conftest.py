"""Shared fixtures of the kernel tests."""
import pytest


@pytest.fixture(params=["blocks", "pairs"])
def sr_variant(request, monkeypatch):
    """Each SR bit mapping of ``_cast16_kernel`` (NVFP4LAB_SR_VARIANT, read at launch)."""
    monkeypatch.setenv("NVFP4LAB_SR_VARIANT", request.param)
    return request.param


@pytest.fixture(params=["0", "1"])
def pt_precompute(request, monkeypatch):
    """Both per-token global-scale paths of ``_cast16_kernel`` (NVFP4LAB_PT_PRECOMPUTE, read at launch)."""
    monkeypatch.setenv("NVFP4LAB_PT_PRECOMPUTE", request.param)
    return request.param == "1"
