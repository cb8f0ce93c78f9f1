"""Clients of a sandbox owner server: the resources server's routes and the
sandbox API an agent works through.

Standard library only (urllib), Python 3.9 or later.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from .errors import SandboxGone, SandboxOwnerError, TransportError, error_from_reply

HEADER_REQUEST_ID = "X-Request-Id"

# Added to a command's own timeout for the HTTP call that carries it: the
# server answers a timed-out command itself, a little after the timeout.
_EXEC_GRACE_S = 30.0


@dataclass(frozen=True)
class Reply:
    """One HTTP answer: status, headers (lower-cased names) and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    set_cookies: Tuple[str, ...] = ()

    @property
    def request_id(self) -> Optional[str]:
        return self.headers.get(HEADER_REQUEST_ID.lower())

    def json(self) -> Any:
        return json.loads(self.body)


def _send(
    method: str,
    url: str,
    body: Optional[bytes],
    headers: Mapping[str, str],
    timeout: float,
) -> Reply:
    """Sends one request; a non-2xx reply raises its typed error."""
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return _reply(resp.status, resp.headers, resp.read())
    except urllib.error.HTTPError as e:
        r = _reply(e.code, e.headers, e.read())
        raise error_from_reply(
            r.status,
            r.body,
            r.request_id or headers.get(HEADER_REQUEST_ID),
            r.headers.get("retry-after"),
        ) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TransportError(0, "transport", f"{method} {url}: {reason}", headers.get(HEADER_REQUEST_ID)) from e


def _reply(status: int, msg: Any, body: bytes) -> Reply:
    hdrs = {k.lower(): v for k, v in msg.items()} if msg is not None else {}
    cookies = tuple(msg.get_all("Set-Cookie") or ()) if msg is not None else ()
    return Reply(status, hdrs, body, cookies)


def _json_body(body: Any) -> Optional[bytes]:
    if body is None:
        return None
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    return json.dumps(body).encode()


@dataclass(frozen=True)
class SandboxAccess:
    """What ``/sandbox_access`` answers: where the session's sandbox is and
    the token that opens it.

    ``endpoint`` is ``http://<host>:<port>/sandboxes/<sandbox_id>``; the
    token names that one sandbox and expires at ``token_expires_at``.
    ``workdir`` is the agent's checkout inside the sandbox; ``raw`` is the
    whole reply (Gym's SandboxAccess JSON).
    """

    sandbox_id: str
    endpoint: str
    token: str
    token_expires_at: Optional[str]
    workdir: Optional[str]
    provider_config_ref: Optional[str]
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, access: Mapping[str, Any]) -> "SandboxAccess":
        conn = access.get("connection") or {}
        desc = conn.get("descriptor") or {}
        if not desc.get("endpoint") or not desc.get("token"):
            raise ValueError("the sandbox access names no endpoint and token: the server lends no sandbox API")
        return cls(
            sandbox_id=str(desc.get("sandbox_id") or ""),
            endpoint=str(desc["endpoint"]),
            token=str(desc["token"]),
            token_expires_at=desc.get("token_expires_at"),
            workdir=access.get("workdir"),
            provider_config_ref=conn.get("provider_config_ref"),
            raw=access,
        )


