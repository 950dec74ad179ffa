"""The policy language: shipped policies, broken fixtures with exact messages, canonical revisions."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.chain import BuildEnv
from gateway import policy, policy_tests
from gateway.config_yaml import ConfigError
from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ENV = BuildEnv(Settings())
BASE = """\
version: 1
chain:
  - filter: principal
  - filter: protocol
    max_body_bytes: 1000
  - filter: route
  - filter: access
lists:
  approved: ["llama3-8b@v2.4"]
rules:
  - name: only-approved
    when: {tenant: [bank]}
    unless: {model: ["@approved"]}
    action: deny
"""


SHIPPED = sorted([*(ROOT / "policies").glob("*.yaml"), *(ROOT / "policies" / "examples").glob("*.yaml")])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_policies_check(path: Path) -> None:
    names = policy.load(path, ENV).chain.names
    # Every shipped policy authenticates first; only auth_guard, which refuses, comes before.
    assert names[: names.index("principal")] in ([], ["auth_guard"]), names


def test_shipped_policy_tests_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert policy_tests.run(ROOT / "policies" / "tests", ENV) == 0
    assert " 0 failed" in capsys.readouterr().out


def test_committed_json_schema_is_current() -> None:
    assert json.loads((ROOT / "policies" / "policy.schema.json").read_text()) == policy.json_schema()


def test_the_schema_checks_each_filter_s_own_parameters() -> None:
    check = jsonschema.Draft202012Validator(policy.json_schema())
    for path in SHIPPED:
        assert not [e.message for e in check.iter_errors(yaml.safe_load(path.read_text()))], path.name
    doc = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    entry = next(e for e in doc["chain"] if e["filter"] == "prompt_injection")
    policy.compile_policy(yaml.safe_dump(doc), "p.yaml", ENV)
    for change in ({"too_lng": "deny"}, {"too_long": "maybe"}, {"max_windows": 0}, {"filter": "no_such"}):
        bad = {**doc, "chain": [{**e, **change} if e is entry else e for e in doc["chain"]]}
        assert list(check.iter_errors(bad)), change
        with pytest.raises(ConfigError):  # what the editor marks, the gateway refuses
            policy.compile_policy(yaml.safe_dump(bad), "p.yaml", ENV)
    # A filter of one's own (ZTGATE_FILTER_MODULES) is in the schema `ztgate policy schema` prints.
    own = {**doc, "chain": [*doc["chain"][:-1], {"filter": "read_answers"}, doc["chain"][-1]]}
    assert list(check.iter_errors(own))
    assert not list(
        jsonschema.Draft202012Validator(policy.json_schema(["bench.answer_reader"])).iter_errors(own)
    )


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("version: 1", "version: 2", "p.yaml:1:10: version: Input should be 1 (got 2): use one of: 1"),
        (
            "  - filter: route\n",
            "  - filter: rute\n",
            "p.yaml:6:13: unknown filter 'rute': did you mean 'route'?",
        ),
        (
            "    max_body_bytes: 1000",
            "    max_body_byte: 1000",
            "p.yaml:5:5: unknown parameter 'max_body_byte' for protocol: did you mean 'max_body_bytes'?",
        ),
        (
            "    max_body_bytes: 1000",
            "    max_body_bytes: big",
            "p.yaml:5:21: protocol.max_body_bytes: Input should be a valid integer (got 'big'): write a whole number",
        ),
        (
            "    max_body_bytes: 1000",
            "    forward_headers: [authorization]",
            "p.yaml:5:22: protocol.forward_headers: Value error, 'authorization' is never forwarded to a model server "
            "(got ['authorization'])",
        ),
        (
            "    max_body_bytes: 1000",
            "    forward_headers: [X-Trace]",
            "p.yaml:5:22: protocol.forward_headers: Value error, 'X-Trace' is not a lower-case header name (got ['X-Trace'])",
        ),
        (
            "    max_body_bytes: 1000",
            "    answer_headers: [content-encoding]",
            "p.yaml:5:21: protocol.answer_headers: Value error, 'content-encoding' is never sent on to a client "
            "(got ['content-encoding'])",
        ),
        (
            "  - filter: access\n",
            "  - filter: access\n  - filter: route\n",
            "p.yaml:8:13: filter 'route' is already in the chain: list each filter once",
        ),
        (
            '["@approved"]',
            '["@aproved"]',
            "p.yaml:13:22: undefined list '@aproved': define it under `lists:` (defined: approved)",
        ),
        (
            "    action: deny",
            "    action: block",
            "p.yaml:14:13: rules.0.action: Input should be 'allow', 'deny', 'flag', 'review' or 'redact' (got 'block'): "
            "use one of: 'allow', 'deny', 'flag', 'review' or 'redact'",
        ),
        (
            "    when: {tenant: [bank]}",
            "    whn: {tenant: [bank]}",
            "p.yaml:12:5: unknown key 'whn': did you mean 'when'?",
        ),
        (
            "    when: {tenant: [bank]}",
            "    when: {tenant: bank}",
            "p.yaml:12:20: rules.0.when.tenant: Input should be a valid list (got 'bank'): write a list ([a, b] or - items)",
        ),
        (
            "rules:\n",
            "rules:\n  - {name: only-approved, action: allow}\n",
            "p.yaml:12:11: duplicate rule name 'only-approved': rule names must be unique (first used by rules[0])",
        ),
        (
            "version: 1\n",
            "version: 1\nversion: 1\n",
            "p.yaml:2:1: duplicate key 'version': each key may appear once in a mapping",
        ),
        (
            "    action: deny",
            "    action: deny\n    status: 500",
            "p.yaml:15:13: rules.0.status: Input should be less than or equal to 499 (got 500): use a value in range",
        ),
        (
            "chain:",
            "chain: 5\nx:",
            "p.yaml:2:8: chain: Input should be a valid list (got 5): write a list ([a, b] or - items)",
        ),
        (
            "  - filter: route\n  - filter: access\n",
            "  - filter: access\n  - filter: route\n",
            "p.yaml:6:13: filter 'access' needs 'route' earlier in the chain: list route above access",
        ),
        (
            "    action: deny",
            "    action: redact",
            "p.yaml:14:13: a redact rule needs the pii filter after access in the chain: "
            "add `- filter: pii` below `- filter: access`",
        ),
        (
            "    action: deny",
            "    action: review",
            "p.yaml:14:13: a review rule needs the risk filter in the chain (it would do nothing): "
            "add `- filter: risk` below `- filter: principal`",
        ),
        (
            "  - filter: access\n",
            "  - filter: audit\n  - filter: access\n",
            "p.yaml:7:13: audit must be the last filter: a filter after it could change the outcome "
            "after the record was written; move audit to the end",
        ),
        (
            "  - filter: principal\n",
            "  - filter: principal\n  - filter: risk\n    threshold: 0\n",
            "p.yaml:5:16: risk.threshold: Input should be greater than or equal to 1 (got 0): use a value in range",
        ),
        (
            "  - filter: principal\n",
            "  - filter: principal\n  - filter: risk\n    count: [injections]\n",
            "p.yaml:5:13: risk.count.0: Input should be 'injection', 'policy_flag', 'policy_deny' or "
            "'pii_prompt' (got 'injections'): use one of: 'injection', 'policy_flag', 'policy_deny' or 'pii_prompt'",
        ),
        (
            "  - filter: access\n",
            "  - filter: access\n  - filter: pii\n    threshhold: 0.4\n",
            "p.yaml:9:5: unknown parameter 'threshhold' for pii: did you mean 'threshold'?",
        ),
        (
            "  - filter: access\n",
            "  - filter: access\n  - filter: pii\n    threshold: 1.5\n",
            "p.yaml:9:16: pii.threshold: Input should be less than or equal to 1 (got 1.5): use a value in range",
        ),
        (
            "  - filter: access\n",
            '  - filter: access\n  - filter: pii\n    patterns: [{entity: EMP_ID, regex: "EMP-(\\\\d"}]\n',
            "p.yaml:9:40: pii.patterns.0.regex: Value error, regex does not compile: missing ), unterminated "
            "subpattern at position 4 (got 'EMP-(\\\\d')",
        ),
        (
            "  - filter: access\n",
            "  - filter: access\n  - filter: pii\n    entities: [CN_MOBILE, PASSPORT]\n",
            "p.yaml:9:15: pii.entities: Value error, unknown entities ['PASSPORT']: known are CN_RESIDENT_ID, "
            "CN_BANK_CARD, CREDIT_CARD, CN_MOBILE, IBAN_CODE, US_SSN, EMAIL_ADDRESS, IP_ADDRESS, PHONE_NUMBER "
            "(got ['CN_MOBILE', 'PASSPORT'])",
        ),
    ],
)
def test_broken_policies_are_reported_exactly(old: str, new: str, message: str) -> None:
    text = BASE.replace(old, new, 1)
    assert text != BASE
    with pytest.raises(ConfigError) as e:
        policy.compile_policy(text, "p.yaml", ENV)
    assert message in [str(p) for p in e.value.problems], str(e.value)


def test_yaml_syntax_error_has_a_location() -> None:
    with pytest.raises(ConfigError) as e:
        policy.compile_policy(BASE + "  - name: [unclosed\n", "p.yaml", ENV)
    assert str(e.value).startswith("p.yaml:")
    assert "Traceback" not in str(e.value)


def test_revision_ignores_comments_order_and_style() -> None:
    a = policy.compile_policy(BASE, "p.yaml", ENV).revision
    doc = yaml.safe_load(BASE)
    restyled = "# a comment\n" + yaml.safe_dump(doc, default_flow_style=True, sort_keys=True)
    assert policy.compile_policy(restyled, "p.yaml", ENV).revision == a
    changed = BASE.replace("action: deny", "action: allow")
    assert policy.compile_policy(changed, "p.yaml", ENV).revision != a


NAMES = st.text(alphabet="abcdefghij-", min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(
    rules=st.lists(
        st.fixed_dictionaries(
            {
                "name": NAMES,
                "action": st.sampled_from(["allow", "deny", "flag", "review"]),
                "mode": st.sampled_from(["enforce", "monitor"]),
                "when": st.fixed_dictionaries(
                    {},
                    optional={
                        "tenant": st.lists(NAMES, min_size=1, max_size=3),
                        "model": st.lists(NAMES.map(lambda n: n + "@*"), min_size=1, max_size=2),
                        "protocol": st.lists(
                            st.sampled_from(["openai", "kserve_v2"]), min_size=1, max_size=2
                        ),
                    },
                ),
            }
        ),
        max_size=5,
        unique_by=lambda r: str(r["name"]),
    ),
    default=st.sampled_from(["allow", "deny"]),
)
def test_parse_dump_parse_round_trips(rules: list[dict[str, object]], default: str) -> None:
    doc = {
        "version": 1,
        "chain": [{"filter": f} for f in ("principal", "risk", "protocol", "route", "access")],
        "default_action": default,
        "rules": rules,
    }
    first = policy.compile_policy(yaml.safe_dump(doc), "a.yaml", ENV)
    dumped = first.spec.model_dump(mode="json", exclude_defaults=True)
    second = policy.compile_policy(yaml.safe_dump(dumped), "b.yaml", ENV)
    assert second.spec == first.spec
    assert second.revision == first.revision


def test_precedence_most_specific_wins_and_flags_add_up() -> None:
    text = """\
