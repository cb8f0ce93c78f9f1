"""The client against the real server binary: a notes server on loopback
named by SANDBOXOWNER_URL (clients/python's Go test starts one and runs
these). Without it the tests skip."""

import os
import unittest
import uuid

import sandboxowner as so

URL = os.environ.get("SANDBOXOWNER_URL")


@unittest.skipUnless(URL, "SANDBOXOWNER_URL names no running server (go test ./clients/python starts one)")
class ServerTest(unittest.TestCase):
    def setUp(self):
        # A rollout id of its own per test: sessions never meet.
        self.rc = so.ResourcesClient(URL, capture_key="py-" + uuid.uuid4().hex[:12])
        self.rc.seed_session({})
        self.addCleanup(self._close)

    def _close(self):
        try:
            self.rc.close_session()
        except so.SandboxOwnerError:
            pass

    def test_tool_call_then_the_agent_reads_it_in_the_sandbox(self):
        self.assertEqual(self.rc.tool("append_note", {"line": "one"}), {"success": True})
        sb = self.rc.sandbox()
        res = sb.exec("cat notes.txt")
        self.assertEqual((res.stdout, res.exit_code, res.ok), ("one\n", 0, True))
        self.assertTrue(res.request_id)

    def test_exec_with_cwd_env_and_a_failing_exit(self):
        sb = self.rc.sandbox()
        sb.exec("mkdir -p sub")
        res = sb.exec('pwd; echo "$GREETING" >&2; exit 3', cwd="sub", env={"GREETING": "hello"})
        self.assertTrue(res.stdout.rstrip().endswith("/sub"), res.stdout)
        self.assertEqual((res.stderr, res.exit_code, res.ok), ("hello\n", 3, False))

    def test_write_then_read_a_file(self):
        sb = self.rc.sandbox()
        data = bytes(range(256))
        self.assertEqual(sb.write_file("blob.bin", data), 256)
        self.assertEqual(sb.read_file("blob.bin"), data)
        sb.write_file("notes.txt", "one\ntwo\n")
        self.assertEqual(sb.read_text("notes.txt"), "one\ntwo\n")
        # What the agent wrote is what the grader reads.
        reply = self.rc.verify({"expected_notes": ["one", "two"]})
        self.assertEqual(reply["reward"], 1)

    def test_errors_are_typed_and_carry_the_request_id(self):
        sb = self.rc.sandbox()
        with self.assertRaises(so.NotFound) as cm:
            sb.read_file("missing.txt", request_id="py-missing-1")
        e = cm.exception
        self.assertEqual((e.status, e.code, e.request_id), (404, "file_not_found", "py-missing-1"))
        with self.assertRaises(so.InvalidRequest) as cm:
            sb.read_file("../../etc/passwd")
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "path_escape"))
        self.assertTrue(cm.exception.request_id, "a request id the server made")
        with self.assertRaises(so.InvalidRequest) as cm:
            sb.exec("true", cwd="no/such/dir")
        self.assertEqual(cm.exception.code, "invalid_cwd")

    def test_a_forged_token_is_unauthorized(self):
        sb = self.rc.sandbox()
        forged = so.Sandbox(sb.endpoint, sb.token[:-2] + ("AA" if not sb.token.endswith("AA") else "BB"))
        with self.assertRaises(so.Unauthorized) as cm:
            forged.exec("true")
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))

    def test_a_closed_session_s_sandbox_is_gone(self):
        sb = self.rc.sandbox()
        self.rc.close_session()
        with self.assertRaises(so.SandboxGone) as cm:
            sb.exec("true")
        self.assertEqual(cm.exception.code, "ended")
        self.assertFalse(cm.exception.superseded)
        with self.assertRaises(so.NotFound) as cm:
            self.rc.sandbox_access()
        self.assertEqual(cm.exception.code, "no_sandbox_access")

    def test_verify_without_a_session_is_a_conflict_never_a_reward(self):
        other = so.ResourcesClient(URL, capture_key="py-" + uuid.uuid4().hex[:12])
        with self.assertRaises(so.Conflict) as cm:
            other.verify({"expected_notes": []})
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "no_session_sandbox"))

    def test_a_bad_capture_key_is_an_invalid_request(self):
        bad = so.ResourcesClient(URL, capture_key="r1-a0")  # attempt 0 has no suffix
        with self.assertRaises(so.InvalidRequest) as cm:
            bad.seed_session({})
        self.assertEqual(cm.exception.code, "invalid_capture_key")


if __name__ == "__main__":
    unittest.main()
