"""Shared fixtures of the kernel tests."""
import pytest


@pytest.fixture(params=["blocks", "pairs"])
def sr_variant(request, monkeypatch):
    """Each SR bit mapping of ``_cast16_kernel`` (NVFP4LAB_SR_VARIANT, read at launch)."""
    monkeypatch.setenv("NVFP4LAB_SR_VARIANT", request.param)
    return request.param
