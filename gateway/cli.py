"""The `ztgate` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _up(args: argparse.Namespace) -> int:
    from gateway.settings import Settings
    from gateway.supervisor import up

    if args.no_envoy and args.no_workers:
        print("ztgate up: --no-envoy and --no-workers leave nothing to run", file=sys.stderr)
        return 2
    return up(
        Settings.from_env(), demo=not args.no_demo, envoy=not args.no_envoy, workers=not args.no_workers
    )


def _envoy_config(args: argparse.Namespace) -> int:
    from gateway import envoy_config
    from gateway.registry import Registry
    from gateway.settings import Settings

    s = Settings.from_env()
    registry = Registry.load(s.registry_file)
    if args.out:
        # With the Consul registry, an empty CDS file beside it: run `python -m gateway.cluster_feed` on it.
        envoy_config.write(s, registry, Path(args.out))
        return 0
    cds = Path(envoy_config.CDS_FILE) if s.registry_source == "consul" else None
    secrets = envoy_config.Secrets(Path(envoy_config.SDS_DIR))
    print(json.dumps(envoy_config.render(s, registry, cds=cds, secrets=secrets), indent=1))
    if secrets.secrets:
        print(
            f"note: the config names SDS secret files ({', '.join(sorted(secrets.secrets))} in "
            f"{envoy_config.SDS_DIR}/); --out writes them beside the bootstrap",
            file=sys.stderr,
        )
    return 0


def _keys_new(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime, timedelta

    import yaml

    from filters.principal import digest, new_key

    key = new_key()
    entry: dict[str, object] = {
        "id": args.id or args.user,
        "sha256": digest(key),
        "user": args.user,
        "tenant": args.tenant,
        "groups": [g for g in (args.groups or "").split(",") if g],
    }
    if args.days is not None:
        if args.days < 1:
            print("--days: at least 1", file=sys.stderr)
            return 2
        until = datetime.now(UTC).replace(microsecond=0) + timedelta(days=args.days)
        entry["expires"] = until.isoformat().replace("+00:00", "Z")
    print(f"API key (shown once, give it to {args.user}): {key}", file=sys.stderr)
    print(yaml.safe_dump([entry], sort_keys=False, allow_unicode=True), end="")
    return 0


def _registry_check(args: argparse.Namespace) -> int:
    from gateway.registry import Registry, RegistryError

    try:
        reg = Registry.load(Path(args.file)) if not args.consul else _consul_doc(Path(args.file))[1]
    except RegistryError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{args.file}: ok, revision {reg.revision}, {len(reg.spec.models)} models")
    return 0


def _consul_doc(path: Path) -> tuple[bytes, Any]:
    """A registry file read and validated as a Consul-sourced document (services allowed)."""
    from gateway.config_yaml import Problem
    from gateway.registry import Registry, RegistryError
    from gateway.settings import Settings

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RegistryError([Problem(str(path), 1, 1, f"cannot read the file: {exc.strerror}")]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RegistryError.single(str(path), "the file is not valid UTF-8") from None
    reg = Registry.from_yaml(text, f"consul:{Settings.from_env().consul_key}")
    return raw, reg


def _registry_push(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.consul import Consul, ConsulError
    from gateway.registry import RegistryError
    from gateway.settings import Settings

    s = Settings.from_env()
    try:
        raw, reg = _consul_doc(Path(args.file))
    except RegistryError as exc:
        print(exc, file=sys.stderr)
        return 1

    async def push() -> bool:
        consul = Consul(s.consul_url, s.consul_token)
        try:
            return await consul.put(s.consul_key, raw, cas=0 if args.if_absent else None)
        finally:
            await consul.close()

    try:
        written = asyncio.run(push())
    except ConsulError as exc:
        print(f"ztgate registry push: {exc}", file=sys.stderr)
        return 1
    where = f"{s.consul_url} key {s.consul_key}"
    if not written:
        print(f"{where}: a registry is already there, left as it is (--if-absent)")
        return 0
    print(f"{where}: revision {reg.revision} written, {len(reg.spec.models)} models")
    return 0


def _policy_files(target: str) -> list[Path]:
    p = Path(target)
    return sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml")) if p.is_dir() else [p]


def _policy_env() -> Any:
    from filters.chain import BuildEnv
    from gateway.settings import Settings

    return BuildEnv(Settings.from_env())


def _policy_check(args: argparse.Namespace) -> int:
    from gateway import policy
    from gateway.config_yaml import ConfigError

    env, bad = _policy_env(), 0
    for f in _policy_files(args.target):
        try:
            p = policy.load(f, env)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            bad += 1
            continue
        print(f"{f}: ok, revision {p.revision}, {len(p.rules)} rules, chain {' → '.join(p.chain.names)}")
    return 1 if bad else 0


def _policy_schema(args: argparse.Namespace) -> int:
    from gateway import policy
    from gateway.settings import Settings

    modules = Settings.from_env().filter_modules
    try:
        schema = policy.json_schema(modules)
    except ImportError as exc:
        print(f"ztgate policy schema: ZTGATE_FILTER_MODULES: cannot import {exc.name}", file=sys.stderr)
        return 2
    print(json.dumps(schema, indent=2))
    return 0


def _policy_explain(args: argparse.Namespace) -> int:
    from gateway import policy
    from gateway.config_yaml import ConfigError

    try:
        p = policy.load(Path(args.policy), _policy_env())
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    subject = policy.Subject(
        tenant=args.tenant,
        groups=tuple(args.group or ()),
        user=args.user,
        model=args.model,
        route=args.path,
        protocol=args.protocol,
        key=args.key,
    )
    print("\n".join(p.explain(subject)))
    return 0


def _policy_test(args: argparse.Namespace) -> int:
    from gateway import policy_tests

    return policy_tests.run(Path(args.dir), _policy_env())


def _cli_replacer(mode: str) -> Any:
    from classifiers.pii.engine import Replacement, replacer
    from gateway.keyfile import load_or_create
    from gateway.settings import Settings

    s = Settings.from_env()
    key = load_or_create(s.pii_key_path) if mode == "hash" else b""
    return replacer(Replacement(mode), key)


def _redact_engine(args: argparse.Namespace) -> tuple[Any, Any] | str:
    """The engine and replacer to use: --entities, or the policy's pii filter."""
    from classifiers.pii.engine import PiiEngine

    if args.entities:
        try:
            engine = PiiEngine([e.strip() for e in args.entities.split(",") if e.strip()], args.threshold)
        except ValueError as exc:
            return str(exc)
        return engine, _cli_replacer(args.replacement or "entity")
    from filters.pii import PiiRedactor
    from gateway import policy
    from gateway.config_yaml import ConfigError

    try:
        p = policy.load(Path(args.policy), _policy_env())
    except ConfigError as exc:
        return str(exc)
    # The chain entry's pii (its parameters, not an override's).
    bare = [f.base if isinstance(f, policy.ScopedFilter) else f for f in p.chain.filters]
    found = [f for f in bare if isinstance(f, PiiRedactor)]
    if not found:
        return f"{args.policy}: the policy has no pii filter; name entities with --entities"
    rep = _cli_replacer(args.replacement) if args.replacement else found[0].replace
    return found[0].engine, rep


