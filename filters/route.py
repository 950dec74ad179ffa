"""Version-aware routing from the model registry.

Resolves `name[@version][:hash]` to an upstream and writes the gateway-owned routing header
(`x-ztgate-upstream`), then asks Envoy to re-route. The upstream gets the model under the name
and version it knows: the OpenAI `model` field or the KServe path is rewritten accordingly.
The OpenAI model list is answered by the gateway from the registry.

Prefix-cache isolation (`cache_scope`): a model server that caches prompt prefixes across
requests (vLLM's automatic prefix caching) answers a prefix it has seen faster, so a caller can
time its way to another caller's system prompt or documents. vLLM keeps a request's cached
blocks apart from every request with another `cache_salt`, so every OpenAI chat and completion
gets a salt the gateway derives from its caller's tenant (or user): a keyed hash, never the
client's own value, which is mixed in and so can only narrow the scope further. Servers without
the field (llama.cpp) ignore it.

Sequence isolation: Triton's sequence batcher keeps a stateful model's state per correlation id
(`parameters.sequence_id`), one namespace for every client, so a caller who sends another's id
continues, and reads, that sequence. The id a KServe call names is replaced by a keyed hash of
its tenant and that id, so each tenant's sequences are its own.

A registry snapshot that cannot be vouched for (Consul unreachable past its staleness bound,
gateway/consul.py) goes through `fail_mode.consul`: 503 registry_unavailable by default, or the
last good snapshot, flagged. With no snapshot ever read, every request is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from filters import _kserve, _openai
from filters._protocols import Prompt, compact_json
from filters.base import (
    BaseFilter,
    Continue,
    Decision,
    Deny,
    Phase,
    Principal,
    RequestContext,
    Respond,
    Verdict,
    fail_mode,
)
from filters.chain import BuildEnv, register
from gateway.errors import ErrorCode
from gateway.policy import Action, subject
from gateway.registry import NO_REGISTRY, Protocol, parse_ref

UPSTREAM_HEADER = "x-ztgate-upstream"
_NOT_FOUND = Deny(404, ErrorCode.MODEL_NOT_FOUND, "the model does not exist or is not available to you")
_UNAVAILABLE = Deny(503, ErrorCode.REGISTRY_UNAVAILABLE, "the model registry is unavailable; try again later")


def _model_entry(model_id: str) -> dict[str, object]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "ztgate"}


CacheScope = Literal["tenant", "user", "shared"]


class RouteParams(BaseModel):
    """Parameters of `route`."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    cache_scope: CacheScope = Field(
        default="tenant",
        description="Who may share the model server's prefix cache (vLLM's `cache_salt` on every "
        "OpenAI chat and completion): `tenant` (callers of one tenant), `user` (one user), or "
        "`shared` (everyone: no salt, unless the client sends one). A cached prefix is answered "
        "faster, so callers who share a cache can time their way to each other's prompts.",
    )


