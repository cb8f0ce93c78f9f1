package owner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/snapshotindex"
)

// LabelTemplate is set on the sandbox a template is built in (and so on
// its snapshot): the digest of the template's key.
const LabelTemplate = "ng.template"

// templates is the shell of keyed seeds: the book's decisions under a
// mutex, a channel per build in flight for the seeds that wait for it, and
// the sandboxes templates are being built in (which a sweep keeps).
type templates struct {
	mu       sync.Mutex
	book     *templateBook
	flights  map[uint64]chan struct{}
	builders map[string]bool
	// told are the flights whose builder's own fork the provider was told
	// to expect (by their first waiting seed).
	told map[uint64]bool
	// setups counts the setups run into templates; builds numbers the
	// builds, for their snapshots' tags.
	setups, builds atomic.Int64
	// onWait, when set, is told of every seed that waits for a build (a
	// test's hook).
	onWait func()
}

func newTemplates() *templates {
	return &templates{book: newTemplateBook(), flights: map[uint64]chan struct{}{}, builders: map[string]bool{}, told: map[uint64]bool{}}
}

// TemplateSetups is how many setups the owner ran into templates.
func (o *Owner) TemplateSetups() int64 { return o.tmpl.setups.Load() }

// Templates counts the templates ready to fork.
func (o *Owner) Templates() int {
	o.tmpl.mu.Lock()
	defer o.tmpl.mu.Unlock()
	return len(o.tmpl.book.snapshots())
}

// templateKey is the key of a template: the resources server's key and a
// digest of what the sandbox is made of (image, workdir, environment,
// files, resources), so that one key under another spec is another
// template. Labels and leases are not part of it.
func templateKey(key string, spec provider.Spec, workdir string) string {
	spec.Metadata, spec.TTLSeconds, spec.ReadyTimeoutSeconds = nil, 0, 0
	b, _ := json.Marshal(struct {
		Spec    provider.Spec
		Workdir string
	}{spec, workdir})
	sum := sha256.Sum256(b)
	return key + "@" + hex.EncodeToString(sum[:6])
}

// labelValue is a digest short and plain enough for any provider's labels.
func labelValue(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// StartKeyedSessionSandbox is StartSessionSandbox for a setup that is a
// pure function of key (the same key always leaves the same sandbox and
// session data: a task's id, not a per-session secret). The first seed of
// a key runs the setup once into a template snapshot; every seed of that
// key, the first included, starts as a fork of it with the setup's session
// data, and seeds that come while it is built wait for that one build. A
// setup that fails fails every seed that waited for it with its error, and
// nothing is kept. With an index the template is kept there across
// restarts until the sweep finds it unused; without one it lasts until
// Close. key "", or a provider that cannot snapshot, is StartSessionSandbox.
func (o *Owner) StartKeyedSessionSandbox(ctx context.Context, sessionID, key string, spec provider.Spec, setup sandbox.SetupFunc, workdir string) (sandbox.Sandbox, error) {
	if key == "" || o.caps.Snapshotter == nil {
		return o.StartSessionSandbox(ctx, sessionID, spec, setup, workdir)
	}
	tkey := templateKey(key, spec, workdir)
	var ready tmplReady
	var claimed string
	launch := func(ctx context.Context, labelled provider.Spec) (sandbox.Launched, error) {
		// A fork that finds the template's snapshot gone (deleted behind
		// the owner's back, or expired meanwhile) builds it again, once.
		for attempt := 0; ; attempt++ {
			r, expected, err := o.template(ctx, tkey, spec, setup, workdir)
			if err != nil {
				return sandbox.Launched{}, err
			}
			l, err := o.launchFork(ctx, tkey, spec, labelled, r, expected)
			if errors.Is(err, provider.ErrSnapshotNotFound) && attempt == 0 {
				o.tmpl.mu.Lock()
				o.tmpl.book.lost(tkey, r.SnapshotID)
				o.tmpl.mu.Unlock()
				o.drainPool(tkey)
				continue
			}
			ready, claimed = r, l.Handle.SandboxID
			return l, err
		}
	}
	fromTemplate := func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
		return ready.Data, nil
	}
	sb, err := o.startSession(ctx, sessionID, spec, fromTemplate, workdir, launch)
	o.settleClaim(claimed)
	return sb, err
}