def _text_of(line: str) -> str | None:
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    text = doc.get("text") if isinstance(doc, dict) else None
    return text if isinstance(text, str) else None


def _jsonl(path: str | None, handle: Callable[[str], dict[str, Any]]) -> int:
    """One JSON line out per JSONL line in, in order; a bad line says so in its place (exit 1)."""
    bad = 0
    src = sys.stdin if path in (None, "-") else open(path, encoding="utf-8")  # noqa: SIM115
    with src:
        for n, line in enumerate(src, 1):
            if not line.strip():
                continue
            text = _text_of(line)
            if text is None:
                bad += 1
                out: dict[str, Any] = {"error": f'line {n}: expected a JSON object with a string "text"'}
                print(out["error"], file=sys.stderr)
            else:
                out = handle(text)
            sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
    return 1 if bad else 0


def _redact(args: argparse.Namespace) -> int:
    got = _redact_engine(args)
    if isinstance(got, str):
        print(got, file=sys.stderr)
        return 2
    engine, rep = got

    def handle(text: str) -> dict[str, Any]:
        redacted, spans = engine.redact(text, rep)
        return {
            "text": redacted,
            "spans": [{"start": s.start, "end": s.end, "entity": s.entity, "score": s.score} for s in spans],
        }

    return _jsonl(args.file, handle)


def _classify(args: argparse.Namespace) -> int:
    from classifiers.injection.runtime import InjectionModel, Manifest, ModelError

    try:
        model = InjectionModel(Manifest.load(Path(args.model)))
    except ModelError as exc:
        print(exc, file=sys.stderr)
        return 2
    threshold = args.threshold if args.threshold is not None else model.manifest.threshold

    def handle(text: str) -> dict[str, Any]:
        score = model.score(text)
        return {"score": round(score, 6), "flagged": score >= threshold}

    return _jsonl(args.file, handle)


