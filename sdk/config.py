"""Typed run configuration: YAML plus command-line dotlist overrides, merged onto dataclasses.

Each component owns a config dataclass next to its code (`AnchorConfig` in
`anchors.py`, ...); `RunConfig` only assembles them. The `domain:` section's
schema is chosen by `domain.name` from the domain registry and the
`world_model:` section's by `world_model.type` from the world-model registry
(default: the domain's own), so their keys are typed and checked like everyone
else's, and a world model that does not serve the domain is refused here.
Every section validates itself the same way (`core/validation.py`), once, here.
Every mistake a user can make
in a config -- YAML that does not parse, a key that does not exist, a value of
the wrong type, an unknown mode or domain, a value out of range -- becomes a
`ConfigError` that names the key and says what is allowed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, is_dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from wmrl.core.anchors import AnchorConfig
from wmrl.core.engine import EngineConfig
from wmrl.core.estimators import EstimatorConfig, plan_mode
from wmrl.core.registry import DOMAINS, WORLD_MODELS
from wmrl.core.trainer import TrainerConfig
from wmrl.core.validation import validate_config
from wmrl.core.wm_spec import default_config, world_models_for
from wmrl.registry import load_builtin_domains

DEFAULT_DOMAIN = "synthetic-program"


class ConfigError(ValueError):
    """A configuration the run cannot start from; the message says what to fix."""


#: the config sections that are mappings of keys
SECTIONS = ("domain", "world_model", "estimator", "anchors", "engine", "trainer")


@dataclass
class RunConfig:
    domain: Any = None  # the domain's config dataclass, chosen by domain.name
    world_model: Any = None  # a WorldModelConfig subclass, chosen by world_model.type; None: the domain has none
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    anchors: AnchorConfig = field(default_factory=AnchorConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    run_dir: str = "runs/default"
    run_id: str = "run"
    tensorboard: bool = True
    log_level: str = "WARNING"
    imports: list[str] = field(default_factory=list)  # modules that register user domains


def resolve_config_path(name_or_path: str) -> Path:
    """A YAML path as given, or the name of a config shipped with the package."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        return p
    shipped = resources.files("wmrl.configs") / f"{name_or_path}.yaml"
    if not shipped.is_file():
        known = sorted(f.name[:-5] for f in resources.files("wmrl.configs").iterdir() if f.name.endswith(".yaml"))
        raise ConfigError(f"no config named {name_or_path!r}; shipped configs: {', '.join(known)}; or pass a .yaml path")
    return Path(str(shipped))


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        # one line: the CLI promises a single line per mistake
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        what = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ConfigError(f"{path} is not valid YAML{at}: {what}; fix the file's syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config sections, not {type(data).__name__}")
    return data


def _key_of(exc: OmegaConfBaseException) -> str:
    return str(getattr(exc, "full_key", None) or getattr(exc, "key", None) or "?")


#: keys that moved, with where they went (an unknown key among them says so)
MOVED = {"domain.world_model": "world_model.type", "trainer.wm_timeout_s": "world_model.runtime.timeout_s",
         "trainer.wm_warm_start": "world_model.runtime.warm_start"}


def _allowed_keys(schema: DictConfig, key: str) -> str:
    """For an unknown key: the keys its section does have, so the message says what to write instead."""
    if key in MOVED:
        return f"; it is {MOVED[key]} now (docs/world_models.md)"
    if key.startswith("domain.wm_"):
        return ("; world models have their own section: world_model.type=NAME and world_model.<key> "
                "(docs/world_models.md lists each one's keys)")
    parent = key.rpartition(".")[0]
    node = OmegaConf.select(schema, parent, default=None) if parent else schema
    if not isinstance(node, DictConfig):
        return ""
    return f"; {parent or 'top-level'} keys are: {', '.join(str(k) for k in node.keys())}"


def _check_override(item: str) -> None:
    key, eq, _ = item.partition("=")
    if not eq or not key.strip() or any(not part for part in key.split(".")):
        raise ConfigError(f"bad command-line override {item!r}: write it as key.sub=value (e.g. trainer.steps=100)")


