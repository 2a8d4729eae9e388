"""Preflight: open and parse every file the config names, before anything is served.

``check`` lists every finding; ``serve`` runs the same checks before uvicorn
starts, so a missing certificate is one line naming its config key instead
of a traceback from deep inside the TLS setup.

Theory of operation:

* Each check returns :class:`~gateway.tools.findings.Finding` values (``error`` or ``warning``),
  each naming the config key (``listen.tls.certfile``,
  ``auth.issuers[0].jwks_file``…) and the file it is about. A finding never
  carries a file's contents or a secret's value: problems are fixed phrases
  and exception *type* names.
* Files are opened and parsed the way the server will use them: the
  certificate and key load together into an ``ssl.SSLContext`` (so a key of
  another certificate is caught), the client CA bundle loads as verify
  locations, a JWKS must give keys usable under the issuer's algorithms, an
  HS256 secret must be set in the environment, as must the link key of
  ``images.url_key_env`` (at least 32 bytes).
* Nothing is created or written. A directory the server will create
  (``staging.dir``, the folders of ``audit.path`` and ``staging.catalog``)
  passes when it exists and is writable, or when its nearest existing
  ancestor is a writable directory.
* Placeholder digests (``gateway.core.digests``) in every ``launch`` block and in
  policies' ``api_keys`` are warnings: well-formed, so never fatal.
* Agents (``preflight_agents.py``): the session key when a route has
  agents, and each route's MCP client config.
* One writer per audit file (spec §13, §24): an audit path whose lock a
  running gateway holds is an error for ``serve`` naming ``audit.path`` (it
  would be refused at start), and a warning for ``check`` (run beside the
  running gateway, as the deploy guide does, it is that gateway's own lock).
  The lock is only tried, never created.
* Exposure (spec §24), warnings: ``/metrics`` on the callers' port
  (``metrics.listen`` unset: served to ``metrics`` credentials only), and
  tenants' evidence quotas that sum past the size of the volume holding
  ``staging.dir`` (one tenant within its quota could fill it for all).
* A pinned worker that keeps a prefix cache (``launch.prefix_cache_n`` > 0)
  for a route more than one tenant's policy names is a warning (spec §21):
  a prefix another tenant sent shortens the time to first token, so a
  tenant can test guesses at another's prompts. A worker without a
  ``launch`` block is not known to ``check``.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from pydantic import BaseModel

from gateway.auth.keys import KeyFetchError, check_jwks_url, hs256_secret, parse_jwks
from gateway.books.audit_file import lock_path
from gateway.config import GatewayConfig, IssuerConfig, LaunchConfig, TLSConfig
from gateway.config.loader import (
    POLICY_SUFFIXES,
    ConfigError,
    Loaded,
    config_warnings,
    load_config_with_policy_errors,
    load_policies,
)
from gateway.config.policy import PolicySet
from gateway.config.releases import RELEASE_PREFIX
from gateway.core.digests import placeholder_reason
from gateway.core.signed_urls import MIN_KEY_BYTES
from gateway.ratelimit.factory import store_password
from gateway.tools.findings import Finding as Finding
from gateway.tools.findings import error as _error
from gateway.tools.findings import read_bounded
from gateway.tools.findings import warning as _warning
from gateway.tools.preflight_agents import check_agents

#: far above any certificate chain or CA bundle an operator would configure
MAX_PEM_BYTES = 4 * 1024 * 1024


def preflight(
    config: GatewayConfig, env: Mapping[str, str], *, serving: bool = False
) -> list[Finding]:
    """Every file and secret the gateway config names, checked; in config order.
    ``serving``: for ``serve``, which would be a second writer on a held audit path."""
    findings: list[Finding] = []
    if config.listen.tls is not None:
        findings += check_tls(config.listen.tls)
    for index, issuer in enumerate(config.auth.issuers):
        findings += check_issuer(f"auth.issuers[{index}]", issuer, env)
    findings += check_readable_dir("policies_dir", config.policies_dir)
    findings += check_writable_dir("staging.dir", config.staging.dir)
    findings += check_writable_file("staging.catalog", config.staging.catalog)
    findings += check_writable_file("audit.path", config.audit.path)
    findings += check_audit_writer(config.audit.path, serving=serving)
    try:
        store_password(config, env)
    except ConfigError:
        name = config.limits_store.password_env
        findings.append(
            _error("limits_store.password_env", f"environment variable {name} is not set or empty")
        )
    if config.state.backend == "postgres":
        name = config.state.dsn_env
        # Checked for shape only: the DSN holds a password and is never printed.
        if not env.get(name, "").startswith(("postgresql://", "postgres://")):
            findings.append(
                _error("state.dsn_env", f"environment variable {name} holds no postgresql:// DSN")
            )
    name = config.images.url_key_env
    if name is not None and len(env.get(name, "").encode()) < MIN_KEY_BYTES:
        findings.append(
            _error(
                "images.url_key_env",
                f"environment variable {name} must hold at least {MIN_KEY_BYTES} bytes",
            )
        )
    findings += launch_digest_warnings(config)
    findings += check_agents(config, env)
    return findings


def errors_of(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "error"]


# ------------------------------------------------------------------- files


def _read(
    key: str, path: Path, limit: int = MAX_PEM_BYTES, limit_name: str | None = None
) -> tuple[bytes | None, Finding | None]:
    """The file's bytes, or the finding; ``limit_name`` names a configured limit."""
    return read_bounded(key, path, limit, limit_name)


