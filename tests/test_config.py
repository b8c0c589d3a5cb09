"""Config loading: shipped configs, overrides, typed domain sections, and every user mistake as a ConfigError."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from wmrl.config import DEFAULT_DOMAIN, ConfigError, RunConfig, load_config, to_yaml
from wmrl.core.anchors import AnchorConfig
from wmrl.core.debias import DebiasConfig
from wmrl.core.engine import EngineConfig
from wmrl.core.estimators import EstimatorConfig
from wmrl.core.trainer import TrainerConfig
from wmrl.domains.synthetic.control import ControlConfig, LatentConfig, PerturbedConfig
from wmrl.domains.synthetic.program import DistortedConfig, ProgramConfig


def _error(source=None, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(source, overrides)
    return str(info.value)


# ------------------------------------------------------------------ what loads


def test_defaults_load_with_default_domain_typed():
    cfg = load_config(None)
    assert isinstance(cfg, RunConfig)
    assert DEFAULT_DOMAIN == "synthetic-program"
    assert isinstance(cfg.domain, ProgramConfig)
    assert cfg.domain == ProgramConfig()
    assert isinstance(cfg.estimator, EstimatorConfig) and cfg.estimator == EstimatorConfig()
    assert isinstance(cfg.estimator.debias, DebiasConfig)
    assert cfg.anchors == AnchorConfig()
    assert cfg.engine == EngineConfig()
    assert cfg.trainer == TrainerConfig()
    assert cfg.run_dir == RunConfig().run_dir


def test_shipped_program_config_loads():
    cfg = load_config("synthetic-program")
    assert isinstance(cfg.domain, ProgramConfig)
    # values from configs/synthetic-program.yaml, not the dataclass defaults
    assert isinstance(cfg.world_model, DistortedConfig)
    assert cfg.world_model.hack == 0.6 and DistortedConfig().hack != 0.6
    assert cfg.domain.real_delay_s == 0.02
    assert cfg.trainer.steps == 80
    assert cfg.engine.lr == 0.03
    assert cfg.estimator.mode == "wmrl"
    assert cfg.run_dir == "runs/synthetic-program"


def test_shipped_control_config_loads():
    cfg = load_config("synthetic-control")
    assert isinstance(cfg.domain, ControlConfig)
    assert cfg.domain.name == "synthetic-control"
    assert isinstance(cfg.world_model, PerturbedConfig)
    assert cfg.world_model.gain_error == 0.1
    assert cfg.world_model.speed_bonus == 0.15
    assert cfg.trainer.steps == 60
    assert cfg.run_dir == "runs/synthetic-control"


def test_domain_name_override_picks_the_domain_schema():
    cfg = load_config(None, ["domain.name=synthetic-control", "domain.horizon=5"])
    assert isinstance(cfg.domain, ControlConfig)
    assert cfg.domain.horizon == 5


def test_yaml_plus_overrides_overrides_win(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({
        "domain": {"name": "synthetic-program", "n_slots": 3},
        "world_model": {"hack": 0.1},
        "trainer": {"steps": 11, "group_size": 4},
        "anchors": {"fraction": 0.5},
        "run_dir": "from-yaml",
    }))
    cfg = load_config(str(path), ["trainer.steps=7", "anchors.fraction=0.75", "run_dir=from-cli"])
    assert cfg.trainer.steps == 7  # override wins
    assert cfg.anchors.fraction == 0.75
    assert cfg.run_dir == "from-cli"
    assert cfg.trainer.group_size == 4  # yaml kept where not overridden
    assert cfg.world_model.hack == 0.1 and cfg.domain.n_slots == 3
    assert cfg.trainer.groups_per_step == TrainerConfig().groups_per_step  # default elsewhere


def test_shipped_config_plus_overrides():
    cfg = load_config("synthetic-program", ["trainer.steps=3", "domain.real_delay_s=0"])
    assert cfg.trainer.steps == 3
    assert cfg.domain.real_delay_s == 0.0
    assert cfg.world_model.hack == 0.6


def test_mapping_and_runconfig_sources():
    cfg = load_config({"trainer": {"steps": 5}}, ["trainer.seed=3"])
    assert (cfg.trainer.steps, cfg.trainer.seed) == (5, 3)
    again = load_config(cfg, ["trainer.steps=6"])
    assert again.trainer.steps == 6 and again.trainer.seed == 3
    assert cfg.trainer.steps == 5  # the source is not mutated


def test_domain_and_world_model_keys_are_typed():
    cfg = load_config(None, ["world_model.hack=0.3", "domain.n_slots=5"])
    assert isinstance(cfg.world_model.hack, float) and cfg.world_model.hack == 0.3
    assert isinstance(cfg.domain.n_slots, int) and cfg.domain.n_slots == 5
    # an int written for a float field becomes a float
    cfg = load_config(None, ["world_model.hack=1"])
    assert isinstance(cfg.world_model.hack, float)


def test_domain_key_of_wrong_type_names_the_key():
    msg = _error(None, ["domain.n_slots=abc"])
    assert "domain.n_slots" in msg
    assert "abc" in msg


def test_key_of_another_domain_is_rejected():
    msg = _error(None, ["domain.name=synthetic-control", "domain.n_slots=3"])
    assert "domain.n_slots" in msg
    assert "horizon" in msg  # lists the keys the control domain does have


def test_the_executor_is_local_or_ray_and_an_address_needs_ray():
    assert load_config("autoresearch", ["domain.executor=ray"]).domain.executor == "ray"
    assert "domain.executor must be one of local, ray, got 'k8s'" in _error("autoresearch", ["domain.executor=k8s"])
    assert "set domain.executor=ray" in _error("autoresearch", ["domain.ray_address=auto"])


# ------------------------------------------------------------------ bad input


def test_malformed_yaml_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("trainer:\n  steps: [1, 2\n  seed: 3\n")
    msg = _error(str(path))
    assert str(path) in msg
    assert "YAML" in msg
    assert "\n" not in msg  # one line: the CLI prints it as-is


def test_yaml_that_is_a_list(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- trainer\n- steps\n")
    msg = _error(str(path))
    assert str(path) in msg
    assert "mapping" in msg and "list" in msg


def test_empty_yaml_is_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert load_config(str(path)) == load_config(None)


def test_unknown_top_level_key():
    msg = _error(None, ["bogus=1"])
    assert "bogus" in msg
    assert "trainer" in msg and "estimator" in msg  # what is allowed


def test_unknown_top_level_key_in_yaml(tmp_path):
    path = tmp_path / "extra.yaml"
    path.write_text("trainers:\n  steps: 3\n")
    msg = _error(str(path))
    assert "trainers" in msg


def test_unknown_nested_key():
    msg = _error(None, ["estimator.debias.bogus=1"])
    assert "estimator.debias.bogus" in msg
    assert "min_pairs" in msg  # lists the real keys of that section


def test_wrong_type():
    msg = _error(None, ["trainer.steps=many"])
    assert "trainer.steps" in msg
    assert "many" in msg
    assert "int" in msg.lower()


def test_section_that_is_not_a_mapping():
    msg = _error(None, ["domain=5"])
    assert msg.startswith("domain")
    assert "mapping" in msg
    msg = _error(None, ["estimator=5"])
    assert msg.startswith("estimator")


def test_unknown_mode_lists_modes():
    msg = _error(None, ["estimator.mode=foo"])
    assert "estimator.mode" in msg and "foo" in msg
    for mode in ("real", "wm", "wmrl"):
        assert mode in msg


def test_unknown_domain_lists_registered():
    msg = _error(None, ["domain.name=nope"])
    assert "domain.name" in msg and "nope" in msg
    assert "synthetic-program" in msg and "synthetic-control" in msg


@pytest.mark.parametrize("rho", ["1.5", "-0.1"])
def test_anchor_fraction_out_of_range(rho):
    msg = _error(None, [f"anchors.fraction={rho}"])
    assert "anchors.fraction" in msg
    assert "[0, 1]" in msg


@pytest.mark.parametrize("rho", ["0", "1"])
def test_anchor_fraction_bounds_are_allowed(rho):
    mode = "wm" if rho == "0" else "wmrl"
    assert load_config(None, [f"anchors.fraction={rho}", f"estimator.mode={mode}"]).anchors.fraction == float(rho)


def test_zero_anchors_in_wmrl_mode():
    msg = _error(None, ["anchors.fraction=0", "estimator.mode=wmrl"])
    assert "anchors.fraction" in msg and "wmrl" in msg
    assert "estimator.mode=wm" in msg  # what to do instead


def test_zero_stage_out_of_range():
    msg = _error(None, ["engine.zero_stage=7"])
    assert "engine.zero_stage" in msg
    assert "0..3" in msg


def test_group_size_one():
    msg = _error(None, ["trainer.group_size=1"])
    assert "trainer.group_size" in msg
    assert ">= 2" in msg


@pytest.mark.parametrize("item", ["nokeyvalue", "=5", "trainer..steps=3", "anchors.max_in_flight"])
def test_bad_dotlist_override(item):
    msg = _error(None, [item])
    assert repr(item) in msg
    assert "key.sub=value" in msg


def test_missing_config_file(tmp_path):
    path = tmp_path / "absent.yaml"
    msg = _error(str(path))
    assert str(path) in msg
    assert "does not exist" in msg


def test_unknown_shipped_name_lists_shipped():
    msg = _error("no-such-config")
    assert "no-such-config" in msg
    assert "synthetic-program" in msg and "synthetic-control" in msg
    assert ".yaml" in msg


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# ------------------------------------------------------------------ round trip


@pytest.mark.parametrize("source, overrides", [
    (None, []),
    ("synthetic-program", ["world_model.hack=0.3", "anchors.max_in_flight=2", "trainer.eval_splits=[test_id]"]),
    ("synthetic-control", ["world_model.type=latent-dynamics", "world_model.members=3",
                           "world_model.runtime.timeout_s=2.5"]),
    ("synthetic-control", ["estimator.mode=wm", "anchors.fraction=0", "domain.ledger=/tmp/x.jsonl"]),
])
def test_to_yaml_round_trip(tmp_path, source, overrides):
    cfg = load_config(source, overrides)
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    back = load_config(str(path))
    assert back == cfg
    assert type(back.domain) is type(cfg.domain)
    assert dataclasses.asdict(back) == dataclasses.asdict(cfg)
    assert to_yaml(back) == to_yaml(cfg)


def test_imports_key_registers_a_user_domain(tmp_path, monkeypatch):
    (tmp_path / "my_wmrl_domain.py").write_text(
        "from dataclasses import dataclass\n"
        "import wmrl\n"
        "from wmrl.domains.synthetic.program import ProgramConfig, ProgramDomain\n"
        "@dataclass\n"
        "class MyConfig(ProgramConfig):\n"
        "    name: str = 'my-domain'\n"
        "    extra: int = 3\n"
        "@wmrl.register_domain('my-domain')\n"
        "class MyDomain(ProgramDomain):\n"
        "    config_class = MyConfig\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config({"imports": ["my_wmrl_domain"], "domain": {"name": "my-domain", "extra": 5}})
    assert cfg.domain.extra == 5
    with pytest.raises(ConfigError, match="could not import 'no_such_module_xyz'"):
        load_config({"imports": ["no_such_module_xyz"]})
    with pytest.raises(ConfigError, match="list of module names"):
        load_config({"imports": "my_wmrl_domain"})


# ------------------------------------------------------------------ the world_model section


def test_world_model_type_selects_its_typed_section_and_defaults_to_the_domains_own():
    assert load_config(None).world_model == DistortedConfig(type="program-distorted")
    # switching the type on the command line drops the file's keys for the other type
    cfg = load_config("synthetic-control", ["world_model.type=latent-dynamics", "world_model.members=3"])
    assert isinstance(cfg.world_model, LatentConfig) and cfg.world_model.members == 3
    assert load_config("synthetic-control", ["world_model.shape=3"]).world_model.gain_error == 0.1  # same type: kept
    msg = _error("synthetic-control", ["world_model.type=latent-dynamics", "world_model.gain_error=0.1"])
    assert "'world_model.gain_error'" in msg and "world_model keys are: type, runtime, members" in msg


def test_a_world_model_of_another_domain_is_refused_with_what_fits():
    msg = _error("synthetic-control", ["world_model.type=program-distorted"])
    assert msg == ("world_model.type: 'program-distorted' serves synthetic-program, not 'synthetic-control'; "
                   "world models for domain 'synthetic-control': latent-dynamics, perturbed-dynamics "
                   "(or register one with @wmrl.register_world_model)")


def test_an_unknown_world_model_is_refused_with_what_fits():
    msg = _error("synthetic-control", ["world_model.type=nope"])
    assert msg == ("world_model.type: unknown world model 'nope'; world models for domain 'synthetic-control': "
                   "latent-dynamics, perturbed-dynamics (or register one with @wmrl.register_world_model)")


@pytest.mark.parametrize("override", ["domain.wm_hack=0.3", "domain.wm_noise=0.1"])
def test_the_old_domain_keys_for_world_models_point_at_the_new_section(override):
    msg = _error(None, [override])
    assert "world models have their own section: world_model.type=NAME and world_model.<key>" in msg


@pytest.mark.parametrize("overrides, expected", [
    (["world_model.shape=0"], "world_model.shape must be > 0, got 0.0"),
    (["world_model.runtime.timeout_s=-1"], "world_model.runtime.timeout_s must be >= 0 (0: no deadline), got -1.0"),
    (["world_model.runtime.warm_start=[/no/such/store.sqlite]"],
     "world_model.runtime.warm_start: no run store at /no/such/store.sqlite; point it at a run's store.sqlite"),
    (["trainer.eval_splits=[test]"], "trainer.eval_splits: unknown split 'test'; splits are train, test_id, test_ood, validation"),
    (["domain.real_delay_s=-1"], "domain.real_delay_s must be >= 0, got -1.0"),
    (["estimator.mode=grpo"], "estimator.mode: unknown mode 'grpo'; choose one of fused, real, wm, wmrl"),
    (["anchors.fraction=0"], "anchors.fraction is 0 in mode wmrl: it needs an anchor stream, anchors.fraction in "
                             "(0, 1]; use estimator.mode=wm for none"),
    (["estimator.lambda_half_life=0"], "estimator.lambda_half_life must be > 0 (steps), got 0.0"),
])
def test_each_refused_value_says_what_to_fix(overrides, expected):
    assert _error(None, overrides) == expected


def test_a_mode_that_needs_a_world_model_is_refused_on_a_domain_without_one(tmp_path, monkeypatch):
    (tmp_path / "wmrl_no_wm_domain.py").write_text(
        "from dataclasses import dataclass\n"
        "import wmrl\n"
        "from wmrl.domains.synthetic.program import ProgramConfig, ProgramDomain\n"
        "@dataclass\n"
        "class BareConfig(ProgramConfig):\n"
        "    name: str = 'bare-domain'\n"
        "@wmrl.register_domain('bare-domain')\n"
        "class BareDomain(wmrl.Domain):\n"
        "    config_class = BareConfig\n"
        "    tasks = ProgramDomain.tasks\n"
        "    make_policy = ProgramDomain.make_policy\n"
        "    make_real_env = ProgramDomain.make_real_env\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    base = {"imports": ["wmrl_no_wm_domain"], "domain": {"name": "bare-domain"}}
    assert load_config({**base, "estimator": {"mode": "real"}}).world_model is None
    msg = _error(base)
    assert msg == ("estimator.mode=wmrl needs a world model and domain 'bare-domain' has none registered; "
                   "use estimator.mode=real or register one with @wmrl.register_world_model")
    assert "has no default world model; set world_model.type" in _error({**base, "world_model": {"hack": 0.1}})


def test_switching_the_type_keeps_the_runtime_and_naming_the_default_type_keeps_the_keys():
    src = {"world_model": {"noise": 0.2, "runtime": {"timeout_s": 3.0}}}
    same = load_config(src, ["world_model.type=program-distorted"])  # the default type, named: nothing dropped
    assert same.world_model.noise == 0.2 and same.world_model.runtime.timeout_s == 3.0
    ctl = {"domain": {"name": "synthetic-control"}, **src}
    other = load_config(ctl, ["world_model.type=latent-dynamics"])
    assert isinstance(other.world_model, LatentConfig) and other.world_model.runtime.timeout_s == 3.0


@pytest.mark.parametrize("key, where", [("trainer.wm_timeout_s=1", "world_model.runtime.timeout_s"),
                                        ("trainer.wm_warm_start=[]", "world_model.runtime.warm_start"),
                                        ("domain.world_model=x", "world_model.type")])
def test_a_moved_key_says_where_it_went(key, where):
    assert _error(None, [key]).endswith(f"it is {where} now (docs/world_models.md)")


def test_a_saved_run_config_that_no_longer_loads_names_its_folder(tmp_path):
    from wmrl.config import load_run_config

    (tmp_path / "config.yaml").write_text("domain:\n  name: synthetic-program\n  wm_hack: 0.6\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(tmp_path)
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path / 'config.yaml'} (a saved run): config key 'domain.wm_hack'")
    assert msg.endswith("train it again in a new run_dir")
    with pytest.raises(ConfigError, match="not a wmrl run folder"):
        load_run_config(tmp_path / "nope")
