// Package logs is the logger policy: one logrus logger is injected
// everywhere; a component given none logs nowhere (Discard), and log lines
// name what they concern with the keys below.
package logs

import (
	"io"

	"github.com/sirupsen/logrus"
)

// Field keys every component uses for the things it logs about.
const (
	SessionID    = "session_id"
	SandboxID    = "sandbox_id"
	CheckpointID = "checkpoint_id"
)

// Discard is the default of a component given no logger.
func Discard() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// Or returns l, or Discard when l is nil.
func Or(l logrus.FieldLogger) logrus.FieldLogger {
	if l == nil {
		return Discard()
	}
	return l
}
