package http

import (
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/resources"
)

// dataRequest is what a data request hands its resources server, in one
// allocation: the session and its logger.
type dataRequest struct {
	sess resources.Session
	log  requestLogger
}

// newDataRequest is a request's session: sess.Log is the server's logger
// with the request's session_id, request_id and, when the session has one,
// its episode's capture key.
func (s *Server) newDataRequest(id, requestID string, ep control.EpisodeID, hasEpisode bool) *resources.Session {
	r := &dataRequest{
		sess: resources.Session{ID: id, Owner: s.own, Episode: ep, HasEpisode: hasEpisode},
		log:  requestLogger{base: s.log, session: id, request: requestID, episode: ep, hasEpisode: hasEpisode},
	}
	r.sess.Log = &r.log
	return &r.sess
}

// requestLogger is a request's logger, its entry made on first use: most
// requests log nothing, and logrus copies the fields into a new map and
// entry (five allocations per request, eight with an episode).
type requestLogger struct {
	base             *logrus.Entry
	session, request string
	episode          control.EpisodeID
	hasEpisode       bool
	entry            atomic.Pointer[logrus.Entry]
}

func (l *requestLogger) get() *logrus.Entry {
	if e := l.entry.Load(); e != nil {
		return e
	}
	f := logrus.Fields{"session_id": l.session, "request_id": l.request}
	if l.hasEpisode {
		f["episode"] = l.episode.CaptureKey()
	}
	// A resources server may log from several goroutines: the first entry
	// made is the one kept.
	l.entry.CompareAndSwap(nil, l.base.WithFields(f))
	return l.entry.Load()
}

func (l *requestLogger) WithField(key string, value any) *logrus.Entry {
	return l.get().WithField(key, value)
}
func (l *requestLogger) WithFields(fields logrus.Fields) *logrus.Entry {
	return l.get().WithFields(fields)
}
func (l *requestLogger) WithError(err error) *logrus.Entry   { return l.get().WithError(err) }
func (l *requestLogger) Print(args ...any)                   { l.get().Print(args...) }
func (l *requestLogger) Printf(format string, args ...any)   { l.get().Printf(format, args...) }
func (l *requestLogger) Println(args ...any)                 { l.get().Println(args...) }
func (l *requestLogger) Fatal(args ...any)                   { l.get().Fatal(args...) }
func (l *requestLogger) Fatalf(format string, args ...any)   { l.get().Fatalf(format, args...) }
func (l *requestLogger) Fatalln(args ...any)                 { l.get().Fatalln(args...) }
func (l *requestLogger) Panic(args ...any)                   { l.get().Panic(args...) }
func (l *requestLogger) Panicf(format string, args ...any)   { l.get().Panicf(format, args...) }
func (l *requestLogger) Panicln(args ...any)                 { l.get().Panicln(args...) }
func (l *requestLogger) Debug(args ...any)                   { l.get().Debug(args...) }
func (l *requestLogger) Debugf(format string, args ...any)   { l.get().Debugf(format, args...) }
func (l *requestLogger) Debugln(args ...any)                 { l.get().Debugln(args...) }
func (l *requestLogger) Info(args ...any)                    { l.get().Info(args...) }
func (l *requestLogger) Infof(format string, args ...any)    { l.get().Infof(format, args...) }
func (l *requestLogger) Infoln(args ...any)                  { l.get().Infoln(args...) }
func (l *requestLogger) Warn(args ...any)                    { l.get().Warn(args...) }
func (l *requestLogger) Warnf(format string, args ...any)    { l.get().Warnf(format, args...) }
func (l *requestLogger) Warnln(args ...any)                  { l.get().Warnln(args...) }
func (l *requestLogger) Warning(args ...any)                 { l.get().Warning(args...) }
func (l *requestLogger) Warningf(format string, args ...any) { l.get().Warningf(format, args...) }
func (l *requestLogger) Warningln(args ...any)               { l.get().Warningln(args...) }
func (l *requestLogger) Error(args ...any)                   { l.get().Error(args...) }
func (l *requestLogger) Errorf(format string, args ...any)   { l.get().Errorf(format, args...) }
func (l *requestLogger) Errorln(args ...any)                 { l.get().Errorln(args...) }

var _ logrus.FieldLogger = (*requestLogger)(nil)
