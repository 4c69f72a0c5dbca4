"""NVFP4Recipe / MXFP8Recipe: presets, role -> config mapping, rules, environment layer."""
import dataclasses

import pytest

from nvfp4lab import MXFP8QuantConfig, MXFP8Recipe, NVFP4QuantConfig, NVFP4Recipe
from nvfp4lab.recipes import ROLES, from_recipe_name, nvfp4_recipe_names, recipe_summary

SW = "swizzled"


def cfg(**kw):
    kw.setdefault("scale_layout", SW)
    return NVFP4QuantConfig(**kw)


def test_te_default_is_the_dataclass_default_and_maps_roles_like_te():
    r = NVFP4Recipe.te_default()
    assert r == NVFP4Recipe()
    expected = {  # TE NVFP4BlockScaling: 2D weights, RHT on the wgrad copies of input and grad, SR on grads
        "input_fprop": cfg(),
        "input_wgrad": cfg(rowwise=False, columnwise=True, rht=True),
        "weight_fprop": cfg(block="16x16"),
        "weight_dgrad": cfg(block="16x16", rowwise=False, columnwise=True),
        "grad_dgrad": cfg(stochastic_rounding=True),
        "grad_wgrad": cfg(rowwise=False, columnwise=True, rht=True, stochastic_rounding=True),
    }
    assert set(ROLES) == set(expected)
    for role, want in expected.items():
        assert r.config_for(role) == want, role
    assert r.tensor_config("input", rowwise=True, columnwise=True) == cfg(columnwise=True, rht=True)
    assert r.config_for("input_wgrad").rht_sign_mask == 0xD7E8


def test_per_token_preset():
    r = NVFP4Recipe.per_token()
    assert r.config_for("input_fprop") == cfg(per_token=True)
    assert r.config_for("input_wgrad") == cfg(rowwise=False, columnwise=True, per_token=True)
    assert r.config_for("weight_fprop") == cfg(block="16x16")  # the weight stays per tensor, 16x16
    assert r.config_for("grad_dgrad") == cfg(stochastic_rounding=True)
    g = NVFP4Recipe.per_token(gradients=True)
    assert g.config_for("grad_wgrad") == cfg(rowwise=False, columnwise=True, per_token=True, stochastic_rounding=True)


def test_pr3045_preset_and_rules():
    """PR 3045's recipe: x, W and dy per token with its numerics; RHT (fp32) may go with per-token there."""
    r = NVFP4Recipe.pr3045(rht=True)
    pt = dict(per_token=True, numerics="te_pr3045")
    assert r.config_for("input_fprop") == cfg(**pt)
    assert r.config_for("input_wgrad") == cfg(rowwise=False, columnwise=True, rht=True, **pt)
    assert r.config_for("weight_fprop") == cfg(**pt) and r.config_for("weight_dgrad") == cfg(rowwise=False, columnwise=True, **pt)
    assert r.config_for("grad_wgrad") == cfg(rowwise=False, columnwise=True, rht=True, **pt)
    assert NVFP4Recipe.pr3045(backward="high_precision").backward == "high_precision"  # dy stays per token when quantized
    for kwargs, match in ((dict(per_token_gradients=False), "without per_token_activations and per_token_gradients"),
                          (dict(four_over_six_scope="weights"), "numerics='te_pr3045' and four_over_six_scope"),
                          (dict(numerics="te_pr2931"), "numerics must be one of")):
        with pytest.raises(ValueError, match=match):
            NVFP4Recipe.pr3045(**kwargs)


def test_four_over_six_preset_and_scopes():
    r = NVFP4Recipe.four_over_six()
    assert r.config_for("input_fprop") == cfg(four_over_six="mae", e4m3_max=256.0)
    assert r.config_for("weight_dgrad") == cfg(block="16x16", rowwise=False, columnwise=True, four_over_six="mae", e4m3_max=256.0)
    assert r.config_for("grad_wgrad") == cfg(rowwise=False, columnwise=True, stochastic_rounding=True)  # never on grads
    w = NVFP4Recipe.four_over_six("weights", "mse")
    assert w.rht and w.config_for("input_wgrad") == cfg(rowwise=False, columnwise=True, rht=True)
    assert w.config_for("weight_fprop") == cfg(block="16x16", four_over_six="mse", e4m3_max=256.0)
    # E = 256 only where four_over_six_e256_scope says; 448 elsewhere
    e = NVFP4Recipe.four_over_six("all", four_over_six_e256_scope="weights")
    assert e.config_for("input_fprop").e4m3_max == 448.0 and e.config_for("weight_fprop").e4m3_max == 256.0
    assert NVFP4Recipe.four_over_six("all", four_over_six_e256_scope=None).config_for("weight_fprop").e4m3_max == 448.0


