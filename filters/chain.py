"""The chain runner: filters register by name, the chain folds their decisions in order.

Per phase, each filter that declared the phase runs in order. A Deny or Respond ends the phase
(and the request); Continue values are merged, and a replaced body is what the next filter sees.
"""

from __future__ import annotations

import difflib
import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from filters.base import CONTINUE, Continue, Decision, Deny, Filter, Phase, RequestContext, Verdict
from gateway.config_yaml import hint_for
from gateway.errors import ErrorCode

T = TypeVar("T")

if TYPE_CHECKING:
    from gateway.reload import Reloadable
    from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class BuildEnv:
    """What filter factories get at start-up: settings now; engines (ONNX, Redis…) as they come.

    A factory whose filter reads a hot-reloadable file registers it in `reloadables`; the worker
    watches them.
    """

    settings: Settings
    # Which process builds: `w<port>` for a worker (names its audit chain), `cli` for tools.
    instance: str = "cli"
    reloadables: list[Reloadable[Any]] = field(default_factory=list)
    # Engines shared by every chain this process builds (one per policy revision): built once.
    engines: dict[str, Any] = field(default_factory=dict)

    def audit_key(self) -> bytes:
        """The audit key (keyed fingerprints: the audit record's, the delivered answers'), read once."""
        from gateway.keyfile import load_or_create

        return self.engine("audit:key", lambda: load_or_create(self.settings.audit_key_path))

    def engine(self, name: str, make: Callable[[], T]) -> T:
        """The engine called `name`, made on first use and reused by later chains."""
        if name not in self.engines:
            self.engines[name] = make()
        value: T = self.engines[name]
        return value

    async def close(self) -> None:
        """Close the engines that hold resources (files, connection pools), once, at exit."""
        for engine in self.engines.values():
            closer = getattr(engine, "aclose", None) or getattr(engine, "close", None)
            if callable(closer):
                result = closer()
                if hasattr(result, "__await__"):
                    await result


Factory = Callable[[BuildEnv, Any], Filter]
_FACTORIES: dict[str, tuple[Factory, type[BaseModel]]] = {}
# Modules that register the shipped filters; imported on first lookup.
_BUILTIN_MODULES = (
    "filters.auth_guard",
    "filters.principal",
    "filters.protocol",
    "filters.route",
    "filters.static_route",
    "filters.access",
    "filters.pii",
    "filters.prompt_injection",
    "filters.risk",
    "filters.quota",
    "filters.audit",
)


