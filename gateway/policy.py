"""Policy as data: YAML → strict models → a compiled policy (filters built, references checked).

A compiled policy is immutable and published by one reference assignment (see gateway.reload);
each request captures one for its whole life. Its revision is the hash of the canonical JSON of
the validated document, so reformatting or comments do not change it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from filters.base import Principal
from filters.chain import BuildEnv, Chain, ChainConfigError, Recorder, build_with_params, shipped_and
from gateway.config_yaml import ConfigError, Marks, Problem, at, validate
from gateway.reload import Reloadable


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Action(StrEnum):
    """What a rule does when it matches."""

    ALLOW = "allow"
    DENY = "deny"
    FLAG = "flag"
    REVIEW = "review"
    REDACT = "redact"


class Mode(StrEnum):
    """Enforce a rule, or only record what it would have done (shadow / dry run)."""

    ENFORCE = "enforce"
    MONITOR = "monitor"


class FailMode(StrEnum):
    """What happens when a dependency is down."""

    DENY = "deny"
    ALLOW_WITH_FLAG = "allow_with_flag"


Lax = Strict(False)  # enums come from YAML as strings
# What the gateway depends on at run time: the risk store, the registry, the classifier, the audit log.
Dependency = Literal["redis", "consul", "classifier", "audit"]


class Scope(_Strict):
    """Who and what a rule is about. Within a field any entry matches; all given fields must match."""

    key: list[str] | None = Field(
        default=None, description="API key ids (the key file's `id`), e.g. `@batch-keys`: scopes per key."
    )
    tenant: list[str] | None = Field(default=None, description="Tenants (from the API key).")
    group: list[str] | None = Field(default=None, description="User groups (from the API key).")
    user: list[str] | None = Field(default=None, description="Users (from the API key).")
    model: list[str] | None = Field(
        default=None, description="Models as `name@version` globs (`llama3-8b@*`), or `@list` references."
    )
    route: list[str] | None = Field(default=None, description="Request paths (globs, e.g. `/v1/*`).")
    protocol: list[Literal["openai", "kserve_v2"]] | None = Field(default=None, description="Wire protocols.")


class Rule(_Strict):
    """A scoped decision. The most specific matching rule decides (see docs/policy.md)."""

    name: str = Field(description="Unique name, shown in logs, audit and `ztgate policy explain`.")
    description: str = Field(default="", description="Why the rule exists.")
    when: Scope = Field(default_factory=Scope, description="The rule applies when all of these match.")
    unless: Scope | None = Field(default=None, description="…and none of these match.")
    action: Annotated[Action, Lax] = Field(
        description="allow, deny, flag (count as a risk event), review (escalate the user) or redact "
        "(the pii filter redacts prompts and answers of matching requests, whatever its defaults)."
    )
    status: Annotated[int, Field(ge=400, le=499)] = Field(default=403, description="HTTP status of a deny.")
    message: str = Field(
        default="this request is not allowed by policy", description="Public text of a deny."
    )
    mode: Annotated[Mode, Lax] = Field(default=Mode.ENFORCE, description="enforce, or monitor (dry run).")


class FilterEntry(BaseModel):
    """One step of the chain: `filter: name` and that filter's own parameters."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)
    filter: str = Field(description="A registered filter (see `ztgate policy schema`).")


class PolicySpec(_Strict):
    """A policy file."""

    version: Literal[1] = Field(description="Policy language version.")
    description: str = Field(default="", description="What this policy is for.")
    chain: list[FilterEntry] = Field(description="Filters in order, with their parameters.")
    default_action: Annotated[Action, Lax] = Field(
        default=Action.ALLOW, description="Decision when no rule matches (allow or deny)."
    )
    rules: list[Rule] = Field(default_factory=list, description="Scoped rules.")
    lists: dict[str, list[str]] = Field(default_factory=dict, description="Named lists, used as `@name`.")
    fail_mode: dict[Dependency, Annotated[FailMode, Lax]] = Field(
        default_factory=dict,
        description="Per dependency (redis: the risk store; audit: the audit log; classifier: the "
        "injection model; consul: the Consul registry, past its staleness bound): deny (default) or "
        "allow_with_flag (let through, flagged; the audit record names the mode that fired).",
    )