def test_other_options_reach_the_configs():
    r = NVFP4Recipe(weight_2d=False, rht_sign_mask=0x1234, stochastic_rounding=False, scale_layout="compact")
    assert r.config_for("weight_fprop") == NVFP4QuantConfig()
    assert r.config_for("grad_wgrad") == NVFP4QuantConfig(rowwise=False, columnwise=True, rht=True, rht_sign_mask=0x1234)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(per_token_activations=True), "rht and per_token_activations"),
        (dict(per_token_gradients=True), "rht and per_token_gradients"),
        (dict(four_over_six_scope="activations"), "rht and four_over_six_scope='activations'"),
        (dict(four_over_six_scope="all"), "rht and four_over_six_scope='all'"),
        (dict(four_over_six_scope="gradients"), "never applied to gradients"),
        (dict(four_over_six_scope="grads"), "never applied to gradients"),
        (dict(four_over_six_scope="everything"), "four_over_six_scope must be one of"),
        (dict(four_over_six_err_mode="max"), "four_over_six_err_mode must be one of"),
        (dict(four_over_six_e256_scope="gradients"), "four_over_six_e256_scope must be one of"),
        (dict(backward="fp8"), "backward must be one of"),
        (dict(rht=False, per_token_gradients=True, backward="dequantized"), "per_token_gradients and backward='dequantized'"),
        (dict(rht_sign_mask=1 << 16), "rht_sign_mask must be a 16-bit integer"),
        (dict(scale_layout="tiled"), "scale_layout must be one of"),
    ],
)
def test_bad_combinations_raise_naming_the_rule(kwargs, match):
    with pytest.raises(ValueError, match=match):
        NVFP4Recipe(**kwargs)


def test_bad_types_raise_type_error():
    with pytest.raises(TypeError, match="rht must be a bool"):
        NVFP4Recipe(rht=1)
    with pytest.raises(ValueError, match="role must be one of"):
        NVFP4Recipe().config_for("activation_fprop")
    with pytest.raises(ValueError, match="tensor must be one of"):
        NVFP4Recipe().tensor_config("bias")


def test_presets_accept_overrides_and_recipes_are_frozen():
    r = NVFP4Recipe.per_token(stochastic_rounding=False)
    assert not r.stochastic_rounding and r.per_token_activations
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.rht = True
    assert r.replace(backward="dequantized").backward == "dequantized"
    with pytest.raises(ValueError, match="rht and per_token_activations"):
        r.replace(rht=True)


def test_from_env_maps_te_variables():
    env = {
        "NVTE_NVFP4_DISABLE_RHT": "1",
        "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "1",
        "NVTE_NVFP4_DISABLE_2D_QUANTIZATION": "1",
        "NVTE_NVFP4_ROW_SCALED_ACTIVATION": "1",
        "NVTE_NVFP4_4OVER6": "weights",
        "NVTE_NVFP4_4OVER6_ERR_MODE": "MSE",
        "NVTE_NVFP4_4OVER6_E4M3_USE_256": "none",
        "NVTE_BACKWARD_OVERRIDE": "dequantized",
    }
    r = NVFP4Recipe.from_env(environ=env)
    assert r == NVFP4Recipe(rht=False, stochastic_rounding=False, weight_2d=False, per_token_activations=True,
                            four_over_six_scope="weights", four_over_six_err_mode="mse", four_over_six_e256_scope=None,
                            backward="dequantized")
    assert NVFP4Recipe.from_env(environ={}) == NVFP4Recipe.te_default()
    base = NVFP4Recipe.per_token()
    assert NVFP4Recipe.from_env(base, environ={"NVTE_NVFP4_PER_TOKEN_ACTIVATION": "0", "NVTE_NVFP4_DISABLE_RHT": "0"}) == NVFP4Recipe()
    assert NVFP4Recipe.from_env(environ={"NVFP4LAB_RHT_SIGN_MASK": "0xACE1"}).rht_sign_mask == 0xACE1
    # "" is off, as TE's os.getenv(name, "0") == "1" reads it
    assert NVFP4Recipe.from_env(environ={"NVTE_NVFP4_DISABLE_RHT": ""}).rht


