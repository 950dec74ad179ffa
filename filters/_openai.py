"""OpenAI-compatible HTTP (as vLLM serves it): request validation and answer extraction."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast

from filters._protocols import (
    Answer,
    Prompt,
    ProtocolError,
    Segment,
    Slot,
    StreamEvent,
    bad,
    check_text,
    strict_json,
)
from filters._sse import SSEParser
from gateway.errors import ErrorCode
from gateway.registry import Protocol

CHAT = "chat"
COMPLETION = "completion"
MODELS = "models"
MODEL = "model"

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

# Request fields (vLLM's extensions to the OpenAI API) that put client text into what the model
# reads in ways the checks cannot follow: a chat template the server renders, its arguments,
# documents a template pastes in, and prompt embeddings (a base64 tensor the model reads as a
# prompt of its own, beside `prompt` or the messages). They are refused, not forwarded unchecked.
_UNCHECKABLE = ("chat_template", "chat_template_kwargs", "documents", "prompt_embeds")
# vLLM's request fields that steer the engine rather than the answer, which only the operator's
# own routers may set: KV- and encoder-cache transfer between instances (their remote host and
# port, their block ids: a client's would send the engine to any address, or to another
# request's cache), extra engine arguments, logits processors loaded by name, and scheduling
# priority (one tenant's would jump every other's queue); and llama.cpp's per-request LoRA
# adapters (another model than the one the registry routed to and the audit names). Refused,
# with any value but null.
_ENGINE_FIELDS = (
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
    "logits_processors",
    "priority",
    "lora",
)
# What a message may carry. Text fields beside `content` are read too: vLLM hands an assistant
# message's `reasoning` to the chat template (interleaved thinking), templates read
# `reasoning_content`. Any other field with a value is refused: a template may render it, and
# the checks would not have read it. Null or empty ones pass (the openai SDK sends `audio: null`,
# `annotations: []` when a client resends an answer's message).
_MESSAGE_TEXT = ("reasoning", "reasoning_content", "refusal")
_MESSAGE_KEYS = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "function_call", *_MESSAGE_TEXT}
)
# A message's `name` and a tool call's function name and id (chat templates render them):
# identifiers, as OpenAI's API has them, so that they cannot carry text the checks do not read.
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CALL_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_RULE_TEXT = {
    _NAME: "1-64 letters, digits, '_' or '-'",
    _CALL_ID: "1-128 letters, digits, '_', '-', '.' or ':'",
}


def _identifier(value: Any, where: str, rule: re.Pattern[str]) -> None:
    if value is not None and not (isinstance(value, str) and rule.fullmatch(value)):
        raise bad(f"{where} must be {_RULE_TEXT[rule]}")


# JSON Schema's keywords (2020-12 and draft-07, with OpenAPI's `nullable`): a schema object's
# other keys are text the model reads (a template renders the tool whole), so they are checked.
_SCHEMA_KEYWORDS = frozenset(
    {
        "$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary",
        "$comment", "$defs", "definitions", "type", "enum", "const", "multipleOf", "maximum",
        "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern",
        "maxItems", "minItems", "uniqueItems", "maxContains", "minContains", "maxProperties",
        "minProperties", "required", "dependentRequired", "dependencies", "allOf", "anyOf",
        "oneOf", "not", "if", "then", "else", "dependentSchemas", "prefixItems", "items",
        "additionalItems", "contains", "properties", "patternProperties", "additionalProperties",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties", "format",
        "contentEncoding", "contentMediaType", "contentSchema", "title", "description",
        "default", "deprecated", "readOnly", "writeOnly", "examples", "nullable",
    }
)  # fmt: skip
# `type` values that are JSON Schema's type names are schema, not text to heed; any other is read.
_SCHEMA_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# Keywords whose object's keys are names (of properties, definitions), not keywords.
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions"})


def _schema_types(value: Any) -> bool:
    if isinstance(value, list):
        return all(isinstance(v, str) and v in _SCHEMA_TYPES for v in value)
    return isinstance(value, str) and value in _SCHEMA_TYPES


def _schema_text(node: Any, out: list[str], depth: int = 0) -> None:
    """Every string a model reads in a tool's JSON schema: descriptions, titles, enum values,
    defaults, examples, patterns, formats, references, property names and keys that are not
    JSON Schema keywords (only `type` values naming JSON Schema's types are left out)."""
    if depth > 64:
        raise bad("a tool's parameters are nested too deeply")
    if isinstance(node, str):
        out.append(node)
    elif isinstance(node, list):
        for item in node:
            _schema_text(item, out, depth + 1)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key not in _SCHEMA_KEYWORDS:
                out.append(key)
            if key in _NAMED and isinstance(value, dict):
                out.extend(value)
                for sub in value.values():
                    _schema_text(sub, out, depth + 1)
            elif key != "type" or not _schema_types(value):
                _schema_text(value, out, depth + 1)


# What a tool and its function may carry. Chat templates render a tool whole (Llama 3.1's and
# Qwen 2.5's `tool | tojson`), so any other field with a value would reach the model unread.
_TOOL_KEYS = frozenset({"type", "function"})
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
# The same for an earlier turn's tool calls (`index` as streamed answers carry it).
_CALL_KEYS = frozenset({"id", "type", "function", "index"})
_CALLED_KEYS = frozenset({"name", "arguments"})


def _unread_fields(obj: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    for key, value in obj.items():
        if key not in allowed and value not in (None, "", [], {}):
            raise bad(f"{where}.{key} is not accepted by the gateway", ErrorCode.UNSUPPORTED_CONTENT)


def _function_text(fn: Any, where: str) -> str:
    """The text of one tool's function definition (`tools[j].function`, legacy `functions[j]`):
    a name that is an identifier, its description and every string of its parameters' schema."""
    if not isinstance(fn, dict):
        raise bad(f"{where} must be an object")
    _unread_fields(fn, _FUNCTION_KEYS, where)
    _identifier(fn.get("name"), f"{where}.name", _NAME)
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise bad(f"{where}.description must be a string")
    if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
        raise bad(f"{where}.strict must be a boolean")
    texts = [desc] if desc else []
    _schema_text(fn.get("parameters"), texts)
    return "\n".join(texts)


def _tool_segments(doc: dict[str, Any]) -> list[Segment]:
    """One `tool_spec` segment per tool definition with text (`tools`, and the legacy
    `functions` that older servers still render)."""
    defs: list[tuple[str, Any]] = []
    tools = doc.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad("'tools' must be an array")
        for j, tool in enumerate(tools):
            if not isinstance(tool, dict):
                raise bad(f"tools[{j}] must be an object")
            _unread_fields(tool, _TOOL_KEYS, f"tools[{j}]")
            if tool.get("type", "function") != "function":
                raise bad(f"tools[{j}].type must be 'function'", ErrorCode.UNSUPPORTED_CONTENT)
            defs.append((f"tools[{j}].function", tool.get("function")))
    functions = doc.get("functions")
    if functions is not None:
        if not isinstance(functions, list):
            raise bad("'functions' must be an array")
        defs += [(f"functions[{j}]", fn) for j, fn in enumerate(functions)]
    segments = []
    for where, fn in defs:
        text = _function_text(fn, where)
        if text:
            segments.append(Segment("tool_spec", check_text(text, "tool description")))
    return segments


def operation_for(method: str, path: str) -> str:
    """The operation a method and path name, or a ProtocolError for anything else."""
    if path == "/v1/chat/completions":
        op = CHAT
    elif path == "/v1/completions":
        op = COMPLETION
    elif path == "/v1/models":
        op = MODELS
    elif path.startswith("/v1/models/") and path.count("/") == 3:
        op = MODEL
    else:
        raise bad("unknown path", ErrorCode.UNKNOWN_PATH, 404)
    want = "POST" if op in (CHAT, COMPLETION) else "GET"
    if method != want:
        raise bad(f"{path} takes {want}", ErrorCode.METHOD_NOT_ALLOWED, 405)
    return op


def _text_of_content(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return check_text(content, where)
    if isinstance(content, list):
        texts: list[str] = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise bad(f"{where}[{i}] must be an object with a string 'type'")
            if part["type"] != "text":
                # Images, audio and files cannot be inspected here: refuse rather than forward unchecked.
                raise bad(
                    f"{where}[{i}]: content type {part['type']!r} is not supported",
                    ErrorCode.UNSUPPORTED_CONTENT,
                )
            if not isinstance(part.get("text"), str):
                raise bad(f"{where}[{i}].text must be a string")
            texts.append(check_text(part["text"], where))
        return "\n".join(texts)
    raise bad(f"{where} must be a string, an array of content parts or null")


def _chat_segments(doc: dict[str, Any]) -> list[Segment]:
    messages = doc.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty array")
    segments: list[Segment] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise bad(f"messages[{i}] must be an object")
        role = msg.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise bad(f"messages[{i}].role must be one of {sorted(_ROLES)}")
        _identifier(msg.get("name"), f"messages[{i}].name", _NAME)
        text = _text_of_content(msg.get("content"), f"messages[{i}].content")
        if text:
            segments.append(Segment(role, text))
        _unread_fields(msg, _MESSAGE_KEYS, f"messages[{i}]")
        for key, value in msg.items():
            if key in _MESSAGE_TEXT and value is not None:
                if not isinstance(value, str):
                    raise bad(f"messages[{i}].{key} must be a string or null")
                if value:
                    segments.append(Segment(role, check_text(value, f"messages[{i}].{key}")))
        _identifier(msg.get("tool_call_id"), f"messages[{i}].tool_call_id", _CALL_ID)
        calls = msg.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise bad(f"messages[{i}].tool_calls must be an array")
        fns = (
            [(f"messages[{i}].function_call", msg["function_call"])]
            if msg.get("function_call") is not None
            else []
        )
        for j, call in enumerate(calls or ()):
            if not isinstance(call, dict):
                raise bad(f"messages[{i}].tool_calls[{j}] must be an object")
            _unread_fields(call, _CALL_KEYS, f"messages[{i}].tool_calls[{j}]")
            if call.get("type", "function") not in ("function", None):
                raise bad(
                    f"messages[{i}].tool_calls[{j}].type must be 'function'", ErrorCode.UNSUPPORTED_CONTENT
                )
            _identifier(call.get("id"), f"messages[{i}].tool_calls[{j}].id", _CALL_ID)
            fns.append((f"messages[{i}].tool_calls[{j}].function", call.get("function")))
        for where, fn in fns:
            if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str):
                raise bad(f"{where}.arguments must be a string")
            _unread_fields(fn, _CALLED_KEYS, where)
            _identifier(fn.get("name"), f"{where}.name", _NAME)
            segments.append(Segment(role, check_text(fn["arguments"], "tool call arguments")))
    return segments + _tool_segments(doc)


def _completion_segments(doc: dict[str, Any]) -> list[Segment]:
    prompt = doc.get("prompt")
    suffix = doc.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise bad("'suffix' must be a string")
    tail = [Segment("user", check_text(suffix, "suffix"))] if suffix else []
    if isinstance(prompt, str):
        return [Segment("user", check_text(prompt, "prompt")), *tail]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return [*(Segment("user", check_text(p, "prompt")) for p in prompt), *tail]
    # Token-id prompts cannot be read by the checks that follow: refuse them.
    raise bad("'prompt' must be a string or a non-empty array of strings")


def parse_request(op: str, body: bytes) -> Prompt:
    """Validate a chat/completion body and extract its text; ProtocolError if malformed."""
    doc = strict_json(body)
    if not isinstance(doc, dict):
        raise bad("request body must be a JSON object")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' must be a non-empty string")
    stream = doc.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise bad("'stream' must be a boolean")
    so = doc.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise bad("'stream_options' must be an object")
    if isinstance(so, dict) and not isinstance(so.get("include_usage", False), bool | None):
        # a server may read 1 or "yes" as true; the gateway must know whether the client asked
        raise bad("'stream_options.include_usage' must be a boolean")
    for name in _UNCHECKABLE:
        if name in doc:
            raise bad(f"'{name}' is not accepted by the gateway", ErrorCode.UNSUPPORTED_CONTENT)
    for name in _ENGINE_FIELDS:
        if doc.get(name) is not None:
            raise bad(
                f"'{name}' is set by the model server's operator, not by a client",
                ErrorCode.UNSUPPORTED_CONTENT,
            )
    # vLLM's prefix-cache salt. The route filter mixes it into a salt of its own, so no server
    # gets it as sent; plain and short all the same (a cache store may fail on other characters).
    _identifier(doc.get("cache_salt"), "'cache_salt'", _CALL_ID)
    segments = _chat_segments(doc) if op == CHAT else _completion_segments(doc)
    return Prompt(Protocol.OPENAI, op, model, bool(stream), tuple(segments), doc)


def _choices(doc: Any) -> list[dict[str, Any]]:
    if not isinstance(doc, dict):
        raise ProtocolError(502, ErrorCode.UPSTREAM_BAD_RESPONSE, "upstream answer is not a JSON object")
    choices = doc.get("choices", [])
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise ProtocolError(502, ErrorCode.UPSTREAM_BAD_RESPONSE, "upstream answer has malformed choices")
    return choices


def _index(choice: dict[str, Any], fallback: int) -> int:
    idx = choice.get("index", fallback)
    return idx if isinstance(idx, int) and idx >= 0 else fallback


def _check_text_fields(part: Any, where: str) -> None:
    """Every answer field a client reads as text must be text: anything else could carry text
    the checks after this do not see, so the answer is refused rather than forwarded."""
    if part is None:
        return
    if not isinstance(part, dict):
        raise _bad_answer(f"{where} is not an object")
    for key, value in part.items():
        if key not in _READ_ANSWER_KEYS and _holds_text(value):
            # A field the gateway does not read (OpenAI's `audio` transcript, a server's own
            # field): the client would get text that no check saw.
            # The key is the upstream's: named only when it is a plain identifier, never echoed
            # as text of its own.
            field = f"{where}.{key}" if _NAME.fullmatch(key) else f"a field of {where}"
            raise _bad_answer(f"{field} holds text the gateway does not read")
    for f in _MESSAGE_FIELDS:
        if part.get(f) is not None and not isinstance(part[f], str):
            raise _bad_answer(f"{where}.{f} is not a string")
    calls = part.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
        raise _bad_answer(f"{where}.tool_calls is not an array of objects")
    for fn in [c.get("function") for c in calls or ()] + [part.get("function_call")]:
        if fn is None:
            continue
        if not isinstance(fn, dict) or not all(
            fn.get(k) is None or isinstance(fn[k], str) for k in ("name", "arguments")
        ):
            raise _bad_answer(f"{where} has a malformed tool call")


def _bad_answer(what: str) -> ProtocolError:
    return ProtocolError(502, ErrorCode.UPSTREAM_BAD_RESPONSE, f"upstream answer: {what}")


def take_document(op: str, doc: Any, message_key: str, answer: Answer) -> None:
    """Add one answer document's choices (`message` when whole, `delta` when streamed) and usage
    (also how a filter that rewrote a document reads what the client gets)."""
    if isinstance(doc, dict) and "error" in doc:
        answer.upstream_error = True
        return
    for n, choice in enumerate(_choices(doc)):
        idx = _index(choice, n)
        if op == CHAT:
            _check_text_fields(choice.get(message_key), f"choices[{n}].{message_key}")
        elif choice.get("text") is not None and not isinstance(choice["text"], str):
            raise _bad_answer(f"choices[{n}].text is not a string")
        if isinstance(choice.get("finish_reason"), str):
            answer.finish[idx] = choice["finish_reason"]
    # The answer's text is exactly what the PII filter rewrites: one list of places for both.
    for slot in answer_slots(op, doc, message_key):
        idx, part = cast(tuple[int, str], slot.key)  # answer_slots' keys are (choice, field)
        answer.add(idx, slot.get(), part)
    if isinstance(doc, dict) and isinstance(doc.get("usage"), dict):
        answer.usage = doc["usage"]


def answer_from_json(op: str, body: bytes, answer: Answer) -> None:
    """Fill `answer` from a whole (non-streamed) response body."""
    answer.document = strict_json(body, "upstream answer")
    take_document(op, answer.document, "message", answer)
    answer.done = True


def usage_only(doc: Any) -> bool:
    """A stream's usage chunk (`stream_options.include_usage`): no choices, only the usage."""
    return isinstance(doc, dict) and doc.get("choices") == [] and isinstance(doc.get("usage"), dict)


def answer_from_sse(op: str, parser: SSEParser, chunk: bytes, end: bool, answer: Answer) -> None:
    """Feed one streamed body chunk; deltas are reassembled per choice across chunk boundaries."""
    events = parser.feed(chunk)
    if end:
        events += parser.close()
    answer.chunk_events = []
    for ev in events:
        answer.events += 1
        if answer.done:
            # The answer was settled at [DONE] (its audit record, the text remembered as
            # delivered): nothing may follow that the record does not hold.
            raise _bad_answer("an event after [DONE]")
        if ev.data == "[DONE]":
            answer.done = True
            answer.chunk_events.append(StreamEvent(ev.event, None))
        else:
            doc = strict_json(ev.data.encode(), "upstream stream event")
            take_document(op, doc, "delta", answer)
            answer.chunk_events.append(StreamEvent(ev.event, doc))


# Text fields of a chat answer's message or delta: all of it reaches the client. Reasoning is
# answer text too (`reasoning` is newer vLLM's name for `reasoning_content`).
_MESSAGE_FIELDS = ("content", "reasoning_content", "reasoning", "refusal")
# What the gateway reads of an answer's message or delta; any other field holding text is refused.
_READ_ANSWER_KEYS = frozenset({"role", *_MESSAGE_FIELDS, "tool_calls", "function_call"})


def request_slots(op: str, doc: dict[str, Any]) -> list[Slot]:
    """The prompt texts of a validated chat/completion request, for rewriting in place.

    Message contents and text parts, the arguments of earlier tool calls, a completion's prompt
    and suffix. Tool definitions are the application's schema and are not rewritten: the PII
    filter refuses a prompt whose personal data sits only where it cannot redact.
    """
    out: list[Slot] = []
    if op == CHAT:
        for i, msg in enumerate(doc["messages"]):
            content = msg.get("content")
            if isinstance(content, str):
                out.append(Slot(i, msg, "content"))
            elif isinstance(content, list):
                out += [Slot(i, part, "text") for part in content]
            out += [Slot(i, msg, key) for key in _MESSAGE_TEXT if isinstance(msg.get(key), str)]
            out += _call_slots(i, msg)
        return out
    if isinstance(doc["prompt"], str):
        out.append(Slot(0, doc, "prompt"))
    else:
        out += [Slot(i, doc["prompt"], i) for i in range(len(doc["prompt"]))]
    if isinstance(doc.get("suffix"), str):
        out.append(Slot("suffix", doc, "suffix"))
    return out


def _holds(value: Any, leaf: Callable[[Any], bool]) -> bool:
    """Whether anything in a JSON value (through its objects and arrays) is a `leaf`."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return any(_holds(v, leaf) for v in value)
    return leaf(value)


def _holds_text(value: Any) -> bool:
    return _holds(value, lambda v: isinstance(v, str) and v != "")


def _holds_something(value: Any) -> bool:
    return _holds(value, lambda v: v is not None and v != "")


def token_field(doc: Any) -> str | None:
    """The first field of an answer document's choices that carries its text again, token by
    token (`logprobs`, vLLM's `token_ids`), or None. A server may send them unasked (llama.cpp
    does for `n_probs`, a field of its own): redaction cannot follow them."""
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        return None
    for n, choice in enumerate(doc["choices"]):
        for key in ("logprobs", "token_ids"):
            if isinstance(choice, dict) and _holds_something(choice.get(key)):
                return f"choices[{n}].{key}"
    return None


def answer_slots(op: str, doc: Any, message_key: str) -> list[Slot]:
    """The answer texts of one answer document (`message` when whole, `delta` when streamed),
    keyed by (choice index, field) so a choice's streamed pieces form one text."""
    out: list[Slot] = []
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        return out
    for n, choice in enumerate(choices):
        if not isinstance(choice, dict):
            continue
        idx = _index(choice, n)
        if op == CHAT:
            part = choice.get(message_key)
            if isinstance(part, dict):
                out += [Slot((idx, f), part, f) for f in _MESSAGE_FIELDS if isinstance(part.get(f), str)]
                out += _call_slots(idx, part)
        elif isinstance(choice.get("text"), str):
            out.append(Slot((idx, "text"), choice, "text"))
    return out


def finished_choices(doc: Any) -> list[int]:
    """Indexes of the choices this streamed event finishes."""
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        return []
    return [
        _index(c, n)
        for n, c in enumerate(choices)
        if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)
    ]


def _call_slots(idx: int, part: dict[str, Any]) -> list[Slot]:
    """The arguments of a message's or delta's tool calls (and of a legacy `function_call`):
    the model wrote them and the client's application acts on them, so they are answer text.
    Keyed by the call's `index` (streams) or its position (whole answers)."""
    out: list[Slot] = []
    calls = part.get("tool_calls")
    for j, call in enumerate(calls if isinstance(calls, list) else ()):
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            out.append(Slot((idx, f"{_CALL}{_call_index(call, j)}"), fn, "arguments"))
    fc = part.get("function_call")
    if isinstance(fc, dict) and isinstance(fc.get("arguments"), str):
        out.append(Slot((idx, "function_call"), fc, "arguments"))
    return out


_CALL = "tool_calls."


def _call_index(call: dict[str, Any], position: int) -> int:
    n = call.get("index", position)
    return n if isinstance(n, int) and n >= 0 else position


def _put(delta: dict[str, Any], fld: str, text: str) -> None:
    """Append `text` to field `fld` of a chat delta, a tool call's arguments included."""
    if fld.startswith(_CALL) or fld == "function_call":
        if fld == "function_call":
            fn = delta.setdefault("function_call", {})
        else:
            n = int(fld[len(_CALL) :])
            calls = delta.setdefault("tool_calls", [])
            call = next((c for j, c in enumerate(calls) if _call_index(c, j) == n), None)
            if call is None:
                call = {"index": n, "function": {}}
                calls.append(call)
            fn = call.setdefault("function", {})
        fn["arguments"] = (fn.get("arguments") or "") + text
    else:
        delta[fld] = (delta.get(fld) or "") + text


def append_text(op: str, doc: Any, key: tuple[int, str], text: str) -> bool:
    """Add `text` to choice/field `key` of a streamed event; False if the event has no such choice."""
    idx, fld = key
    for n, choice in enumerate(doc.get("choices") or ()):
        if isinstance(choice, dict) and _index(choice, n) == idx:
            if op == CHAT:
                delta = choice.get("delta")
                if not isinstance(delta, dict):
                    delta = choice["delta"] = {}
                _put(delta, fld, text)
            else:
                choice["text"] = (choice.get("text") or "") + text
            return True
    return False


def stream_event(op: str, like: Any, texts: dict[tuple[int, str], str]) -> dict[str, Any]:
    """A streamed event carrying `texts` (held text released at the end), shaped like `like`."""
    base = like if isinstance(like, dict) else {}
    doc: dict[str, Any] = {
        k: base[k] for k in ("id", "object", "created", "model", "system_fingerprint") if k in base
    }
    choices: dict[int, dict[str, Any]] = {}
    for (idx, fld), text in texts.items():
        choice = choices.setdefault(idx, {"index": idx, "finish_reason": None})
        if op == CHAT:
            _put(choice.setdefault("delta", {}), fld, text)
        else:
            choice["text"] = text
    doc["choices"] = list(choices.values())
    return doc