def _text_commands(sub: Any) -> None:
    s = sub.add_parser(
        "redact",
        help="redact JSONL {text} lines (file or stdin): one {text, spans} line out per line in",
    )
    s.add_argument("file", nargs="?", help="JSONL input (default: stdin)")
    s.add_argument("--policy", default="policies/default.yaml", help="use this policy's pii settings")
    s.add_argument("--entities", help="comma-separated entities instead of the policy's")
    s.add_argument("--threshold", type=float, default=0.5, help="score threshold with --entities")
    s.add_argument("--replacement", choices=["mask", "entity", "hash"], help="override the replacement")
    s.set_defaults(fn=_redact)
    s = sub.add_parser(
        "classify",
        help="score JSONL {text} lines for prompt injection: one {score, flagged} line out per line in",
    )
    s.add_argument("file", nargs="?", help="JSONL input (default: stdin)")
    s.add_argument(
        "--model",
        default=str(
            Path(__file__).resolve().parents[1] / "classifiers" / "injection" / "model" / "manifest.json"
        ),
        help="the model's manifest.json (default: the shipped model)",
    )
    s.add_argument("--threshold", type=float, help="flag at or above this score (default: the manifest's)")
    s.set_defaults(fn=_classify)


def _audit_verify(args: argparse.Namespace) -> int:
    from gateway import audit

    paths = [f for t in args.target for f in audit.chain_files(Path(t))]
    if not paths:
        print("no audit chains found", file=sys.stderr)
        return 1
    heads: dict[str, dict[int, str]] = {}
    for log_file in args.heads or ():
        with Path(log_file).open(encoding="utf-8", errors="replace") as f:
            for name, anchored in audit.logged_heads(f).items():
                heads.setdefault(name, {}).update(anchored)
    bad = 0
    for path in paths:
        v = audit.verify(path, pruned_ok=args.pruned_ok, anchors=heads.get(path.name))
        if v.ok:
            where = f" in {v.files} files" if v.files > 1 else ""
            pruned = f" from seq {v.starts_at} (earlier segments not here)" if v.starts_at else ""
            print(f"{path}: ok, {v.records} records{where}{pruned}, head {v.head}")
        else:
            bad += 1
            print(f"{path}: BROKEN at {v.problem} ({v.records} records intact before it)")
    return 1 if bad else 0


def _audit_fingerprint(args: argparse.Namespace) -> int:
    from gateway.audit import fingerprint
    from gateway.keyfile import load_or_create
    from gateway.settings import Settings

    path = Settings.from_env().audit_key_path
    if not path.exists():
        print(f"no audit key at {path} (set ZTGATE_AUDIT_KEY_FILE)", file=sys.stderr)
        return 2
    text = Path(args.file).read_text(encoding="utf-8") if args.file else sys.stdin.read()
    print(fingerprint(load_or_create(path), text))
    return 0


def _audit_find(args: argparse.Namespace) -> int:
    from gateway import audit
    from gateway.keyfile import load_or_create
    from gateway.settings import Settings

    s = Settings.from_env()
    want_fp = None
    if args.text_file:
        if not s.audit_key_path.exists():
            print(f"no audit key at {s.audit_key_path} (set ZTGATE_AUDIT_KEY_FILE)", file=sys.stderr)
            return 2
        want_fp = audit.fingerprint(
            load_or_create(s.audit_key_path), Path(args.text_file).read_text(encoding="utf-8")
        )
    found = 0
    for path in audit.chain_files(Path(args.dir or s.audit_path)):
        checked = audit.verify(path, keep=True)
        if not checked.ok:
            print(f"{path}: BROKEN at {checked.problem}; its records are not trusted", file=sys.stderr)
        for rec in checked.kept:
            who = rec.get("principal") or {}
            texts = [rec.get("prompt") or {}, rec.get("response") or {}]
            if (
                (args.trace_id and rec.get("trace_id") != args.trace_id)
                or (args.user and who.get("user") != args.user)
                or (args.tenant and who.get("tenant") != args.tenant)
                or (want_fp and not any(t.get("fingerprint") == want_fp for t in texts))
            ):
                continue
            found += 1
            print(json.dumps({"chain": path.name, **rec}, ensure_ascii=False))
    return 0 if found else 1


