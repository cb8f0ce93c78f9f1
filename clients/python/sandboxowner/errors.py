"""Typed errors built from the server's error envelope.

Every error the server answers is ``{"error": {"code": ..., "detail": ...}}``
with an HTTP status and an ``X-Request-Id`` header. :func:`error_from_reply`
turns one into the exception of its code's family, so an agent branches on
the class (``except SandboxGone``) rather than on strings, and still has the
exact ``code``, ``detail``, ``status`` and ``request_id`` (the id to look for
in the server's log).
"""

from __future__ import annotations

import json
from typing import Optional


class SandboxOwnerError(Exception):
    """Base of every error this client raises.

    ``status`` is the HTTP status (0 when no reply came), ``code`` and
    ``detail`` the envelope's, ``request_id`` the reply's X-Request-Id (or
    the id this client sent), ``retry_after`` the reply's Retry-After in
    seconds when it carried one.
    """

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        request_id: Optional[str] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        self.status = status
        self.code = code
        self.detail = detail
        self.request_id = request_id
        self.retry_after = retry_after
        msg = f"{status} {code}: {detail}" if status else f"{code}: {detail}"
        if request_id:
            msg += f" (request id {request_id})"
        super().__init__(msg)


class TransportError(SandboxOwnerError):
    """No reply: the connection failed or timed out on this side.

    ``code`` is ``"transport"``; ``status`` is 0. Whether the server ran the
    call is unknown.
    """


class Unauthorized(SandboxOwnerError):
    """401: a missing, forged or expired token (``unauthorized``,
    ``token_expired``). Ask ``/sandbox_access`` for a fresh token."""


class SandboxGone(SandboxOwnerError):
    """410: the sandbox a token names is no longer the session's.

    ``code`` is ``superseded`` (a restore replaced it with a fork: ask
    ``/sandbox_access`` again and go on there) or ``ended`` (its session
    ended: nothing more to do in it). The call did not run.
    """

    @property
    def superseded(self) -> bool:
        return self.code == "superseded"


class NotFound(SandboxOwnerError):
    """404: no such route, sandbox, file or sandbox access (``not_found``,
    ``sandbox_not_found``, ``file_not_found``, ``no_sandbox_access``)."""


class InvalidRequest(SandboxOwnerError):
    """The request itself is wrong and resending it unchanged fails again:
    400, 405, 413 and 422 (``bad_request``, ``invalid_request``,
    ``path_escape``, ``invalid_cwd``, ``is_a_directory``, ``file_too_large``,
    ``body_too_large``, ``method_not_allowed`` …)."""


class Conflict(SandboxOwnerError):
    """409: the session or checkpoint state refuses the call
    (``no_session_sandbox``, ``sandbox_lost``, ``stale_attempt``,
    ``session_closed``, ``session_conflict``, ``admission_closed`` …).
    Never a reward: a verify refused this way graded nothing."""


class Unavailable(SandboxOwnerError):
    """503 (and 429): the server cannot take the call now (``at_capacity``,
    ``overloaded``, ``shutting_down``, ``provider_unavailable``). Retrying
    after ``retry_after`` seconds may succeed; nothing was started."""


class Timeout(SandboxOwnerError):
    """The server gave up waiting: 504 ``timeout`` (a sandbox call took too
    long), 408 ``request_timeout``, 409 ``deadline_exceeded``."""


class ServerError(SandboxOwnerError):
    """500 and other 5xx: a failure on the server's side (``internal_error``,
    ``provider_error``, ``unsupported`` …)."""


# Codes whose family is not their status's.
_BY_CODE = {
    "unauthorized": Unauthorized,
    "token_expired": Unauthorized,
    "superseded": SandboxGone,
    "ended": SandboxGone,
    "timeout": Timeout,
    "request_timeout": Timeout,
    "deadline_exceeded": Timeout,
    "at_capacity": Unavailable,
    "overloaded": Unavailable,
    "shutting_down": Unavailable,
    "provider_unavailable": Unavailable,
    "admission_closed": Conflict,
}

_BY_STATUS = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    405: InvalidRequest,
    408: Timeout,
    409: Conflict,
    410: SandboxGone,
    413: InvalidRequest,
    422: InvalidRequest,
    429: Unavailable,
    503: Unavailable,
    504: Timeout,
}


def error_class(status: int, code: str) -> type:
    """The exception class for a reply's status and code."""
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is not None:
        return cls
    if status >= 500:
        return ServerError
    if 400 <= status < 500:
        return InvalidRequest
    return SandboxOwnerError


def error_from_reply(
    status: int,
    body: bytes,
    request_id: Optional[str] = None,
    retry_after: Optional[str] = None,
) -> SandboxOwnerError:
    """The typed error of a non-2xx reply.

    A body that is not the envelope (a plain-text 429 or 503 from the
    connection limits) keeps its text as the detail, with code ``http_<status>``.
    """
    code, detail = f"http_{status}", body.decode("utf-8", "replace").strip()
    try:
        env = json.loads(body)
    except ValueError:
        env = None
    if isinstance(env, dict) and isinstance(env.get("error"), dict):
        code = str(env["error"].get("code") or code)
        detail = str(env["error"].get("detail") or "")
    after: Optional[float] = None
    if retry_after:
        try:
            after = float(retry_after)
        except ValueError:
            after = None
    return error_class(status, code)(status, code, detail, request_id, after)
