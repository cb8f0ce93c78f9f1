# Validates a verify reply as a Gym agent does, with Gym's verify models
# (nemo_gym/base_resources_server.py and the SWE-bench resources server's
# app.py upstream). openai's response types are not installed here, so
# responses_create_params and response are checked as objects and compared
# to the request's field for field.
#
# stdin: {"model": "base" | "notes" | "swebench", "request": {...}, "reply": {...}}
# exit 0 when the reply validates and echoes every request field; else 1
# with the reason on stderr.
import json
import sys
from typing import Any, Dict, Optional

from pydantic import BaseModel, ValidationError


class BaseRunRequest(BaseModel):
    responses_create_params: Dict[str, Any]


class BaseVerifyRequest(BaseRunRequest):
    response: Dict[str, Any]


class BaseVerifyResponse(BaseVerifyRequest):
    reward: float
    failure_reason: Optional[str] = None


class NotesVerifyRequest(BaseVerifyRequest):
    expected_notes: list[str]


class NotesVerifyResponse(BaseVerifyResponse):
    expected_notes: list[str]
    notes: list[str]


class SWEBenchVerifyResponse(BaseVerifyResponse):
    evaluation_completed: bool
    resolved: bool
    eval_sandbox_start_time_taken: float
    patch_verification_time_taken: float
    instance_id: str
    test_output: str
    model_patch: Optional[str]
    log_dir: str


MODELS = {"base": BaseVerifyResponse, "notes": NotesVerifyResponse, "swebench": SWEBenchVerifyResponse}

# Fields a grader computes even when a request carries them.
GRADED = {"reward", "notes", "instance_id"}


def main() -> int:
    doc = json.load(sys.stdin)
    model = MODELS[doc["model"]]
    request, reply = doc["request"], doc["reply"]
    try:
        parsed = model.model_validate(reply)
    except ValidationError as e:
        print(f"the reply does not validate as {model.__name__}: {e}", file=sys.stderr)
        return 1
    # What the agent goes on with: the validated model's dump.
    dumped = parsed.model_dump()
    for key in ("responses_create_params", "response"):
        if dumped[key] != request[key]:
            print(f"{key} did not come back as sent: {dumped[key]!r}", file=sys.stderr)
            return 1
    for key, value in request.items():
        if key in GRADED:
            continue
        if key not in reply:
            print(f"the request's {key!r} is missing from the reply", file=sys.stderr)
            return 1
        if reply[key] != value:
            print(f"the request's {key!r} came back as {reply[key]!r}, not {value!r}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
