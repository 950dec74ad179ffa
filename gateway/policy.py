"""Policy as data: YAML → strict models → a compiled policy (filters built, references checked).

A compiled policy is immutable and published by one reference assignment (see gateway.reload);
each request captures one for its whole life. Its revision is the hash of the canonical JSON of
the validated document, so reformatting or comments do not change it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, Strict

from filters.base import BaseFilter, Decision, Filter, Phase, Principal, RequestContext, Verdict
from filters.chain import (
    BuildEnv,
    Chain,
    ChainConfigError,
    Recorder,
    build_variants,
    build_with_params,
    shipped_and,
)
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


class Override(_Strict):
    """Parameters of one chain filter for the requests in a scope (docs/policy.md, Overrides)."""

    name: str = Field(description="Unique name, shown in logs, audit and `ztgate policy explain`.")
    description: str = Field(default="", description="Why the override exists.")
    when: Scope = Field(default_factory=Scope, description="It applies when all of these match.")
    unless: Scope | None = Field(default=None, description="…and none of these match.")
    filter: str = Field(description="A filter of the chain (after principal and route).")
    params: dict[str, Any] = Field(
        description="Parameters that replace the chain entry's for these requests; the rest are the entry's."
    )


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
    overrides: list[Override] = Field(
        default_factory=list,
        description="Per-scope parameters of chain filters: the most specific matching override of "
        "a filter serves a request (a tie: the first listed); none matching: the chain entry's.",
    )
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
class Matcher:
    """A scope with its lists expanded, ready to match."""

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


@dataclass(frozen=True, slots=True)
class CompiledRule(Matcher):
    """A rule, ready to match."""

    rule: Rule


@dataclass(frozen=True, slots=True)
class CompiledOverride(Matcher):
    """An override, ready to match, with the filter built on its parameters."""

    override: Override
    variant: Filter


def request_subject(ctx: RequestContext) -> Subject:
    """The subject of a request in flight, as far as the chain has read it."""
    r = ctx.route
    return subject(
        ctx.principal,
        f"{r.model}@{r.version}" if r else None,
        ctx.path,
        ctx.prompt.protocol.value if ctx.prompt else None,
    )


class ScopedFilter:
    """A chain filter whose parameters vary by scope.

    The first hook of a request picks the variant: the most specific matching override's (a tie:
    the first listed), else the chain entry's; every later hook of that request, to `on_end`,
    goes to the same one. An override names only scope fields known by then (compile_policy
    checks it): the caller after principal, the path always, the model and the protocol only to
    a filter that first runs on the body or later.
    """

    name: ClassVar[str] = ""
    phases: ClassVar[Phase] = Phase.NONE
    on_behalf: ClassVar[Phase] = Phase.NONE
    needs: ClassVar[tuple[str, ...]] = ()
    precedes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, base: Filter, overrides: Sequence[CompiledOverride]) -> None:
        self.base = base
        # Stable sort: on equal specificity the first listed stays first.
        self.overrides = tuple(sorted(overrides, key=lambda o: o.specificity, reverse=True))
        self._key = f"override:{base.name}"

    def pick(self, s: Subject) -> CompiledOverride | None:
        """The override that serves a request of subject `s` (None: the chain entry's parameters)."""
        return next((o for o in self.overrides if o.matches(s)), None)

    def _serving(self, ctx: RequestContext, phase: Phase) -> Filter:
        chosen = ctx.state.get(self._key)
        if chosen is None:
            o = self.pick(request_subject(ctx))
            chosen = self.base
            if o is not None:
                chosen = o.variant
                ctx.verdicts.append(Verdict(self.name, "override", "apply", 0.0, o.override.name))
            ctx.state[self._key] = chosen
        f = cast("Filter", chosen)
        # Its variants may take more phases than the chosen one does: those are not its.
        return f if f.phases & phase else _IDLE

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        return await self._serving(ctx, Phase.REQUEST_HEADERS).on_request_headers(ctx)

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        return await self._serving(ctx, Phase.REQUEST_BODY).on_request_body(ctx, body)

    async def on_response_headers(self, ctx: RequestContext) -> Decision:
        return await self._serving(ctx, Phase.RESPONSE_HEADERS).on_response_headers(ctx)

    async def on_response_chunk(self, ctx: RequestContext, chunk: bytes, end: bool) -> Decision:
        return await self._serving(ctx, Phase.RESPONSE_BODY).on_response_chunk(ctx, chunk, end)

    async def on_settle(self, ctx: RequestContext) -> Decision:
        return await self._serving(ctx, Phase.SETTLE).on_settle(ctx)

    async def on_end(self, ctx: RequestContext) -> None:
        chosen = ctx.state.get(self._key)
        await cast("Filter", chosen if chosen is not None else self.base).on_end(ctx)


_IDLE: Filter = BaseFilter()  # continues in every phase


def scoped(base: Filter, overrides: Sequence[CompiledOverride]) -> Filter:
    """`base` wrapped so that `overrides` pick its parameters per request (its name and needs).

    It takes every phase that any of its variants takes (a quota override with a token limit
    reads answers though the chain entry's does not); a variant is called only in its own.
    """
    phases, on_behalf = base.phases, base.on_behalf
    for o in overrides:
        phases |= o.variant.phases
        on_behalf &= o.variant.on_behalf
    cls = type(
        f"Scoped_{base.name}",
        (ScopedFilter,),
        {
            "name": base.name,
            "phases": phases,
            "on_behalf": on_behalf,
            "needs": base.needs,
            "precedes": base.precedes,
        },
    )
    wrapped: Filter = cls(base, overrides)
    return wrapped


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
    overrides: tuple[CompiledOverride, ...] = ()

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

    def overrides_for(self, s: Subject) -> list[CompiledOverride]:
        """The override serving each filter for subject `s`, in chain order (filters without one left out)."""
        picked = (f.pick(s) for f in self.chain.filters if isinstance(f, ScopedFilter))
        return [o for o in picked if o is not None]

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
        lines += [
            f"  override {o.override.name}: {o.override.filter} with "
            + ", ".join(f"{k}={v!r}" for k, v in o.override.params.items())
            for o in self.overrides_for(s)
        ]
        return lines


def _why_not(r: CompiledRule, s: Subject) -> str:
    for dim, patterns in r.when.items():
        if not _all_match({dim: patterns}, s):
            return f"{dim} is not one of {list(patterns)}"
    return "an `unless` entry matches"


def canonical(spec: PolicySpec) -> str:
    """Canonical JSON of a validated policy (key order and formatting independent).

    A policy without overrides reads as it did before they existed, so its revision is unchanged.
    """
    doc = spec.model_dump(mode="json", exclude=None if spec.overrides else {"overrides"})
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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
        rules.append(CompiledRule(when, unless, r))
    entries = [(e.filter, dict(e.model_extra or {})) for e in spec.chain]
    chain: Chain | None = None
    try:
        chain = build_with_params(entries, env)
    except ChainConfigError as exc:
        _locate(exc, lambda i: ("chain", i), lambda i: ("chain", i, "filter"), marks, source, problems)
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
    overrides: list[CompiledOverride] = []
    if chain is not None:
        overrides = _overrides(spec, entries, chain, env, marks, source, problems)
    if problems or chain is None:
        raise ConfigError(problems)
    if overrides:
        by_filter: dict[str, list[CompiledOverride]] = {}
        for o in overrides:
            by_filter.setdefault(o.override.filter, []).append(o)
        chain = Chain([scoped(f, by_filter[f.name]) if f.name in by_filter else f for f in chain.filters])
    revision = hashlib.sha256(canonical(spec).encode()).hexdigest()[:12]
    chain.revision = revision
    return CompiledPolicy(spec, revision, source, chain, tuple(rules), tuple(overrides))


def _locate(  # noqa: PLR0917 - one internal helper, for chain entries and overrides
    exc: ChainConfigError,
    prefix: Callable[[int], tuple[Any, ...]],
    bare: Callable[[int], tuple[Any, ...]],
    marks: Marks,
    source: str,
    problems: list[Problem],
) -> None:
    """The chain builder's problems at their place in the file: `prefix(index)` + the parameter's path
    (the nearest located ancestor), or `bare(index)` for a problem of no parameter."""
    for index, key, what, hint in exc.items:
        head = prefix(index)
        path = bare(index)
        if key:
            parts = [int(x) if x.isdigit() else x for x in key.split(".")]
            path = (*head, *parts)
            # The nearest located ancestor: a list item's mark, else its key's.
            while len(path) > len(head) + 1 and path not in marks:
                path = path[:-1]
        if what.startswith("unknown parameter"):
            path = (*path, "<key>")
        problems.append(at(marks, source, path, what, hint))


# The filter after which a scope field is known (the path, `route`, always is).
_KNOWN_AFTER = {
    "key": "principal",
    "user": "principal",
    "group": "principal",
    "tenant": "principal",
    "model": "route",
    "protocol": "protocol",
}


def _unknowable(o: Override, names: list[str], f: Filter) -> list[tuple[str, str, str]]:
    """(when|unless, field, why) for each scope field of `o` that is not known when `f` first runs.

    A filter runs in chain order: the caller is known after `principal`, the path always; the model
    after `route` and the protocol after `protocol`, but only once the body has been read (an
    OpenAI request names its model there), so not to a filter that reads the request headers.
    """
    before = names[: names.index(o.filter)]
    reads_headers = bool(f.phases & Phase.REQUEST_HEADERS)
    out = []
    for part, scope in (("when", o.when), ("unless", o.unless)):
        if scope is None:
            continue
        for dim in _DIMENSIONS:
            if getattr(scope, dim) is None or dim == "route":
                continue
            needed = _KNOWN_AFTER[dim]
            if needed not in before:
                out.append((part, dim, f"{needed} must come before it in the chain"))
            elif dim in ("model", "protocol") and reads_headers:
                out.append((part, dim, f"it reads the request headers, before the request's {dim} is known"))
    return out


def _overrides(  # noqa: PLR0917 - one internal helper of compile_policy
    spec: PolicySpec,
    entries: Sequence[tuple[str, dict[str, Any]]],
    chain: Chain,
    env: BuildEnv,
    marks: Marks,
    source: str,
    problems: list[Problem],
) -> list[CompiledOverride]:
    """The policy's overrides checked and built: each one's filter on the entry's parameters with its own."""
    names = [n for n, _ in entries]
    built = {f.name: f for f in chain.filters}
    seen: dict[str, int] = {}
    wanted: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, o in enumerate(spec.overrides):
        where = ("overrides", i)
        if o.name in seen:
            problems.append(
                at(
                    marks,
                    source,
                    (*where, "name"),
                    f"duplicate override name {o.name!r}",
                    f"override names must be unique (first used by overrides[{seen[o.name]}])",
                )
            )
        seen.setdefault(o.name, i)
        if o.filter not in built:
            problems.append(
                at(
                    marks,
                    source,
                    (*where, "filter"),
                    f"override of {o.filter!r}, which is not in the chain",
                    f"override one of the chain's filters: {', '.join(names)}",
                )
            )
            continue
        unknown = _unknowable(o, names, built[o.filter])
        for part, dim, why in unknown:
            problems.append(
                at(
                    marks,
                    source,
                    (*where, part, dim),
                    f"{o.filter!r} cannot be overridden by {dim}: {why}",
                    "scope it by what is known when the filter runs: who calls (key, user, group, tenant) "
                    "after principal, and the path; the model and the protocol too for a filter after "
                    "route that reads the body or the answer",
                )
            )
        if unknown:
            continue
        wanted.setdefault(o.filter, []).append((i, {**dict(entries[names.index(o.filter)][1]), **o.params}))
    variants: dict[int, Filter] = {}
    for name, todo in wanted.items():
        try:
            variants.update(zip((i for i, _ in todo), build_variants(name, todo, env), strict=True))
        except ChainConfigError as exc:
            _locate(
                exc,
                lambda i: ("overrides", i, "params"),
                lambda i: ("overrides", i, "filter"),
                marks,
                source,
                problems,
            )
    out = []
    for i, o in enumerate(spec.overrides):
        when = _expand(o.when, spec.lists, marks, source, ("overrides", i, "when"), problems) or {}
        unless = _expand(o.unless, spec.lists, marks, source, ("overrides", i, "unless"), problems)
        if i not in variants:
            continue
        missing = [n for n in variants[i].needs if n not in names[: names.index(o.filter)]]
        if missing:
            problems.append(
                at(
                    marks,
                    source,
                    ("overrides", i, "params"),
                    f"with these parameters {o.filter!r} needs {', '.join(map(repr, missing))} earlier "
                    "in the chain",
                    "add it to the chain before this filter, or change the override's parameters",
                )
            )
            continue
        out.append(CompiledOverride(when, unless, o, variants[i]))
    return out


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
    override = defs["Override"]
    variants, overrides = [], []
    for name, params in shipped_and(filter_modules).items():
        own = params.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(own.pop("$defs", {}))
        overrides.append(
            {
                "title": name,
                "type": "object",
                "properties": {
                    **override["properties"],
                    "filter": {"const": name},
                    "params": {
                        "description": override["properties"]["params"]["description"],
                        "type": "object",
                        "properties": own.get("properties", {}),
                        "additionalProperties": False,
                    },
                },
                "required": override["required"],
                "additionalProperties": False,
            }
        )
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
    defs["Override"] = {
        "title": override["title"],
        "description": override["description"],
        "oneOf": overrides,
    }
    return schema
