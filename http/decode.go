package http

import (
	"bytes"
	"encoding/json"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/internal/jsonr"
	"github.com/sandboxowner/owner/resources"
)

// The session routes' bodies are read by hand when they are simple (the
// common case: no escapes, no repeated or case-folded keys) and by
// encoding/json otherwise, so that a body the reader declines gets exactly
// encoding/json's result and error. fast false skips the reader.

// decodeTypedSeed returns the typed seed body holds, decoded strictly, or
// nil for a legacy body (one without resources_session_id).
func decodeTypedSeed(body []byte, fast bool) (*typedSeed, error) {
	if fast && json.Valid(body) {
		if t, ok := readTypedSeed(body); ok {
			return t, nil
		}
	}
	var probe map[string]json.RawMessage
	if json.Unmarshal(body, &probe) != nil {
		return nil, nil // not an object: the resources server judges it
	}
	if _, ok := probe["resources_session_id"]; !ok {
		return nil, nil
	}
	var t typedSeed
	if err := resources.DecodeStrict(body, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// readTypedSeed reads a valid body as decodeTypedSeed does, when it can.
func readTypedSeed(body []byte) (*typedSeed, bool) {
	typed := false
	if !jsonr.Members(body, func(key, _ []byte) bool {
		typed = typed || string(key) == "resources_session_id"
		return true
	}) {
		return nil, false
	}
	if !typed {
		return nil, true
	}
	var t typedSeed
	ok := jsonr.Object(body, true, []string{"resources_session_id", "episode_id", "task_id", "task_data"}, func(i int, value []byte) bool {
		switch i {
		case 0:
			s, ok := jsonr.String(value)
			t.ResourcesSessionID = string(s)
			return ok
		case 1:
			t.EpisodeID = value
		case 2:
			t.TaskID = new(TaskID)
			return readTaskID(value, t.TaskID)
		case 3:
			t.TaskData = value
		}
		return true
	})
	if !ok {
		return nil, false
	}
	return &t, true
}

// readTaskID reads a task_id object strictly.
func readTaskID(value []byte, id *TaskID) bool {
	return jsonr.Object(value, true, []string{"taskset", "task_id"}, func(i int, value []byte) bool {
		s, ok := jsonr.String(value)
		if i == 0 {
			id.Taskset = string(s)
		} else {
			id.TaskID = string(s)
		}
		return ok
	})
}

// readEpisode reads a valid EpisodeId object as json.Unmarshal does
// (unknown fields ignored), when it can.
func readEpisode(raw []byte) (control.EpisodeID, bool) {
	var e control.EpisodeID
	ok := jsonr.Object(raw, false, []string{"rollout_id", "attempt"}, func(i int, value []byte) bool {
		if i == 1 {
			var ok bool
			e.Attempt, ok = jsonr.Int(value)
			return ok
		}
		s, ok := jsonr.String(value)
		e.RolloutID = string(s)
		return ok
	})
	return e, ok
}

// decodeClose decodes a /close_session body as resources.DecodeData does.
func decodeClose(body []byte, fast bool) (closeRequest, error) {
	body = bytes.TrimSpace(body)
	if fast && len(body) == 0 {
		return closeRequest{}, nil // DecodeData reads an empty body as {}
	}
	if fast && json.Valid(body) {
		if req, ok := readClose(body); ok {
			return req, nil
		}
	}
	var req closeRequest
	err := resources.DecodeData(body, &req)
	return req, err
}

// readClose reads a valid close body as json.Unmarshal does (unknown
// fields ignored), when it can.
func readClose(body []byte) (closeRequest, bool) {
	var req closeRequest
	ok := jsonr.Object(body, false, []string{"resources_session_id", "episode_id"}, func(i int, value []byte) bool {
		if i == 1 {
			req.EpisodeID = value
			return true
		}
		if string(value) == "null" {
			return true
		}
		s, ok := jsonr.String(value)
		id := string(s)
		req.ResourcesSessionID = &id
		return ok
	})
	return req, ok
}
