"""NVFP4QuantConfig's numerics choice: what PR 3045's numerics allow and refuse."""
import pytest

from nvfp4lab import NVFP4QuantConfig


def test_pr3045_numerics_allow_fp32_rht_and_the_2d_weight():
    rht = NVFP4QuantConfig(per_token=True, columnwise=True, rht=True, numerics="te_pr3045")
    assert rht.rht and rht.rht_sign_mask == 0xD7E8
    w2d = NVFP4QuantConfig(block="16x16", per_token=True, numerics="te_pr3045")
    assert w2d.broadcast_2d
    assert w2d.per_tensor_2d() == NVFP4QuantConfig(block="16x16")
    assert not NVFP4QuantConfig(per_token=True, numerics="te_pr3045").broadcast_2d


@pytest.mark.parametrize("kwargs, match", [
    (dict(numerics="te_pr9999"), "numerics must be one of"),
    (dict(numerics="te_pr3045"), "numerics='te_pr3045' without per_token"),
    (dict(numerics="te_pr3045", per_token=True, four_over_six="mae"), "numerics='te_pr3045' and four_over_six"),
    (dict(numerics="te_pr3045", per_token=True, e4m3_max=256), "e4m3_max=256"),
    (dict(numerics="te_pr3045", per_token=True, block="16x16", rht=True), "rht and block='16x16'"),
    # TE main's per-token mode still refuses RHT and 16x16 blocks
    (dict(per_token=True, rht=True), "rht and per_token"),
    (dict(per_token=True, block="16x16"), "per_token and block='16x16'"),
])
def test_bad_numerics_combinations_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NVFP4QuantConfig(**kwargs)


def test_hash_kept_per_object_and_left_out_of_pickles():
    """Configs and recipes keep their hash after the first use (plan caches look them up per call);
    a pickle (another process: other string hashes) carries no hash, and copies still hash as equals."""
    import pickle

    from nvfp4lab import NVFP4Recipe

    for obj, twin in ((NVFP4QuantConfig(columnwise=True, scale_layout="swizzled"),
                       NVFP4QuantConfig(columnwise=True, scale_layout="swizzled")),
                      (NVFP4Recipe.te_default(), NVFP4Recipe.te_default())):
        assert hash(obj) == hash(twin) and obj == twin
        assert "_hash" in vars(obj)
        state = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)[2]
        assert "_hash" not in state
        restored = pickle.loads(pickle.dumps(obj))
        assert restored == obj and hash(restored) == hash(obj) and {obj: 1}[restored] == 1
        with pytest.raises(AttributeError):
            obj.rowwise = False