def load_config(source: str | Path | dict | RunConfig | DictConfig | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Build a validated RunConfig from a YAML path/name, a mapping or a RunConfig, plus overrides."""
    unavailable = load_builtin_domains()
    if isinstance(source, RunConfig):
        raw: Any = OmegaConf.structured(source)
    elif isinstance(source, DictConfig):
        raw = source
    elif isinstance(source, dict):
        raw = OmegaConf.create(source)
    elif source is None:
        raw = OmegaConf.create({})
    else:
        raw = OmegaConf.create(_read_yaml(resolve_config_path(str(source))))
    for item in overrides:
        _check_override(str(item))
    try:
        dotlist = OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"bad command-line override ({exc}); write them as key.sub=value") from None
    source_wm = OmegaConf.select(raw, "world_model", default=None)
    raw = OmegaConf.merge(raw, dotlist)
    _import_user_modules(raw)

    for section in SECTIONS:
        value = raw.get(section) if isinstance(raw, DictConfig) else None
        if value is not None and not isinstance(value, DictConfig):
            raise ConfigError(f"{section}: must be a mapping of {section} keys (e.g. {section}.<key>=value), got {value!r}")
    domain_name = OmegaConf.select(raw, "domain.name", default=None) or DEFAULT_DOMAIN
    if not isinstance(domain_name, str):
        raise ConfigError(f"domain.name: must be a domain name (string), got {domain_name!r}; registered: {', '.join(DOMAINS.names())}")
    if domain_name in unavailable:
        raise ConfigError(f"domain.name: {unavailable[domain_name]}")
    if domain_name not in DOMAINS:
        raise ConfigError(f"domain.name: unknown domain {domain_name!r}; registered: {', '.join(DOMAINS.names())}")
    domain_schema = DOMAINS.get(domain_name).config_class
    if not OmegaConf.select(raw, "domain", default=None):
        raw.domain = {}
    raw.domain.name = domain_name
    switched = OmegaConf.select(dotlist, "world_model.type", default=None)
    if switched is not None and isinstance(source_wm, DictConfig):
        before = source_wm.get("type") or DOMAINS.get(domain_name).default_world_model
        if switched != before:  # the source's keys were for another type: that type's defaults apply
            kept = {"runtime": source_wm.runtime} if source_wm.get("runtime") is not None else {}
            raw.world_model = OmegaConf.merge(OmegaConf.create(kept), dotlist.world_model)
    wm_type = _world_model_type(raw, domain_name)
    wm_schema = None
    if wm_type is not None:
        wm_schema = default_config(wm_type)
        if not OmegaConf.select(raw, "world_model", default=None):
            raw.world_model = {}
        raw.world_model.type = wm_type
    try:
        schema = OmegaConf.structured(RunConfig(domain=domain_schema(), world_model=wm_schema))
        merged = OmegaConf.merge(schema, raw)
        cfg: RunConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        msg = str(exc).splitlines()[0]
        key = _key_of(exc)
        hint = _allowed_keys(schema, key) if isinstance(exc, ConfigKeyError) else ""
        raise ConfigError(f"config key {key!r}: {msg}{hint}") from None
    validate(cfg)
    return cfg


def _world_model_type(raw: DictConfig, domain: str) -> str | None:
    """`world_model.type`, or the domain's default (for the configured mode); refused unless it serves `domain`."""
    name = OmegaConf.select(raw, "world_model.type", default=None)
    fits = world_models_for(domain)
    offer = f"world models for domain {domain!r}: {', '.join(fits) or 'none'} (or register one with @wmrl.register_world_model)"
    if name is None:
        cls = DOMAINS.get(domain)
        mode = OmegaConf.select(raw, "estimator.mode", default=None)
        name = cls.mode_world_models.get(mode, cls.default_world_model)
        if name is None and OmegaConf.select(raw, "world_model", default=None):
            raise ConfigError(f"world_model: domain {domain!r} has no default world model; set world_model.type ({offer})")
        return name
    if not isinstance(name, str) or name not in WORLD_MODELS:
        raise ConfigError(f"world_model.type: unknown world model {name!r}; {offer}")
    spec = WORLD_MODELS.get(name)
    if not spec.serves(domain):
        raise ConfigError(f"world_model.type: {name!r} serves {', '.join(spec.domains)}, not {domain!r}; {offer}")
    return name


def _import_user_modules(raw: Any) -> None:
    """`imports: [my_pkg.my_domain]` registers a user's domain before its name is looked up."""
    mods = raw.get("imports") if isinstance(raw, DictConfig) else None
    if mods is None:
        return
    if isinstance(mods, str) or not all(isinstance(m, str) for m in mods):
        raise ConfigError(f"imports: must be a list of module names, got {mods!r}")
    for mod in mods:
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            raise ConfigError(f"imports: could not import {mod!r} ({exc}); is it installed or on PYTHONPATH?") from None


def validate(cfg: RunConfig) -> None:
    """Every section's own checks, then what only the whole config can say (the mode against rho and the WM)."""
    try:
        validate_config(cfg)
        plan = plan_mode(cfg.estimator, cfg.anchors.fraction)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if plan.uses_world_model and cfg.world_model is None:
        raise ConfigError(f"estimator.mode={cfg.estimator.mode} needs a world model and domain {cfg.domain.name!r} has "
                          "none registered; use estimator.mode=real or register one with @wmrl.register_world_model")


def load_run_config(run_dir: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """The config a run folder was trained with (`config.yaml`); an error names the folder."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        raise ConfigError(f"{run_dir} is not a wmrl run folder (no config.yaml)")
    try:
        return load_config(str(path), overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path} (a saved run): {exc}; a run saved by an older wmrl cannot be resumed or "
                          "evaluated by this one: train it again in a new run_dir") from None


def to_yaml(cfg: RunConfig) -> str:
    """The resolved config, as saved next to a run so it can be reproduced."""
    assert is_dataclass(cfg)
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
