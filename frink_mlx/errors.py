"""One error tree for the whole daemon, free of HTTP.

Every failure a client can cause or observe is a `FrinkError` carrying the HTTP
status it maps to, a stable machine `code`, the request field it concerns
(`param`) and, for temporary shortages, `retry_after_s`. Adapters render these
into their protocol's envelope; nothing below the adapters knows about HTTP.
Start-up failures (bad `models.toml`, broken GGUF) are `ConfigError`s, which the
CLI prints as one line and exits non-zero.

    FrinkError (500 internal_error)
    ├── InvalidRequest (400 invalid_request_error)    a field is wrong; `param` names it
    │   ├── ContextLengthExceeded (400 context_length_exceeded)
    │   ├── ModelNotGenerative (400 model_not_generative)  an encoder on a generating route
    │   └── UnsupportedField (400 unsupported_field)  refused by name, never ignored
    ├── AuthenticationFailed (401 authentication_error)
    ├── PermissionDenied (403 permission_error)
    ├── NotFound (404 not_found_error)
    │   ├── ModelNotFound (404 model_not_found)
    │   └── ModelUnavailable (404 model_unavailable)  in the registry, its files are not
    ├── Conflict (409 conflict)
    ├── MisdirectedRequest (421 misdirected_request)
    ├── PayloadTooLarge (413 request_too_large)
    ├── RequestTimeout (408 request_timeout)      the client stalled sending its body
    ├── NotSupported (501 not_implemented)
    ├── Unavailable (503 unavailable; retry_after_s)
    │   ├── NoModelLoaded (503 model_not_loaded)
    │   └── Overloaded (503 overloaded)
    ├── InsufficientMemory (507 model_too_large)  the model cannot fit even alone
    ├── EngineFailure (500 engine_error)
    └── ConfigError (start-up; never reaches a client)
        ├── RegistryError
        └── ModelFormatError  (GGUF / checkpoint refused by name)

Expected shortages inside the engine (no free KV block) are values (`None`),
not exceptions; they become `Overloaded` only at the edge.
"""

from __future__ import annotations


class FrinkError(Exception):
    status: int = 500
    code: str = "internal_error"
    type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after_s = retry_after_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, param={self.param!r})"


class InvalidRequest(FrinkError):
    status = 400
    code = "invalid_request_error"
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"

    def __init__(self, num_tokens: int, limit: int, *, param: str | None = "messages",
                 at_least: bool = False) -> None:
        super().__init__(
            f"This request needs {'at least ' if at_least else ''}{num_tokens} tokens but the "
            f"model's context ceiling is {limit} tokens.",
            param=param,
        )
        self.num_tokens = num_tokens
        self.limit = limit


class ModelNotGenerative(InvalidRequest):
    """The one refusal of an encoder-only model on a generating route (serving/handles.py
    rule 1), naming the model, its kind and the route it does serve."""

    code = "model_not_generative"

    def __init__(self, name: str, kind: str) -> None:
        super().__init__(f"The model '{name}' is an embedding model (kind = \"{kind}\") and "
                         "cannot generate text; use /v1/embeddings with it.", param="model")


class UnsupportedField(InvalidRequest):
    code = "unsupported_field"

    def __init__(self, param: str, why: str = "is not supported by this server") -> None:
        super().__init__(f"'{param}' {why}.", param=param)


class AuthenticationFailed(FrinkError):
    status = 401
    code = "invalid_api_key"
    type = "authentication_error"


class PermissionDenied(FrinkError):
    status = 403
    code = "forbidden"
    type = "permission_error"


class NotFound(FrinkError):
    status = 404
    code = "not_found"
    type = "not_found_error"


class ModelNotFound(NotFound):
    code = "model_not_found"

    def __init__(self, name: str, *, param: str | None = "model") -> None:
        super().__init__(f"The model '{name}' is not in the registry.", param=param)
        self.name = name


class ModelUnavailable(NotFound):
    """A registry entry whose source is missing here (registry.source_problem)."""

    code = "model_unavailable"

    def __init__(self, name: str, reason: str, *, param: str | None = "model") -> None:
        super().__init__(f"The model '{name}' is unavailable: {reason}.", param=param)
        self.name, self.reason = name, reason


class Conflict(FrinkError):
    status = 409
    code = "conflict"
    type = "invalid_request_error"


class PayloadTooLarge(FrinkError):
    status = 413
    code = "request_too_large"
    type = "request_too_large"


class RequestTimeout(FrinkError):
    status = 408
    code = "request_timeout"
    type = "invalid_request_error"


class MisdirectedRequest(FrinkError):
    status = 421
    code = "misdirected_request"
    type = "permission_error"


class NotSupported(FrinkError):
    status = 501
    code = "not_implemented"
    type = "not_implemented_error"


class Unavailable(FrinkError):
    status = 503
    code = "unavailable"
    type = "overloaded_error"

    def __init__(self, message: str, *, retry_after_s: float = 1.0, **kw: object) -> None:
        super().__init__(message, retry_after_s=retry_after_s, **kw)  # type: ignore[arg-type]


class NoModelLoaded(Unavailable):
    code = "model_not_loaded"


class Overloaded(Unavailable):
    code = "overloaded"


class InsufficientMemory(FrinkError):
    """A model whose weights and smallest KV pool exceed the whole memory budget: no
    eviction can help, so retrying is pointless (hence 507, not 503; the message
    carries the numbers). serving/residency.py rule 4."""

    status = 507
    code = "model_too_large"
    type = "server_error"


class EngineFailure(FrinkError):
    status = 500
    code = "engine_error"


class ConfigError(FrinkError):
    """A start-up problem: printed as one line by the CLI, exit code non-zero."""

    code = "config_error"


class RegistryError(ConfigError):
    code = "registry_error"


class ModelFormatError(ConfigError):
    code = "model_format_error"
