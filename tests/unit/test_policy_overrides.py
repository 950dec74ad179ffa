"""Per-scope filter parameters (`overrides`): checks with exact messages, selection, revisions, schema."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from filters.base import Principal, RequestContext
from filters.chain import BuildEnv
from gateway import policy, policy_tests
from gateway.config_yaml import ConfigError
from gateway.registry import Registry
from gateway.settings import Settings

ENV = BuildEnv(Settings())
BASE = """\
version: 1
chain:
  - filter: principal
  - filter: protocol
  - filter: route
  - filter: access
  - filter: pii
    request: false
lists:
  vip: [root]
overrides:
  - name: acme-prompts
    when: {tenant: [acme]}
    filter: pii
    params: {request: true}
"""


def _ctx(request_id: str) -> RequestContext:
    return RequestContext(
        request_id, "POST", "/v1/chat/completions", {}, Registry.from_yaml("upstreams: {}\nmodels: {}\n")
    )


def _who(tenant: str, user: str) -> policy.Subject:
    return policy.subject(Principal("k", user, tenant, ()), "m@1", "/v1/chat/completions", "openai")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "    filter: pii\n    params",
            "    filter: audit\n    params",
            "p.yaml:14:13: override of 'audit', which is not in the chain: override one of the chain's "
            "filters: principal, protocol, route, access, pii",
        ),
        (
            "  - filter: route\n  - filter: access\n  - filter: pii\n    request: false\n",
            "  - filter: pii\n    request: false\n  - filter: route\n  - filter: access\n",
            None,  # by tenant: allowed (the caller is known); by model: refused (below)
        ),
        (
            "  - filter: access\n",
            "  - filter: access\n  - filter: risk\n",
            None,  # (replaced below: an override of risk)
        ),
        (
            "params: {request: true}",
            "params: {reqest: true}",
            "p.yaml:15:14: unknown parameter 'reqest' for pii: did you mean 'request'?",
        ),
        (
            "params: {request: true}",
            "params: {threshold: 2}",
            "p.yaml:15:25: pii.threshold: Input should be less than or equal to 1 (got 2): use a value in range",
        ),
        (
            "params: {request: true}",
            "params: {entities: [PASSPORT]}",
            "p.yaml:15:24: pii.entities: Value error, unknown entities ['PASSPORT']: known are CN_RESIDENT_ID, "
            "CN_BANK_CARD, CREDIT_CARD, CN_MOBILE, IBAN_CODE, US_SSN, EMAIL_ADDRESS, IP_ADDRESS, PHONE_NUMBER "
            "(got ['PASSPORT'])",
        ),
        (
            "when: {tenant: [acme]}",
            'when: {user: ["@vips"]}',
            "p.yaml:13:19: undefined list '@vips': define it under `lists:` (defined: vip)",
        ),
        (
            "    params: {request: true}\n",
            "    params: {request: true}\n  - {name: acme-prompts, filter: pii, params: {}}\n",
            "p.yaml:16:12: duplicate override name 'acme-prompts': override names must be unique "
            "(first used by overrides[0])",
        ),
        (
            "    params: {request: true}\n",
            "    params: true\n",
            "p.yaml:15:13: overrides.0.params: Input should be a valid dictionary (got True): write a mapping "
            "(key: value lines)",
        ),
    ],
)
def test_broken_overrides_are_reported_exactly(old: str, new: str, message: str | None) -> None:
    text = BASE.replace(old, new, 1)
    assert text != BASE
    if message is None:
        policy.compile_policy(text, "p.yaml", ENV)  # scoped by tenant: known to any filter after principal
        if "filter: risk" in text:  # risk reads the request headers: the model is not known yet
            text = text.replace("    filter: pii\n    params", "    filter: risk\n    params").replace(
                "{request: true}", "{threshold: 2}"
            )
            why = "it reads the request headers, before the request's model is known"
        else:
            why = "route must come before it in the chain"
        text = text.replace("when: {tenant: [acme]}", 'when: {tenant: [acme]}\n    unless: {model: ["m@*"]}')
        filt = "risk" if "filter: risk\n    params" in text else "pii"
        line = next(n for n, ln in enumerate(text.splitlines(), 1) if "unless" in ln)
        message = (
            f"p.yaml:{line}:21: {filt!r} cannot be overridden by model: {why}: scope it by what is known when "
            "the filter runs: who calls (key, user, group, tenant) after principal, and the path; the model "
            "and the protocol too for a filter after route that reads the body or the answer"
        )
    with pytest.raises(ConfigError) as e:
        policy.compile_policy(text, "p.yaml", ENV)
    assert message in [str(p) for p in e.value.problems], str(e.value)


def test_the_most_specific_override_serves_and_a_tie_goes_to_the_first_listed() -> None:
    text = BASE + (
        '  - {name: vip-monitor, when: {tenant: [acme], user: ["@vip"]}, filter: pii, params: {mode: monitor}}\n'
        "  - {name: acme-later, when: {tenant: [acme]}, filter: pii, params: {response: false}}\n"
        "  - {name: not-acme, when: {tenant: ['*']}, unless: {tenant: [acme]}, filter: pii,"
        " params: {replacement: mask}}\n"
    )
    p = policy.compile_policy(text, "p.yaml", ENV)

    def serving(tenant: str, user: str) -> list[str]:
        return [o.override.name for o in p.overrides_for(_who(tenant, user))]

    assert serving("acme", "ann") == ["acme-prompts"]
    assert serving("acme", "root") == ["vip-monitor"]
    assert serving("globex", "ann") == ["not-acme"]
    assert serving("acme", "bob") == ["acme-prompts"]  # not-acme's `unless` excludes acme
    variant = next(o.variant for o in p.overrides if o.override.name == "acme-prompts")
    base = next(f for f in p.chain.filters if f.name == "pii")
    # The variant carries the entry's parameters with the override's on top.
    assert (variant.request, variant.response) == (True, True)  # type: ignore[attr-defined]
    assert isinstance(base, policy.ScopedFilter) and base.base.request is False  # type: ignore[attr-defined]
    assert "  override acme-prompts: pii with request=True" in p.explain(_who("acme", "ann"))


async def test_one_request_is_served_by_one_variant_from_its_first_hook_to_its_last() -> None:
    p = policy.compile_policy(BASE, "p.yaml", ENV)
    pii = next(f for f in p.chain.filters if f.name == "pii")
    assert isinstance(pii, policy.ScopedFilter)
    ctx = _ctx("r1")
    ctx.principal = Principal("k", "ann", "acme", ())
    await pii.on_request_body(ctx, b"")
    chosen = ctx.state["override:pii"]
    assert chosen is pii.overrides[0].variant
    ctx.principal = Principal("k", "ann", "globex", ())  # not re-read: the request keeps its variant
    await pii.on_settle(ctx)
    assert ctx.state["override:pii"] is chosen
    assert [(v.phase, v.action, v.detail) for v in ctx.verdicts if v.phase == "override"] == [
        ("override", "apply", "acme-prompts")
    ]
    other = _ctx("r2")
    other.principal = Principal("k", "bob", "globex", ())
    await pii.on_request_body(other, b"")
    assert other.state["override:pii"] is pii.base and not other.verdicts


def test_a_policy_without_overrides_keeps_its_revision_and_one_with_them_gets_another() -> None:
    plain = BASE.split("overrides:", maxsplit=1)[0]
    spec = policy.compile_policy(plain, "p.yaml", ENV).spec
    assert "overrides" not in policy.canonical(spec)
    assert (
        policy.compile_policy(plain, "p.yaml", ENV).revision
        != policy.compile_policy(BASE, "p.yaml", ENV).revision
    )


def test_the_schema_checks_an_override_s_parameters_by_its_filter() -> None:
    check = jsonschema.Draft202012Validator(policy.json_schema())
    doc = yaml.safe_load(BASE)
    assert not [e.message for e in check.iter_errors(doc)]
    for change in ({"params": {"reqest": True}}, {"params": {"threshold": 2}}, {"filter": "no_such"}):
        bad = {**doc, "overrides": [{**doc["overrides"][0], **change}]}
        assert list(check.iter_errors(bad)), change


def test_policy_tests_can_expect_the_overrides_that_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "p.yaml").write_text(BASE)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.yaml").write_text(
        "policy: ../p.yaml\ncases:\n"
        "  - name: acme\n    request: {tenant: acme, user: ann, model: m@1}\n"
        "    expect: {decision: allow, overrides: [acme-prompts]}\n"
        "  - name: globex wrongly expected\n    request: {tenant: globex, user: ann, model: m@1}\n"
        "    expect: {decision: allow, overrides: [acme-prompts]}\n"
    )
    assert policy_tests.run(tmp_path / "tests", ENV) == 1
    out = capsys.readouterr().out
    assert "PASS t.yaml: acme" in out
    assert "globex wrongly expected: expected allow, got allow by default, overrides []" in out


def test_a_tenant_can_have_its_own_injection_model(tmp_path: Path) -> None:
    from tests.injection_model import build

    shipped = Path(__file__).resolve().parents[2] / "classifiers" / "injection" / "model" / "manifest.json"
    own = build(tmp_path / "own")
    text = (
        "version: 1\nchain: [{filter: principal}, {filter: protocol}, {filter: route},"
        f" {{filter: prompt_injection, model: {shipped}}}]\n"
        f"overrides:\n  - {{name: globex-model, when: {{tenant: [globex]}}, filter: prompt_injection,"
        f" params: {{model: {own}}}}}\n"
    )
    p = policy.compile_policy(text, "p.yaml", ENV)
    (o,) = p.overrides
    scoped = next(f for f in p.chain.filters if f.name == "prompt_injection")
    assert isinstance(scoped, policy.ScopedFilter)
    base_model, own_model = scoped.base.model, o.variant.model  # type: ignore[attr-defined]
    assert base_model.revision != own_model.revision
    # The variant reads with its own manifest's threshold (the entry set none).
    assert o.variant.threshold == own_model.manifest.threshold == 0.5  # type: ignore[attr-defined]
    assert own_model.assess("jailbreak").score > 0.9
    assert own_model.assess("please summarise the report").score < 0.1


@settings(max_examples=200, deadline=None)
@given(
    scopes=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "tenant": st.sampled_from([["acme"], ["globex"], ["acme", "globex"]]),
                "user": st.sampled_from([["ann"], ["bob"]]),
                "route": st.sampled_from([["/v1/*"], ["/v2/*"]]),
            },
        ),
        min_size=1,
        max_size=6,
    ),
    tenant=st.sampled_from(["acme", "globex", "initech"]),
    user=st.sampled_from(["ann", "bob"]),
    route=st.sampled_from(["/v1/chat/completions", "/v2/models/m/infer"]),
)
def test_the_override_picked_is_the_most_specific_match_and_the_first_listed_on_a_tie(
    scopes: list[dict[str, list[str]]], tenant: str, user: str, route: str
) -> None:
    overrides = [
        {"name": f"o{i}", "when": when, "filter": "pii", "params": {"threshold": round(0.1 + i / 10, 1)}}
        for i, when in enumerate(scopes)
    ]
    doc = {**yaml.safe_load(BASE.split("overrides:", maxsplit=1)[0]), "overrides": overrides}
    p = policy.compile_policy(json.dumps(doc), "p.yaml", ENV)  # JSON is YAML, and has no anchors
    s = policy.subject(Principal("k", user, tenant, ()), "m@1", route, "openai")
    # Reference: every field given matches (globs for route), then most fields, then key >
    # user > group > tenant > model > route > protocol, then the first listed.
    order = ("key", "user", "group", "tenant", "model", "route", "protocol")
    value = {"tenant": tenant, "user": user, "route": route}

    def matches(when: dict[str, list[str]]) -> bool:
        return all(any(fnmatch.fnmatchcase(value[k], v) for v in vs) for k, vs in when.items())

    ranked = sorted(
        (i for i, w in enumerate(scopes) if matches(w)),
        key=lambda i: (-len(scopes[i]), tuple(d not in scopes[i] for d in order), i),
    )
    expected = [f"o{ranked[0]}"] if ranked else []
    assert [o.override.name for o in p.overrides_for(s)] == expected