class _EncryptedKey(Exception):
    """Raised by the password callback: serve has no key password to give."""


def _no_password() -> bytes:
    raise _EncryptedKey


def check_tls(tls: TLSConfig) -> list[Finding]:
    """Certificate and key load together (and match); the client CA bundle loads."""
    findings: list[Finding] = []
    cert, problem = _read("listen.tls.certfile", tls.certfile)
    findings += [problem] if problem else []
    key, problem = _read("listen.tls.keyfile", tls.keyfile)
    findings += [problem] if problem else []
    if cert is not None:
        findings += _check_certificates("listen.tls.certfile", tls.certfile, cert)
    if cert is not None and key is not None and not findings:
        findings += _check_pair(tls, key)
    if tls.client_ca is not None:
        findings += check_ca_bundle("listen.tls.client_ca", tls.client_ca)
    return findings


def _check_certificates(key: str, path: Path, data: bytes) -> list[Finding]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        return [_error(key, "holds no PEM certificate", path)]
    now = datetime.datetime.now(datetime.UTC)
    leaf = certs[0]
    if leaf.not_valid_after_utc < now:
        day = leaf.not_valid_after_utc.date().isoformat()
        return [_warning(key, f"the certificate expired on {day}", path)]
    if leaf.not_valid_before_utc > now:
        day = leaf.not_valid_before_utc.date().isoformat()
        return [_warning(key, f"the certificate is not valid before {day}", path)]
    return []


def _check_pair(tls: TLSConfig, key_data: bytes) -> list[Finding]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(tls.certfile, tls.keyfile, password=_no_password)
    except _EncryptedKey:
        problem = "is encrypted (serve takes no key password)"
    except ssl.SSLError:
        # The certificate parsed already: either the key does not parse, or it
        # is a key of another certificate (OpenSSL words that several ways).
        problem = "does not match the certificate in listen.tls.certfile"
        if not _is_private_key(key_data):
            problem = "is not a PEM private key usable with listen.tls.certfile"
    except OSError as exc:  # the file changed between the reads
        problem = f"cannot read ({type(exc).__name__})"
    else:
        return []
    return [_error("listen.tls.keyfile", problem, tls.keyfile)]


def _is_private_key(data: bytes) -> bool:
    try:
        serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return False
    return True


def check_ca_bundle(key: str, path: Path) -> list[Finding]:
    _, problem = _read(key, path)
    if problem is not None:
        return [problem]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=path)
    except ssl.SSLError:
        return [_error(key, "holds no PEM certificate", path)]
    except OSError as exc:
        return [_error(key, f"cannot read ({type(exc).__name__})", path)]
    if context.cert_store_stats().get("x509_ca", 0) == 0:
        return [_error(key, "holds no CA certificate (no basicConstraints CA:TRUE)", path)]
    return []


