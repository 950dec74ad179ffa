"""Who is calling: an API key (`Authorization: Bearer …`) resolved against hashed keys.

Zero trust: no key or an unknown key is a 401. Keys are stored only as SHA-256 digests (they are
high-entropy random tokens, so a plain digest is enough and lookups are constant-time per key).
The key never travels upstream.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from filters.base import BaseFilter, Continue, Decision, Deny, Phase, Principal, RequestContext
from filters.chain import BuildEnv, register
from gateway.config_yaml import ConfigError, Problem, at, validate
from gateway.errors import ErrorCode
from gateway.reload import Reloadable

KEY_PREFIX = "ztg-"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class _KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    id: str = Field(description="Key id, shown in logs and audit (never the key).")
    sha256: str = Field(description="Hex SHA-256 of the key.")
    user: str = Field(description="User the key belongs to.")
    tenant: str = Field(description="Tenant the user belongs to.")
    groups: list[str] = Field(default_factory=list, description="User groups, for policy scoping.")


class _KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    keys: list[_KeyEntry]


class KeyFileError(ConfigError):
    """The key file is unreadable or invalid."""


def digest(key: str) -> str:
    """The stored form of a key."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random API key."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class KeyStore:
    """Digest → principal, loaded once at start-up."""

    by_digest: dict[str, Principal]

    @classmethod
    def load(cls, path: Path) -> KeyStore:
        """Read and validate a key file; KeyFileError lists problems as file:line:column."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise KeyFileError([Problem(str(path), 1, 1, f"cannot read the file: {exc.strerror}")]) from None
        try:
            spec, marks = validate(_KeyFile, text, str(path))
        except ConfigError as exc:
            raise KeyFileError(exc.problems) from None
        out: dict[str, Principal] = {}
        problems: list[Problem] = []
        for i, e in enumerate(spec.keys):
            where = ("keys", i, "sha256")
            if not _HEX64.match(e.sha256):
                problems.append(
                    at(
                        marks,
                        str(path),
                        where,
                        f"key {e.id!r}: sha256 must be 64 lower-case hex digits",
                        "paste the digest that `ztgate keys new` printed",
                    )
                )
            elif e.sha256 in out:
                problems.append(
                    at(
                        marks,
                        str(path),
                        where,
                        f"key {e.id!r} is the same key as another entry",
                        "each key may appear once",
                    )
                )
            out[e.sha256] = Principal(e.id, e.user, e.tenant, tuple(e.groups))
        if problems:
            raise KeyFileError(problems)
        return cls(out)

    def lookup(self, key: str) -> Principal | None:
        """The principal for a presented key, or None."""
        return self.by_digest.get(digest(key))


class ApiKeyPrincipal(BaseFilter):
    """Resolve the caller from `Authorization: Bearer <key>`; 401 otherwise."""

    name: ClassVar[str] = "principal"
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS

    def __init__(self, keys: KeyStore | Reloadable[KeyStore]) -> None:
        # A Reloadable is read once per request: a key revoked in the file stops working within
        # about a second, and a broken edit leaves the last good keys in force.
        self._keys = keys

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        auth = ctx.headers.get("authorization", "")
        if not auth:
            return Deny(401, ErrorCode.MISSING_API_KEY, "an API key is required: Authorization: Bearer <key>")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        keys = self._keys.current if isinstance(self._keys, Reloadable) else self._keys
        principal = keys.lookup(token) if scheme.lower() == "bearer" and token else None
        if principal is None:
            return Deny(401, ErrorCode.INVALID_API_KEY, "the API key is not valid")
        ctx.principal = principal
        # The gateway key is ours: the upstream never sees it.
        return Continue(remove_headers=("authorization",))


@register("principal")
def _build(env: BuildEnv, _params: object) -> ApiKeyPrincipal:
    def make() -> Reloadable[KeyStore]:
        keys = Reloadable(env.settings.keys_file, KeyStore.load)
        env.reloadables.append(keys)
        return keys

    return ApiKeyPrincipal(env.engine("keys", make))
