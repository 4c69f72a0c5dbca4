"""Shared fixtures of the kernel tests."""
import pytest

from nvfp4lab.kernels import nvfp4_quantize as kq
from nvfp4lab.kernels.nvfp4_quantize_details import cast as cast_module
from nvfp4lab.kernels.nvfp4_quantize_details import opt_flags

from .kernel_checks import set_plan_flags


@pytest.fixture
def plan_flags(monkeypatch):
    """``plan_flags(**values)``: quantize ``opt_flags`` values (thresholds, program order) for the test, with the cached
    launch plans dropped before (built under the defaults) and after."""
    yield lambda **values: set_plan_flags(monkeypatch, opt_flags, kq, cast_module, **values)
    cast_module.cast_plan.cache_clear()