_DIMENSIONS = ("key", "user", "group", "tenant", "model", "route", "protocol")
_STRICTNESS = {Action.DENY: 3, Action.REVIEW: 2, Action.FLAG: 1, Action.ALLOW: 0, Action.REDACT: 0}


@dataclass(frozen=True, slots=True)
class Subject:
    """What a rule is matched against."""

    tenant: str | None
    groups: tuple[str, ...]
    user: str | None
    model: str | None  # name@version
    route: str
    protocol: str | None
    key: str | None = None  # the API key's id


def subject(principal: Principal | None, model: str | None, route: str, protocol: str | None) -> Subject:
    """The subject of a request: who (from the API key) asks for which model, where, over what."""
    return Subject(
        tenant=principal.tenant if principal else None,
        groups=principal.groups if principal else (),
        user=principal.user if principal else None,
        model=model,
        route=route,
        protocol=protocol,
        key=principal.key_id if principal else None,
    )


@dataclass(frozen=True, slots=True)
class CompiledRule:
    """A rule with its lists expanded, ready to match."""

    rule: Rule
    when: dict[str, tuple[str, ...]]
    unless: dict[str, tuple[str, ...]] | None

    @property
    def specificity(self) -> tuple[int, tuple[bool, ...]]:
        """More scope fields win; then key > user > group > tenant > model > route > protocol."""
        present = tuple(d in self.when for d in _DIMENSIONS)
        return (sum(present), present)

    def matches(self, s: Subject) -> bool:
        """`when` matches entirely and `unless` (if any) does not."""
        if not _all_match(self.when, s):
            return False
        return not (self.unless and _all_match(self.unless, s))


def _all_match(scope: dict[str, tuple[str, ...]], s: Subject) -> bool:
    for dim, patterns in scope.items():
        if dim == "group":
            if not any(g in patterns for g in s.groups):
                return False
            continue
        value = getattr(s, dim)
        if value is None or not any(fnmatch.fnmatchcase(value, p) for p in patterns):
            return False
    return True


@dataclass(frozen=True, slots=True)
class Outcome:
    """The policy's decision for one request, and what monitor-mode rules would have done."""

    action: Action
    rule: CompiledRule | None
    shadow: tuple[tuple[str, Action], ...]
    marks: tuple[str, ...] = ()
    redact: tuple[str, ...] = ()  # matching `redact` rules: PII redaction on both sides


@dataclass(frozen=True)
class CompiledPolicy:
    """An immutable, validated policy with its chain built."""

    spec: PolicySpec
    revision: str
    source: str
    chain: Chain
    rules: tuple[CompiledRule, ...]

    def action_of(self, rule_name: str) -> Action:
        """The action of the rule called `rule_name` (names are unique)."""
        return next(r.rule.action for r in self.rules if r.rule.name == rule_name)

    def fails_open(self, dependency: Dependency) -> bool:
        """Does this policy let requests through (flagged) when `dependency` is down?"""
        return self.spec.fail_mode.get(dependency) is FailMode.ALLOW_WITH_FLAG

    def decide(self, s: Subject) -> Outcome:
        """Allow/deny: the most specific matching rule (deny wins a tie), else `default_action`.

        Flag and review rules are additive: every matching one applies to a request that is let
        through (review outranks flag). Monitor-mode rules only report what they would do.
        """
        gate: CompiledRule | None = None
        marks: list[CompiledRule] = []
        redact: list[str] = []
        shadow: list[tuple[str, Action]] = []
        for r in self.rules:
            if not r.matches(s):
                continue
            if r.rule.mode is Mode.MONITOR:
                shadow.append((r.rule.name, r.rule.action))
            elif r.rule.action is Action.REDACT:
                redact.append(r.rule.name)
            elif r.rule.action in (Action.FLAG, Action.REVIEW):
                marks.append(r)
            elif gate is None or (r.specificity, _STRICTNESS[r.rule.action]) > (
                gate.specificity,
                _STRICTNESS[gate.rule.action],
            ):
                gate = r
        base = gate.rule.action if gate else self.spec.default_action
        if base is Action.DENY:
            return Outcome(base, gate, tuple(shadow))
        if not marks:
            return Outcome(base, gate, tuple(shadow), redact=tuple(redact))
        top = max(marks, key=lambda r: (_STRICTNESS[r.rule.action], r.specificity))
        return Outcome(top.rule.action, top, tuple(shadow), tuple(m.rule.name for m in marks), tuple(redact))

    def explain(self, s: Subject) -> list[str]:
        """Human-readable: which rules match, in precedence order, and the decision."""
        lines = [f"policy {self.source} revision {self.revision}"]
        matching = sorted(
            (r for r in self.rules if r.matches(s)),
            key=lambda r: (r.specificity, _STRICTNESS[r.rule.action]),
            reverse=True,
        )  # precedence order for allow/deny; flag/review add up
        lines += [f"  skip  {r.rule.name}: {_why_not(r, s)}" for r in self.rules if r not in matching]
        for r in matching:
            dims = ", ".join(d for d in _DIMENSIONS if d in r.when) or "everything"
            lines.append(
                f"  match {r.rule.name} ({r.rule.mode.value}, {r.rule.action.value}; scoped by {dims})"
            )
        out = self.decide(s)
        decided = f"rule {out.rule.rule.name}" if out.rule else "default_action"
        lines.append(f"decision: {out.action.value} (by {decided})")
        if out.marks:
            lines.append(f"  marked by: {', '.join(out.marks)}")
        if out.redact:
            lines.append(f"  PII redacted on both sides by: {', '.join(out.redact)}")
        lines += [f"  monitor: {name} would {action.value}" for name, action in out.shadow]
        return lines


