import pytest

from qkv.config import ModelConfig, PRESETS, preset
from qkv.errors import ConfigError
from qkv.settings import apply_overrides, from_dict, load_yaml


def test_unknown_key_gets_did_you_mean():
    with pytest.raises(ConfigError, match="unknown key 'd_modle'.*did you mean 'd_model'"):
        from_dict(ModelConfig, {"d_modle": 256})


def test_overrides_parse_and_check_types():
    cfg = apply_overrides(PRESETS["tiny-gpt"], ["d_model=48", "dropout=0.1", "bias=false", "positional=rope"])
    assert (cfg.d_model, cfg.dropout, cfg.bias, cfg.positional) == (48, 0.1, False, "rope")
    with pytest.raises(ConfigError, match="expected an integer"):
        apply_overrides(cfg, ["n_heads=two"])
    with pytest.raises(ConfigError, match="did you mean 'n_heads'"):
        apply_overrides(cfg, ["n_head=2"])
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides(cfg, ["n_heads"])


def test_inconsistent_values_are_errors():
    with pytest.raises(ConfigError, match="not divisible"):
        ModelConfig(d_model=10, n_heads=3)
    with pytest.raises(ConfigError, match="positional='sinusodal'.*did you mean 'sinusoidal'"):
        ModelConfig(positional="sinusodal")
    with pytest.raises(ConfigError, match="dropout"):
        ModelConfig(dropout=1.5)


def test_yaml_file(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("arch: gpt\nd_model: 64\nn_heads: 4\n")
    cfg = load_yaml(path, ModelConfig, ["n_layers=3"])
    assert (cfg.arch, cfg.d_model, cfg.n_layers) == ("gpt", 64, 3)
    path.write_text("d_model: 64\nnheads: 4\n")
    with pytest.raises(ConfigError, match=r"m.yaml: unknown key 'nheads'"):
        load_yaml(path, ModelConfig)
    with pytest.raises(ConfigError, match="not found"):
        load_yaml(tmp_path / "missing.yaml", ModelConfig)


def test_preset_overrides():
    assert preset("tiny-gpt", vocab_size=100).vocab_size == 100
    with pytest.raises(ConfigError, match="did you mean 'tiny-gpt'"):
        preset("tiny-gtp")
