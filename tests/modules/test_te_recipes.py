"""TE's recipe classes under TE's names (nvfp4lab.te_recipes): fields, defaults and validation as TE main
and PR 3045 have them, the mapping to NVFP4Recipe and back, and from_env with TE's parsing."""
import dataclasses

import pytest

import nvfp4lab
from nvfp4lab import NVFP4BlockScaling, NVFP4PerTokenBlockScaling, NVFP4Recipe
from nvfp4lab.te_recipes import Format

TE_MAIN_FIELDS = ("disable_rht", "disable_stochastic_rounding", "disable_2d_quantization", "row_scaled_activation",
                  "nvfp4_4over6", "nvfp4_4over6_e4m3_use_256", "nvfp4_4over6_err_mode", "fp4_format", "fp8_format",
                  "fp8_dpa", "fp8_mha", "backward_override")


def test_fields_and_defaults_are_te_mains():
    te = NVFP4BlockScaling()
    assert tuple(f.name for f in dataclasses.fields(te)) == TE_MAIN_FIELDS
    assert (te.disable_rht, te.disable_stochastic_rounding, te.disable_2d_quantization, te.row_scaled_activation) == (False,) * 4
    assert (te.nvfp4_4over6, te.nvfp4_4over6_e4m3_use_256, te.nvfp4_4over6_err_mode) == ("none", "all", "MAE")
    assert (te.fp4_format, te.fp8_format, te.fp8_dpa, te.fp8_mha, te.backward_override) == (Format.E2M1, Format.E4M3, False, False, None)
    assert te.to_recipe() == NVFP4Recipe.te_default()


@pytest.mark.parametrize("te_kwargs, recipe_kwargs", [
    (dict(disable_rht=True), dict(rht=False)),
    (dict(disable_stochastic_rounding=True), dict(stochastic_rounding=False)),
    (dict(disable_2d_quantization=True), dict(weight_2d=False)),
    (dict(disable_rht=True, row_scaled_activation=True), dict(rht=False, per_token_activations=True)),
    (dict(nvfp4_4over6="weights"), dict(four_over_six_scope="weights")),
    (dict(disable_rht=True, nvfp4_4over6="all", nvfp4_4over6_e4m3_use_256="none", nvfp4_4over6_err_mode="MSE"),
     dict(rht=False, four_over_six_scope="all", four_over_six_err_mode="mse", four_over_six_e256_scope=None)),
    (dict(backward_override="dequantized"), dict(backward="dequantized")),
    (dict(backward_override="high_precision"), dict(backward="high_precision")),
])
def test_te_names_map_to_the_recipe_and_back(te_kwargs, recipe_kwargs):
    te = NVFP4BlockScaling(**te_kwargs)
    recipe = NVFP4Recipe(**recipe_kwargs)
    assert te.to_recipe() == recipe == NVFP4Recipe.from_te(te)
    assert recipe.to_te() == te
    assert repr(te) == f"NVFP4BlockScaling({', '.join(f'{k}={v!r}' for k, v in te_kwargs.items())})"


def test_the_issue_example_is_te_mains_row_scaled_recipe():
    te = NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True)
    assert te.to_recipe() == NVFP4Recipe.per_token()
    layer = nvfp4lab.Linear(32, 16, recipe=te)
    assert layer.recipe == NVFP4Recipe.per_token()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(row_scaled_activation=True), ValueError, "rht and per_token_activations"),  # TE's quantizers refuse it too
    (dict(nvfp4_4over6="activations"), ValueError, "rht and four_over_six_scope"),
    (dict(nvfp4_4over6="All"), ValueError, "nvfp4_4over6 must be one of"),
    (dict(nvfp4_4over6_err_mode="mae"), ValueError, "nvfp4_4over6_err_mode must be one of"),  # TE asserts MAE / MSE
    (dict(backward_override="none"), ValueError, "backward_override must be one of"),
    (dict(fp4_format=Format.E4M3), ValueError, "fp4_format must be Format.E2M1"),
    (dict(fp8_format="E5M2"), ValueError, "fp8_format must be Format.E4M3"),
    (dict(fp8_format=3), TypeError, "fp8_format must be a Format"),
    (dict(fp8_dpa=True), ValueError, "Linear layers only"),
    (dict(disable_rht=1), TypeError, "disable_rht must be a bool"),
])
def test_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        NVFP4BlockScaling(**kwargs)


def test_format_names_are_accepted():
    assert NVFP4BlockScaling(fp4_format="E2M1", fp8_format="E4M3") == NVFP4BlockScaling()


def test_recipes_te_cannot_express_refuse_to_map_back():
    with pytest.raises(ValueError, match="rht_sign_mask=0x1234"):
        NVFP4Recipe(rht_sign_mask=0x1234).to_te()
    with pytest.raises(ValueError, match="per_token_gradients=True with TE main's numerics"):
        NVFP4Recipe(rht=False, per_token_gradients=True).to_te()
    # the scale layout is nvfp4lab's storage choice, not part of TE's recipe
    assert NVFP4Recipe(scale_layout="compact").to_te() == NVFP4BlockScaling()


