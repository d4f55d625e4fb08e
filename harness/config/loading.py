"""Loading: sweep -> preset -> method YAML, merged with overrides by OmegaConf and validated before any work.

Overrides come as dotted ``key=value`` strings (CLI ``--set``, Snakemake ``--config set="k=v k=v"``) or as nested
mappings (Snakemake ``--config 'train={learning_rate: 1e-4}'``).

Every error names the file, the dotted key and what is allowed: unknown keys, wrong types, values out of their
declared choices or range (``methods/declaration.py``), broken rules across keys (``harness/config/rules.py``),
unusable local input files: empty, malformed rows, a benchmark's problems in the training file
(``harness/config/inputs.py``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.config.inputs import input_file_problems
from harness.config.paths import CONFIG_DIR, REPO_ROOT
from harness.config.rules import (
    check_launch,
    missing_input_files,
    non_finite_keys,
    section_problems,
    seed_problems,
    sweep_problems,
)
from harness.config.schema import (
    PRESET_SECTIONS,
    REQUIRED_SWEEP_KEYS,
    SWEEP_KEYS,
    ConfigError,
    MethodSpec,
    PresetConfig,
    Resolved,
    SweepConfig,
)
from methods.declaration import declared_problems


def load_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:  # yaml.YAMLError carries the line
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return loaded


def merge_config(schema_cls: type, sources: list[tuple[str, Any]]) -> Any:
    """Merge (origin, mapping) pairs into the schema in order; return the validated dataclass object."""
    merged = OmegaConf.structured(schema_cls)
    for origin, source in sources:
        try:
            merged = OmegaConf.merge(merged, source)
        except OmegaConfBaseException as exc:
            raise ConfigError(_explain(exc, origin, schema_cls, source)) from None
    origins = ", ".join(o for o, _ in sources)
    non_finite = non_finite_keys(OmegaConf.to_container(merged))
    if non_finite:
        raise ConfigError(f"{origins}: key(s) {non_finite}: NaN and infinity are not allowed (every number must be "
                          "finite)")
    try:
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_explain(exc, sources[-1][0] if sources else "defaults", schema_cls)) from None
    except ValueError as exc:  # a method Config's __post_init__ check; its message names the field
        raise ConfigError(f"{origins}: {exc}") from None
    problems = section_problems(obj) or declared_problems(obj)
    if problems:  # the first, as a section's own checks would have stopped at it
        raise ConfigError(f"{origins}: {problems[0]}")
    return obj


def _leaves(value: Any, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    if isinstance(value, dict) and value:
        return [leaf for key, item in value.items() for leaf in _leaves(item, (*prefix, key))]
    return [(prefix, value)]


def _failing_key(schema_cls: type, source: Any) -> str:
    """The first dotted key of ``source`` that does not merge into the schema on its own (OmegaConf's merge errors
    on a whole section, e.g. ``train: 5``, carry no key)."""
    for path, value in _leaves(OmegaConf.to_container(OmegaConf.create(source))):
        single: Any = value
        for key in reversed(path):
            single = {key: single}
        try:
            OmegaConf.merge(OmegaConf.structured(schema_cls), single)
        except OmegaConfBaseException:
            return ".".join(str(key) for key in path)
    return "?"


def _explain(exc: OmegaConfBaseException, origin: str, schema_cls: type, source: Any = None) -> str:
    key = getattr(exc, "full_key", "") or _failing_key(schema_cls, source or {})
    message = str(exc).splitlines()[0]
    if "is not a ListConfig" in message:
        message = "expected a list, e.g. [a, b]"
    allowed = _allowed_keys(schema_cls, key)
    hint = f"; allowed keys here: {', '.join(allowed)}" if allowed and "not in" in message else ""
    return f"{origin}: key '{key}': {message}{hint}"


def _allowed_keys(schema_cls: type, dotted: str) -> list[str]:
    cls = schema_cls
    for part in dotted.split(".")[:-1]:
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if part not in fields:
            return []
        default = fields[part].default_factory() if fields[part].default_factory is not dataclasses.MISSING else None
        if not dataclasses.is_dataclass(default):
            return []
        cls = type(default)
    return sorted(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else []


def parse_overrides(overrides: list[str] | None) -> DictConfig:
    """``["train.learning_rate=1e-4", ...]`` -> a nested mapping; values are read as YAML scalars."""
    dotlist = []
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value (e.g. train.learning_rate=1e-4)")
        dotlist.append(item)
    try:
        return OmegaConf.from_dotlist(dotlist)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"overrides {dotlist}: {exc}") from None


def resolve(sweep: str | Path | dict, overrides: list[str] | None = None) -> Resolved:
    """Resolve a sweep (a file, or the mapping Snakemake built from --configfile/--config) with overrides."""
    if isinstance(sweep, dict):
        source, raw = "snakemake config", OmegaConf.create(sweep)
    else:
        source, raw = str(sweep), load_yaml(Path(sweep))
    raw = OmegaConf.merge(raw, parse_overrides(overrides))
    extra = raw.pop("set", None)  # Snakemake: --config set="train.learning_rate=1e-4 eval.k=2"
    if extra:
        raw = OmegaConf.merge(raw, parse_overrides(str(extra).split()))
    unknown = set(raw.keys()) - SWEEP_KEYS - PRESET_SECTIONS
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {sorted(unknown)}; allowed: "
                          f"{sorted(SWEEP_KEYS | PRESET_SECTIONS)}")
    if not isinstance(sweep, dict):
        require_sweep_keys(raw, source)
    sweep_part = {k: raw[k] for k in raw if k in SWEEP_KEYS}
    preset_part = {k: raw[k] for k in raw if k in PRESET_SECTIONS}
    sweep_cfg = merge_config(SweepConfig, [(source, sweep_part)])
    problems = sweep_problems(sweep_cfg)
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))
    preset_file = CONFIG_DIR / "preset" / f"{sweep_cfg.preset}.yaml"
    if not preset_file.is_file():
        known = sorted(p.stem for p in (CONFIG_DIR / "preset").glob("*.yaml"))
        raise ConfigError(f"{source}: key 'preset': no preset {sweep_cfg.preset!r}; known presets: {known}")
    preset_cfg = merge_config(PresetConfig, [(str(preset_file), load_yaml(preset_file)), (source, preset_part)])
    bad_files = missing_input_files(preset_cfg) or input_file_problems(preset_cfg)  # content once they are there
    if bad_files:
        raise ConfigError(f"{source} (preset {preset_file}): " + "; ".join(bad_files))
    specs = [load_method(label, search_dirs=sweep_cfg.method_config_dirs)  # fail at start, not mid-sweep
             for label in sweep_cfg.methods]
    bad_seeds = seed_problems(sweep_cfg.seeds, specs, preset_cfg)
    if bad_seeds:
        raise ConfigError(f"{source}: " + "; ".join(bad_seeds))
    check_launch(preset_cfg, [s for s in specs if s.checkpoint], sweep_cfg.seeds, source)
    return Resolved(sweep_cfg, preset_cfg, source, {s.label: s for s in specs})


def require_sweep_keys(raw: Any, source: str) -> None:
    """A sweep file (``harness --sweep``, ``snakemake --configfile``) names what it runs; the defaults of
    ``SweepConfig`` serve mappings built in code."""
    missing = [key for key in REQUIRED_SWEEP_KEYS if key not in raw]
    if missing:
        raise ConfigError(f"{source}: key(s) {missing} missing: a sweep file names its "
                          f"{', '.join(REQUIRED_SWEEP_KEYS)} itself (e.g. methods: [uniform], seeds: [0])")


def _method_dirs(search_dirs: list[str] | None) -> list[Path]:
    return [REPO_ROOT / d if not Path(d).is_absolute() else Path(d) for d in search_dirs or []] + [
        CONFIG_DIR / "method"]


def method_labels(search_dirs: list[str] | None = None) -> list[str]:
    return sorted({p.stem for d in _method_dirs(search_dirs) for p in d.glob("*.yaml")})


def load_method(label: str, overrides: list[str] | None = None, search_dirs: list[str] | None = None) -> MethodSpec:
    """Read ``<label>.yaml`` (from ``search_dirs``, then configs/method) into the registered method's Config,
    applying ``method.*`` overrides."""
    from methods.registry import get_method_class

    candidates = [d / f"{label}.yaml" for d in _method_dirs(search_dirs)]
    path = next((c for c in candidates if c.is_file()), None)
    if path is None:
        raise ConfigError(f"unknown method label {label!r}: no file {label}.yaml in "
                          f"{[str(d) for d in _method_dirs(search_dirs)]}; known labels: {method_labels(search_dirs)}")
    raw = load_yaml(path)
    name = raw.pop("method", None)
    seed_offset = raw.pop("seed_offset", 0)
    if not isinstance(seed_offset, int) or seed_offset < 0:
        raise ConfigError(f"{path}: key 'seed_offset' must be a non-negative integer, got {seed_offset!r}")
    checkpoint = raw.pop("checkpoint", "")
    if not isinstance(checkpoint, str):
        raise ConfigError(f"{path}: key 'checkpoint' must be a hub id or a directory, got {checkpoint!r}")
    if name is None:
        raise ConfigError(f"{path}: key 'method' (the registered method name) is missing")
    try:
        cls = get_method_class(str(name))
    except KeyError as exc:
        raise ConfigError(f"{path}: key 'method': {exc.args[0]}") from None
    sources: list[tuple[str, Any]] = [(str(path), raw)]
    if overrides:
        sources.append(("--set method.*", parse_overrides(overrides)))
    params = merge_config(cls.Config, sources)
    return MethodSpec(label, str(name), params, seed_offset, checkpoint)


def dump_yaml(obj: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(obj), sort_keys=False)
