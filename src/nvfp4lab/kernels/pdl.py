"""Programmatic dependent launch (PDL): how this package's kernels start before the kernel ahead of them on
the stream has finished.

Every kernel of the package takes a last constexpr ``PDL`` and calls :func:`wait_prior_grid` (``griddepcontrol.wait``)
before its first memory access. :class:`~nvfp4lab.kernels.launch.Launch` sets ``PDL`` and Triton's ``launch_pdl`` (the
launch attribute) for them on GPUs of compute capability 9.0 and later (:func:`pdl_meta`): the launch is then set up
while the kernel ahead runs, and its programs start as soon as that kernel's programs have exited, without the gap of
a full stream dependency; the wait then holds them until the prior grid has completed and its writes are visible.
No kernel triggers its dependents early (``griddepcontrol.launch_dependents``), so a dependent never holds SM
resources while this one still has programs to start. Since each kernel waits before it reads, a chain of them orders
every write before every later read, as plain stream order does. Older GPUs and the interpreter launch without it
(``PDL`` False: no instruction).
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

__all__ = ["pdl_meta", "wait_prior_grid"]


@triton.jit
def wait_prior_grid(PDL: tl.constexpr):
    """With PDL: wait until the grid ahead on the stream has completed and its memory is visible."""
    if PDL:
        gdc_wait()


def pdl_meta(kernel, meta: dict, capability) -> dict:
    """``meta`` with PDL on (the ``PDL`` constexpr and the ``launch_pdl`` option) where ``kernel`` takes the ``PDL``
    constexpr and ``capability`` (the device's (major, minor), None for the interpreter or the CPU) is 9.0 or later;
    else ``meta`` itself."""
    if capability is None or capability[0] < 9 or "PDL" not in getattr(kernel, "arg_names", ()):
        return meta
    return {**meta, "PDL": True, "launch_pdl": True}