def check_issuer(prefix: str, issuer: IssuerConfig, env: Mapping[str, str]) -> list[Finding]:
    if issuer.jwks_file is not None:
        key = f"{prefix}.jwks_file"
        data, problem = _read(key, issuer.jwks_file, issuer.jwks_max_bytes, "jwks_max_bytes")
        if problem is not None:
            return [problem]
        assert data is not None
        try:
            parse_jwks(data, issuer)
        except KeyFetchError as exc:
            # parse_jwks names key ids and members, never key material.
            return [_error(key, f"not a usable JWKS: {exc}", issuer.jwks_file)]
        return []
    try:
        if issuer.jwks_url is not None:
            check_jwks_url(issuer)
        else:
            hs256_secret(issuer, env)
    except KeyFetchError as exc:
        field = "jwks_url" if issuer.jwks_url is not None else "hs256_secret_env"
        return [_error(f"{prefix}.{field}", str(exc))]
    return []


def check_readable_dir(key: str, path: Path) -> list[Finding]:
    if not path.exists():
        return [_error(key, "does not exist", path)]
    if not path.is_dir():
        return [_error(key, "is not a directory", path)]
    try:
        next(iter(path.iterdir()), None)
    except OSError as exc:
        return [_error(key, f"cannot be listed ({type(exc).__name__})", path)]
    return []


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(path.anchor or ".")


def check_writable_dir(key: str, path: Path) -> list[Finding]:
    """``path`` is a writable directory, or can be created as one."""
    existing = _nearest_existing(path)
    if not existing.is_dir():
        what = (
            "is not a directory"
            if existing == path
            else f"cannot be created ({existing} is not a directory)"
        )
        return [_error(key, what, path)]
    if not os.access(existing, os.W_OK | os.X_OK):
        what = (
            "is not writable"
            if existing == path
            else f"cannot be created ({existing} is not writable)"
        )
        return [_error(key, what, path)]
    return []


def check_writable_file(key: str, path: Path) -> list[Finding]:
    """``path`` is a writable regular file, or its folder is (or can be) a writable one."""
    if path.is_dir():
        return [_error(key, "is a directory", path)]
    if path.exists():
        if not path.is_file():
            return [_error(key, "is not a regular file", path)]
        if not os.access(path, os.R_OK | os.W_OK):
            return [_error(key, "is not writable", path)]
        return []
    problems = check_writable_dir(key, path.parent)
    return [_error(key, f"its folder {p.problem}", path) for p in problems]


