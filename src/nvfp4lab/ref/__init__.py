"""Reference numerics: plain PyTorch, CPU and GPU, the single definition of every format's bits."""
from . import codecs, gemm, mxfp8, nvfp4, swizzle  # noqa: F401
