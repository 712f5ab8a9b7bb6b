"""An OpenAPI 3.1 document for routes that FastAPI does not see.

The store server answers its protocol in a pure ASGI layer in front of FastAPI (for speed; see
``lightning_rl.store.server``), so FastAPI's generated schema would list none of its routes. This
builds the document from the same table the server dispatches on and the pydantic models it parses
bodies with, so the schema cannot drift from what the server accepts. Schema-driven fuzzers
(schemathesis) and client generators read it; servers serve it only when asked to
(``create_store_app(openapi_url=...)``), since a production server need not advertise its API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

__all__ = ["OpenAPIRoute", "build_openapi", "ERROR_SCHEMA"]

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}
"""``{"error": {"type", "message"}}``: every 4xx of the store server."""

OpenAPIRoute = tuple[str, str, type[BaseModel] | None, str]
"""``(path, method, body model or None, summary)``; ``{name}`` segments are string path parameters."""


def build_openapi(title: str, version: str, routes: Sequence[OpenAPIRoute], errors: Sequence[int]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``: request bodies from the models' JSON schemas (in
    validation mode, what the server accepts), a JSON 200, and ``errors`` answered with
    ``ERROR_SCHEMA``."""
    models = sorted({m for _, _, m, _ in routes if m is not None}, key=lambda m: m.__name__)
    refs, defs = models_json_schema([(m, "validation") for m in models], ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = dict(defs.get("$defs", {}))
    schemas["Error"] = ERROR_SCHEMA
    error = {
        "description": "client error",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    paths: dict[str, dict[str, Any]] = {}
    for path, method, model, summary in routes:
        operation: dict[str, Any] = {
            "summary": summary,
            "operationId": f"{method.lower()}{path.replace('/', '_').replace('{', '').replace('}', '')}",
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
                **{str(code): error for code in errors},
            },
        }
        names = [part[1:-1] for part in path.split("/") if part.startswith("{") and part.endswith("}")]
        if names:
            operation["parameters"] = [
                {"name": n, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}} for n in names
            ]
        if model is not None:
            schema = refs[(model, "validation")]
            operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }
