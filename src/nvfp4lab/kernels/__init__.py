"""Triton kernels, one family per file; each public launcher is a ``torch.library`` custom op.

Importing this package needs Triton. On a machine without a GPU the kernels run under the Triton
interpreter (``TRITON_INTERPRET=1`` set before Triton is imported), bit for bit like the GPU: the
codecs in :mod:`.formats` use integer bit operations, never float8 casts.
"""