class RegistryRoute(BaseFilter):
    """Route each request to the upstream the registry names for its model reference, and give
    OpenAI calls the prefix-cache salt of their caller's scope."""

    name: ClassVar[str] = "route"
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS | Phase.REQUEST_BODY
    needs: ClassVar[tuple[str, ...]] = ("protocol",)

    def __init__(self, key: bytes, cache_scope: CacheScope = "tenant") -> None:
        self._key = key
        self._scope = cache_scope

    def cache_salt(self, who: Principal | None, client_salt: str | None) -> str | None:
        """The salt the upstream gets: a keyed hash of the caller's scope and the client's own
        salt, if any (so it can narrow its scope, never widen it); None: share with everyone."""
        if self._scope == "shared":
            if client_salt is None:
                return None
            parts = ["shared"]
        elif who is None:
            parts = ["anonymous"]  # a route without keys: one scope, apart from every tenant
        else:
            parts = ["tenant", who.tenant] + (["user", who.user] if self._scope == "user" else [])
        msg = json.dumps(["ztgate cache_salt", *parts, client_salt]).encode()  # unambiguous
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()[:32]

    def sequence_id(self, who: Principal | None, seq: int | str) -> int | str:
        """The correlation id the model server gets for a caller's `sequence_id`: a keyed hash of
        the caller's tenant and the id, of the same type (a number below 2^63, never 0)."""
        scope = ["anonymous"] if who is None else ["tenant", who.tenant]
        msg = json.dumps(["ztgate sequence_id", *scope, seq]).encode()
        digest = hmac.new(self._key, msg, hashlib.sha256).digest()
        if isinstance(seq, str):
            return digest.hex()[:32]
        return (int.from_bytes(digest[:8], "big") >> 1) or 1

    def _kserve_body(self, ctx: RequestContext, p: Prompt) -> tuple[bytes, str | None] | None:
        """The body and Inference-Header-Content-Length the model server gets when the call names
        a sequence (None: as sent): its id in the caller's tenant's namespace."""
        doc: Any = p.document
        params = doc.get("parameters") if isinstance(doc, dict) else None
        if not isinstance(params, dict):
            return None
        seq = params.get("sequence_id")  # checked by the protocol filter: a number or an identifier
        if seq is None or seq in (0, ""):  # 0 and "": no sequence (Triton's own reading)
            return None
        p.document = {**doc, "parameters": {**params, "sequence_id": self.sequence_id(ctx.principal, seq)}}
        if p.operation == _kserve.INFER:
            return _kserve.body_with_binary(p.document, p.binary_tail)
        return compact_json(p.document), None

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        # Calls without a body (model lists, health, metadata) are complete at this point.
        return self._route(ctx, ctx.prompt) if ctx.prompt is not None else Continue()

    async def on_request_body(self, ctx: RequestContext, body: bytes) -> Decision:
        if ctx.prompt is None:
            return Deny(500, ErrorCode.INTERNAL, "internal error")
        if ctx.route is not None or ctx.prompt.operation in (_openai.MODELS, _openai.MODEL):
            return Continue()
        return self._route(ctx, ctx.prompt, body)

    def _openai_body(self, ctx: RequestContext, p: Prompt, model: str, sent: bytes | None) -> bytes | None:
        """The body the upstream gets (None: as sent): the model under its upstream name, the
        cache salt of the caller's scope."""
        doc: Any = p.document
        if not isinstance(doc, dict):
            return None
        client_salt = doc.get("cache_salt")  # checked by the protocol filter: a short identifier
        salt = self.cache_salt(ctx.principal, client_salt)
        changes: dict[str, str] = {}
        if model != p.model_ref:
            changes["model"] = model
        if salt is not None:
            changes["cache_salt"] = salt
        if not changes:
            return None
        # Later filters that rewrite the body start from what the upstream will get.
        p.document = {**doc, **changes}
        if sent is not None and salt is not None and "model" not in changes and "cache_salt" not in doc:
            # Only a new key: put it in front of the others rather than serialize the whole body
            # again (a prompt of megabytes). Not when the body has the key at all, even as null:
            # a JSON reader takes the last of two, the client's. The body parsed to `doc`, so it
            # is an object with a `model`: a comma always follows its first `{`.
            start = sent.index(b"{")
            return b'%s{"cache_salt":"%s",%s' % (sent[:start], salt.encode(), sent[start + 1 :])
        return compact_json(p.document)

    def _route(self, ctx: RequestContext, p: Prompt, sent: bytes | None = None) -> Decision:
        reg = ctx.registry
        if reg.problem is not None:
            if reg.revision == NO_REGISTRY:
                # Nothing was ever read, so there is no last good snapshot to fall back on.
                ctx.verdicts.append(Verdict(self.name, "fail_mode", "deny", 0.0, "consul_failed=no_registry"))
                return _UNAVAILABLE
            d = fail_mode(ctx, self.name, "consul", "stale", _UNAVAILABLE)
            if isinstance(d, Deny):
                return d
        if p.protocol is Protocol.OPENAI:
            if p.operation == _openai.MODELS:
                ids: list[str] = []
                for m, v in reg.models_for(Protocol.OPENAI):
                    if _usable(ctx, m, v):
                        ids += [m, f"{m}@{v}"] if v == reg.spec.models[m].latest else [f"{m}@{v}"]
                return _json(200, {"object": "list", "data": [_model_entry(i) for i in dict.fromkeys(ids)]})
            if p.operation == _openai.MODEL:
                ref = parse_ref(p.model_ref or "")
                found = reg.resolve(ref, Protocol.OPENAI) if ref is not None else None
                if found is None or not _usable(ctx, found.model, found.version):
                    return _NOT_FOUND
                return _json(200, _model_entry(p.model_ref or ""))
        if p.protocol is Protocol.KSERVE_V2 and p.operation in (_kserve.SERVER, _kserve.HEALTH):
            cluster = reg.server_route(Protocol.KSERVE_V2)
            if cluster is None:
                return Deny(404, ErrorCode.UNKNOWN_PATH, "no model server is configured for this call")
            return Continue(set_headers=((UPSTREAM_HEADER, cluster), *_checked_path(ctx)), reroute=True)
        ref = parse_ref(p.model_ref or "")
        route = reg.resolve(ref, p.protocol) if ref is not None else None
        if route is None:
            return _NOT_FOUND
        ctx.route = route
        headers: tuple[tuple[str, str], ...] = ((UPSTREAM_HEADER, route.cluster), *_checked_path(ctx))
        body: bytes | None = None
        if p.protocol is Protocol.OPENAI:
            body = self._openai_body(ctx, p, route.upstream_model, sent)
        else:
            path = _kserve.upstream_path(
                _kserve.KPath(p.operation, p.model_ref), route.upstream_model, route.upstream_version
            )
            headers = ((UPSTREAM_HEADER, route.cluster), (":path", path))
            rewritten = self._kserve_body(ctx, p)
            if rewritten is not None:
                body, length = rewritten
                if length is not None:
                    headers += ((_kserve.HEADER_LENGTH, length),)
        return Continue(set_headers=headers, body=body, reroute=True)


def _checked_path(ctx: RequestContext) -> tuple[tuple[str, str], ...]:
    """The path without its query string, when there is one. Neither protocol defines a query
    on these calls, and nothing in the chain reads it: it is not forwarded unchecked."""
    return ((":path", ctx.path),) if ctx.query else ()


def _usable(ctx: RequestContext, model: str, version: str) -> bool:
    """Whether the policy would let this caller chat with the model: lists show nothing more."""
    policy = ctx.policy
    if policy is None or "access" not in policy.chain.names:
        return True
    who = subject(ctx.principal, f"{model}@{version}", "/v1/chat/completions", "openai")
    return policy.decide(who).action is not Action.DENY


def _json(status: int, doc: object) -> Respond:
    return Respond(status, json.dumps(doc).encode())


@register("route", RouteParams)
def _build(env: BuildEnv, params: RouteParams) -> RegistryRoute:
    return RegistryRoute(env.audit_key(), params.cache_scope)
