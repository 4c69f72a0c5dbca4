"""Internals of :mod:`nvfp4lab.kernels.nvfp4_quantize` and :mod:`nvfp4lab.kernels.grouped_quantize`, one
module per kernel, each exporting public names:

* ``common``: device helpers (global scales, correctly rounded division, normal-range test, packing,
  scale layouts, split search, tile loads);
* ``rht``, ``stochastic_rounding``: the RHT and the SR random bytes / rounding rule;
* ``amax``: ``amax_kernel`` (outer amaxes), ``amax_rht_col_kernel`` (the per-tensor post-RHT amax of bf16 x,
  butterflies in registers) and their launcher;
* ``pt_scales``: ``pt_scales_kernel`` (per-token global-scale tables) and its launcher;
* ``cast16``: ``cast16_kernel``, the cast of every recipe without 4over6, and its launcher;
* ``cast_row``: ``cast_row_kernel``, the rowwise-only 1x16 bf16 cast (SR or not; split casts' rowwise launch), its
  per-tensor factor table ``row_factor_table_kernel`` and their launcher;
* ``cast_rowcol``: ``cast_rowcol_kernel``, the per-tensor 1x16 bf16 row+col cast without RHT and SR, the
  launch of its two factor tables ``factor_tables_kernel`` and ``col_scales_kernel``, which writes its columnwise
  scales from their staging buffer;
* ``four_over_six``: the 4over6 casts: ``four_over_six_1x16_kernel`` (1x16 blocks of bf16 input, one output per
  launch, whole blocks per thread) and ``four_over_six_kernel`` (the others);
* ``opt_flags``: every launch choice (tiles, warps, register cap, amax steps, kernel and launch split);
* ``cast``: the cast pass (output buffers, kernel choice, tables, seed).
"""
