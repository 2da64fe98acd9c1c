"""Pydantic's validation problems as the service's 422: every problem located, misspelt fields named.

A misspelt field (``extra_forbidden``) says which field of its object it likely meant, read from the
request's pydantic model.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from mmencode.app.engine.errors import ValidationFailed
from mmencode.app.suggest import did_you_mean

__all__ = ["validation_error"]


def validation_error(
    problems: Sequence[Mapping[str, Any]],
    *,
    prefix: Sequence[str | int] = (),
    model: type[BaseModel] | None = None,
    subject: str | None = None,
) -> ValidationFailed:
    """A 422 listing every problem with its location, as pydantic reports them.

    With the body's ``model``, a misspelt field (``extra_forbidden``) says which field it likely meant;
    ``subject`` (``"an SGLang 0.5.23 EncodeRequest"``) says what the body failed to be.
    """
    listed = [
        {
            "loc": [*prefix, *problem.get("loc", ())],
            "msg": str(problem.get("msg", "")) + _suggestion(problem, model),
            "type": str(problem.get("type", "")),
        }
        for problem in problems
    ]
    first = listed[0] if listed else {"loc": [], "msg": "invalid request"}
    where = _param(first["loc"])
    summary = f"{len(listed)} problem(s) in the request; first: {where or 'body'}: {first['msg']}"
    return ValidationFailed(
        f"not {subject}: {summary}" if subject else summary,
        param=where,
        details={"errors": listed},
    )


def _suggestion(problem: Mapping[str, Any], model: type[BaseModel] | None) -> str:
    """``"; did you mean `image`?"`` for an unknown field close to one its object has; else ``""``."""
    loc = [part for part in problem.get("loc", ()) if part != "body"]
    if model is None or problem.get("type") != "extra_forbidden" or not loc or not isinstance(loc[-1], str):
        return ""
    fields = _fields_at(model, loc[:-1])
    meant = did_you_mean(loc[-1], fields) if fields else None
    return f"; did you mean `{meant}`?" if meant else ""


def _fields_at(model: type[BaseModel], loc: Sequence[Any]) -> list[str] | None:
    """The field names of the object at ``loc`` inside ``model`` (list indices pass through)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(str(part)) if current is not None else None
        current = _model_in(field.annotation) if field is not None else None
        if current is None:
            return None
    return list(current.model_fields) if current is not None else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``X | None``, ``list[X]``, ``Annotated[X, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _model_in(argument)
        if found is not None:
            return found
    return None


def _param(loc: Sequence[Any]) -> str | None:
    # ("body", "items", 1, "image") -> "items[1].image"
    out = ""
    for part in loc:
        if part in ("body", "query", "path", "header") and not out:
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None
