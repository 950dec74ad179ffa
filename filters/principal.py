"""Who is calling: an API key (`Authorization: Bearer …`) resolved against hashed keys.

Zero trust: no key, an unknown key, a key past its `expires` time or a `disabled` one is a 401.
Keys are stored only as SHA-256 digests (they are high-entropy random tokens, so a plain digest is
enough and lookups are constant-time per key). The key never travels upstream.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from filters.base import BaseFilter, Continue, Decision, Deny, Phase, Principal, RequestContext, Verdict
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
    expires: datetime | None = Field(
        default=None,
        description="When the key stops working: a time with its zone, e.g. 2027-03-31T00:00:00Z.",
    )
    disabled: bool = Field(default=False, description="Refuse the key (kept in the file, e.g. under review).")

    @field_validator("expires", mode="before")
    @classmethod
    def _aware(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, str) and "T" not in v.upper() and " " not in v.strip():
            raise ValueError(
                "write a time with its zone, e.g. 2027-03-31T00:00:00Z (a date alone is ambiguous)"
            )
        if isinstance(v, str):
            try:
                v = datetime.fromisoformat(v)
            except ValueError:
                raise ValueError("not an ISO 8601 time, e.g. 2027-03-31T00:00:00Z") from None
        if not isinstance(v, datetime):
            raise ValueError(  # noqa: TRY004 - pydantic reports ValueError, not TypeError, as the file's problem
                "write a time with its zone, e.g. 2027-03-31T00:00:00Z (a date alone is ambiguous)"
            )
        if v.tzinfo is None or v.utcoffset() is None:
            raise ValueError("write the time zone too, e.g. 2027-03-31T00:00:00Z or +08:00")
        return v


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
    """Digest → principal, loaded once at start-up; with each key's expiry (epoch seconds) and the
    disabled ones."""

    by_digest: dict[str, Principal]
    expires: dict[str, float] = field(default_factory=dict)
    disabled: frozenset[str] = frozenset()

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
        expires = {e.sha256: e.expires.timestamp() for e in spec.keys if e.expires is not None}
        return cls(out, expires, frozenset(e.sha256 for e in spec.keys if e.disabled))

    def check(self, key: str, now: float) -> tuple[Principal | None, str | None]:
        """The principal for a presented key (None: unknown), and why it is refused at `now`
        (epoch seconds): "expired", "disabled", or None. One digest per request."""
        d = digest(key)
        principal = self.by_digest.get(d)
        if principal is None or (not self.expires and not self.disabled):
            return principal, None
        if d in self.disabled:
            return principal, "disabled"
        until = self.expires.get(d)
        return principal, "expired" if until is not None and now >= until else None

    def expiring(self, now: float, within_s: float) -> dict[str, list[str]]:
        """Key ids by state: expired, expiring within `within_s`, disabled (for /readyz)."""
        ids = {d: p.key_id for d, p in self.by_digest.items()}
        return {
            "expired": sorted(ids[d] for d, t in self.expires.items() if t <= now),
            "expiring": sorted(ids[d] for d, t in self.expires.items() if now < t <= now + within_s),
            "disabled": sorted(ids[d] for d in self.disabled),
        }


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
        principal, refused = (
            keys.check(token, time.time()) if scheme.lower() == "bearer" and token else (None, None)
        )
        if principal is None:
            return Deny(401, ErrorCode.INVALID_API_KEY, "the API key is not valid")
        if refused is not None:
            # The key's id (never the key) tells operators whose key is still in use.
            ctx.verdicts.append(Verdict(self.name, "check", "deny", 0.0, f"key={principal.key_id},{refused}"))
            if refused == "expired":
                return Deny(401, ErrorCode.EXPIRED_API_KEY, "the API key has expired")
            return Deny(401, ErrorCode.DISABLED_API_KEY, "the API key is disabled")
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
