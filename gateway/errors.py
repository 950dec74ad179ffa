"""User-safe error codes and the protocol-shaped error bodies clients receive.

Everything a client is told comes from here: a stable code, a fixed message, the request id.
Exception text, prompt text and internal details never reach a client or an operational log.
"""

from __future__ import annotations

import json
from enum import StrEnum


class ErrorCode(StrEnum):
    """Stable, documented codes (docs/errors.md)."""

    MISSING_API_KEY = "missing_api_key"
    INVALID_API_KEY = "invalid_api_key"
    EXPIRED_API_KEY = "expired_api_key"
    DISABLED_API_KEY = "disabled_api_key"
    INVALID_JSON = "invalid_json"
    INVALID_ENCODING = "invalid_encoding"
    INVALID_REQUEST = "invalid_request"
    UNSUPPORTED_CONTENT = "unsupported_content"
    BODY_TOO_LARGE = "body_too_large"
    UNKNOWN_PATH = "unknown_path"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    FORBIDDEN_PATH = "forbidden_path"
    MODEL_NOT_FOUND = "model_not_found"
    UPSTREAM_BAD_RESPONSE = "upstream_bad_response"
    ANSWER_TOO_LARGE = "answer_too_large"
    GATEWAY_TIMEOUT = "gateway_timeout"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    GATEWAY_ERROR = "gateway_error"
    INTERNAL = "internal_error"
    POLICY_DENIED = "policy_denied"
    PROMPT_REJECTED = "prompt_rejected"
    PROMPT_TOO_LONG = "prompt_too_long"
    PII_UNREDACTABLE = "pii_unredactable"
    CLASSIFIER_UNAVAILABLE = "classifier_unavailable"
    AUDIT_UNAVAILABLE = "audit_unavailable"
    RISK_UNAVAILABLE = "risk_unavailable"
    REGISTRY_UNAVAILABLE = "registry_unavailable"
    USER_UNDER_REVIEW = "user_under_review"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    TOKEN_QUOTA_EXCEEDED = "token_quota_exceeded"  # noqa: S105 - an error code, not a secret
    CONCURRENCY_LIMIT_EXCEEDED = "concurrency_limit_exceeded"
    QUOTA_UNAVAILABLE = "quota_unavailable"
    TOO_MANY_AUTH_FAILURES = "too_many_auth_failures"
    AUTH_GUARD_UNAVAILABLE = "auth_guard_unavailable"


_OPENAI_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error_body(kserve: bool, status: int, code: str, message: str, request_id: str) -> bytes:
    """The error in the protocol's own shape: OpenAI's `{"error": {...}}` or KServe's `{"error": str}`."""
    if kserve:
        doc: dict[str, object] = {"error": f"{message} (request id {request_id})", "code": code}
    else:
        doc = {
            "error": {
                "message": f"{message} (request id {request_id})",
                "type": _OPENAI_TYPE.get(status, "gateway_error"),
                "param": None,
                "code": code,
            }
        }
    doc["request_id"] = request_id
    return json.dumps(doc, ensure_ascii=False).encode()
