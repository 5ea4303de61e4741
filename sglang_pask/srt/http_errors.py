"""Bodies FastAPI cannot parse or validate are answered with what is wrong, not where the server's code is.

SGLang 0.5.23's handler of ``RequestValidationError`` (every route but ``/v1/messages`` and
``/v1/systemone``, which already answer without internals) puts ``str(exc)`` in the HTTP 400 body, and
that names the server's source file and line (``File ".../http_server.py", line 928, in
generate_request``). :func:`install_validation_handler`, an AFTER hook of ``http_server.
set_global_state`` (called in the HTTP server's process before it serves), puts
:func:`answer_invalid_body` in that handler's place on SGLang's app: the same status and response
shapes, with the message of :func:`sglang_pask.api.error_text.validation_message`.
"""

from __future__ import annotations

from typing import Any, Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import ORJSONResponse, Response
from sglang.srt.entrypoints.openai.protocol import ErrorResponse

from sglang_pask.api.error_text import validation_message

# Routes whose SGLang handler already answers without internals, in shapes of their own APIs.
_OWN_SHAPE_PREFIXES = ("/v1/messages", "/v1/systemone")
_BAD_REQUEST = 400


def install_validation_handler(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook of ``sglang.srt.entrypoints.http_server.set_global_state``: SGLang's app answers
    invalid bodies with :func:`answer_invalid_body` (idempotent)."""
    from sglang.srt.entrypoints.http_server import app

    handlers = app.exception_handlers
    stock = handlers.get(RequestValidationError)
    if stock is not None and getattr(stock, "sglang_pask_stock", None) is None:
        handlers[RequestValidationError] = _answer_with(stock)
    return result


def _answer_with(stock: Callable[[Request, RequestValidationError], Any]) -> Callable[..., Any]:
    async def handler(request: Request, exc: RequestValidationError) -> Response:
        return await answer_invalid_body(request, exc, stock)

    handler.sglang_pask_stock = stock  # type: ignore[attr-defined]
    return handler


async def answer_invalid_body(
    request: Request, exc: RequestValidationError, stock: Callable[[Request, RequestValidationError], Any]
) -> Response:
    """HTTP 400 naming each problem of the body; the routes in :data:`_OWN_SHAPE_PREFIXES` keep
    SGLang's own answer (``stock``)."""
    path = request.url.path.removeprefix(request.scope.get("root_path", ""))
    if path.startswith(_OWN_SHAPE_PREFIXES):
        return await stock(request, exc)
    message = validation_message(exc.errors())
    if path.startswith("/v1/responses"):
        nested = {"message": message, "type": "Bad Request", "param": None, "code": _BAD_REQUEST}
        return ORJSONResponse(status_code=_BAD_REQUEST, content={"error": nested})
    error = ErrorResponse(message=message, type="Bad Request", code=_BAD_REQUEST)
    return ORJSONResponse(status_code=_BAD_REQUEST, content=error.model_dump())
