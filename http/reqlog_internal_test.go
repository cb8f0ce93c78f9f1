package http

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

// TestRequestLoggerMethods: every method of a request's logger writes
// through one entry with the request's fields, at its own level, as the
// entry itself would (Fatal's exit and Panic's panic included).
func TestRequestLoggerMethods(t *testing.T) {
	base, hook := test.NewNullLogger()
	base.SetLevel(logrus.DebugLevel)
	exits := 0
	base.ExitFunc = func(int) { exits++ }
	l := &requestLogger{base: base.WithField("server", "s"), session: "sess", request: "req"}
	panics := func(f func()) (p bool) {
		defer func() { p = recover() != nil }()
		f()
		return false
	}
	calls := []struct {
		name string
		call func()
	}{
		{"Print", func() { l.Print("m") }}, {"Printf", func() { l.Printf("%s", "m") }}, {"Println", func() { l.Println("m") }},
		{"Debug", func() { l.Debug("m") }}, {"Debugf", func() { l.Debugf("%s", "m") }}, {"Debugln", func() { l.Debugln("m") }},
		{"Info", func() { l.Info("m") }}, {"Infof", func() { l.Infof("%s", "m") }}, {"Infoln", func() { l.Infoln("m") }},
		{"Warn", func() { l.Warn("m") }}, {"Warnf", func() { l.Warnf("%s", "m") }}, {"Warnln", func() { l.Warnln("m") }},
		{"Warning", func() { l.Warning("m") }}, {"Warningf", func() { l.Warningf("%s", "m") }}, {"Warningln", func() { l.Warningln("m") }},
		{"Error", func() { l.Error("m") }}, {"Errorf", func() { l.Errorf("%s", "m") }}, {"Errorln", func() { l.Errorln("m") }},
		{"Fatal", func() { l.Fatal("m") }}, {"Fatalf", func() { l.Fatalf("%s", "m") }}, {"Fatalln", func() { l.Fatalln("m") }},
		{"Panic", func() { l.Panic("m") }}, {"Panicf", func() { l.Panicf("%s", "m") }}, {"Panicln", func() { l.Panicln("m") }},
		{"WithField", func() { l.WithField("k", "v").Info("m") }},
		{"WithFields", func() { l.WithFields(logrus.Fields{"k": "v"}).Info("m") }},
		{"WithError", func() { l.WithError(errTest).Info("m") }},
	}
	type line struct {
		Level  string
		Msg    string
		Fields logrus.Fields
		Panic  bool
	}
	var got, want []line
	fields := logrus.Fields{"server": "s", "session_id": "sess", "request_id": "req"}
	with := func(k string, v any) logrus.Fields {
		f := logrus.Fields{k: v}
		for k, v := range fields {
			f[k] = v
		}
		return f
	}
	for _, c := range calls {
		hook.Reset()
		p := panics(c.call)
		e := hook.LastEntry()
		if e == nil {
			t.Errorf("%s wrote nothing", c.name)
			continue
		}
		got = append(got, line{e.Level.String(), e.Message, e.Data, p})
	}
	for _, lv := range []string{"info", "debug", "info", "warning", "warning", "error", "fatal", "panic"} {
		for range 3 {
			want = append(want, line{lv, "m", fields, lv == "panic"})
		}
	}
	want = append(want, line{"info", "m", with("k", "v"), false}, line{"info", "m", with("k", "v"), false}, line{"info", "m", with(logrus.ErrorKey, errTest), false})
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
		t.Errorf("lines by method (-want +got):\n%s", diff)
	}
	if exits != 3 {
		t.Errorf("Fatal, Fatalf and Fatalln exited %d times, want 3", exits)
	}
}

var errTest = testError("boom")

type testError string

func (e testError) Error() string { return string(e) }