def audit_path_held(path: Path) -> bool:
    """Whether a running gateway holds the audit file's lock (tried, never created)."""
    try:
        fd = os.open(lock_path(path), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # no lock file: no writer yet (what is wrong with the path is said above)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)  # and with it the lock just taken
    return False


def check_audit_writer(path: Path, *, serving: bool) -> list[Finding]:
    """A second writer on an audit path, named by the key it conflicts on (no path:
    spec §13's messages name none, and the key says which file)."""
    if not audit_path_held(path):
        return []
    if serving:
        return [
            _error(
                "audit.path",
                "held by another gateway process: one writer per audit file "
                "(give each replica its own audit.path)",
            )
        ]
    return [
        _warning(
            "audit.path",
            "held by a running gateway process: a second `serve` with this config is refused",
        )
    ]


# ------------------------------------------------------------------- digests


def _launch_blocks(value: object, path: str) -> Iterator[tuple[str, LaunchConfig]]:
    """Every LaunchConfig in the config, wherever it sits (one per upstream)."""
    if isinstance(value, LaunchConfig):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _launch_blocks(getattr(value, name), f"{path}.{name}" if path else name)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _launch_blocks(item, f"{path}[{index}]")


def launch_digest_warnings(config: GatewayConfig) -> list[Finding]:
    findings = []
    for path, launch in _launch_blocks(config, ""):
        for name in ("binary_sha256", "model_bundle_sha256"):
            reason = placeholder_reason(getattr(launch, name))
            if reason is not None:
                findings.append(_warning(f"{path}.{name}", f"looks like a placeholder: {reason}"))
    return findings


def policy_digest_warnings(policies: PolicySet, directory: Path) -> list[Finding]:
    """Placeholder ``api_keys[].sha256`` in the tenants' policy files."""
    findings = []
    for name, tenant in sorted(policies.tenants.items()):
        file = _policy_file(directory, name)
        for index, key in enumerate(tenant.policy.api_keys):
            reason = placeholder_reason(key.sha256)
            if reason is not None:
                findings.append(
                    _warning(
                        f"api_keys[{index}].sha256", f"looks like a placeholder: {reason}", file
                    )
                )
    return findings


def _policy_file(directory: Path, tenant: str) -> Path:
    for suffix in POLICY_SUFFIXES:
        if (directory / f"{tenant}{suffix}").is_file():
            return directory / f"{tenant}{suffix}"
    return directory / f"{tenant}.yaml"


# ------------------------------------------------------------------- sharing


def prefix_cache_warnings(config: GatewayConfig, policies: PolicySet) -> list[Finding]:
    """Routes of a worker with a prefix cache that more than one tenant's policy names."""
    tenants_of: dict[str, set[str]] = {}
    arms = {RELEASE_PREFIX + r.name: (r.stable, r.canary) for r in config.releases}
    for name, tenant in policies.tenants.items():
        for target in tenant.policy.models.values():
            # A release alias reaches both of its routes (spec §18).
            for route in arms.get(target, (target,)):
                tenants_of.setdefault(route, set()).add(name)
    if config.upstreams is not None:
        workers = [(f"upstreams[{i}]", u) for i, u in enumerate(config.upstreams)]
    else:
        workers = [("upstream", u) for u in config.workers]
    findings = []
    for key, worker in workers:
        launch = worker.launch
        if launch is None or launch.prefix_cache_n == 0:
            continue
        for route in worker.served_routes:
            tenants = sorted(tenants_of.get(route, ()))
            if len(tenants) > 1:
                findings.append(
                    _warning(
                        f"{key}.launch.prefix_cache_n",
                        f"is {launch.prefix_cache_n} and route {route} is in the policies of "
                        f"tenants {', '.join(tenants)}: a prefix one of them sent shortens the "
                        "others' time to first token (set 0, or give each tenant its own "
                        "worker)",
                    )
                )
    return findings


# ------------------------------------------------------------------- exposure


def exposure_warnings(config: GatewayConfig, policies: PolicySet) -> list[Finding]:
    """``/metrics`` on the callers' port; evidence quotas past the staging volume."""
    findings = []
    if config.metrics.listen is None:
        findings.append(
            _warning(
                "metrics.listen",
                "is unset: /metrics is served on the callers' port, to credentials with "
                "scope metrics only (give scrapes a port of their own: metrics.listen)",
            )
        )
    quotas = sum(t.policy.evidence.max_bytes for t in policies.tenants.values())
    size = volume_bytes(Path(config.staging.dir))
    if size is not None and quotas > size:
        findings.append(
            _warning(
                "staging.dir",
                f"the tenants' evidence quotas (evidence.max_bytes) sum to {quotas} bytes, "
                f"more than the {size} bytes of its volume: one tenant within its quota "
                "can fill it for every tenant",
                Path(config.staging.dir),
            )
        )
    return findings


def volume_bytes(path: Path) -> int | None:
    """The size of the filesystem that holds (or will hold) ``path``; None if unknown."""
    try:
        stat = os.statvfs(_nearest_existing(path))
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


# ------------------------------------------------------------------- all


@dataclass(frozen=True)
class Checked:
    """The config, its files and every policy, checked: what ``check`` and ``serve`` act on."""

    #: None unless there are no errors
    loaded: Loaded | None
    errors: list[str]
    warnings: list[str]


def load_checked(path: Path, env: Mapping[str, str], *, serving: bool = False) -> Checked:
    """Config (ConfigError when it is itself invalid), then its files, then every policy.

    Every error of the files and the policies is collected, so one run lists them all.
    ``serving``: checked for ``serve`` (see :func:`check_audit_writer`).
    """
    config = load_config_with_policy_errors(path)
    findings = preflight(config, env, serving=serving)
    errors = [str(f) for f in errors_of(findings)]
    warnings = [*config_warnings(config), *(str(f) for f in findings if f.level == "warning")]
    policies = None
    if not any(f.key == "policies_dir" for f in errors_of(findings)):
        try:
            policies = load_policies(config)
        except ConfigError as exc:
            errors += exc.errors
    if policies is not None:
        warnings += [str(f) for f in policy_digest_warnings(policies, config.policies_dir)]
        warnings += [str(f) for f in prefix_cache_warnings(config, policies)]
        warnings += [str(f) for f in exposure_warnings(config, policies)]
    loaded = None
    if policies is not None and not errors:
        loaded = Loaded(config, policies, path, tuple(warnings))
    return Checked(loaded, errors, warnings)