// launchFork claims a fork of r from its warm pool, or forks r for the
// session (labelled: spec with the session's labels). expected: the
// provider was told to expect this fork, which a claim makes no start.
func (o *Owner) launchFork(ctx context.Context, tkey string, spec, labelled provider.Spec, r tmplReady, expected bool) (sandbox.Launched, error) {
	if l, ok := o.fromPool(tkey, poolRecipe{Spec: spec, Snapshot: r.SnapshotID, Workdir: r.Workdir}); ok {
		if expected {
			o.startsCancelled(1)
		}
		return l, nil
	}
	at := o.clk.Now()
	n := o.startLabel()
	labelled.Metadata = maps.Clone(labelled.Metadata)
	labelled.Metadata[LabelStart] = n
	h, err := o.caps.Snapshotter.Fork(ctx, labelled, r.SnapshotID)
	if err != nil {
		// It may have failed after the provider made the fork.
		o.stopUnreported(LabelStart, n)
		return sandbox.Launched{}, fmt.Errorf("fork the template: %w", err)
	}
	return sandbox.Launched{Handle: h, FromSnapshot: r.SnapshotID, Workdir: r.Workdir, StartedAt: at}, nil
}

// template is key's template: ready, built by this call, or built by the
// call in flight this one waited for. expected: the provider was told to
// expect this seed's fork (see StartsExpecter); a seed that will not fork
// after all tells it so, here when it fails or leaves (then expected means
// nothing more).
func (o *Owner) template(ctx context.Context, tkey string, spec provider.Spec, setup sandbox.SetupFunc, workdir string) (_ tmplReady, expected bool, _ error) {
	t := o.tmpl
	t.mu.Lock()
	d := t.book.seed(tkey, o.clk.Now())
	switch d.Action {
	case tmplBuild:
		t.flights[d.Flight] = make(chan struct{})
	}
	ch := t.flights[d.Flight]
	tell := 0
	if e := o.caps.StartsExpecter; e != nil && d.Action == tmplWait {
		// Every seed waiting forks once the build ends, and so does the
		// one building (told of by the first to wait): the provider makes
		// ahead meanwhile what each fork would make on its own.
		expected, tell = true, 1
		if !t.told[d.Flight] {
			t.told[d.Flight], tell = true, 2
		}
	}
	t.mu.Unlock()
	switch d.Action {
	case tmplFork:
		return d.Ready, false, nil
	case tmplWait:
		if tell > 0 {
			o.caps.StartsExpecter.ExpectStarts(tell)
		}
		if t.onWait != nil {
			t.onWait()
		}
	case tmplBuild:
		r, err := o.buildTemplate(ctx, tkey, spec, setup, workdir)
		t.mu.Lock()
		if err != nil {
			t.book.failed(tkey, d.Flight, err)
		} else {
			t.book.built(tkey, d.Flight, r, o.clk.Now())
		}
		delete(t.flights, d.Flight)
		told := t.told[d.Flight]
		delete(t.told, d.Flight)
		close(ch)
		t.mu.Unlock()
		if err != nil && told {
			o.startsCancelled(1)
		}
		return r, told, err
	}
	o.rt.Await(ctx, func() bool { return sched.Closed(ch) }) // Await itself returns once ctx is done
	select {
	case <-ch:
	case <-ctx.Done():
		t.mu.Lock()
		t.book.leave(d.Flight)
		t.mu.Unlock()
		if expected {
			o.startsCancelled(1)
		}
		return tmplReady{}, false, fmt.Errorf("waiting for the template's setup: %w", ctx.Err())
	}
	t.mu.Lock()
	w := t.book.wake(d.Flight)
	t.mu.Unlock()
	if w.Err != nil && expected {
		o.startsCancelled(1)
	}
	return w.Ready, expected, w.Err
}

// startsCancelled tells the provider that n forks it was told to expect
// will not come, so that it gives back what it made ahead for them.
func (o *Owner) startsCancelled(n int) {
	if e := o.caps.StartsExpecter; e != nil {
		e.StartsCancelled(n)
	}
}