def _risk(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.risk import RiskStore
    from gateway.settings import Settings

    s = Settings.from_env()

    async def run() -> int:
        store = RiskStore.from_url(s.redis_url, s.redis_prefix, 5.0)
        try:
            if args.risk_cmd == "clear":
                was = await store.clear(args.tenant, args.user)
                print(
                    f"{args.tenant}/{args.user}: {'released from review' if was else 'was not under review'}"
                )
            else:
                print(json.dumps(await store.status(args.tenant, args.user), indent=1))
        finally:
            await store.aclose()
        return 0

    return asyncio.run(run())


def _quota(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.quota import Per, QuotaStore
    from gateway.settings import Settings

    s = Settings.from_env()
    per: Per | None = "user" if args.user else "key" if args.key else None
    who: str | None = args.user or args.key

    async def run() -> int:
        store = QuotaStore.from_url(s.redis_url, s.redis_prefix, 5.0)
        try:
            if args.quota_cmd == "clear":
                n = await store.clear(args.tenant, per=per, who=who, limit=args.limit)
                print(f"{args.tenant}: {n} counter(s) cleared")
            else:
                found = [
                    {k: v for k, v in c.items() if k != "key"}
                    for c in await store.counters(args.tenant)
                    if (per is None or (c["per"], c["who"]) == (per, who))
                    and (args.limit is None or c["limit"] == args.limit)
                ]
                print(json.dumps(found, indent=1))
        finally:
            await store.aclose()
        return 0

    return asyncio.run(run())


def _auth_guard(args: argparse.Namespace) -> int:
    import asyncio
    import ipaddress

    from gateway.auth_guard import AuthFailStore
    from gateway.settings import Settings

    s = Settings.from_env()
    if args.guard_cmd == "clear" and args.source is None and not args.all:
        print("ztgate auth-guard clear: give --source ADDRESS|NETWORK or --all", file=sys.stderr)
        return 2
    try:
        want = ipaddress.ip_network(args.source, strict=False) if args.source else None
    except ValueError as exc:
        print(f"ztgate auth-guard: {exc}", file=sys.stderr)
        return 2

    def matches(network: str) -> bool:
        if want is None:
            return True
        net = ipaddress.ip_network(network)
        return net.version == want.version and (net.subnet_of(want) or want.subnet_of(net))  # type: ignore[arg-type]

    async def run() -> int:
        store = AuthFailStore.from_url(s.redis_url, s.redis_prefix, 5.0)
        try:
            found = [e for e in await store.sources() if matches(e["source"])]
            if args.guard_cmd == "clear":
                n = (
                    await store.clear()
                    if want is None
                    else sum([await store.clear(e["source"]) for e in found])
                )
                print(f"{len(found)} source network(s) cleared ({n} key(s))")
            else:
                print(json.dumps(found, indent=1))
        finally:
            await store.aclose()
        return 0

    return asyncio.run(run())


def _ops_commands(sub: Any) -> None:
    aud = sub.add_parser("audit", help="the audit log: verify chains, fingerprint a text").add_subparsers(
        dest="audit_cmd", required=True
    )
    s = aud.add_parser(
        "verify",
        help="check audit chains, segments included (files or folders of them); exit 1 if any is broken",
    )
    s.add_argument("target", nargs="+")
    s.add_argument(
        "--pruned-ok",
        action="store_true",
        help="a chain may start after its first record (old segments archived away); its first "
        "record present is taken on trust",
    )
    s.add_argument(
        "--heads",
        action="append",
        metavar="LOG",
        help="the workers' JSON logs (repeatable): every `audit_head` they logged must be in its "
        "chain, so records cut off a chain's end are found",
    )
    s.set_defaults(fn=_audit_verify)
    s = aud.add_parser(
        "fingerprint", help="the fingerprint a text has in the audit log (with this gateway's audit key)"
    )
    s.add_argument("file", nargs="?", help="the text, exactly (default: stdin)")
    s.set_defaults(fn=_audit_fingerprint)
    s = aud.add_parser(
        "find", help="records of verified chains by trace id, user, or a text's fingerprint (exit 1: none)"
    )
    s.add_argument("dir", nargs="?", help="chain file or folder (default: ZTGATE_AUDIT_DIR)")
    s.add_argument("--trace-id")
    s.add_argument("--tenant")
    s.add_argument("--user")
    s.add_argument("--text-file", help="records whose prompt or answer is exactly this text")
    s.set_defaults(fn=_audit_find)
    risk = sub.add_parser("risk", help="per-user risk graphs in Redis").add_subparsers(
        dest="risk_cmd", required=True
    )
    for name, what in (
        ("show", "a user's events, graph and review state"),
        ("clear", "release a user from review"),
    ):
        s = risk.add_parser(name, help=what)
        s.add_argument("--tenant", required=True)
        s.add_argument("--user", required=True)
        s.set_defaults(fn=_risk)
    quota = sub.add_parser("quota", help="request and token quota counters in Redis").add_subparsers(
        dest="quota_cmd", required=True
    )
    for name, what in (
        ("show", "a tenant's counters (or one user's or key's): used, oldest and newest request, expiry"),
        ("clear", "forget counters, so their subjects start afresh"),
    ):
        s = quota.add_parser(name, help=what)
        s.add_argument("--tenant", required=True)
        who = s.add_mutually_exclusive_group()
        who.add_argument("--user", help="only this user's counters")
        who.add_argument("--key", help="only this API key's counters (the key file's id)")
        s.add_argument("--limit", help="only the counters of the limit of this name")
        s.set_defaults(fn=_quota)
    guard = sub.add_parser(
        "auth-guard", help="failed authentications and blocks per source network in Redis"
    ).add_subparsers(dest="guard_cmd", required=True)
    for name, what in (
        ("show", "source networks with failures in their window or a block: failures, ms blocked for"),
        ("clear", "forget failures and lift blocks (of the networks holding --source, or --all)"),
    ):
        s = guard.add_parser(name, help=what)
        s.add_argument("--source", help="an address or network: the stored networks it holds or is in")
        if name == "clear":
            s.add_argument("--all", action="store_true", help="every source network")
        s.set_defaults(fn=_auth_guard)


def _keys_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="keys_cmd", required=True)
    s = keys.add_parser("new", help="make a key: prints it once, and the entry for the key file")
    s.add_argument("--user", required=True)
    s.add_argument("--tenant", required=True)
    s.add_argument("--id")
    s.add_argument("--groups", help="comma-separated")
    s.add_argument("--days", type=int, help="the key expires this many days from now (entry's `expires`)")
    s.set_defaults(fn=_keys_new)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="ztgate", description="Zero-trust gateway for self-hosted LLMs")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("up", help="run the gateway in the foreground (with demo upstreams unless --no-demo)")
    s.add_argument(
        "--no-demo", action="store_true", help="do not start the demo Triton and llama.cpp upstreams"
    )
    s.add_argument(
        "--no-envoy",
        action="store_true",
        help="run only the ext_proc workers and admin (Envoy runs in its own container)",
    )
    s.add_argument(
        "--no-workers",
        action="store_true",
        help="run only Envoy and admin (the workers run in their own container)",
    )
    s.set_defaults(fn=_up)
    s = sub.add_parser("envoy-config", help="print the rendered Envoy bootstrap (for compose and debugging)")
    s.add_argument("--out", help="write to this file instead of stdout")
    s.set_defaults(fn=_envoy_config)
    _keys_parser(sub)
    reg = sub.add_parser("registry", help="model registry").add_subparsers(dest="reg_cmd", required=True)
    s = reg.add_parser("check", help="validate a registry file")
    s.add_argument("file")
    s.add_argument("--consul", action="store_true", help="check it as a Consul registry document")
    s.set_defaults(fn=_registry_check)
    s = reg.add_parser("push", help="validate a registry file and write it to Consul's KV store")
    s.add_argument("file")
    s.add_argument("--if-absent", action="store_true", help="only if the key holds nothing yet (seeding)")
    s.set_defaults(fn=_registry_push)
    pol = sub.add_parser("policy", help="policy files: check, explain, test, schema").add_subparsers(
        dest="pol_cmd", required=True
    )
    s = pol.add_parser(
        "check", help="validate a policy file or every *.yaml in a folder (exit 1 on problems)"
    )
    s.add_argument("target")
    s.set_defaults(fn=_policy_check)
    s = pol.add_parser("explain", help="which rules apply to a request, in which order, and why")
    s.add_argument("--policy", default="policies/default.yaml")
    s.add_argument("--tenant")
    s.add_argument("--user")
    s.add_argument("--key", help="the API key's id (the key file's `id`)")
    s.add_argument("--group", action="append", help="repeat for several groups")
    s.add_argument("--model", help="name@version, as the registry resolves it")
    s.add_argument("--path", default="/v1/chat/completions")
    s.add_argument("--protocol", choices=["openai", "kserve_v2"], default="openai")
    s.set_defaults(fn=_policy_explain)
    s = pol.add_parser("test", help="run policy test cases (YAML) in a folder")
    s.add_argument("dir")
    s.set_defaults(fn=_policy_test)
    s = pol.add_parser("schema", help="print the policy JSON Schema")
    s.set_defaults(fn=_policy_schema)
    _text_commands(sub)
    _ops_commands(sub)
    args = p.parse_args(argv)
    code: int = args.fn(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
