"""A restore supersedes the sandbox: the client asks for the fork once and
goes on there. A stand-in server answers as the real one does (410
superseded before anything runs), since superseding a sandbox takes a
checkpoint and a restore."""

import json
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import sandboxowner as so


class _Handler(BaseHTTPRequestHandler):
    calls = []  # replaced per test

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n))
        self.calls.append((self.path, self.headers.get("Authorization"), body))
        if self.path == "/sandboxes/old/exec":
            out, status = {"error": {"code": "superseded", "detail": "ask /sandbox_access again"}}, 410
        elif self.path == "/sandboxes/gone/exec":
            out, status = {"error": {"code": "ended", "detail": "the session ended"}}, 410
        else:
            out, status = {"stdout": "hi\n", "stderr": "", "exit_code": 0, "truncated": False}, 200
        raw = json.dumps(out).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Request-Id", "fake-" + str(len(self.calls)))
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


class RefreshTest(unittest.TestCase):
    def setUp(self):
        _Handler.calls = []
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.addCleanup(self.srv.server_close)
        self.addCleanup(self.srv.shutdown)
        self.base = "http://127.0.0.1:%d" % self.srv.server_address[1]

    def access(self, sandbox_id, token):
        return so.SandboxAccess.from_json({"connection": {"descriptor": {
            "sandbox_id": sandbox_id, "endpoint": self.base + "/sandboxes/" + sandbox_id, "token": token}},
            "workdir": "/w"})

    def test_superseded_asks_for_the_fork_once_and_runs_there(self):
        refreshed = []

        def refresh():
            refreshed.append(1)
            return self.access("fork", "t-fork")

        sb = so.Sandbox.from_access(self.access("old", "t-old"), refresh=refresh)
        res = sb.exec("echo hi")
        self.assertEqual(res.stdout, "hi\n")
        self.assertEqual(len(refreshed), 1)
        self.assertEqual([(p, a) for p, a, _ in _Handler.calls],
                         [("/sandboxes/old/exec", "Bearer t-old"), ("/sandboxes/fork/exec", "Bearer t-fork")])
        self.assertEqual(sb.sandbox_id, "fork")
        self.assertEqual(res.request_id, "fake-2")

    def test_without_refresh_superseded_is_raised(self):
        sb = so.Sandbox.from_access(self.access("old", "t-old"))
        with self.assertRaises(so.SandboxGone) as cm:
            sb.exec("echo hi")
        self.assertEqual((cm.exception.code, cm.exception.request_id), ("superseded", "fake-1"))

    def test_ended_is_never_retried(self):
        sb = so.Sandbox.from_access(self.access("gone", "t"), refresh=lambda: self.fail("refresh called"))
        with self.assertRaises(so.SandboxGone) as cm:
            sb.exec("echo hi")
        self.assertFalse(cm.exception.superseded)
        self.assertEqual(len(_Handler.calls), 1)

    def test_a_fork_superseded_again_is_raised_not_looped(self):
        sb = so.Sandbox.from_access(self.access("old", "t-old"), refresh=lambda: self.access("old", "t-again"))
        with self.assertRaises(so.SandboxGone):
            sb.exec("echo hi")
        self.assertEqual(len(_Handler.calls), 2)

    def test_no_server_is_a_transport_error(self):
        self.srv.shutdown()
        self.srv.server_close()
        sb = so.Sandbox.from_access(self.access("fork", "t"), timeout=5)
        with self.assertRaises(so.TransportError) as cm:
            sb.exec("echo hi", request_id="mine")
        self.assertEqual((cm.exception.status, cm.exception.request_id), (0, "mine"))


if __name__ == "__main__":
    unittest.main()