// buildTemplate starts a sandbox for tkey, runs the setup in it, snapshots
// it and stops it; with an index the template is recorded there before it
// is used. A crash midway leaves a sandbox of an earlier incarnation (the
// next start stops it) or a snapshot nothing names (the sweep removes it).
func (o *Owner) buildTemplate(ctx context.Context, tkey string, spec provider.Spec, setup sandbox.SetupFunc, workdir string) (tmplReady, error) {
	label := labelValue(tkey)
	log := logs.ForRequest(ctx, o.log).WithField("template", tkey)
	h, err := o.prov.Start(ctx, o.labelled(spec, "", map[string]string{LabelTemplate: label}))
	if err != nil {
		// It may have failed after the provider made the sandbox; no other
		// build of the key runs meanwhile (single flight).
		o.stopUnreported(LabelTemplate, label)
		return tmplReady{}, fmt.Errorf("start the template's sandbox: %w", err)
	}
	o.tmpl.mu.Lock()
	o.tmpl.builders[h.SandboxID] = true
	o.tmpl.mu.Unlock()
	defer func() {
		stopCtx, cancel := context.WithTimeout(o.base, timeouts.CloseStops)
		defer cancel()
		if err := provider.StopRetrying(stopCtx, o.prov, h); err != nil {
			log.WithError(err).WithField("sandbox_id", h.SandboxID).Warn("could not stop a template's sandbox; the next start or sweep stops it")
		}
		o.tmpl.mu.Lock()
		delete(o.tmpl.builders, h.SandboxID)
		o.tmpl.mu.Unlock()
	}()
	o.tmpl.setups.Add(1)
	data, err := runTemplateSetup(ctx, o.prov, setup, sandbox.Sandbox{Handle: h, Spec: spec, Workdir: workdir})
	if err != nil {
		return tmplReady{}, err
	}
	if workdir == "" {
		if workdir, err = actors.WorkdirOf(ctx, o.prov, h); err != nil {
			return tmplReady{}, fmt.Errorf("the template's sandbox: %w", err)
		}
	}
	// The snapshot's name ends with a tag that an intent names until the
	// template is recorded: a crash in between leaves the next start a
	// snapshot to find and delete, not one nothing names.
	tag := roundTag(o.incarnation, "template/"+tkey, uint64(o.tmpl.builds.Add(1)))
	intent := snapshotindex.IntentKey{Kind: intentTemplate, ID: label + "-" + tag}
	if o.index != nil {
		body, _ := json.Marshal(commitIntent{Tag: tag})
		if err := o.index.PutIntent(snapshotindex.Intent{Kind: intent.Kind, ID: intent.ID, Body: body}); err != nil {
			return tmplReady{}, fmt.Errorf("record the template's build: %w", err)
		}
	}
	snap, err := o.caps.Snapshotter.Snapshot(ctx, h, "ng-template-"+label+"-"+tag)
	if err != nil {
		o.dropTemplateBuild(log, intent, tag)
		return tmplReady{}, fmt.Errorf("snapshot the template: %w", err)
	}
	r := tmplReady{SnapshotID: snap, Workdir: workdir, Data: data}
	if o.index != nil {
		err := o.index.PutTemplate(snapshotindex.Template{Key: tkey, SnapshotID: snap, Provider: o.prov.Name(), Workdir: workdir, Data: data, CreatedAt: o.clk.Now()}, intent)
		if err != nil {
			o.dropTemplateBuild(log, intent, tag, snap)
			return tmplReady{}, fmt.Errorf("record the template: %w", err)
		}
	}
	log.WithFields(logrus.Fields{"sandbox_id": h.SandboxID, "snapshot_id": snap}).Info("template built: its key's seeds fork it")
	return r, nil
}

// dropTemplateBuild deletes the snapshots of a build that will not be a
// template (taken: those known; a snapshot call may fail after its effect,
// so the others are found by their tag), then its intent; what it cannot
// delete the intent leaves to the next start.
func (o *Owner) dropTemplateBuild(log logrus.FieldLogger, intent snapshotindex.IntentKey, tag string, taken ...string) {
	ctx, cancel := context.WithTimeout(o.base, timeouts.CloseStops)
	defer cancel()
	for _, id := range sortedSet(append(o.listSnapshotsByTag(ctx, tag), taken...)) {
		if err := o.caps.Snapshotter.DeleteSnapshot(ctx, id); err != nil {
			log.WithError(err).WithField("snapshot_id", id).Warn("could not delete the snapshot of a template not recorded; the next start deletes it")
			return
		}
	}
	if o.index != nil {
		if err := o.index.DeleteIntent(intent); err != nil {
			log.WithError(err).Warn("could not drop a failed template build's intent; the next start drops it")
		}
	}
}

// runTemplateSetup runs setup as a session's start does: a panic is an
// error, and its data must be a JSON object of bounded size.
func runTemplateSetup(ctx context.Context, p provider.Provider, setup sandbox.SetupFunc, sb sandbox.Sandbox) (data json.RawMessage, err error) {
	if setup != nil {
		err = func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			data, err = setup(ctx, p, sb)
			return err
		}()
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", sandbox.ErrSetup, err)
	}
	return actors.ValidateSessionData(data)
}

