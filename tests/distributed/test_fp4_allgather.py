"""FP4 weight all-gather over 2 gloo processes equals quantizing the full weight on one process."""
import pytest
import torch
import torch.distributed as dist

import nvfp4lab
from nvfp4lab.config import NVFP4QuantConfig
from nvfp4lab.dist_harness import init_rank, spawn_ranks
from nvfp4lab.distributed import all_gather_nvfp4, gathered_bytes, quantize_weight_shard

FIELDS = ("rowwise_data", "rowwise_scale", "rowwise_amax", "columnwise_data", "columnwise_scale", "columnwise_amax")


def _worker(rank, world, port, weight, configs, results):
    init_rank(rank, world, port, "cpu")
    try:
        rows = weight.shape[0] // world
        shard = weight[rank * rows : (rank + 1) * rows]
        for i, cfg in enumerate(configs):
            full = all_gather_nvfp4(quantize_weight_shard(shard, cfg))
            if rank == 0:
                results[i] = {f: getattr(full, f) for f in FIELDS if getattr(full, f) is not None}
    finally:
        dist.destroy_process_group()


CONFIGS = [
    NVFP4QuantConfig(rowwise=True, columnwise=True),
    NVFP4QuantConfig(block="16x16", rowwise=True, columnwise=True),
    NVFP4QuantConfig(rowwise=True, columnwise=True, four_over_six="mae"),
]


def test_two_rank_gather_is_bit_identical_to_single_process():
    torch.manual_seed(0)
    # shard 1 holds the largest value: rank 0 must still use the global amax
    weight = torch.randn(64, 96, dtype=torch.bfloat16)
    weight[40, 7] = 40.0
    results = spawn_ranks(_worker, weight, CONFIGS, world=2)
    assert len(results) == len(CONFIGS)
    for i, cfg in enumerate(CONFIGS):
        want = nvfp4lab.quantize_nvfp4(weight, config=cfg, backend="ref")
        for f, got in results[i].items():
            assert torch.equal(got, getattr(want, f)), (cfg, f)


def test_shard_rules_and_byte_count():
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_weight_shard(torch.randn(24, 32), NVFP4QuantConfig(columnwise=True))
    with pytest.raises(ValueError, match="per_token"):
        quantize_weight_shard(torch.randn(32, 32), NVFP4QuantConfig(per_token=True))
    both = quantize_weight_shard(torch.randn(32, 64), NVFP4QuantConfig(rowwise=True, columnwise=True))
    assert gathered_bytes(both, 2) == 2 * (32 * 32 + 32 * 4 + 64 * 16 + 64 * 2)
    rowwise = quantize_weight_shard(torch.randn(32, 64), NVFP4QuantConfig(rowwise=True))
    bf16_bytes = 2 * 32 * 64 * 2  # what a bf16 all-gather of the same 2 shards moves
    assert bf16_bytes / gathered_bytes(rowwise, 2) > 3.5  # 4096 / 1152 = 3.56
