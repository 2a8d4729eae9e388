"""``mistralrs-gateway`` verbs → config → run. No logic beyond wiring."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gateway.config.loader import ConfigError, Loaded, load_all, load_config


def _load(path: str) -> Loaded:
    return load_all(Path(path))


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from gateway.http.app import create_app
    from gateway.http.server import serve
    from gateway.observe.logs import setup_logging
    from gateway.tools.preflight import load_checked

    checked = load_checked(Path(args.config), os.environ, serving=True)
    if checked.loaded is None:
        # One line per problem, naming its config key: nothing is served half-configured.
        for line in checked.errors:
            print(f"error: {line}", file=sys.stderr)
        return 1
    loaded = checked.loaded
    setup_logging(loaded.config.logging.level)
    for warning in checked.warnings:
        logging.getLogger("gateway").warning("config: %s", warning)
    listen = loaded.config.listen
    host = args.host or listen.host
    port = listen.port if args.port is None else args.port
    return serve(loaded, create_app(loaded), host, port)


def cmd_check(args: argparse.Namespace) -> int:
    from gateway.tools.fleet_summary import fleet_summary
    from gateway.tools.preflight import load_checked
    from gateway.upstream.table import capacities

    checked = load_checked(Path(args.config), os.environ)
    if checked.loaded is None:
        print("error: configuration is invalid:", file=sys.stderr)
        for line in checked.errors:
            print(f"  {line}", file=sys.stderr)
        for warning in checked.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        return 1
    loaded = checked.loaded
    config = loaded.config
    print(f"config: {args.config}: ok")
    capacity_of = capacities(config)
    for upstream in config.workers:
        routes = ", ".join(
            route if kind == "chat" else f"{route} ({kind})"
            for route, kind in upstream.route_kinds.items()
        )
        capacity = capacity_of[upstream.name]
        print(
            f"upstream {upstream.name}: {upstream.base_url} capacity {capacity} "
            f"probe {'on' if upstream.probe else 'off'} routes [{routes}]"
        )
    print(
        f"admission: capacity {config.admission.capacity}, max_queue {config.admission.max_queue}"
    )
    for line in fleet_summary(config):
        print(line)
    for name, tenant in sorted(loaded.policies.tenants.items()):
        lim = tenant.limits
        models = ", ".join(sorted(tenant.policy.models)) or "(none)"
        print(
            f"tenant {name}: models [{models}] endpoints [{', '.join(tenant.policy.endpoints)}] "
            f"modalities [{', '.join(tenant.policy.modalities)}] "
            f"max_body_bytes={lim.max_body_bytes} max_prompt_bytes={lim.max_prompt_bytes} "
            f"max_output_tokens={lim.max_output_tokens} max_media_parts={lim.max_media_parts} "
            f"rpm={lim.requests_per_minute} tpm={lim.tokens_per_minute} "
            f"tpd={lim.tokens_per_day} max_concurrent={lim.max_concurrent_requests} "
            f"share={tenant.policy.admission.share} "
            f"max_permits={tenant.policy.admission.max_permits}"
        )
    for warning in checked.warnings:
        print(f"warning: {warning}")
    return 0


def cmd_launch_plan(args: argparse.Namespace) -> int:
    from gateway.upstream.launch import launch_plan_json

    config = load_config(Path(args.config))
    try:
        plan = launch_plan_json(config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(plan, indent=2, sort_keys=True))
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from gateway.auth.authenticator import mint_dev_token

    loaded = _load(args.config)
    if args.tenant not in loaded.policies.tenants:
        # A token for a tenant without a policy would only ever get 403.
        print(
            f"error: tenant_not_configured: no policy for tenant {args.tenant!r} "
            f"in {loaded.config.policies_dir}",
            file=sys.stderr,
        )
        return 1
    scopes = args.scope or ["inference", "evidence"]
    try:
        token = mint_dev_token(
            loaded.config.auth,
            args.tenant,
            scopes=scopes,
            ttl_s=args.ttl,
            issuer=args.issuer,
            env=os.environ,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(token)
    return 0


def cmd_evidence_add(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.books.evidence.records import EvidenceRecord
    from gateway.books.state.factory import evidence_service, open_state
    from gateway.core.errors import GatewayError

    loaded = _load(args.config)
    tenant = loaded.policies.tenants.get(args.tenant)
    if tenant is None:
        print("error: tenant_not_configured", file=sys.stderr)
        return 1
    try:
        data = Path(args.file).read_bytes()
    except OSError as exc:
        print(f"error: cannot read the file ({type(exc).__name__})", file=sys.stderr)
        return 1

    async def add() -> EvidenceRecord:
        state = open_state(loaded.config, os.environ)
        try:
            return await evidence_service(loaded.config, state).upload(
                tenant, data, None, args.locator
            )
        finally:
            await state.close()

    try:
        record = asyncio.run(add())
    except GatewayError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    print(json.dumps(record.to_api(), indent=2))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if args.engine:
        from gateway.tools.demo_engine import run_engine_demo

        return run_engine_demo(args.model_size, args.max_tokens)
    from gateway.tools.demo import DEFAULT_DIR, run_demo

    return run_demo(Path(args.dir) if args.dir else DEFAULT_DIR)


def cmd_bundle_digest(args: argparse.Namespace) -> int:
    from gateway.upstream.bundle import BundleError, bundle_digest

    try:
        bundle = bundle_digest(Path(args.directory))
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        report = {
            "directory": str(Path(args.directory).resolve()),
            "model_bundle_sha256": bundle.sha256,
            "files": [f.entry() for f in bundle.files],
        }
        print(json.dumps(report, indent=2))
    else:
        print(bundle.sha256)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from gateway.tools.docgen import json_schema

    print(json.dumps(json_schema(args.which), indent=2))
    return 0


def cmd_policies_generator(args: argparse.Namespace) -> int:
    from gateway.tools.kustomize import GeneratorError, policies_generator

    target = args.check or args.output
    policies = Path(args.policies_dir)
    root = Path(args.root) if args.root else (Path(target).parent if target else policies.parent)
    try:
        text = policies_generator(policies, root, args.name)
    except GeneratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.check:
        try:
            committed = Path(args.check).read_text(encoding="utf-8")
        except OSError as exc:
            print(f"error: cannot read {args.check} ({type(exc).__name__})", file=sys.stderr)
            return 1
        if committed != text:
            print(
                f"error: {args.check} does not match {policies}: regenerate it with "
                f"`mistralrs-gateway policies-generator {policies} --output {args.check}`",
                file=sys.stderr,
            )
            return 1
        print(f"{args.check}: matches {policies}")
        return 0
    if args.output:
        # Written whole, then renamed: a failed run never leaves half a file.
        out = Path(args.output)
        partial = out.with_name(f".{out.name}.partial")
        partial.write_text(text, encoding="utf-8")
        partial.replace(out)
        return 0
    sys.stdout.write(text)
    return 0


def cmd_receipts(args: argparse.Namespace) -> int:
    from gateway.tools import receipts_cli

    if args.receipts_verb == "merge":
        return receipts_cli.merge(args.paths)
    if args.anchors and args.config is None:
        print("error: --anchors needs --config (the state store they are in)", file=sys.stderr)
        return 2
    return receipts_cli.verify(
        args.paths,
        allow_unfinished=args.allow_unfinished,
        config=args.config if args.anchors else None,
    )


def cmd_release(args: argparse.Namespace) -> int:
    from gateway.tools import release_cli

    return release_cli.run(args.release_verb, args.config, args.name, args.percent)


def cmd_simulator(args: argparse.Namespace) -> int:
    from gateway.testing.simulator import main as simulator_main

    return simulator_main(args.rest, prog="mistralrs-gateway simulator")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mistralrs-gateway",
        description="Authenticating sidecar gateway for a mistral.rs worker.",
    )
    verbs = parser.add_subparsers(dest="verb", required=True)

    p = verbs.add_parser("serve", help="run the gateway")
    p.add_argument("--config", required=True)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.set_defaults(func=cmd_serve)

    p = verbs.add_parser("check", help="validate config and every policy")
    p.add_argument("--config", required=True)
    p.set_defaults(func=cmd_check)

    p = verbs.add_parser("launch-plan", help="print the worker launch contract as JSON")
    p.add_argument("--config", required=True)
    p.set_defaults(func=cmd_launch_plan)

    p = verbs.add_parser("token", help="mint a development JWT (HS256 issuers only)")
    p.add_argument("--config", required=True)
    p.add_argument("--tenant", required=True)
    p.add_argument("--scope", action="append")
    p.add_argument("--ttl", type=int, default=600)
    p.add_argument("--issuer")
    p.set_defaults(func=cmd_token)

    p = verbs.add_parser("evidence", help="evidence staging")
    ev = p.add_subparsers(dest="evidence_verb", required=True)
    add = ev.add_parser("add", help="stage a file for a tenant")
    add.add_argument("--config", required=True)
    add.add_argument("--tenant", required=True)
    add.add_argument("--locator")
    add.add_argument("file")
    add.set_defaults(func=cmd_evidence_add)

    from gateway.tools.kustomize import POLICIES_CONFIG_MAP
    from gateway.upstream.bundle import DEFINITION

    p = verbs.add_parser(
        "bundle-digest",
        help="compute model_bundle_sha256 of a model directory",
        description=DEFINITION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("directory", help="the model directory (as mounted for the worker)")
    p.add_argument("--json", action="store_true", help="also print the per-file manifest")
    p.set_defaults(func=cmd_bundle_digest)

    p = verbs.add_parser(
        "schema",
        help="print the JSON Schema of gateway.yaml (config) or of a tenant policy (policy)",
        description="The JSON Schema of the pydantic models the files are parsed into "
        "(docs/reference.md is generated from the same models).",
    )
    p.add_argument("which", choices=("config", "policy"))
    p.set_defaults(func=cmd_schema)

    p = verbs.add_parser(
        "policies-generator",
        help="write the kustomize generator of the policies ConfigMap from a policies directory",
        description="kustomize's configMapGenerator takes no directory: this lists every policy "
        "file of POLICIES_DIR (as the gateway loads them) in a builtin ConfigMapGenerator config "
        "that kustomization.yaml names under `generators:`.",
    )
    p.add_argument("policies_dir", help="the policies directory, e.g. deploy/policies")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--output", help="write the generator config here (default: stdout)")
    where.add_argument(
        "--check", help="exit 1 unless this file is what would be written (CI, pre-commit)"
    )
    p.add_argument(
        "--root",
        help="the kustomization's folder the paths are relative to (default: the folder of "
        "--output/--check, else the parent of POLICIES_DIR)",
    )
    p.add_argument("--name", default=POLICIES_CONFIG_MAP, help="the ConfigMap's name")
    p.set_defaults(func=cmd_policies_generator)

    p = verbs.add_parser("receipts", help="check or merge the audit files of a fleet")
    rc = p.add_subparsers(dest="receipts_verb", required=True)
    for name, about in (
        (
            "verify",
            "report gaps, forks, torn lines, unfinished requests and (--anchors) truncated "
            "chains in every replica's chain (exit 1 if any)",
        ),
        ("merge", "print every receipt line in one stream, by created, replica and seq"),
    ):
        q = rc.add_parser(name, help=about, description=about)
        q.add_argument(
            "paths", nargs="+", metavar="DIR", help="audit directories (or files) to read"
        )
        if name == "verify":
            q.add_argument(
                "--allow-unfinished",
                action="store_true",
                help="open lines without a receipt (requests in flight) are printed, not findings",
            )
            q.add_argument(
                "--anchors",
                action="store_true",
                help="hold each chain against the anchor its replica recorded in the state "
                "store (needs --config): a chain ending before it is truncated",
            )
            q.add_argument("--config", help="the gateway.yaml whose state store holds the anchors")
        q.set_defaults(func=cmd_receipts)

    p = verbs.add_parser(
        "release",
        help="canary releases across the fleet: status, set, rollback, clear (spec §18)",
        description="Each acts on every replica through the state store; "
        "they apply it within 2 s. Exit 1 on an unknown NAME, a percent outside 0-100, "
        "or a state store that cannot be reached.",
    )
    rl = p.add_subparsers(dest="release_verb", required=True)
    for name, about in (
        ("status", "JSON: each release's routes, configured and effective percent, state, arms"),
        ("set", "override the canary percent until `release clear` (stands across SIGHUP)"),
        ("rollback", "the canary gets nothing, now, until `release clear`"),
        ("clear", "back to the config's canary_percent"),
    ):
        q = rl.add_parser(name, help=about, description=about)
        q.add_argument("--config", required=True)
        if name == "status":
            q.add_argument("name", nargs="?", metavar="NAME", help="one release (default: all)")
        else:
            q.add_argument("name", metavar="NAME", help="the release (releases[].name)")
        if name == "set":
            q.add_argument("--percent", required=True, metavar="P", help="0-100")
        q.set_defaults(func=cmd_release, percent=None)

    p = verbs.add_parser("demo", help="simulator + gateway + one multimodal request")
    p.add_argument(
        "--engine",
        action="store_true",
        help="instead: the real mistral.rs engine on a generated random-weight model "
        "(test equipment, needs the engine extra) + gateway + one streaming and one "
        "non-streaming text request",
    )
    p.add_argument(
        "--dir",
        help="where the demo writes its config, policies, evidence and receipts "
        "(default var/demo; a rerun replaces it)",
    )
    p.add_argument("--model-size", choices=("tiny", "small"), default="small")
    p.add_argument("--max-tokens", type=int, default=128)
    p.set_defaults(func=cmd_demo)

    # The simulator parses its own flags (its --help lists them). A REMAINDER
    # positional does not take arguments that start with "-" (argparse hands
    # them to the parent, which calls them unrecognized), so main() passes
    # everything after the verb through untouched.
    p = verbs.add_parser(
        "simulator",
        help="run the mistral.rs protocol simulator (test equipment)",
        add_help=False,
    )
    p.set_defaults(func=cmd_simulator, rest=[])
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if argv[:1] == ["simulator"]:
        args = parser.parse_args(argv[:1])
        args.rest = argv[1:]
    else:
        args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print("error: configuration is invalid:", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
