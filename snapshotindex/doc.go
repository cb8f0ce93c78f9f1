// Package snapshotindex is the Badger index of committed checkpoints and the
// provider snapshots they name.
package snapshotindex

import _ "github.com/dgraph-io/badger/v4"