def _why_not(r: CompiledRule, s: Subject) -> str:
    for dim, patterns in r.when.items():
        if not _all_match({dim: patterns}, s):
            return f"{dim} is not one of {list(patterns)}"
    return "an `unless` entry matches"


def canonical(spec: PolicySpec) -> str:
    """Canonical JSON of a validated policy (key order and formatting independent)."""
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _expand(  # noqa: PLR0917 - one internal helper, called twice
    scope: Scope | None,
    lists: dict[str, list[str]],
    marks: Marks,
    source: str,
    where: tuple[Any, ...],
    problems: list[Problem],
) -> dict[str, tuple[str, ...]] | None:
    if scope is None:
        return None
    out: dict[str, tuple[str, ...]] = {}
    for dim in _DIMENSIONS:
        values = getattr(scope, dim)
        if values is None:
            continue
        expanded: list[str] = []
        for i, v in enumerate(values):
            if isinstance(v, str) and v.startswith("@"):
                name = v[1:]
                if name not in lists:
                    known = ", ".join(sorted(lists)) or "none defined"
                    problems.append(
                        at(
                            marks,
                            source,
                            (*where, dim, i),
                            f"undefined list {v!r}",
                            f"define it under `lists:` (defined: {known})",
                        )
                    )
                    continue
                expanded += lists[name]
            else:
                expanded.append(str(v))
        out[dim] = tuple(expanded)
    return out


