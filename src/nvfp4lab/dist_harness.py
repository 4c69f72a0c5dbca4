"""Local multi-process runs for the FSDP2/DDP tests and ``benchmarks/fsdp.py``: spawn one process per
rank on this host, set up each rank's process group, and count the bytes FSDP all-gathers."""
from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(worker, *args, world: int) -> dict:
    """Run ``worker(rank, world, port, *args, results)`` in ``world`` processes and wait for them;
    returns what the ranks stored in ``results`` (a shared dict)."""
    port = free_port()
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(world, port, *args, results), nprocs=world, join=True)
        return dict(results)


def init_rank(rank: int, world: int, port: int, device_type: str) -> torch.device:
    """Join the process group (NCCL on CUDA, one GPU per rank; gloo on CPU); returns this rank's device."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")  # NVLink multicast stays off
    cuda = device_type == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    return device


class AllGatherByteCounter:
    """Adds up the output size (what every rank holds afterwards) of every all-gather issued through
    torch.distributed while active."""

    def __init__(self):
        self.bytes = 0
        self._inside = False
        self._saved = {}

    def __enter__(self):
        for name in ("all_gather_single", "all_gather_into_tensor"):  # the first exists in newer torch
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self._saved[name] = fn

            def counted(output_tensor, input_tensor, *args, _fn=fn, **kwargs):
                if not self._inside:  # one collective may call the other: count the outer one only
                    self.bytes += output_tensor.numel() * output_tensor.element_size()
                self._inside, outer = True, self._inside
                try:
                    return _fn(output_tensor, input_tensor, *args, **kwargs)
                finally:
                    self._inside = outer

            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
