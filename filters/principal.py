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

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from filters.base import BaseFilter, Continue, Decision, Deny, Phase, Principal, RequestContext
from filters.chain import BuildEnv, register
from gateway.errors import ErrorCode

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


class KeyFileError(ValueError):
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
        """Read and validate a key file."""
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            spec = _KeyFile.model_validate(data)
        except OSError as exc:
            raise KeyFileError(f"{path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError:
            raise KeyFileError(f"{path}: not valid YAML") from None
        except ValidationError as exc:
            raise KeyFileError(f"{path}: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
        out: dict[str, Principal] = {}
        for e in spec.keys:
            if not _HEX64.match(e.sha256):
                raise KeyFileError(f"{path}: key {e.id!r}: sha256 must be 64 lower-case hex digits")
            if e.sha256 in out:
                raise KeyFileError(f"{path}: key {e.id!r} duplicates another key")
            out[e.sha256] = Principal(e.id, e.user, e.tenant, tuple(e.groups))
        return cls(out)

    def lookup(self, key: str) -> Principal | None:
        """The principal for a presented key, or None."""
        return self.by_digest.get(digest(key))


class ApiKeyPrincipal(BaseFilter):
    """Resolve the caller from `Authorization: Bearer <key>`; 401 otherwise."""

    name: ClassVar[str] = "principal"
    phases: ClassVar[Phase] = Phase.REQUEST_HEADERS

    def __init__(self, keys: KeyStore) -> None:
        self._keys = keys

    async def on_request_headers(self, ctx: RequestContext) -> Decision:
        auth = ctx.headers.get("authorization", "")
        if not auth:
            return Deny(401, ErrorCode.MISSING_API_KEY, "an API key is required: Authorization: Bearer <key>")
        scheme, _, token = auth.partition(" ")
        token = token.strip()
        principal = self._keys.lookup(token) if scheme.lower() == "bearer" and token else None
        if principal is None:
            return Deny(401, ErrorCode.INVALID_API_KEY, "the API key is not valid")
        ctx.principal = principal
        # The gateway key is ours: the upstream never sees it.
        return Continue(remove_headers=("authorization",))


@register("principal")
def _build(env: BuildEnv) -> ApiKeyPrincipal:
    return ApiKeyPrincipal(KeyStore.load(env.settings.keys_file))