version: 1
chain: [{filter: principal}, {filter: risk}, {filter: protocol}, {filter: route}, {filter: access}]
default_action: deny
rules:
  - {name: tenant-allow, when: {tenant: [acme]}, action: allow}
  - {name: model-deny, when: {tenant: [acme], model: ["secret@*"]}, action: deny}
  - {name: user-allow, when: {tenant: [acme], user: [root], model: ["secret@*"]}, action: allow}
  - {name: count, when: {tenant: [acme]}, action: flag}
  - {name: shadow, when: {tenant: [acme]}, action: deny, mode: monitor}
"""
    p = policy.compile_policy(text, "p.yaml", ENV)

    def decide(user: str, model: str) -> tuple[str, str | None, tuple[str, ...]]:
        out = p.decide(policy.Subject("acme", (), user, model, "/v1/chat/completions", "openai"))
        return out.action.value, out.rule.rule.name if out.rule else None, tuple(n for n, _ in out.shadow)

    assert decide("ann", "open@1") == ("flag", "count", ("shadow",))
    assert decide("ann", "secret@1") == ("deny", "model-deny", ("shadow",))
    assert decide("root", "secret@1") == ("flag", "count", ("shadow",))
    assert p.decide(policy.Subject("other", (), "x", "open@1", "/", "openai")).action.value == "deny"


def test_redact_rules_add_up_and_never_open_a_deny() -> None:
    text = """\
