"""`ztgate policy test DIR`: policy test cases in YAML, so security teams can test their edits in CI.

A test file names the policy it tests and lists cases: who asks for what, and the expected
decision (and, optionally, the deciding rule). Like OPA's policy tests, but data, not code.

    policy: ../default.yaml
    cases:
      - name: tellers cannot use the dev model
        request: {tenant: bank, groups: [tellers], user: ann, model: dev-llm@v1, path: /v1/chat/completions}
        expect: {decision: deny, rule: dev-models-only-for-devs}

`expect` may also name `redact` (whether a redact rule applies) and `overrides` (the overrides
that serve the request, in chain order).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway import policy
from gateway.config_yaml import ConfigError, Problem, at, validate


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class CaseRequest(_Strict):
    """The request of a test case."""

    key: str | None = Field(default=None, description="The API key's id.")
    tenant: str | None = None
    groups: list[str] = Field(default_factory=list)
    user: str | None = None
    model: str | None = Field(default=None, description="name@version")
    path: str = "/v1/chat/completions"
    protocol: Literal["openai", "kserve_v2"] = "openai"


class Expect(_Strict):
    """What the policy must decide."""

    decision: Literal["allow", "deny", "flag", "review"]
    rule: str | None = Field(
        default=None, description="The deciding rule (omit: not checked; `default`: none)."
    )
    redact: bool | None = Field(
        default=None, description="Whether a `redact` rule applies (omit: not checked)."
    )
    overrides: list[str] | None = Field(
        default=None, description="The overrides that serve this request, in chain order (omit: not checked)."
    )


class Case(_Strict):
    """One test case."""

    name: str
    request: CaseRequest
    expect: Expect


class TestFile(_Strict):
    """A policy test file."""

    policy: str = Field(description="Path of the policy, relative to this file.")
    cases: list[Case]


def run(directory: Path, env: Any) -> int:
    """Run every *.yaml test file in a folder; print one line per case; exit code 1 on any failure."""
    files = sorted(directory.glob("*.yaml"))
    if not files:
        print(f"{directory}: no test files (*.yaml)", file=sys.stderr)
        return 1
    passed = failed = 0
    for f in files:
        try:
            tests, marks = validate(TestFile, f.read_text(encoding="utf-8"), str(f))
            pol = policy.load((f.parent / tests.policy).resolve(), env)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        for i, case in enumerate(tests.cases):
            r = case.request
            subject = policy.Subject(r.tenant, tuple(r.groups), r.user, r.model, r.path, r.protocol, r.key)
            out = pol.decide(subject)
            rule = out.rule.rule.name if out.rule else "default"
            serving = [o.override.name for o in pol.overrides_for(subject)]
            ok = (
                out.action.value == case.expect.decision
                and case.expect.rule in (None, rule)
                and case.expect.redact in (None, bool(out.redact))
                and case.expect.overrides in (None, serving)
            )
            if ok:
                passed += 1
                print(f"PASS {f.name}: {case.name}")
            else:
                failed += 1
                where: Problem = at(marks, str(f), ("cases", i, "expect"), "")
                print(
                    f"FAIL {where.source}:{where.line}:{where.column}: {case.name}: expected "
                    f"{case.expect.decision}{f' by {case.expect.rule}' if case.expect.rule else ''}, "
                    f"got {out.action.value} by {rule}"
                    + (f", redact {bool(out.redact)}" if case.expect.redact is not None else "")
                    + (f", overrides {serving}" if case.expect.overrides is not None else "")
                )
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
