"""The error envelope to typed exceptions, without a server."""

import unittest

import sandboxowner as so


class ErrorClassTest(unittest.TestCase):
    def test_every_documented_code_has_its_family(self):
        # (status, code) pairs the server answers, as its error table lists them.
        cases = [
            (401, "unauthorized", so.Unauthorized),
            (401, "token_expired", so.Unauthorized),
            (410, "superseded", so.SandboxGone),
            (410, "ended", so.SandboxGone),
            (404, "not_found", so.NotFound),
            (404, "sandbox_not_found", so.NotFound),
            (404, "file_not_found", so.NotFound),
            (404, "no_sandbox_access", so.NotFound),
            (400, "bad_request", so.InvalidRequest),
            (400, "path_escape", so.InvalidRequest),
            (400, "invalid_capture_key", so.InvalidRequest),
            (400, "name_too_long", so.InvalidRequest),
            (405, "method_not_allowed", so.InvalidRequest),
            (413, "body_too_large", so.InvalidRequest),
            (413, "file_too_large", so.InvalidRequest),
            (422, "invalid_request", so.InvalidRequest),
            (422, "invalid_cwd", so.InvalidRequest),
            (422, "is_a_directory", so.InvalidRequest),
            (409, "no_session_sandbox", so.Conflict),
            (409, "sandbox_lost", so.Conflict),
            (409, "stale_attempt", so.Conflict),
            (409, "admission_closed", so.Conflict),
            (409, "session_conflict", so.Conflict),
            (409, "deadline_exceeded", so.Timeout),
            (408, "request_timeout", so.Timeout),
            (504, "timeout", so.Timeout),
            (503, "at_capacity", so.Unavailable),
            (503, "overloaded", so.Unavailable),
            (503, "shutting_down", so.Unavailable),
            (503, "provider_unavailable", so.Unavailable),
            (429, "http_429", so.Unavailable),
            (500, "internal_error", so.ServerError),
            (500, "provider_error", so.ServerError),
            (501, "unsupported", so.ServerError),
            (418, "teapot", so.InvalidRequest),
        ]
        for status, code, want in cases:
            with self.subTest(status=status, code=code):
                self.assertIs(so.error_class(status, code), want)

    def test_every_family_is_a_sandbox_owner_error(self):
        for cls in (so.Unauthorized, so.SandboxGone, so.NotFound, so.InvalidRequest, so.Conflict,
                    so.Unavailable, so.Timeout, so.ServerError, so.TransportError):
            self.assertTrue(issubclass(cls, so.SandboxOwnerError), cls)


class ErrorFromReplyTest(unittest.TestCase):
    def test_envelope(self):
        e = so.error_from_reply(410, b'{"error":{"code":"superseded","detail":"ask again"}}', "rid-1")
        self.assertIsInstance(e, so.SandboxGone)
        self.assertEqual((e.status, e.code, e.detail, e.request_id), (410, "superseded", "ask again", "rid-1"))
        self.assertTrue(e.superseded)
        self.assertIn("rid-1", str(e))

    def test_retry_after(self):
        e = so.error_from_reply(503, b'{"error":{"code":"at_capacity","detail":"full"}}', None, "30")
        self.assertIsInstance(e, so.Unavailable)
        self.assertEqual(e.retry_after, 30.0)
        self.assertIsNone(so.error_from_reply(503, b"{}", None, "soon").retry_after)

    def test_a_body_that_is_not_the_envelope_keeps_its_text(self):
        e = so.error_from_reply(429, b"Too many connections\n")
        self.assertIsInstance(e, so.Unavailable)
        self.assertEqual((e.code, e.detail), ("http_429", "Too many connections"))


class SandboxAccessTest(unittest.TestCase):
    def test_from_json(self):
        a = so.SandboxAccess.from_json({
            "connection": {"kind": "direct", "provider_config_ref": "sandbox", "descriptor": {
                "sandbox_id": "sb-1", "workdir": None, "endpoint": "http://h:1/sandboxes/sb-1",
                "token": "v1.x", "token_expires_at": "2026-01-01T00:00:00Z"}},
            "workdir": "/w",
        })
        self.assertEqual((a.sandbox_id, a.endpoint, a.token, a.workdir, a.provider_config_ref),
                         ("sb-1", "http://h:1/sandboxes/sb-1", "v1.x", "/w", "sandbox"))
        self.assertEqual(so.Sandbox.from_access(a).sandbox_id, "sb-1")

    def test_a_descriptor_without_a_token_is_refused(self):
        with self.assertRaises(ValueError):
            so.SandboxAccess.from_json({"connection": {"descriptor": {"sandbox_id": "sb-1"}}, "workdir": "/w"})


if __name__ == "__main__":
    unittest.main()