class NoParams(BaseModel):
    """A filter without parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def register(name: str, params: type[BaseModel] = NoParams) -> Callable[[Factory], Factory]:
    """Decorator: make a filter factory available to chains under `name`.

    `params` is the pydantic model of the filter's policy parameters (strict, extra keys refused);
    the factory receives a validated instance.
    """

    def deco(factory: Factory) -> Factory:
        if name in _FACTORIES and _FACTORIES[name][0] is not factory:
            raise ValueError(f"filter {name!r} is registered twice")
        _FACTORIES[name] = (factory, params)
        return factory

    return deco


def available() -> dict[str, type[BaseModel]]:
    """Every registered filter with its parameter model."""
    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)
    return {n: p for n, (_, p) in sorted(_FACTORIES.items())}


def shipped_and(modules: Sequence[str]) -> dict[str, type[BaseModel]]:
    """The shipped filters and those the named modules register, with their parameter models
    (whatever else this process registered, e.g. a test's, left out)."""
    wanted = {*_BUILTIN_MODULES, *modules}
    for mod in sorted(wanted):
        importlib.import_module(mod)
    return {n: p for n, (f, p) in sorted(_FACTORIES.items()) if f.__module__ in wanted}


class ChainConfigError(ValueError):
    """Filter entries that cannot be built: (index, parameter or None, what, hint) each."""

    def __init__(self, items: list[tuple[int, str | None, str, str]]) -> None:
        self.items = items
        super().__init__("; ".join(f"chain[{i}]{'.' + k if k else ''}: {w}" for i, k, w, _ in items))


def _params(
    i: int, name: str, raw: dict[str, Any], problems: list[tuple[int, str | None, str, str]]
) -> BaseModel | None:
    """`raw` validated by filter `name`'s parameter model; None, with the problems noted, if not."""
    model = _FACTORIES[name][1]
    try:
        return model.model_validate(raw, strict=True)
    except ValidationError as exc:
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else None
            if err["type"] == "extra_forbidden":
                fields = list(model.model_fields)
                close = difflib.get_close_matches(str(key), fields, n=1)
                hint = (
                    f"did you mean {close[0]!r}?"
                    if close
                    else f"{name} takes: {', '.join(fields) or 'nothing'}"
                )
                problems.append((i, key, f"unknown parameter {key!r} for {name}", hint))
            else:
                # The full path locates nested mistakes (patterns.0.regex), not just the key.
                dotted = ".".join(str(p) for p in err["loc"]) or None
                problems.append(
                    (
                        i,
                        dotted,
                        f"{name}.{dotted or '(parameters)'}: {err['msg'].rstrip('.')} (got {err.get('input')!r})",
                        hint_for(err["type"], err),
                    )
                )
        return None


def _made(
    i: int, name: str, params: BaseModel, env: BuildEnv, problems: list[tuple[int, str | None, str, str]]
) -> Filter | None:
    try:
        return _FACTORIES[name][0](env, params)
    except (ImportError, OSError, ValueError) as exc:
        # A missing optional package or model, an unreadable key file: a policy problem.
        problems.append((i, None, f"filter {name!r} cannot start: {exc}", "see docs for the filter"))
        return None


def build_with_params(entries: Sequence[tuple[str, dict[str, Any]]], env: BuildEnv) -> Chain:
    """Build a chain from (filter name, parameters); every problem is collected, none skipped."""
    for mod in env.settings.filter_modules:
        importlib.import_module(mod)
    known = available()
    problems: list[tuple[int, str | None, str, str]] = []
    filters: list[Filter] = []
    names = [n for n, _ in entries]
    for i, (name, raw) in enumerate(entries):
        if name not in _FACTORIES:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known filters: {', '.join(known)}"
            problems.append((i, None, f"unknown filter {name!r}", hint))
            continue
        if names.index(name) != i:
            problems.append((i, None, f"filter {name!r} is already in the chain", "list each filter once"))
            continue
        params = _params(i, name, raw, problems)
        built = _made(i, name, params, env, problems) if params is not None else None
        if built is None:
            continue
        missing = [n for n in built.needs if n not in names[:i]]
        if missing:
            problems.append(
                (
                    i,
                    None,
                    f"filter {name!r} needs {', '.join(map(repr, missing))} earlier in the chain",
                    f"list {', '.join(missing)} above {name}",
                )
            )
            continue
        later = [n for n in built.precedes if n not in names[i + 1 :]]
        if later:
            problems.append(
                (
                    i,
                    None,
                    f"filter {name!r} must come before {', '.join(map(repr, later))} in the chain",
                    f"list {name} above {', '.join(later)}",
                )
            )
            continue
        filters.append(built)
    if problems:
        raise ChainConfigError(problems)
    return Chain(filters)


def build_variants(name: str, variants: Sequence[tuple[int, dict[str, Any]]], env: BuildEnv) -> list[Filter]:
    """Filter `name` once per (index, parameters): the variants that per-scope overrides select.

    Each is validated and built as a chain entry would be; engines are shared by name, so a
    variant costs only what its own parameters need. Problems carry the variant's index.
    """
    problems: list[tuple[int, str | None, str, str]] = []
    built: list[Filter] = []
    for i, raw in variants:
        params = _params(i, name, raw, problems)
        made = _made(i, name, params, env, problems) if params is not None else None
        if made is not None:
            built.append(made)
    if problems:
        raise ChainConfigError(problems)
    return built


def build(names: Sequence[str], env: BuildEnv) -> Chain:
    """Build a chain of filters with default parameters (benchmarks, tests)."""
    try:
        return build_with_params([(n, {}) for n in names], env)
    except ChainConfigError as exc:
        raise ValueError(str(exc)) from None


_PHASE_MASKS = {
    "request_headers": Phase.REQUEST_HEADERS,
    "request_body": Phase.REQUEST_BODY,
    # A filter that reads the answer also sees its headers (to know status and content type).
    "response_headers": Phase.RESPONSE_HEADERS | Phase.RESPONSE_BODY,
    "response_body": Phase.RESPONSE_BODY,
    "settle": Phase.SETTLE,
}


class Recorder(Protocol):
    """Receives one observation per filter hook run (metrics)."""

    def __call__(self, filter_name: str, phase: str, action: str, seconds: float) -> None: ...


def _no_record(filter_name: str, phase: str, action: str, seconds: float) -> None:
    return None


def merge(a: Continue, b: Continue) -> Continue:
    """Two continues in order: later header sets and bodies win."""
    if a is CONTINUE:
        return b
    if b is CONTINUE:
        return a
    return Continue(
        set_headers=a.set_headers + b.set_headers,
        remove_headers=a.remove_headers + b.remove_headers,
        body=b.body if b.body is not None else a.body,
        reroute=a.reroute or b.reroute,
    )


class Chain:
    """An ordered, immutable list of filters."""

    def __init__(self, filters: Sequence[Filter], recorder: Recorder = _no_record) -> None:
        self.filters = tuple(filters)
        self.recorder = recorder
        self.revision = "-"  # the policy revision this chain was built from
        # What the filters take for themselves; a phase taken on behalf of others only if one
        # of them takes it for itself.
        self.phases = Phase.NONE
        for f in self.filters:
            self.phases |= f.phases & ~f.on_behalf
        # Flag arithmetic is slow in Python: who runs in which phase is settled once, here.
        self._members: dict[str, tuple[Filter, ...]] = {
            label: tuple(f for f in self.filters if f.phases & mask & (self.phases | ~f.on_behalf))
            for label, mask in _PHASE_MASKS.items()
        }
        # Whether a request's outcome is recorded at SETTLE (risk, audit, pii findings).
        self.settles = bool(self._members["settle"])

    @property
    def names(self) -> list[str]:
        """Filter names in order."""
        return [f.name for f in self.filters]

    async def _fold(
        self, ctx: RequestContext, label: str, body: bytes | None = None, end: bool = False
    ) -> Decision:
        # The hot loop of the gateway: plain calls, no per-filter closures or pattern matching.
        acc: Continue = CONTINUE
        perf = time.perf_counter
        record = self.recorder
        verdicts = ctx.verdicts
        for f in self._members[label]:
            t0 = perf()
            if label == "request_headers":
                d = await f.on_request_headers(ctx)
            elif label == "request_body":
                d = await f.on_request_body(ctx, body or b"")
            elif label == "response_headers":
                d = await f.on_response_headers(ctx)
            else:
                d = await f.on_response_chunk(ctx, body or b"", end)
            dt = perf() - t0
            if isinstance(d, Continue):
                empty = d is CONTINUE or (d.body is None and not d.set_headers and not d.remove_headers)
                record(f.name, label, "continue" if empty else "mutate", dt)
                verdicts.append(Verdict(f.name, label, "continue" if empty else "mutate", dt))
                if not empty:
                    acc = merge(acc, d)
                    if d.body is not None:
                        body = d.body
                continue
            action = "deny" if isinstance(d, Deny) else "respond"
            record(f.name, label, action, dt)
            verdicts.append(Verdict(f.name, label, action, dt))
            return d
        return acc

    async def request_headers(self, ctx: RequestContext) -> Decision:
        """Run every filter's on_request_headers."""
        return await self._fold(ctx, "request_headers")

    async def request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        """Run every filter's on_request_body; each sees the body as earlier filters left it."""
        return await self._fold(ctx, "request_body", body)

    async def response_headers(self, ctx: RequestContext) -> Decision:
        """Run every filter's on_response_headers (filters wanting headers or the body)."""
        return await self._fold(ctx, "response_headers")

    async def response_chunk(self, ctx: RequestContext, chunk: bytes, end: bool) -> Decision:
        """Run every filter's on_response_chunk on one body chunk."""
        return await self._fold(ctx, "response_body", chunk, end)

    async def settle(self, ctx: RequestContext) -> Decision:
        """Every SETTLE filter in order, each seeing the outcome as those before it left it.

        Returns the first refusal of a request that was not refused yet (CONTINUE otherwise).
        A filter that raises counts as a refusal (fail closed), and the filters after it still
        run: the audit record is written even when the risk store failed.
        """
        refusal: Decision = CONTINUE
        for f in self._members["settle"]:
            t0 = time.perf_counter()
            try:
                d = await f.on_settle(ctx)
                detail = ""
            except Exception as exc:  # noqa: BLE001 - a bug here refuses, and the rest still record
                d = Deny(500, ErrorCode.INTERNAL, "internal gateway error")
                detail = f"error={type(exc).__name__}"
            dt = time.perf_counter() - t0
            action = "deny" if isinstance(d, Deny) else "continue"
            self.recorder(f.name, "settle", action, dt)
            ctx.verdicts.append(Verdict(f.name, "settle", action, dt, detail))
            if isinstance(d, Deny) and ctx.outcome in ("allowed", "responded"):
                ctx.outcome, ctx.status, ctx.error_code = "denied", d.status, str(d.code)
                refusal = d
        return refusal

    async def end(self, ctx: RequestContext) -> None:
        """Every filter's on_end, whatever happened; one failing does not skip the others."""
        first: BaseException | None = None
        for f in self.filters:
            try:
                await f.on_end(ctx)
            except Exception as exc:  # noqa: BLE001 - re-raised below after the others ran
                first = first or exc
        if first is not None:
            raise first
