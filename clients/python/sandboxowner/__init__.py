"""A Python client of the sandbox owner server (standard library only,
Python 3.9 or later).

:class:`ResourcesClient` calls a resources server's routes for one session
(seed, tools, verify, ``/sandbox_access``); :class:`Sandbox` is the sandbox
API an agent holding a sandbox's descriptor works through (exec, file read
and write). Every error reply raises a :class:`SandboxOwnerError` subclass
named for its code's family.
"""

from .client import HEADER_REQUEST_ID, ExecResult, Reply, ResourcesClient, Sandbox, SandboxAccess
from .errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    SandboxGone,
    SandboxOwnerError,
    ServerError,
    Timeout,
    TransportError,
    Unauthorized,
    Unavailable,
    error_class,
    error_from_reply,
)

__all__ = [
    "HEADER_REQUEST_ID",
    "Conflict",
    "ExecResult",
    "InvalidRequest",
    "NotFound",
    "Reply",
    "ResourcesClient",
    "Sandbox",
    "SandboxAccess",
    "SandboxGone",
    "SandboxOwnerError",
    "ServerError",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "error_class",
    "error_from_reply",
]
