"""OpenAI-style error bodies: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import json
from http import HTTPStatus
from typing import TYPE_CHECKING

from nv_engine.engine.engine_dead_error import EngineDeadError

if TYPE_CHECKING:   # the web stack loads with the app; APIError itself needs none of it
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

# OpenAI's `type` values by HTTP status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error a handler returns to the client as an OpenAI error body."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, err_type: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.err_type = err_type or _ERROR_TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return error_body(self.message, self.err_type, self.param, self.code)


def error_body(message: str, err_type: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    from fastapi.responses import JSONResponse

    return JSONResponse(err.body(), status_code=err.status)


def sse_error(err: APIError) -> str:
    """The error as one server-sent event (for failures after a stream has started)."""
    return f"data: {json.dumps(err.body())}\n\n"


def _validation_param(loc: tuple) -> str | None:
    # loc is e.g. ("body", "temperature") or ("body", "messages", 0, "content")
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) if parts else None


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app returns carries OpenAI's error body."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(EngineDeadError)
    async def _engine_dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(APIError(f"The engine is not running: {exc}", status=503))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            msg = f"Malformed JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}"
            return error_response(APIError(msg, code="invalid_json"))
        param = _validation_param(tuple(first.get("loc", ())))
        msg = "; ".join(
            f"{_validation_param(tuple(e.get('loc', ()))) or 'body'}: {e.get('msg')}" for e in errors
        )
        return error_response(APIError(msg or "Invalid request", param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(exc.status_code).phrase
        except ValueError:
            phrase = "Error"
        detail = exc.detail if isinstance(exc.detail, str) else phrase
        return error_response(APIError(detail, status=exc.status_code))