// loadTemplates makes the index's templates of this provider ready (a
// fresh owner forks what the one before it built), as used now.
func (o *Owner) loadTemplates() error {
	if o.index == nil || o.caps.Snapshotter == nil {
		return nil
	}
	ts, err := o.index.Templates()
	if err != nil {
		return err
	}
	o.tmpl.mu.Lock()
	defer o.tmpl.mu.Unlock()
	for _, t := range ts {
		if t.Provider == o.prov.Name() {
			o.tmpl.book.load(t.Key, tmplReady{SnapshotID: t.SnapshotID, Workdir: t.Workdir, Data: t.Data}, o.clk.Now())
		}
	}
	return nil
}

// TemplateExpiry is what ExpireTemplates dropped: the templates' keys,
// the snapshots deleted, and those whose delete waits (a fork stands on
// them, or the delete failed: the sweep's pending deletes retry them).
type TemplateExpiry struct {
	// Kept counts the templates still ready.
	Kept     int
	Dropped  []string
	Deleted  []string
	Deferred []string
	Failed   map[string]string
}

// ExpireTemplates drops the templates no seed used since before: out of
// the index, their snapshots tombstoned and deleted (a snapshot a live
// fork stands on stays a pending delete). A running server's sweep calls
// it with its templates' retention; an owner without an index keeps its
// templates until Close.
func (o *Owner) ExpireTemplates(ctx context.Context, before time.Time) (TemplateExpiry, error) {
	var rep TemplateExpiry
	if o.index == nil {
		return rep, nil
	}
	o.tmpl.mu.Lock()
	gone := o.tmpl.book.expire(before)
	rep.Kept = len(o.tmpl.book.snapshots())
	o.tmpl.mu.Unlock()
	if len(gone) == 0 {
		return rep, nil
	}
	rep.Dropped = slices.Sorted(maps.Keys(gone))
	for _, k := range rep.Dropped {
		// The pool's forks would stand on the snapshot.
		o.drainPool(k)
	}
	ids := make([]string, 0, len(gone))
	ts := make([]snapshotindex.Tombstone, 0, len(gone))
	for _, k := range rep.Dropped {
		ids = append(ids, gone[k].SnapshotID)
		ts = append(ts, snapshotindex.Tombstone{SnapshotID: gone[k].SnapshotID, Provider: o.prov.Name(), Reason: "template unused", At: o.clk.Now()})
	}
	if err := o.index.DropTemplates(rep.Dropped, ts); err != nil {
		// Nothing was dropped: the templates are ready again.
		o.tmpl.mu.Lock()
		for k, r := range gone {
			o.tmpl.book.load(k, r, o.clk.Now())
		}
		o.tmpl.mu.Unlock()
		return TemplateExpiry{Kept: rep.Kept + len(gone)}, fmt.Errorf("drop unused templates: %w", err)
	}
	out := o.deleteSnapshots(ctx, ids)
	for _, e := range afterDelete(out) {
		o.perform(ctx, e)
	}
	rep.Deleted, rep.Deferred, rep.Failed = out.Deleted, out.InUse, out.Failed
	for _, k := range rep.Dropped {
		o.log.WithFields(logrus.Fields{"template": k, "snapshot_id": gone[k].SnapshotID}).Info("template unused for its retention: dropped")
	}
	return rep, nil
}

// closeTemplates deletes the templates of an owner without an index, which
// nothing would find after it; an owner with one keeps them for the next.
func (o *Owner) closeTemplates(ctx context.Context) {
	if o.index != nil || o.caps.Snapshotter == nil {
		return
	}
	o.tmpl.mu.Lock()
	all := o.tmpl.book.takeAll()
	o.tmpl.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(all)) {
		if err := o.caps.Snapshotter.DeleteSnapshot(ctx, all[k].SnapshotID); err != nil {
			o.log.WithError(err).WithField("snapshot_id", all[k].SnapshotID).Warn("could not delete a template at shutdown")
		}
	}
}

// keptSnapshots are the snapshots a release must not take for leftovers of
// earlier runs though no checkpoint names them: those live forks stand on,
// and the templates (an earlier run may have built them).
func (o *Owner) keptSnapshots() map[string]bool {
	out := o.liveSnapshots()
	o.tmpl.mu.Lock()
	defer o.tmpl.mu.Unlock()
	for _, id := range o.tmpl.book.snapshots() {
		out[id] = true
	}
	return out
}

// holdTemplates adds what templates hold to h: the sandboxes being built
// and the snapshots ready to fork.
func (o *Owner) holdTemplates(h *Holdings) {
	o.tmpl.mu.Lock()
	defer o.tmpl.mu.Unlock()
	for id := range o.tmpl.builders {
		h.Sandboxes[id] = true
	}
	for _, id := range o.tmpl.book.snapshots() {
		h.Snapshots[id] = true
	}
}
