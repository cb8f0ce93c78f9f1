package python_test

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/sandboxowner/owner/app"
)

// gymServer is one entry of a Gym configuration: <id>: <type>: <name>: {...}.
type gymEntry struct {
	Host           string `yaml:"host"`
	Port           int    `yaml:"port"`
	ResourceServer *struct {
		Type string `yaml:"type"`
		Name string `yaml:"name"`
	} `yaml:"resources_server"`
}

// The Gym-side example points Gym at the server its neighbour example runs:
// same name, host and port, the agent naming that server, and the control
// token the checkpointing example sets.
func TestGymConfigPointsAtTheExampleServer(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "gym", "notes_sandbox_owner.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var gym map[string]map[string]map[string]gymEntry
	var ck struct {
		Checkpoint struct {
			Enabled          bool   `yaml:"enabled"`
			ControlAuthToken string `yaml:"control_auth_token"`
		} `yaml:"checkpoint"`
	}
	if err := yaml.Unmarshal(raw, &ck); err != nil {
		t.Fatal(err)
	}
	var top map[string]yaml.Node
	if err := yaml.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	gym = map[string]map[string]map[string]gymEntry{}
	for id, node := range top {
		if id == "checkpoint" {
			continue
		}
		var e map[string]map[string]gymEntry
		if err := node.Decode(&e); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		gym[id] = e
	}

	for _, file := range []string{"notes.yaml", "notes-checkpoints.yaml"} {
		opts, err := app.ParseArgs([]string{"-config", filepath.Join("..", "..", "examples", file)}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		cfg := opts.Config
		entry, ok := gym[cfg.Name]["resources_servers"][cfg.Name]
		if !ok {
			t.Fatalf("no Gym entry %s.resources_servers.%s for examples/%s", cfg.Name, cfg.Name, file)
		}
		if diff := cmp.Diff([2]any{cfg.Host, cfg.Port}, [2]any{entry.Host, entry.Port}); diff != "" {
			t.Errorf("host and port of examples/%s against the Gym entry (-server +gym):\n%s", file, diff)
		}
		if cfg.Checkpoint.Enabled && (!ck.Checkpoint.Enabled || ck.Checkpoint.ControlAuthToken != cfg.Checkpoint.ControlAuthToken) {
			t.Errorf("the Gym checkpoint block %+v does not match examples/%s's control token", ck.Checkpoint, file)
		}
	}
	agent := gym["notes_simple_agent"]["responses_api_agents"]["simple_agent"].ResourceServer
	if agent == nil || agent.Type != "resources_servers" || gym[agent.Name]["resources_servers"] == nil {
		t.Errorf("the agent does not name the resources server: %+v", agent)
	}
}
