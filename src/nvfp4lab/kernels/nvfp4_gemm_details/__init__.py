"""Private parts of :mod:`nvfp4lab.kernels.nvfp4_gemm`: one module per GEMM path and the heuristics.

* :mod:`.common`: device helpers and the epilogue shared by every path, host helpers for operands.
* :mod:`.fused`: the fused-decode kernel (both operands decoded per tile; dense and grouped) and the
  expansion kernel (FP16 or BF16 q * s).
* :mod:`.stream`: the weight-stream kernel for few rows of A (dense, M <= 64).
* :mod:`.dequant_mm`: operands expanded, cuBLAS with its own epilogue or an epilogue kernel (large M);
  :mod:`.cublaslt`: the cuBLASLt binding it calls.
* :mod:`.opt_flags`: tiles, splits and the choice of path (:class:`.opt_flags.GemmConfig`).
"""