def compile_policy(text: str, source: str, env: BuildEnv) -> CompiledPolicy:
    """Validate and compile policy YAML; ConfigError lists every problem with its location."""
    spec, marks = validate(PolicySpec, text, source)
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    for i, r in enumerate(spec.rules):
        if r.name in seen:
            problems.append(
                at(
                    marks,
                    source,
                    ("rules", i, "name"),
                    f"duplicate rule name {r.name!r}",
                    f"rule names must be unique (first used by rules[{seen[r.name]}])",
                )
            )
        seen.setdefault(r.name, i)
    rules = []
    for i, r in enumerate(spec.rules):
        when = _expand(r.when, spec.lists, marks, source, ("rules", i, "when"), problems) or {}
        unless = _expand(r.unless, spec.lists, marks, source, ("rules", i, "unless"), problems)
        rules.append(CompiledRule(r, when, unless))
    entries = [(e.filter, dict(e.model_extra or {})) for e in spec.chain]
    chain: Chain | None = None
    try:
        chain = build_with_params(entries, env)
    except ChainConfigError as exc:
        for index, key, what, hint in exc.items:
            path: tuple[Any, ...] = ("chain", index, "filter")
            if key:
                parts = [int(x) if x.isdigit() else x for x in key.split(".")]
                path = ("chain", index, *parts)
                # The nearest located ancestor: a list item's mark, else its key's.
                while len(path) > 3 and path not in marks:
                    path = path[:-1]
            if what.startswith("unknown parameter"):
                path = (*path, "<key>")
            problems.append(at(marks, source, path, what, hint))
    names = [e.filter for e in spec.chain]
    for i, r in enumerate(spec.rules):
        if r.action is Action.REDACT and not (
            "pii" in names and "access" in names and names.index("access") < names.index("pii")
        ):
            problems.append(
                at(
                    marks,
                    source,
                    ("rules", i, "action"),
                    "a redact rule needs the pii filter after access in the chain",
                    "add `- filter: pii` below `- filter: access`",
                )
            )
    for i, r in enumerate(spec.rules):
        if r.action in (Action.FLAG, Action.REVIEW) and r.mode is Mode.ENFORCE and "risk" not in names:
            problems.append(
                at(
                    marks,
                    source,
                    ("rules", i, "action"),
                    f"a {r.action.value} rule needs the risk filter in the chain (it would do nothing)",
                    "add `- filter: risk` below `- filter: principal`",
                )
            )
    if "audit" in names and names[-1] != "audit":
        problems.append(
            at(
                marks,
                source,
                ("chain", names.index("audit"), "filter"),
                "audit must be the last filter",
                "a filter after it could change the outcome after the record was written; move audit to the end",
            )
        )
    if problems or chain is None:
        raise ConfigError(problems)
    revision = hashlib.sha256(canonical(spec).encode()).hexdigest()[:12]
    chain.revision = revision
    return CompiledPolicy(spec, revision, source, chain, tuple(rules))


def load(path: Path, env: BuildEnv) -> CompiledPolicy:
    """Read and compile a policy file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Problem(str(path), 1, 1, f"cannot read the file: {exc.strerror}")]) from None
    return compile_policy(text, str(path), env)


class Fixed:
    """A policy that never reloads (an explicit ZTGATE_FILTERS chain)."""

    def __init__(self, policy: CompiledPolicy) -> None:
        self.current = policy


def source_for(env: BuildEnv, recorder: Recorder | None = None) -> Reloadable[CompiledPolicy] | Fixed:
    """The process's policy: the hot-reloaded policy file, or a fixed chain from ZTGATE_FILTERS."""

    def compiled(p: CompiledPolicy) -> CompiledPolicy:
        if recorder is not None:
            p.chain.recorder = recorder
        return p

    s = env.settings
    if s.filters:
        text = json.dumps(
            {"version": 1, "description": "ZTGATE_FILTERS", "chain": [{"filter": f} for f in s.filters]}
        )
        return Fixed(compiled(compile_policy(text, "ZTGATE_FILTERS", env)))
    source = Reloadable(s.policy_file, lambda path: compiled(load(path, env)))
    env.reloadables.append(source)
    return source


def json_schema(filter_modules: Sequence[str] = ()) -> dict[str, Any]:
    """The JSON Schema editors use to validate policy files as people type.

    A chain entry is one of the registered filters, each with its own parameters (a misspelt
    parameter or a wrong value is marked in the editor, as `ztgate policy check` refuses it);
    `filter_modules` (ZTGATE_FILTER_MODULES) register filters of one's own first.
    """
    schema = PolicySpec.model_json_schema()
    defs: dict[str, Any] = schema["$defs"]
    entry = defs["FilterEntry"]
    variants = []
    for name, params in shipped_and(filter_modules).items():
        own = params.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(own.pop("$defs", {}))
        variants.append(
            {
                "title": name,
                "description": own.get("description", ""),
                "type": "object",
                "properties": {"filter": {"const": name}, **own.get("properties", {})},
                "required": ["filter", *own.get("required", [])],
                "additionalProperties": False,
            }
        )
    defs["FilterEntry"] = {"title": entry["title"], "description": entry["description"], "oneOf": variants}
    return schema
