"""Keeps ``/openapi.json`` true for routes that read their body by hand (JSON or multipart)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from mmencode.schemas.errors import ErrorResponse

__all__ = ["ERROR_RESPONSES", "install_openapi", "request_body"]

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "Invalid request: partial_precomputed, missing_metadata, invalid_image, unknown_hash, ...",
        401: "invalid_api_key: API keys are configured and the Bearer key is missing or wrong",
        404: "model_not_found",
        413: "payload_too_large",
        422: "validation_error: the body does not fit the schema",
        500: "token_count_mismatch or internal_error",
        503: "overloaded (with Retry-After) or not_ready",
        504: "timeout",
    }.items()
}


class _RequestBody(dict[str, Any]):
    """A route's ``openapi_extra`` that remembers the model it refers to, for ``install_openapi``."""

    def __init__(self, model: type[BaseModel], extra: dict[str, Any]) -> None:
        super().__init__(extra)
        self.model = model


def request_body(model: type[BaseModel], *, multipart: dict[str, Any] | None = None) -> dict[str, Any]:
    """``openapi_extra`` for a route that parses ``model`` itself; the app's schema then defines the model."""
    content: dict[str, Any] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
    if multipart is not None:
        content["multipart/form-data"] = {"schema": multipart}
    return _RequestBody(model, {"requestBody": {"required": True, "content": content}})


def install_openapi(
    app: FastAPI, routers: Sequence[APIRouter], *, bearer_protected: Callable[[str], bool] | None = None
) -> None:
    """``routers``: the app's, whose ``request_body`` models the schema defines. ``bearer_protected``: which
    paths need ``Authorization: Bearer`` (API keys on), so /docs can send one."""
    # From the routes' openapi_extra, not a registry filled at import: this app's routes, and only theirs.
    body_models = {
        extra.model.__name__: extra.model
        for router in routers
        for route in router.routes
        if isinstance(extra := getattr(route, "openapi_extra", None), _RequestBody)
    }

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, model in body_models.items():
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(model_schema.pop("$defs", {}))
            components[name] = model_schema
        if bearer_protected is not None:
            schemes = schema["components"].setdefault("securitySchemes", {})
            schemes["apiKey"] = {"type": "http", "scheme": "bearer", "description": "one of the --api-key keys"}
            for path, operations in schema.get("paths", {}).items():
                if bearer_protected(path):
                    for operation in operations.values():
                        operation["security"] = [{"apiKey": []}]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