def test_from_env_per_token_switch_is_pr3045s_recipe():
    """NVTE_NVFP4_PER_TOKEN=1 turns the recipe into PR 3045's, whose own variables opt into RHT / SR /
    2D weights and which overrules the knobs it forces (as the PR's NVFP4BlockScaling does)."""
    env = {"NVTE_NVFP4_PER_TOKEN": "1", "NVTE_NVFP4_DISABLE_RHT": "0", "NVTE_NVFP4_4OVER6": "all"}
    assert NVFP4Recipe.from_env(environ=env) == NVFP4Recipe.pr3045()
    env.update(NVTE_NVFP4_PER_TOKEN_RHT="1", NVTE_NVFP4_PER_TOKEN_SR="1", NVTE_NVFP4_PER_TOKEN_WEIGHT_2D="1",
               NVTE_BACKWARD_OVERRIDE="dequantized")
    assert NVFP4Recipe.from_env(environ=env) == NVFP4Recipe.pr3045(rht=True, stochastic_rounding=True, weight_2d=True,
                                                                   backward="dequantized")
    # the PR's variables without its switch act only on a PR 3045 base
    assert NVFP4Recipe.from_env(environ={"NVTE_NVFP4_PER_TOKEN_SR": "1"}) == NVFP4Recipe()
    assert NVFP4Recipe.from_env(NVFP4Recipe.pr3045(), environ={"NVTE_NVFP4_PER_TOKEN_SR": "1"}).stochastic_rounding


@pytest.mark.parametrize(
    "env, match",
    [
        # TE reads only "1" as on: values it would silently read as off are refused
        ({"NVTE_NVFP4_DISABLE_RHT": "yes"}, "NVTE_NVFP4_DISABLE_RHT='yes': TE reads only the exact string '1' as on"),
        ({"NVTE_NVFP4_DISABLE_RHT": "true"}, "TE reads only the exact string '1'"),
        ({"NVTE_NVFP4_ROW_SCALED_ACTIVATION": " 1"}, "TE reads only the exact string '1'"),
        ({"NVTE_NVFP4_PER_TOKEN": "True"}, "NVTE_NVFP4_PER_TOKEN='True'"),
        ({"NVTE_NVFP4_4OVER6": "grads"}, "NVTE_NVFP4_4OVER6 must be one of"),
        ({"NVTE_NVFP4_4OVER6": "All"}, "TE's exact spelling"),  # TE asserts the lower-case names
        ({"NVTE_NVFP4_4OVER6_ERR_MODE": "L1"}, "NVTE_NVFP4_4OVER6_ERR_MODE must be MAE or MSE"),
        ({"NVTE_BACKWARD_OVERRIDE": "fp32"}, "NVTE_BACKWARD_OVERRIDE must be"),
        ({"NVTE_BACKWARD_OVERRIDE": "none"}, "NVTE_BACKWARD_OVERRIDE must be"),  # TE's assert refuses it too
        ({"NVFP4LAB_RHT_SIGN_MASK": "abc"}, "NVFP4LAB_RHT_SIGN_MASK must be an integer"),
        # TE default keeps RHT on; the message names the variables that made the combination
        ({"NVTE_NVFP4_ROW_SCALED_ACTIVATION": "1"},
         r"environment \(NVTE_NVFP4_ROW_SCALED_ACTIVATION='1'\) is not valid: .*rht and per_token_activations"),
        ({"NVFP4LAB_RHT_SIGN_MASK": "0x10000"}, r"\(NVFP4LAB_RHT_SIGN_MASK='0x10000'\) is not valid: .*16-bit"),
    ],
)
def test_from_env_rejects_bad_values(env, match):
    with pytest.raises(ValueError, match=match):
        NVFP4Recipe.from_env(environ=env)


