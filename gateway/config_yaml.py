"""YAML configuration files with errors people can act on.

Every problem is reported as `file:line:column: what is wrong: what would be right`, located on
the exact key or value, never as a Python traceback. Stricter than plain `yaml.safe_load`:
duplicate keys are an error (PyYAML silently keeps the last one, so a reviewer could read one
value while the gateway enforced another), and so are anchors, aliases and custom tags.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, get_origin

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
Path_ = tuple[str | int, ...]
Marks = dict[Path_, tuple[int, int]]

_PLAIN_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One located problem."""

    source: str
    line: int
    column: int
    what: str
    hint: str = ""

    def __str__(self) -> str:
        tail = f": {self.hint}" if self.hint else ""
        return f"{self.source}:{self.line}:{self.column}: {self.what}{tail}"


class ConfigError(ValueError):
    """A configuration file has problems; `problems` lists them in file order."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line, p.column))
        super().__init__("\n".join(str(p) for p in self.problems))


_TIMESTAMP = "tag:yaml.org,2002:timestamp"


def _walk(node: yaml.Node, path: Path_, marks: Marks, source: str, scalars: yaml.SafeLoader) -> Any:
    marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if node.tag == _TIMESTAMP and isinstance(node, yaml.ScalarNode):
        return node.value  # a time or a date reads as written; the field that wants one parses it
    if node.tag not in _PLAIN_TAGS:
        raise ConfigError(
            [
                Problem(
                    source,
                    *marks[path],
                    f"tag {node.tag!r} is not allowed",
                    "use plain strings, numbers, booleans, lists and mappings",
                )
            ]
        )
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _walk(key_node, (*path, "<key>"), {}, source, scalars)
            if key in out:
                raise ConfigError(
                    [
                        Problem(
                            source,
                            key_node.start_mark.line + 1,
                            key_node.start_mark.column + 1,
                            f"duplicate key {key!r}",
                            "each key may appear once in a mapping",
                        )
                    ]
                )
            out[key] = _walk(value_node, (*path, str(key)), marks, source, scalars)
            marks[(*path, str(key), "<key>")] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(v, (*path, i), marks, source, scalars) for i, v in enumerate(node.value)]
    return scalars.construct_object(node, deep=True)


class _NoAliases(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.MarkedYAMLError(None, None, "anchors and aliases are not allowed", event.start_mark)
        return super().compose_node(parent, index)


def load(text: str, source: str) -> tuple[Any, Marks]:
    """Parse YAML strictly; return the data and the (line, column) of every path in it."""
    try:
        loader = _NoAliases(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = exc.problem or exc.context or "syntax error"
        hint = "" if "alias" in what else "check indentation, quotes and colons here"
        raise ConfigError([Problem(source, line, col, f"not valid YAML: {what}", hint)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(source, 1, 1, f"not valid YAML: {exc}")]) from None
    if node is None:
        raise ConfigError(
            [Problem(source, 1, 1, "the file is empty", "it needs at least the required sections")]
        )
    marks: Marks = {}
    # One constructor per file (loaders are not thread-safe, and reloads run in threads).
    return _walk(node, (), marks, source, yaml.SafeLoader("")), marks


def _fields_at(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """Field names of the (sub)model that a location points into, for did-you-mean hints."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        else:
            current = _element(current)
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            models = [
                a
                for a in getattr(current, "__args__", ())
                if isinstance(a, type) and issubclass(a, BaseModel)
            ]
            current = models[-1] if models and get_origin(current) not in (dict, list, tuple) else current
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _element(annotation: Any) -> Any:
    """What a dict value or list item of this annotation is."""
    args: tuple[Any, ...] = tuple(getattr(annotation, "__args__", ()))
    origin = get_origin(annotation)
    if origin is dict and len(args) == 2:
        return args[-1]
    if origin in (list, tuple) and args:
        return args[0]
    return annotation


def validate(model: type[M], text: str, source: str) -> tuple[M, Marks]:
    """Load YAML and validate it into `model`, with every problem located in the file.

    Returns the marks too, so checks across fields (references) can point at the right line.
    """
    data, marks = load(text, source)
    try:
        return model.model_validate(data), marks
    except ValidationError as exc:
        problems = [_problem(model, err, marks, source) for err in exc.errors()]
        raise ConfigError(problems) from None


def at(marks: Marks, source: str, path: Path_, what: str, hint: str = "") -> Problem:
    """A problem located at a path of the document (or its nearest located ancestor)."""
    probe = path
    while probe and probe not in marks:
        probe = probe[:-1]
    line, col = marks.get(probe, (1, 1))
    return Problem(source, line, col, what, hint)


def _problem(model: type[BaseModel], err: Any, marks: Marks, source: str) -> Problem:
    loc = tuple(str(p) if not isinstance(p, int) else p for p in err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        key = str(loc[-1])
        line, col = marks.get((*loc, "<key>"), marks.get(loc, (1, 1)))
        close = difflib.get_close_matches(key, _fields_at(model, loc[:-1]), n=1)
        allowed = ", ".join(sorted(_fields_at(model, loc[:-1])))
        hint = f"did you mean {close[0]!r}?" if close else f"allowed keys: {allowed}"
        return Problem(source, line, col, f"unknown key {key!r}", hint)
    # Nearest located ancestor: a missing key is reported where its mapping starts.
    probe = loc
    while probe and probe not in marks:
        probe = probe[:-1]
    line, col = marks.get(probe, (1, 1))
    where = ".".join(str(p) for p in loc) or "(top)"
    if kind == "missing":
        return Problem(source, line, col, f"missing key {where!r}", "add it")
    value = err.get("input")
    shown = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return Problem(source, line, col, f"{where}: {err['msg'].rstrip('.')} (got {shown})", hint_for(kind, err))


def hint_for(kind: str, err: Any) -> str:
    """What would be right, for a pydantic error type (empty when there is nothing useful to say)."""
    ctx = err.get("ctx") or {}
    if kind in ("int_type", "int_parsing"):
        return "write a whole number"
    if kind in ("string_type",):
        return "write text (quote it if it looks like a number)"
    if kind in ("bool_type",):
        return "write true or false"
    if kind in ("enum", "literal_error"):
        return f"use one of: {ctx.get('expected', '')}"
    if kind in ("less_than_equal", "greater_than_equal", "less_than", "greater_than"):
        return "use a value in range"
    if kind in ("dict_type", "model_type"):
        return "write a mapping (key: value lines)"
    if kind in ("list_type", "tuple_type"):
        return "write a list ([a, b] or - items)"
    return ""
