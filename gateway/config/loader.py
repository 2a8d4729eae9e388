"""Read the config file and every policy file; fail closed with every error.

Errors are collected, not raised one at a time, so an operator sees all of
them in one run: each is ``file: key: problem``. Messages name files and keys
only, never a value (a value may be a secret).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gateway.config import GatewayConfig
from gateway.config.policy import PolicySet, TenantPolicy, build_policy_set, check_policy

M = TypeVar("M", bound=BaseModel)


class ConfigError(Exception):
    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("\n".join(errors))


@dataclass(frozen=True)
class Loaded:
    config: GatewayConfig
    policies: PolicySet
    config_path: Path
    warnings: tuple[str, ...] = ()


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (YAML keeps the last one silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "found an unhashable mapping key", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node))


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse one YAML mapping; raise ConfigError naming the file (not its contents)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read ({type(exc).__name__})"]) from exc
    return parse_yaml(text, str(path))


def parse_yaml(text: str, origin: str) -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError([f"{origin}: {problem}{where}"]) from exc
    except (ValueError, TypeError, AttributeError, IndexError, KeyError, OverflowError) as exc:
        # PyYAML constructors fail this way on scalars they cannot build
        # (2001-13-45, `!!timestamp nope`, an unhashable key in a set...).
        raise ConfigError([f"{origin}: invalid YAML value"]) from exc
    except RecursionError as exc:
        raise ConfigError([f"{origin}: YAML nested too deeply"]) from exc
    if not isinstance(data, dict):
        raise ConfigError([f"{origin}: must be a YAML mapping"])
    return data


def dotted_key(loc: tuple[int | str, ...]) -> str:
    """``("auth", "issuers", 0, "audience")`` -> ``auth.issuers[0].audience``,
    the form ``check``'s file findings use too."""
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def validation_errors(origin: str, exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors(include_input=False, include_url=False):
        key = dotted_key(err["loc"]) or "(top level)"
        out.append(f"{origin}: {key}: {err['msg']}")
    return out


def validate_model(cls: type[M], data: dict[str, Any], origin: str, base_dir: Path) -> M:
    try:
        return cls.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError(validation_errors(origin, exc)) from exc


def parse_config(data: dict[str, Any], origin: str, base_dir: Path) -> GatewayConfig:
    # Sections with defaulted paths must be validated so the paths resolve.
    for section in ("staging", "audit", "listen"):
        data.setdefault(section, {})
    return validate_model(GatewayConfig, data, origin, base_dir)


def load_config(path: Path) -> GatewayConfig:
    return parse_config(read_yaml(path), str(path), path.resolve().parent)


#: What counts as a tenant policy in policies_dir (the deploy generator lists the same).
POLICY_SUFFIXES = (".yaml", ".yml")


def policy_files(directory: Path) -> list[Path]:
    """The policy files of a directory, in the order they are loaded."""
    return sorted(p for p in directory.iterdir() if p.suffix in POLICY_SUFFIXES)


def load_policies(config: GatewayConfig) -> PolicySet:
    directory = config.policies_dir
    if not directory.is_dir():
        raise ConfigError([f"{directory}: policies_dir is not a directory"])
    errors: list[str] = []
    policies: list[TenantPolicy] = []
    files = policy_files(directory)
    for file in files:
        try:
            policy = validate_model(TenantPolicy, read_yaml(file), str(file), directory)
        except ConfigError as exc:
            errors.extend(exc.errors)
            continue
        errors.extend(
            f"{file}: {key}: {problem}" for key, problem in check_policy(policy, file.stem, config)
        )
        policies.append(policy)
    owners: dict[str, str] = {}
    for policy in policies:
        for key in policy.api_keys:
            if key.sha256 in owners:
                errors.append(
                    f"{directory}: api_keys: the same key digest is configured for "
                    f"{owners[key.sha256]!r} and {policy.tenant!r}"
                )
            owners[key.sha256] = policy.tenant
    if not files:
        errors.append(f"{directory}: no tenant policy files (*.yaml)")
    if errors:
        raise ConfigError(errors)
    return build_policy_set(policies, config)


def config_warnings(config: GatewayConfig) -> list[str]:
    warnings = []
    file_url = config.staging.worker_media == "file_url"
    for upstream in config.workers:
        launch = upstream.launch
        if file_url and launch and launch.version_tuple() >= (0, 8, 18):
            warnings.append(
                "staging.worker_media: file_url needs a worker <= 0.8.17; "
                f"upstream {upstream.name}: launch.version is {launch.version} "
                "(file:// is refused there)"
            )
    if not config.auth.issuers:
        warnings.append("auth.issuers is empty: only static API keys can authenticate")
    return warnings


def load_all(path: Path) -> Loaded:
    """Config then policies; every error from both in one ConfigError.

    An invalid config still has its policy files checked on their own (their
    keys and types; what needs the config, such as routes, waits for a valid
    one), so one run names the mistakes of both."""
    config = load_config_with_policy_errors(path)
    policies = load_policies(config)
    return Loaded(config, policies, path, tuple(config_warnings(config)))


def load_config_with_policy_errors(path: Path) -> GatewayConfig:
    """:func:`load_config`; when the config is invalid, its ConfigError also
    lists the schema errors of the policy files its ``policies_dir`` names."""
    data = read_yaml(path)
    base_dir = path.resolve().parent
    try:
        return parse_config(data, str(path), base_dir)
    except ConfigError as exc:
        raise ConfigError(exc.errors + _policy_schema_errors(data, base_dir)) from exc


def _policy_schema_errors(data: dict[str, Any], base_dir: Path) -> list[str]:
    raw = data.get("policies_dir", "policies")
    if not isinstance(raw, str):
        return []  # the config's own error names it
    directory = Path(raw) if Path(raw).is_absolute() else base_dir / raw
    if not directory.is_dir():
        return []  # reported once the config is valid
    errors: list[str] = []
    for file in policy_files(directory):
        try:
            validate_model(TenantPolicy, read_yaml(file), str(file), directory)
        except ConfigError as exc:
            errors.extend(exc.errors)
    return errors