@dataclass(frozen=True)
class ExecResult:
    """A command's outcome. ``truncated`` says the output was cut at the
    server's cap; ``timed_out`` that the command ran past its timeout and
    was killed (``exit_code`` is then the kill's)."""

    stdout: str
    stderr: str
    exit_code: int
    truncated: bool = False
    timed_out: bool = False
    request_id: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Sandbox:
    """The sandbox API for one sandbox, as an agent holding its descriptor
    uses it: exec, read_file, write_file.

    ``refresh``, when given, is called on 410 ``superseded`` (a restore
    moved the session to a fork) for a fresh :class:`SandboxAccess`; the
    call is then sent once more to the fork. The 410 comes before anything
    runs, so the retry never runs a command twice.
    """

    def __init__(
        self,
        endpoint: str,
        token: str,
        *,
        timeout: float = 60.0,
        refresh: Optional[Callable[[], SandboxAccess]] = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.refresh = refresh

    @classmethod
    def from_access(
        cls,
        access: Union[SandboxAccess, Mapping[str, Any]],
        *,
        timeout: float = 60.0,
        refresh: Optional[Callable[[], SandboxAccess]] = None,
    ) -> "Sandbox":
        if not isinstance(access, SandboxAccess):
            access = SandboxAccess.from_json(access)
        return cls(access.endpoint, access.token, timeout=timeout, refresh=refresh)

    @property
    def sandbox_id(self) -> str:
        return self.endpoint.rsplit("/", 1)[-1]

    def exec(
        self,
        command: str,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout_ms: Optional[int] = None,
        request_id: Optional[str] = None,
    ) -> ExecResult:
        """Runs ``command`` with ``sh -c`` in the sandbox (cwd relative to
        its workdir, or absolute under it). A non-zero exit is a result,
        not an error."""
        req: Dict[str, Any] = {"command": command}
        if cwd is not None:
            req["cwd"] = cwd
        if env:
            req["env"] = dict(env)
        if timeout_ms is not None:
            req["timeout_ms"] = int(timeout_ms)
        http_timeout = self.timeout + (timeout_ms or 0) / 1000.0 + _EXEC_GRACE_S
        r = self._call("POST", "/exec", _json_body(req), "application/json", http_timeout, request_id)
        out = r.json()
        return ExecResult(
            stdout=out.get("stdout", ""),
            stderr=out.get("stderr", ""),
            exit_code=int(out.get("exit_code", -1)),
            truncated=bool(out.get("truncated", False)),
            timed_out=bool(out.get("timed_out", False)),
            request_id=r.request_id,
        )

    def read_file(self, path: str, *, request_id: Optional[str] = None) -> bytes:
        """The file's bytes."""
        q = "?" + urllib.parse.urlencode({"path": path})
        return self._call("GET", "/files" + q, None, None, self.timeout, request_id).body

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read_file(path).decode(encoding)

    def write_file(
        self, path: str, data: Union[bytes, str], *, request_id: Optional[str] = None
    ) -> int:
        """Writes (creates or replaces) the file; returns its size."""
        if isinstance(data, str):
            data = data.encode()
        q = "?" + urllib.parse.urlencode({"path": path})
        r = self._call("PUT", "/files" + q, bytes(data), "application/octet-stream", self.timeout, request_id)
        return int(r.json().get("size", len(data)))

    def _call(
        self,
        method: str,
        tail: str,
        body: Optional[bytes],
        content_type: Optional[str],
        timeout: float,
        request_id: Optional[str],
    ) -> Reply:
        for attempt in (0, 1):
            headers = {"Authorization": "Bearer " + self.token}
            if content_type:
                headers["Content-Type"] = content_type
            if request_id:
                headers[HEADER_REQUEST_ID] = request_id
            try:
                return _send(method, self.endpoint + tail, body, headers, timeout)
            except SandboxGone as e:
                if attempt or not e.superseded or self.refresh is None:
                    raise
                fresh = self.refresh()
                self.endpoint, self.token = fresh.endpoint.rstrip("/"), fresh.token
        raise AssertionError("unreachable")


class ResourcesClient:
    """A resources server's data routes for one session, as Gym calls them:
    seed, tools, verify, close, and ``/sandbox_access``.

    The session is the server's signed cookie, kept here between calls.
    ``capture_key`` (``<rollout_id>`` for attempt 0, ``<rollout_id>-a<N>``
    for attempt N) sends every call under ``/ng-rollout/<capture_key>/``,
    which is how the server's checkpoints know the episode a session runs.
    """

    def __init__(
        self,
        base_url: str,
        *,
        capture_key: Optional[str] = None,
        timeout: float = 60.0,
        cookies: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.capture_key = capture_key
        self.timeout = timeout
        self.cookies: Dict[str, str] = dict(cookies or {})

    def post(
        self, route: str, body: Any = None, *, request_id: Optional[str] = None, timeout: Optional[float] = None
    ) -> Any:
        """POSTs a JSON body to ``route`` (``"append_note"``, ``"verify"``
        …) under the capture key, and returns the decoded reply."""
        path = "/" + route.lstrip("/")
        if self.capture_key:
            path = "/ng-rollout/" + urllib.parse.quote(self.capture_key, safe="") + path
        headers = {"Content-Type": "application/json"}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if request_id:
            headers[HEADER_REQUEST_ID] = request_id
        data = _json_body(body)
        if data is None:
            data = b""
        r = _send("POST", self.base_url + path, data, headers, timeout or self.timeout)
        self._keep_cookies(r.set_cookies)
        return r.json() if r.body.strip() else None

    def seed_session(self, row: Any = None) -> Any:
        return self.post("seed_session", {} if row is None else row)

    def tool(self, name: str, args: Any = None) -> Any:
        """Calls the server's tool route ``/<name>``."""
        return self.post(name, {} if args is None else args)

    def verify(self, body: Any) -> Any:
        return self.post("verify", body)

    def close_session(self) -> Any:
        return self.post("close_session")

    def sandbox_access(self) -> SandboxAccess:
        """The session's current sandbox (after a restore, the fork)."""
        return SandboxAccess.from_json(self.post("sandbox_access"))

    def sandbox(self, *, timeout: float = 60.0) -> Sandbox:
        """A :class:`Sandbox` for the session's sandbox that follows it to
        its fork when a restore supersedes it."""
        return Sandbox.from_access(self.sandbox_access(), timeout=timeout, refresh=self.sandbox_access)

    def _keep_cookies(self, set_cookies: Tuple[str, ...]) -> None:
        for line in set_cookies:
            c: SimpleCookie = SimpleCookie()
            try:
                c.load(line)
            except Exception:  # a cookie this client cannot parse is not its session
                continue
            for name, morsel in c.items():
                max_age = morsel["max-age"]
                if morsel.value == "" or (max_age and max_age.lstrip("-").isdigit() and int(max_age) <= 0):
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value


__all__ = [
    "ExecResult",
    "Reply",
    "ResourcesClient",
    "Sandbox",
    "SandboxAccess",
    "SandboxOwnerError",
]
