package records

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Retained is what the checkpoints under a directory name.
type Retained struct {
	// Snapshots and Sandboxes are every non-null snapshot_id and
	// sandbox_id found at any depth of any record.
	Snapshots, Sandboxes map[string]bool
	// Participants counts the participant directories read.
	Participants int
}

// RetainedUnder reads every participant's records under root, at any depth,
// of any kind or instance, verified as a restore verifies them, and
// collects the snapshots and sandboxes they name, as Gym's sweep does with
// --retain-from. A participant is a gym/<kind>/<instance> directory with a
// manifest; other files (a controller's own) are ignored. It fails closed:
// root not a directory, or any participant's records unreadable or not
// verifying, is an error.
func RetainedUnder(root string) (Retained, error) {
	out := Retained{Snapshots: map[string]bool{}, Sandboxes: map[string]bool{}}
	st, err := os.Stat(root)
	if err != nil {
		return out, fmt.Errorf("retain-from %s: %w", root, err)
	}
	if !st.IsDir() {
		return out, fmt.Errorf("retain-from %s is not a directory", root)
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || d.Name() != ManifestName {
			return nil
		}
		instanceDir := filepath.Dir(p)
		kindDir := filepath.Dir(instanceDir)
		gymDir := filepath.Dir(kindDir)
		if filepath.Base(gymDir) != "gym" {
			return nil
		}
		part := Participant{Kind: filepath.Base(kindDir), Instance: filepath.Base(instanceDir)}
		_, err = Read(OS{}, filepath.Dir(gymDir), part, func(line []byte) error {
			var v any
			if err := json.Unmarshal(line, &v); err != nil {
				return err
			}
			collectIDs(v, out)
			return nil
		})
		if err != nil {
			return err
		}
		out.Participants++
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("cannot read retained checkpoint state under %s: %w", root, err)
	}
	return out, nil
}

// collectIDs adds every snapshot_id and sandbox_id string in v.
func collectIDs(v any, out Retained) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if s, ok := e.(string); ok && s != "" {
				switch k {
				case "snapshot_id":
					out.Snapshots[s] = true
				case "sandbox_id":
					out.Sandboxes[s] = true
				}
			}
			collectIDs(e, out)
		}
	case []any:
		for _, e := range v {
			collectIDs(e, out)
		}
	}
}