version: 1
chain: [{filter: principal}, {filter: protocol}, {filter: route}, {filter: access}, {filter: pii}]
default_action: allow
rules:
  - {name: no-secret, when: {model: ["secret@*"]}, action: deny}
  - {name: redact-acme, when: {tenant: [acme]}, action: redact}
  - {name: redact-shadow, when: {tenant: [acme]}, action: redact, mode: monitor}
"""
    p = policy.compile_policy(text, "p.yaml", ENV)
    out = p.decide(policy.Subject("acme", (), "ann", "open@1", "/v1/chat/completions", "openai"))
    assert (out.action.value, out.redact, out.shadow) == (
        "allow",
        ("redact-acme",),
        (("redact-shadow", policy.Action.REDACT),),
    )
    denied = p.decide(policy.Subject("acme", (), "ann", "secret@1", "/v1/chat/completions", "openai"))
    assert (denied.action.value, denied.redact) == ("deny", ())
    assert p.decide(policy.Subject("other", (), "x", "open@1", "/", "openai")).redact == ()


@settings(max_examples=60, deadline=None)
@given(
    flow=st.booleans(),
    sort=st.booleans(),
    indent=st.integers(2, 6),
    comment=st.text("abc xyz", max_size=20),
    width=st.integers(20, 200),
)
def test_revision_is_stable_under_any_reformatting(
    flow: bool, sort: bool, indent: int, comment: str, width: int
) -> None:
    doc = yaml.safe_load(BASE)
    text = yaml.safe_dump(doc, default_flow_style=flow, sort_keys=sort, indent=indent, width=width)
    text = f"# {comment}\n{text}\n# end\n"
    assert (
        policy.compile_policy(text, "p.yaml", ENV).revision
        == policy.compile_policy(BASE, "p.yaml", ENV).revision
    )


def test_the_documented_policy_compiles() -> None:
    doc = (ROOT / "docs" / "policy.md").read_text(encoding="utf-8")
    example = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    p = policy.compile_policy(example, "docs/policy.md", ENV)
    assert p.chain.names[0] == "principal" and p.chain.names[-1] == "audit"


def test_rules_scoped_by_api_key_outrank_user_and_group_rules() -> None:
    from filters.base import Principal

    text = """\
version: 1
chain: [{filter: principal}, {filter: protocol}, {filter: route}, {filter: access}]
lists: {batch-keys: [k-batch]}
rules:
  - {name: devs, when: {group: [dev], model: ["m@*"]}, action: allow}
  - {name: batch-only-completes, when: {key: ["@batch-keys"], model: ["m@*"]}, action: deny}
"""
    p = policy.compile_policy(text, "p.yaml", ENV)
    batch = policy.subject(
        Principal("k-batch", "ann", "acme", ("dev",)), "m@1", "/v1/chat/completions", "openai"
    )
    other = policy.subject(
        Principal("k-ann", "ann", "acme", ("dev",)), "m@1", "/v1/chat/completions", "openai"
    )
    assert batch.key == "k-batch"
    assert p.decide(batch).rule.rule.name == "batch-only-completes"  # type: ignore[union-attr]
    assert p.decide(other).action.value == "allow"