def test_environment_is_read_only_by_from_env(monkeypatch):
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_RHT", "1")
    monkeypatch.setenv("NVTE_BACKWARD_OVERRIDE", "high_precision")
    assert NVFP4Recipe().rht and NVFP4Recipe.te_default().backward == "quantized"
    r = NVFP4Recipe.from_env()
    assert not r.rht and r.backward == "high_precision"
    assert MXFP8Recipe.from_env().backward == "high_precision" and MXFP8Recipe().backward == "quantized"


def test_mxfp8_recipe():
    r = MXFP8Recipe.te_default()
    assert r.config_for("grad_wgrad") == MXFP8QuantConfig(rowwise=False, columnwise=True)
    h = MXFP8Recipe(fp8_format="hybrid")
    assert h.config_for("grad_dgrad") == MXFP8QuantConfig(fp8_format="e5m2")
    assert h.config_for("input_fprop") == MXFP8QuantConfig()
    with pytest.raises(ValueError, match="fp8_format must be one of"):
        MXFP8Recipe(fp8_format="e5m2")
    with pytest.raises(ValueError, match="backward must be one of"):
        MXFP8Recipe(backward="none")


# ------------------------------------------------------------------------------ recipe names
@pytest.mark.parametrize("name, expected", [
    ("te", NVFP4Recipe.te_default()),
    ("nvfp4-w2d-rht-sr", NVFP4Recipe.te_default()),
    ("nvfp4", NVFP4Recipe(weight_2d=False, rht=False, stochastic_rounding=False)),
    ("nvfp4-w2d-pt-sr", NVFP4Recipe.per_token()),
    ("nvfp4-w2d-pt-ptg-sr", NVFP4Recipe.per_token(gradients=True)),
    ("nvfp4-w2d-4o6mae-sr", NVFP4Recipe.four_over_six()),
    ("nvfp4-w2d-4o6w-rht-sr", NVFP4Recipe.four_over_six("weights")),
    ("nvfp4-4o6mse448", NVFP4Recipe(weight_2d=False, rht=False, stochastic_rounding=False, four_over_six_scope="all",
                                    four_over_six_err_mode="mse", four_over_six_e256_scope=None)),
    ("nvfp4-w2d-rht-sr-hpbwd", NVFP4Recipe.te_default(backward="high_precision")),
    ("nvfp4-dqbwd", NVFP4Recipe(weight_2d=False, rht=False, stochastic_rounding=False, backward="dequantized")),
    ("nvfp4-pr3045", NVFP4Recipe.pr3045()),
    ("nvfp4-w2d-pr3045-rht-sr", NVFP4Recipe.pr3045(weight_2d=True, rht=True, stochastic_rounding=True)),
    ("mxfp8", MXFP8Recipe()),
    ("mxfp8-hybrid", MXFP8Recipe(fp8_format="hybrid")),
    ("bf16", None),
])
def test_recipe_names_build_the_presets(name, expected):
    assert from_recipe_name(name) == expected


@pytest.mark.parametrize("name, match", [
    ("nvfp5", "unknown recipe"),
    ("nvfp4-w3d", "unknown NVFP4 feature"),
    ("nvfp4-sr-w2d", "in the order .*did you mean nvfp4-w2d-sr"),
    ("nvfp4-sr-sr", "once each"),
    ("nvfp4-4o6mae-4o6w", "one 4over6 variant"),
    ("nvfp4-hpbwd-dqbwd", "one backward mode"),
    ("nvfp4-pt-rht", "incompatible recipe options rht and per_token_activations"),
    ("nvfp4-pr3045-4o6mae", "numerics='te_pr3045' and four_over_six_scope='all'"),
])
def test_bad_recipe_names(name, match):
    with pytest.raises(ValueError, match=match):
        from_recipe_name(name)


def test_catalogue_names_are_the_valid_feature_subsets():
    names = nvfp4_recipe_names(("w2d", "pt", "4o6mae", "4o6w", "rht"))
    assert names[:5] == ["nvfp4", "nvfp4-w2d", "nvfp4-pt", "nvfp4-4o6mae", "nvfp4-4o6w"]
    assert "nvfp4-pt-rht" not in names and "nvfp4-4o6mae-rht" not in names and "nvfp4-4o6w-rht" in names
    assert "nvfp4-w2d-pt-4o6w" in names and not any("4o6mae-4o6w" in n for n in names)
    assert recipe_summary("nvfp4-w2d-sr") == "NVFP4 + 16x16 weights, SR on gradients"
