"""An agent's tool calls reaching the server through the client.

A Gym agent's model answers with tool calls; the agent runs each and sends
the result back to the model. Here the tools are the sandbox API's (a shell
command, a file read and write) and the resources server's own
(append_note), and the model's answers are scripted. Against a notes server:

    go run ./cmd/server &            # a notes server on 127.0.0.1:8080
    PYTHONPATH=clients/python python3 clients/python/examples/agent_tool_call.py http://127.0.0.1:8080

It prints each tool call with its result, then the episode's reward.
"""

import json
import sys
import uuid

import sandboxowner as so

# The tools as the model sees them (OpenAI-style function schemas).
TOOLS = [
    {"type": "function", "name": "run_command",
     "description": "Run a shell command in your sandbox's working directory.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"type": "function", "name": "read_file",
     "description": "Read a file in your sandbox.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"type": "function", "name": "write_file",
     "description": "Write a file in your sandbox.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"]}},
    {"type": "function", "name": "append_note",
     "description": "Append a line to your notes.",
     "parameters": {"type": "object", "properties": {"line": {"type": "string"}}, "required": ["line"]}},
]


def run_tool(rc: so.ResourcesClient, sandbox: so.Sandbox, name: str, arguments: str) -> str:
    """Runs one tool call and returns what goes back to the model. A
    refusal is the model's to see and recover from; only a sandbox that
    is gone for good ends the episode."""
    args = json.loads(arguments)
    try:
        if name == "run_command":
            res = sandbox.exec(args["command"], timeout_ms=60_000)
            return json.dumps({"exit_code": res.exit_code, "stdout": res.stdout, "stderr": res.stderr,
                               "timed_out": res.timed_out})
        if name == "read_file":
            return json.dumps({"content": sandbox.read_text(args["path"])})
        if name == "write_file":
            return json.dumps({"size": sandbox.write_file(args["path"], args["content"])})
        return json.dumps(rc.tool(name, args))
    except (so.InvalidRequest, so.NotFound, so.Conflict) as e:
        return json.dumps({"error": e.code, "detail": e.detail})


def main(base_url: str) -> int:
    # The capture key puts the episode's calls under /ng-rollout/<key>/, so
    # a checkpoint knows which episode the session runs.
    # The "x" keeps the random part from reading as an attempt suffix
    # ("-a0576499" would be attempt 0576499, refused as not canonical).
    rc = so.ResourcesClient(base_url, capture_key="example-x" + uuid.uuid4().hex[:8])
    rc.seed_session({})
    sandbox = rc.sandbox()  # follows the session to its fork after a restore

    # What a model might answer, turn by turn.
    calls = [
        ("append_note", {"line": "one"}),
        ("run_command", {"command": "cat notes.txt && ls -a"}),
        ("write_file", {"path": "scratch.txt", "content": "draft\n"}),
        ("read_file", {"path": "no-such-file"}),
        ("append_note", {"line": "two"}),
    ]
    for name, args in calls:
        out = run_tool(rc, sandbox, name, json.dumps(args))
        print(f"{name}({json.dumps(args)}) -> {out}")

    reply = rc.verify({"expected_notes": ["one", "two"]})
    print("reward", reply["reward"])
    return 0 if reply["reward"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080"))