# ----------------------------------------------------------------------------------- PR 3045
def test_per_token_recipe_fields_defaults_and_role_map():
    te = NVFP4PerTokenBlockScaling()
    assert isinstance(te, NVFP4BlockScaling)
    names = [f.name for f in dataclasses.fields(te)]
    assert names == [*TE_MAIN_FIELDS, "per_token_rht", "per_token_sr", "per_token_weight_2d"]
    assert (te.per_token_rht, te.per_token_sr, te.per_token_weight_2d) == (False, False, False)
    # the knobs the PR forces
    assert (te.disable_rht, te.disable_stochastic_rounding, te.disable_2d_quantization) == (True, True, True)
    assert (te.row_scaled_activation, te.nvfp4_4over6) == (False, "none")
    recipe = te.to_recipe()
    assert recipe == NVFP4Recipe.pr3045()
    for role in ("input_fprop", "input_wgrad", "weight_fprop", "weight_dgrad", "grad_dgrad", "grad_wgrad"):
        config = recipe.config_for(role)
        assert config.per_token and config.numerics == "te_pr3045" and config.block == "1x16", role
        assert not (config.rht or config.stochastic_rounding), role
    assert repr(te) == "NVFP4PerTokenBlockScaling()"


def test_per_token_opt_ins():
    te = NVFP4PerTokenBlockScaling(per_token_rht=True, per_token_sr=True, per_token_weight_2d=True, backward_override=None)
    assert not te.disable_rht and not te.disable_stochastic_rounding and te.disable_2d_quantization
    recipe = te.to_recipe()
    assert recipe == NVFP4Recipe.pr3045(rht=True, stochastic_rounding=True, weight_2d=True)
    assert recipe.to_te() == te
    rht_on = {role for role in ("input_wgrad", "grad_wgrad", "input_fprop", "grad_dgrad") if recipe.config_for(role).rht}
    assert rht_on == {"input_wgrad", "grad_wgrad"}  # the two wgrad copies
    assert recipe.config_for("grad_dgrad").stochastic_rounding and recipe.config_for("grad_wgrad").stochastic_rounding
    assert not recipe.config_for("input_fprop").stochastic_rounding
    assert recipe.config_for("weight_fprop").block == "16x16" and recipe.config_for("weight_fprop").broadcast_2d
    assert te.replace(per_token_rht=False).to_recipe() == NVFP4Recipe.pr3045(stochastic_rounding=True, weight_2d=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(disable_rht=False), "forces disable_rht=True"),
    (dict(per_token_rht=True, disable_rht=True), "forces disable_rht=False"),
    (dict(disable_2d_quantization=False), "forces disable_2d_quantization=True"),
    (dict(row_scaled_activation=True), "forces row_scaled_activation=False"),
    (dict(nvfp4_4over6="weights"), "forces nvfp4_4over6='none'"),
])
def test_per_token_refuses_contrary_forced_knobs(kwargs, match):
    """The PR overwrites these silently; here an explicit contrary value raises."""
    with pytest.raises(ValueError, match=match):
        NVFP4PerTokenBlockScaling(**kwargs)
    NVFP4PerTokenBlockScaling(disable_rht=True, row_scaled_activation=False, nvfp4_4over6="none")  # agreeing values are fine


# ------------------------------------------------------------------------------------ from_env
def test_from_env_uses_te_names_and_parsing():
    env = {"NVTE_NVFP4_DISABLE_RHT": "1", "NVTE_NVFP4_DISABLE_STOCHASTIC_ROUNDING": "0",
           "NVTE_NVFP4_ROW_SCALED_ACTIVATION": "1", "NVTE_NVFP4_4OVER6": "weights", "NVTE_NVFP4_4OVER6_ERR_MODE": "mse",
           "NVTE_BACKWARD_OVERRIDE": "high_precision", "NVTE_NVFP4_DISABLE_2D_QUANTIZATION": ""}
    te = NVFP4BlockScaling.from_env(env)
    assert te == NVFP4BlockScaling(disable_rht=True, row_scaled_activation=True, nvfp4_4over6="weights",
                                   nvfp4_4over6_err_mode="MSE", backward_override="high_precision")
    assert NVFP4BlockScaling.from_env({}) == NVFP4BlockScaling()
    with pytest.raises(ValueError, match="TE reads only the exact string '1'"):
        NVFP4BlockScaling.from_env({"NVTE_NVFP4_DISABLE_RHT": "true"})


def test_from_env_per_token_switch_and_variables():
    env = {"NVTE_NVFP4_PER_TOKEN": "1", "NVTE_NVFP4_PER_TOKEN_RHT": "1", "NVTE_NVFP4_PER_TOKEN_WEIGHT_2D": "1",
           "NVTE_NVFP4_DISABLE_RHT": "1", "NVTE_NVFP4_4OVER6": "all"}  # the last two: forced by the PR
    te = NVFP4BlockScaling.from_env(env)
    assert te == NVFP4PerTokenBlockScaling(per_token_rht=True, per_token_weight_2d=True)
    assert NVFP4PerTokenBlockScaling.from_env({"NVTE_NVFP4_PER_TOKEN_SR": "1"}) == NVFP4PerTokenBlockScaling(per_token_sr=True)
    assert te.to_recipe() == NVFP4Recipe.from_env(environ=env)


def test_from_env_reads_os_environ(monkeypatch):
    monkeypatch.setenv("NVTE_NVFP4_DISABLE_2D_QUANTIZATION", "1")
    assert NVFP4BlockScaling() == NVFP4BlockScaling(disable_2d_quantization=False)  # defaults never read it
    assert NVFP4BlockScaling.from_env().disable_2d_quantization
