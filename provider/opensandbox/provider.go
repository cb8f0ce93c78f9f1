package opensandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	rand2 "math/rand/v2"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
)

// Name is the provider's name, in handles and records.
const Name = "opensandbox"

// Provider drives an OpenSandbox server. It implements provider.Provider,
// Snapshotter, Leaser and Lister, and is safe for concurrent use.
type Provider struct {
	opts  Options
	base  string
	clk   clock.Clock
	sleep func(context.Context, time.Duration) error
	http  *http.Client
	log   logrus.FieldLogger
	rng   *jitter
	// frameCap bounds one line of a command stream: maxFrame, smaller in
	// tests (SetFrameCap) that cut a line without 16 MiB of it.
	frameCap int

	creates   chan struct{}
	snapshots chan struct{}

	mu sync.Mutex
	// endpoints caches each sandbox's execd endpoint.
	endpoints map[string]endpoint
	// tokens are the execd access tokens of sandboxes this process made
	// or has read the label of.
	tokens map[string]string
	// execdBase is the transport each sandbox's execd transport is cloned
	// from (see execdClient); nil when every call goes through p.http (a
	// client the options gave, or the server proxy).
	execdBase *http.Transport
	// transports are the sandboxes' execd transports.
	transports map[string]*http.Transport
	// labels caches the metadata of sandboxes this process made, for
	// naming their snapshots.
	labels map[string]map[string]string
	// typical is how long waits of each kind took lately.
	typical map[string]time.Duration
	// unreachable is the error of the last lifecycle call, when it got no
	// answer.
	unreachable error
	// background counts deletes of snapshots that missed their deadline.
	background sync.WaitGroup
}

// Wait returns once the deletes of snapshots that missed their deadline,
// which run in the background, are done.
func (p *Provider) Wait() { p.background.Wait() }

var (
	_ provider.Provider    = (*Provider)(nil)
	_ provider.Snapshotter = (*Provider)(nil)
	_ provider.Leaser      = (*Provider)(nil)
	_ provider.Lister      = (*Provider)(nil)
)

// Capabilities: an OpenSandbox server snapshots, leases and lists.
func (p *Provider) Capabilities() provider.Capabilities {
	return provider.Capabilities{Snapshotter: p, Leaser: p, Lister: p}
}

// New checks opts and fills in the defaults.
func New(opts Options) (*Provider, error) {
	if opts.Domain == "" {
		return nil, fmt.Errorf("opensandbox: domain (host:port of the lifecycle server) is required: %w", provider.ErrInvalidSpec)
	}
	if strings.Contains(opts.Domain, "://") {
		return nil, fmt.Errorf("opensandbox: domain %q must be host:port, without a scheme: %w", opts.Domain, provider.ErrInvalidSpec)
	}
	switch opts.Protocol {
	case "":
		opts.Protocol = "http"
	case "http", "https":
	default:
		return nil, fmt.Errorf("opensandbox: protocol must be http or https, not %q: %w", opts.Protocol, provider.ErrInvalidSpec)
	}
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.TTL < MinTTL {
		return nil, fmt.Errorf("opensandbox: ttl %v is below the server's minimum %v: %w", opts.TTL, MinTTL, provider.ErrInvalidSpec)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.RequestTimeout, DefaultRequestTimeout)
	def(&opts.ReadyTimeout, DefaultReadyTimeout)
	def(&opts.SnapshotTimeout, DefaultSnapshotTimeout)
	def(&opts.PollInterval, DefaultPollInterval)
	if opts.MaxConcurrentSnapshots <= 0 {
		opts.MaxConcurrentSnapshots = DefaultMaxConcurrentSnapshots
	}
	if opts.MaxConcurrentCreates <= 0 {
		opts.MaxConcurrentCreates = DefaultMaxConcurrentCreates
	}
	if opts.MaxRetries < 0 {
		opts.MaxRetries = 0
	} else if opts.MaxRetries == 0 {
		opts.MaxRetries = DefaultMaxRetries
	}
	if opts.CPU == "" {
		opts.CPU = DefaultCPU
	}
	if opts.Memory == "" {
		opts.Memory = DefaultMemory
	}
	if len(opts.Entrypoint) == 0 {
		opts.Entrypoint = []string{"tail", "-f", "/dev/null"}
	}
	if opts.Workdir == "" {
		opts.Workdir = DefaultWorkdir
	}
	if !path.IsAbs(opts.Workdir) {
		return nil, fmt.Errorf("opensandbox: workdir %q is not absolute: %w", opts.Workdir, provider.ErrInvalidSpec)
	}
	if err := literal("workdir", opts.Workdir); err != nil {
		return nil, err
	}
	if opts.OutputCap <= 0 {
		opts.OutputCap = DefaultOutputCap
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Sleep == nil {
		opts.Sleep = sleepReal
	}
	var execdBase *http.Transport
	if opts.HTTPClient == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		opts.HTTPClient = &http.Client{Transport: tr}
		if !opts.UseServerProxy {
			execdBase = tr
		}
	}
	log := logs.Or(opts.Logger)
	return &Provider{
		execdBase:  execdBase,
		transports: map[string]*http.Transport{},
		opts:       opts,
		base:       opts.Protocol + "://" + opts.Domain + "/v1",
		clk:        opts.Clock,
		sleep:      opts.Sleep,
		http:       opts.HTTPClient,
		log:        log.WithField("provider", Name),
		rng:        &jitter{rng: rand2.New(rand2.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15))},
		frameCap:   maxFrame,
		creates:    make(chan struct{}, opts.MaxConcurrentCreates),
		snapshots:  make(chan struct{}, opts.MaxConcurrentSnapshots),
		endpoints:  map[string]endpoint{},
		tokens:     map[string]string{},
		labels:     map[string]map[string]string{},
		typical:    map[string]time.Duration{},
	}, nil
}

// DefaultTTL is the lease of a sandbox whose spec names none: every
// sandbox has one, which the owner must renew.
func (p *Provider) DefaultTTL() time.Duration { return p.opts.TTL }

// Name is "opensandbox".
func (p *Provider) Name() string { return Name }

// poller spaces the polls of one wait. A wait of a kind this provider has
// seen before first sleeps through most of what such waits took (creates
// and captures take about as long as each other), then polls from an eighth
// of PollInterval, doubling up to it: a short wait ends soon after it could,
// a long one costs few requests.
type poller struct {
	p         *Provider
	kind      string
	start     time.Time
	pending   time.Time // the last poll that found it not ready yet
	deadline  time.Time
	first     time.Duration
	next, max time.Duration
}

// Kinds of waits whose typical length is learnt.
const (
	waitCreate   = "create"
	waitSnapshot = "snapshot"
)

func (p *Provider) poller(kind string, deadline time.Time) *poller {
	w := &poller{p: p, kind: kind, start: p.clk.Now(), deadline: deadline,
		next: max(p.opts.PollInterval/8, time.Millisecond), max: p.opts.PollInterval}
	if kind != "" {
		p.mu.Lock()
		w.first = p.typical[kind] * 9 / 10
		p.mu.Unlock()
	}
	return w
}

func (w *poller) wait(ctx context.Context) error {
	w.pending = w.p.clk.Now()
	if w.first > 0 {
		now := w.pending
		d := min(w.first-now.Sub(w.start), w.deadline.Sub(now))
		w.first = 0
		if d > w.next {
			return w.p.sleep(ctx, d)
		}
	}
	d := w.next
	w.next = min(2*w.next, w.max)
	return w.p.sleep(ctx, d)
}

// done records how long a successful wait took at least (until its last
// poll that found it not ready: an estimate that errs short, so that the
// sleep it sets never feeds on its own overshoot), as a moving average.
func (w *poller) done() {
	if w.kind == "" || w.pending.IsZero() {
		return
	}
	took := w.pending.Sub(w.start)
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	if t := w.p.typical[w.kind]; t > 0 {
		took = (3*t + took) / 4
	}
	w.p.typical[w.kind] = took
}

// acquire takes a slot of sem, waiting (queued) until one frees or ctx ends.
func acquire(ctx context.Context, sem chan struct{}) (func(), error) {
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func newToken() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newExecdToken is a sandbox's execd access token: 128 random bits in hex,
// 32 characters, a valid label value.
func newExecdToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// descriptor is the Handle's provider-specific part.
type descriptor struct {
	SandboxID string `json:"sandbox_id"`
	Workdir   string `json:"workdir,omitempty"`
}

func (p *Provider) handle(id, workdir string) provider.Handle {
	d, _ := json.Marshal(descriptor{SandboxID: id, Workdir: workdir})
	return provider.Handle{SandboxID: id, Provider: Name, Descriptor: d}
}

// check refuses a handle of another provider.
func (p *Provider) check(h provider.Handle) error {
	if h.Provider != Name {
		return fmt.Errorf("opensandbox: handle %s is not an OpenSandbox sandbox: %w", h, provider.ErrSandboxNotFound)
	}
	if h.SandboxID == "" || strings.ContainsAny(h.SandboxID, "/?#%") {
		return fmt.Errorf("opensandbox: bad sandbox id %q: %w", h.SandboxID, provider.ErrSandboxNotFound)
	}
	return nil
}

func workdirOf(h provider.Handle, def string) string {
	var d descriptor
	if json.Unmarshal(h.Descriptor, &d) == nil && d.Workdir != "" {
		return d.Workdir
	}
	return def
}

// sandboxDoc is the Sandbox schema, as far as it is read.
type sandboxDoc struct {
	ID     string `json:"id"`
	Status struct {
		State   string `json:"state"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"status"`
	Metadata   map[string]string `json:"metadata"`
	SnapshotID string            `json:"snapshotId"`
	ExpiresAt  *time.Time        `json:"expiresAt"`
	CreatedAt  time.Time         `json:"createdAt"`
}

// snapshotDoc is the Snapshot schema.
type snapshotDoc struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandboxId"`
	Name      string `json:"name"`
	Status    struct {
		State   string `json:"state"`
		Reason  string `json:"reason"`
		Message string `json:"message"`
	} `json:"status"`
	CreatedAt time.Time `json:"createdAt"`
}

type pagination struct {
	HasNextPage bool `json:"hasNextPage"`
}

// status maps a sandbox state, compared case-insensitively; a state the
// spec does not list is StatusUnknown.
func status(state string) provider.Status {
	switch strings.ToLower(state) {
	case "pending", "allocated":
		return provider.StatusStarting
	case "running":
		return provider.StatusRunning
	case "pausing", "paused", "resuming":
		return provider.StatusPaused
	case "stopping", "terminated":
		return provider.StatusStopped
	case "failed":
		return provider.StatusError
	}
	return provider.StatusUnknown
}

// lost reports a state no sandbox comes back from: its entrypoint exited
// (Terminated, Failed: every container after its runtime restarts), it is
// being deleted (Stopping), or being removed at expiry (Unknown, then 404).
// Such a sandbox is as good as gone.
func lost(state string) bool {
	switch strings.ToLower(state) {
	case "stopping", "terminated", "failed", "unknown":
		return true
	}
	return false
}

// resourceLimits renders the spec's resources, or the configured defaults.
func (p *Provider) resourceLimits(spec provider.Spec) map[string]string {
	rl := map[string]string{"cpu": p.opts.CPU, "memory": p.opts.Memory}
	if r := spec.Resources; r != nil {
		if r.CPU > 0 {
			rl["cpu"] = strconv.Itoa(int(math.Ceil(r.CPU*1000))) + "m"
		}
		if r.MemoryMiB > 0 {
			rl["memory"] = strconv.Itoa(r.MemoryMiB) + "Mi"
		}
		if r.GPU > 0 {
			rl["gpu"] = strconv.Itoa(r.GPU)
		}
	}
	return rl
}

// Start creates a sandbox from the spec's image (through Options.Images),
// waits until it runs and execd answers, and writes spec.Files.
func (p *Provider) Start(ctx context.Context, spec provider.Spec) (provider.Handle, error) {
	image := spec.Image
	if uri, ok := p.opts.Images[image]; ok {
		image = uri
	}
	if image == "" {
		return provider.Handle{}, fmt.Errorf("opensandbox: the spec names no image: %w", provider.ErrInvalidSpec)
	}
	return p.create(ctx, spec, "image", map[string]string{"uri": image})
}

// Fork creates a sandbox from a snapshot (its rootfs; no processes).
func (p *Provider) Fork(ctx context.Context, spec provider.Spec, snapshotID string) (provider.Handle, error) {
	if snapshotID == "" {
		return provider.Handle{}, fmt.Errorf("opensandbox: fork from no snapshot: %w", provider.ErrSnapshotNotFound)
	}
	return p.create(ctx, spec, "snapshotId", snapshotID)
}

func (p *Provider) create(ctx context.Context, spec provider.Spec, sourceKey string, source any) (provider.Handle, error) {
	workdir := spec.Workdir
	if workdir == "" {
		workdir = p.opts.Workdir
	}
	if !path.IsAbs(workdir) {
		return provider.Handle{}, fmt.Errorf("opensandbox: workdir %q is not absolute: %w", workdir, provider.ErrInvalidSpec)
	}
	workdir = path.Clean(workdir)
	if err := literal("workdir", workdir); err != nil {
		return provider.Handle{}, err
	}
	ttl := spec.TTL()
	if ttl <= 0 {
		ttl = p.opts.TTL
	}
	token := newToken()
	// A fork gets a token of its own too: without one in the request it
	// would inherit its source's, and a call meant for one could be
	// answered by the other.
	execdToken := newExecdToken()
	labels := maps.Clone(spec.Metadata)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[createLabel] = token
	labels[tokenLabel] = execdToken
	md, err := encodeLabels(labels)
	if err != nil {
		return provider.Handle{}, err
	}
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	env[execdTokenEnv] = execdToken // the spec's own value, if any, does not stand
	body := map[string]any{
		sourceKey:        source,
		"entrypoint":     p.opts.Entrypoint,
		"timeout":        max(int(math.Ceil(ttl.Seconds())), int(MinTTL.Seconds())),
		"resourceLimits": p.resourceLimits(spec),
		"metadata":       md,
		"env":            env,
	}
	ready := p.opts.ReadyTimeout
	if spec.ReadyTimeoutSeconds > 0 {
		ready = time.Duration(spec.ReadyTimeoutSeconds * float64(time.Second))
	}
	release, err := acquire(ctx, p.creates)
	if err != nil {
		return provider.Handle{}, fmt.Errorf("opensandbox: create: %w", err)
	}
	defer release()
	// The deadline starts once the request is ours to make, not while it
	// queues behind other creates.
	deadline := p.clk.Now().Add(ready)
	ctx, cancel := context.WithTimeout(ctx, ready+p.opts.RequestTimeout)
	defer cancel()

	var adopted string
	req := request{op: "create sandbox", method: http.MethodPost, url: p.base + "/sandboxes", retry: true,
		contentType: "application/json", header: p.apiHeader()}
	req.body, _ = json.Marshal(body)
	req.beforeRetry = func(ctx context.Context) (bool, error) {
		id, err := p.findByLabel(ctx, token)
		adopted = id
		return id != "", err
	}
	resp, err := p.do(ctx, req)
	var id, state string
	switch {
	case errors.Is(err, errAdopted):
		id = adopted
	case err != nil:
		p.reapCreate(ctx, token)
		return provider.Handle{}, err
	case ambiguous(resp.status, nil):
		p.reapCreate(ctx, token)
		return provider.Handle{}, resp.apiError("create sandbox")
	case resp.status == http.StatusNotFound && sourceKey == "snapshotId":
		return provider.Handle{}, fmt.Errorf("%w: %w", resp.apiError("create sandbox"), provider.ErrSnapshotNotFound)
	case resp.status == http.StatusBadRequest, resp.status == http.StatusUnprocessableEntity:
		// 422 is the server's schema validation: {detail: [...]}.
		return provider.Handle{}, fmt.Errorf("%w: %w", resp.apiError("create sandbox"), provider.ErrInvalidSpec)
	case !resp.ok():
		return provider.Handle{}, resp.apiError("create sandbox")
	default:
		var doc sandboxDoc
		if err := json.Unmarshal(resp.body, &doc); err != nil || doc.ID == "" {
			return provider.Handle{}, fmt.Errorf("opensandbox: create sandbox: answer without an id: %s", truncate(resp.body))
		}
		id, state = doc.ID, doc.Status.State
	}
	p.mu.Lock()
	p.tokens[id] = execdToken
	p.mu.Unlock()
	log := logs.ForRequest(ctx, p.log).WithField("sandbox_id", id)
	fail := func(err error) (provider.Handle, error) {
		// A sandbox that did not come up is deleted, never left behind.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
		defer cancel()
		p.forget(id)
		if derr := p.deleteSandbox(dctx, id); derr != nil {
			log.WithError(derr).Warn("opensandbox: could not delete a sandbox that failed to start (its lease will end it)")
		}
		return provider.Handle{}, err
	}
	// A server that answers the create already Running (Docker's does)
	// needs no poll.
	if !strings.EqualFold(state, "running") {
		if err := p.waitRunning(ctx, id, deadline); err != nil {
			return fail(err)
		}
	}
	if sourceKey == "snapshotId" {
		if err := p.ownLabels(ctx, id, md); err != nil {
			return fail(err)
		}
	}
	h := p.handle(id, workdir)
	if err := p.waitUp(ctx, id, deadline); err != nil {
		return fail(err)
	}
	if sourceKey == "image" {
		// Commands run in the workdir, which an image may not have. Best
		// effort: a shell without mkdir leaves it to the image.
		res, err := p.probe(ctx, h, provider.ExecRequest{Command: "mkdir -p " + shellQuote(workdir), Cwd: "/", Timeout: p.opts.RequestTimeout})
		if err != nil {
			return fail(fmt.Errorf("opensandbox: make the workdir %s: %w", workdir, err))
		}
		if res.ExitCode != 0 {
			log.WithField("stderr", res.Stderr).Debug("opensandbox: mkdir of the workdir failed")
		}
	}
	if sourceKey == "image" && len(spec.Files) > 0 {
		files := make(map[string][]byte, len(spec.Files))
		for name, data := range spec.Files {
			files[resolve(workdir, name)] = []byte(data)
		}
		if err := p.upload(ctx, h, files); err != nil {
			return fail(fmt.Errorf("opensandbox: write the spec's files: %w", err))
		}
	}
	p.mu.Lock()
	p.labels[id] = maps.Clone(spec.Metadata)
	p.mu.Unlock()
	log.Debug("opensandbox: sandbox running")
	return h, nil
}

func (p *Provider) apiHeader() map[string]string {
	h := map[string]string{}
	if p.opts.APIKey != "" {
		h[APIKeyHeader] = p.opts.APIKey
	}
	return h
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func truncate(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return string(b)
}

// getSandbox fetches a sandbox; a 404, or a state it cannot come back from
// (see lost; doc is then filled in), wraps provider.ErrSandboxNotFound.
func (p *Provider) getSandbox(ctx context.Context, id string) (sandboxDoc, error) {
	resp, err := p.api(ctx, "get sandbox", http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, true)
	if err != nil {
		return sandboxDoc{}, err
	}
	return readSandbox(id, resp)
}

// readSandbox reads the answer to GET /sandboxes/{id} as getSandbox does.
func readSandbox(id string, resp *response) (sandboxDoc, error) {
	var doc sandboxDoc
	switch {
	case resp.status == http.StatusNotFound:
		return doc, fmt.Errorf("opensandbox: sandbox %s: %w", id, provider.ErrSandboxNotFound)
	case !resp.ok():
		return doc, resp.apiError("get sandbox")
	}
	if err := json.Unmarshal(resp.body, &doc); err != nil {
		return doc, fmt.Errorf("opensandbox: get sandbox %s: %w", id, err)
	}
	if lost(doc.Status.State) {
		return doc, fmt.Errorf("opensandbox: sandbox %s is %s (%s: %s): %w", id, doc.Status.State, doc.Status.Reason, doc.Status.Message, provider.ErrSandboxNotFound)
	}
	return doc, nil
}

// ownLabels makes a fork's metadata its own. A fork inherits its source's
// labels (the runtime keeps them in the snapshot), so a label the fork was
// not given (the source's checkpoint or session) would make the sweep or a
// release act on the wrong sandbox: those are removed, by a JSON merge
// patch, and values that differ are set.
func (p *Provider) ownLabels(ctx context.Context, id string, want map[string]string) error {
	doc, err := p.getSandbox(ctx, id)
	if err != nil {
		return fmt.Errorf("opensandbox: read the labels of fork %s: %w", id, err)
	}
	patch := map[string]any{}
	for k, v := range doc.Metadata {
		if strings.HasPrefix(k, "opensandbox.io/") {
			continue // the server's own
		}
		if w, ok := want[k]; !ok {
			patch[k] = nil
		} else if w != v {
			patch[k] = w
		}
	}
	for k, w := range want {
		if _, ok := doc.Metadata[k]; !ok {
			patch[k] = w
		}
	}
	if len(patch) == 0 {
		return nil
	}
	resp, err := p.api(ctx, "patch metadata", http.MethodPatch, "/sandboxes/"+url.PathEscape(id)+"/metadata", patch, true)
	switch {
	case err != nil:
		return fmt.Errorf("opensandbox: remove the labels fork %s inherited: %w", id, err)
	case !resp.ok():
		return fmt.Errorf("opensandbox: remove the labels fork %s inherited: %w", id, resp.apiError("patch metadata"))
	}
	return nil
}

// waitRunning polls until the sandbox runs; Failed, Terminated, Stopping,
// Unknown, a vanished sandbox or the deadline end it.
func (p *Provider) waitRunning(ctx context.Context, id string, deadline time.Time) error {
	poll := p.poller(waitCreate, deadline)
	for {
		doc, err := p.getSandbox(ctx, id)
		if err != nil {
			return fmt.Errorf("opensandbox: wait for sandbox %s to run: %w", id, err)
		}
		switch st := strings.ToLower(doc.Status.State); st {
		case "running":
			poll.done()
			return nil
		default:
			// Pending, Allocated, or a state this client does not know:
			// keep waiting until the deadline.
			if st != "pending" && st != "allocated" {
				logs.ForRequest(ctx, p.log).WithFields(logrus.Fields{"sandbox_id": id, "state": doc.Status.State}).Debug("opensandbox: unknown sandbox state while starting")
			}
		}
		if !p.clk.Now().Before(deadline) {
			return fmt.Errorf("opensandbox: sandbox %s still %s at the ready deadline: %w", id, doc.Status.State, context.DeadlineExceeded)
		}
		if err := poll.wait(ctx); err != nil {
			return err
		}
	}
}

// waitUp waits until execd answers, in slices of a few polls, and looks at
// the sandbox between them: one whose entrypoint exited (Terminated,
// Failed) never answers, and is a failed start at once, not at the ready
// deadline.
func (p *Provider) waitUp(ctx context.Context, id string, deadline time.Time) error {
	for {
		slice := p.clk.Now().Add(4 * p.opts.PollInterval)
		if slice.After(deadline) {
			slice = deadline
		}
		err := p.waitExecd(ctx, id, slice)
		if err == nil || ctx.Err() != nil || !slice.Before(deadline) {
			return err
		}
		if _, gerr := p.getSandbox(ctx, id); gerr != nil {
			return fmt.Errorf("opensandbox: execd of sandbox %s: %w", id, gerr)
		}
	}
}

// reapCreate deletes what a create that failed ambiguously (no answer, or a
// 500/502/504 after the last retry) may have made: a sandbox nobody holds
// would run until its lease ends.
func (p *Provider) reapCreate(ctx context.Context, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*p.opts.RequestTimeout)
	defer cancel()
	id, err := p.findByLabel(ctx, token)
	if err == nil && id != "" {
		err = p.deleteSandbox(ctx, id)
	}
	if err != nil {
		logs.ForRequest(ctx, p.log).WithError(err).Warn("opensandbox: could not look for a sandbox a failed create may have made (its lease will end it)")
	}
}

// findByLabel looks for the sandbox a create with token made.
func (p *Provider) findByLabel(ctx context.Context, token string) (string, error) {
	var found string
	err := p.eachSandbox(ctx, map[string]string{createLabel: token}, func(doc sandboxDoc) bool {
		if doc.Metadata[createLabel] == token {
			found = doc.ID
			return false
		}
		return true
	})
	return found, err
}

// maxPages bounds a listing, in case a server keeps saying there is more.
const maxPages = 10000

// eachSandbox pages through the sandboxes (filter is sent, but may be
// ignored by the server) until fn returns false.
func (p *Provider) eachSandbox(ctx context.Context, filter map[string]string, fn func(sandboxDoc) bool) error {
	q := url.Values{}
	if len(filter) > 0 {
		enc, err := encodeLabels(filter)
		if err != nil {
			return err
		}
		md := url.Values{}
		for k, v := range enc {
			md.Set(k, v)
		}
		q.Set("metadata", md.Encode())
	}
	return eachPage(ctx, p, "list sandboxes", "/sandboxes", q, func(d sandboxDoc) string { return d.ID }, fn)
}

// eachPage pages through a listing until fn returns false. Deletes shift
// page boundaries, so an item may come twice: it is passed once.
func eachPage[T any](ctx context.Context, p *Provider, op, route string, q url.Values, id func(T) string, fn func(T) bool) error {
	seen := map[string]bool{}
	q.Set("pageSize", "100")
	for page := 1; page <= maxPages; page++ {
		q.Set("page", strconv.Itoa(page))
		resp, err := p.api(ctx, op, http.MethodGet, route+"?"+q.Encode(), nil, true)
		if err != nil {
			return err
		}
		if !resp.ok() {
			return resp.apiError(op)
		}
		var doc struct {
			Items      []T        `json:"items"`
			Pagination pagination `json:"pagination"`
		}
		if err := json.Unmarshal(resp.body, &doc); err != nil {
			return fmt.Errorf("opensandbox: %s: %w", op, err)
		}
		for _, it := range doc.Items {
			if seen[id(it)] {
				continue
			}
			seen[id(it)] = true
			if !fn(it) {
				return nil
			}
		}
		if !doc.Pagination.HasNextPage || len(doc.Items) == 0 {
			return nil
		}
	}
	return nil
}

// Stop deletes the sandbox; one already gone is success.
func (p *Provider) Stop(ctx context.Context, h provider.Handle) error {
	if err := p.check(h); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout())
	defer cancel()
	if err := p.deleteSandbox(ctx, h.SandboxID); err != nil {
		return err
	}
	p.forget(h.SandboxID)
	return nil
}

// opTimeout bounds one operation of single calls and their retries.
func (p *Provider) opTimeout() time.Duration {
	return time.Duration(p.opts.MaxRetries+1)*p.opts.RequestTimeout + time.Minute
}

func (p *Provider) forget(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.endpoints, id)
	delete(p.tokens, id)
	delete(p.labels, id)
	if t, ok := p.transports[id]; ok {
		t.CloseIdleConnections()
		delete(p.transports, id)
	}
}

func (p *Provider) deleteSandbox(ctx context.Context, id string) error {
	resp, err := p.api(ctx, "delete sandbox", http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, true)
	switch {
	case err != nil:
		return err
	case resp.ok(), resp.status == http.StatusNotFound:
		return nil
	}
	return resp.apiError("delete sandbox")
}

// Status reports the sandbox's state; a missing one is ErrSandboxNotFound.
func (p *Provider) Status(ctx context.Context, h provider.Handle) (provider.Status, error) {
	if err := p.check(h); err != nil {
		return provider.StatusUnknown, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout())
	defer cancel()
	doc, err := p.getSandbox(ctx, h.SandboxID)
	if errors.Is(err, provider.ErrSandboxNotFound) {
		if doc.ID != "" {
			return status(doc.Status.State), err
		}
		return provider.StatusStopped, err
	}
	if err != nil {
		return provider.StatusUnknown, err
	}
	return status(doc.Status.State), nil
}

// Renew moves the sandbox's expiry to expiresAt (absolute, whole seconds,
// rounded up). A sandbox gone is ErrSandboxNotFound, and so is one that has
// ended (Terminated, Failed: every one after its runtime restarts): the
// server renews those too, so its state is looked at first, and the owner
// finds the sandbox lost at its next renewal instead of at a call that
// fails.
func (p *Provider) Renew(ctx context.Context, h provider.Handle, expiresAt time.Time) error {
	if err := p.check(h); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout())
	defer cancel()
	if _, err := p.getSandbox(ctx, h.SandboxID); err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	at := expiresAt.UTC()
	if t := at.Truncate(time.Second); !t.Equal(at) {
		at = t.Add(time.Second)
	}
	resp, err := p.api(ctx, "renew expiration", http.MethodPost, "/sandboxes/"+url.PathEscape(h.SandboxID)+"/renew-expiration",
		map[string]string{"expiresAt": at.Format(time.RFC3339)}, true)
	switch {
	case err != nil:
		return err
	case resp.status == http.StatusNotFound:
		p.forget(h.SandboxID)
		return fmt.Errorf("opensandbox: renew sandbox %s: %w", h.SandboxID, provider.ErrSandboxNotFound)
	case !resp.ok():
		return resp.apiError("renew expiration")
	}
	return nil
}

// labelsOf returns the sandbox's metadata: from this process's memory, else
// from the server.
func (p *Provider) labelsOf(ctx context.Context, id string) (map[string]string, error) {
	p.mu.Lock()
	md, ok := p.labels[id]
	p.mu.Unlock()
	if ok {
		return md, nil
	}
	doc, err := p.getSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	return ownerLabels(decodeLabels(doc.Metadata)), nil
}

// Snapshot captures the sandbox's rootfs (not its processes) and returns once
// the snapshot is Ready. At most MaxConcurrentSnapshots run at once; the
// others queue here.
func (p *Provider) Snapshot(ctx context.Context, h provider.Handle, name string) (string, error) {
	if err := p.check(h); err != nil {
		return "", err
	}
	release, err := acquire(ctx, p.snapshots)
	if err != nil {
		return "", fmt.Errorf("opensandbox: snapshot: %w", err)
	}
	defer release()
	deadline := p.clk.Now().Add(p.opts.SnapshotTimeout)
	ctx, cancel := context.WithTimeout(ctx, p.opts.SnapshotTimeout+p.opts.RequestTimeout)
	defer cancel()
	id := h.SandboxID
	md, err := p.labelsOf(ctx, id)
	if err != nil {
		return "", fmt.Errorf("opensandbox: snapshot %s: %w", id, err)
	}
	full := encodeSnapshotName(name, newToken(), md)
	var adopted string
	req := request{op: "create snapshot", method: http.MethodPost, url: p.base + "/sandboxes/" + url.PathEscape(id) + "/snapshots",
		retry: true, contentType: "application/json", header: p.apiHeader()}
	req.body, _ = json.Marshal(map[string]string{"name": full})
	req.beforeRetry = func(ctx context.Context) (bool, error) {
		sid, err := p.findSnapshot(ctx, id, full)
		adopted = sid
		return sid != "", err
	}
	resp, err := p.do(ctx, req)
	var sid, loc string
	switch {
	case errors.Is(err, errAdopted):
		sid = adopted
	case err != nil:
		p.reapSnapshot(ctx, id, full)
		return "", err
	case ambiguous(resp.status, nil):
		p.reapSnapshot(ctx, id, full)
		return "", resp.apiError("create snapshot")
	case resp.status == http.StatusNotFound:
		p.forget(id)
		return "", fmt.Errorf("%w: %w", resp.apiError("create snapshot"), provider.ErrSandboxNotFound)
	case resp.status == http.StatusNotImplemented:
		// The server's runtime takes no snapshots.
		return "", fmt.Errorf("%w: %w", resp.apiError("create snapshot"), provider.ErrUnsupported)
	case !resp.ok():
		return "", resp.apiError("create snapshot")
	default:
		var doc snapshotDoc
		if err := json.Unmarshal(resp.body, &doc); err != nil || doc.ID == "" {
			return "", fmt.Errorf("opensandbox: create snapshot: answer without an id: %s", truncate(resp.body))
		}
		sid = doc.ID
		loc = resp.header.Get("Location")
	}
	log := logs.ForRequest(ctx, p.log).WithFields(logrus.Fields{"sandbox_id": id, "snapshot_id": sid})
	if err := p.waitReady(ctx, sid, snapshotPath(sid, loc), deadline); err != nil {
		p.discardSnapshot(ctx, sid, log)
		return "", err
	}
	return sid, nil
}

// reapSnapshot deletes, in the background, what a snapshot request that
// failed ambiguously may have made: snapshots have no lease, so one nobody
// names would be kept for ever.
func (p *Provider) reapSnapshot(ctx context.Context, sandboxID, name string) {
	p.background.Add(1)
	go func() {
		defer p.background.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.SnapshotTimeout+p.opts.RequestTimeout)
		defer cancel()
		sid, err := p.findSnapshot(ctx, sandboxID, name)
		if err == nil && sid != "" {
			err = p.DeleteSnapshot(ctx, sid)
		}
		if err != nil {
			logs.ForRequest(ctx, p.log).WithError(err).WithField("sandbox_id", sandboxID).Warn("opensandbox: could not delete what a failed snapshot request may have made")
		}
	}()
}

// discardSnapshot deletes a snapshot that will never be used. One that
// failed goes at once; one still Creating (409) is retried in the background
// until it can be deleted, without holding up the caller.
func (p *Provider) discardSnapshot(ctx context.Context, sid string, log logrus.FieldLogger) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	resp, err := p.api(dctx, "delete snapshot", http.MethodDelete, "/snapshots/"+url.PathEscape(sid), nil, true)
	if err == nil && (resp.ok() || resp.status == http.StatusNotFound) {
		return
	}
	p.background.Add(1)
	go func() {
		defer p.background.Done()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.SnapshotTimeout)
		defer cancel()
		if derr := p.DeleteSnapshot(dctx, sid); derr != nil {
			log.WithError(derr).Warn("opensandbox: could not delete a snapshot that did not become ready")
		}
	}()
}

// snapshotPath is where a new snapshot is followed: the Location of the
// answer when it names a snapshot under this API, else /snapshots/{id}.
func snapshotPath(sid, location string) string {
	if rest, ok := strings.CutPrefix(location, "/v1/snapshots/"); ok && rest != "" && !strings.ContainsAny(rest, "/?#") {
		return "/snapshots/" + rest
	}
	return "/snapshots/" + url.PathEscape(sid)
}

func (p *Provider) waitReady(ctx context.Context, sid, route string, deadline time.Time) error {
	poll := p.poller(waitSnapshot, deadline)
	for {
		resp, err := p.api(ctx, "get snapshot", http.MethodGet, route, nil, true)
		if err != nil {
			return err
		}
		if resp.status == http.StatusNotFound {
			return fmt.Errorf("opensandbox: snapshot %s vanished while Creating: %w", sid, provider.ErrSnapshotNotFound)
		}
		if !resp.ok() {
			return resp.apiError("get snapshot")
		}
		var doc snapshotDoc
		if err := json.Unmarshal(resp.body, &doc); err != nil {
			return fmt.Errorf("opensandbox: get snapshot %s: %w", sid, err)
		}
		switch strings.ToLower(doc.Status.State) {
		case "ready":
			poll.done()
			return nil
		case "failed", "deleting":
			return fmt.Errorf("opensandbox: snapshot %s is %s (%s: %s)", sid, doc.Status.State, doc.Status.Reason, doc.Status.Message)
		}
		if !p.clk.Now().Before(deadline) {
			return fmt.Errorf("opensandbox: snapshot %s still %s at its deadline: %w", sid, doc.Status.State, context.DeadlineExceeded)
		}
		if err := poll.wait(ctx); err != nil {
			return err
		}
	}
}

// findSnapshot looks for the snapshot of sandboxID named name.
func (p *Provider) findSnapshot(ctx context.Context, sandboxID, name string) (string, error) {
	var found string
	err := p.eachSnapshot(ctx, url.Values{"sandboxId": {sandboxID}}, func(doc snapshotDoc) bool {
		if doc.Name == name && doc.SandboxID == sandboxID {
			found = doc.ID
			return false
		}
		return true
	})
	return found, err
}

func (p *Provider) eachSnapshot(ctx context.Context, q url.Values, fn func(snapshotDoc) bool) error {
	return eachPage(ctx, p, "list snapshots", "/snapshots", q, func(d snapshotDoc) string { return d.ID }, fn)
}

// codeDeleteConflict is the server's refusal to delete a snapshot a live
// fork was made from.
const codeDeleteConflict = "SNAPSHOT::DELETE_CONFLICT"

// DeleteSnapshot deletes a snapshot; one missing is success, one still
// Creating (409) is tried again until it can be deleted or
// Options.SnapshotTimeout passes. One a live fork was made from is refused
// at once with provider.ErrSnapshotInUse: it can be deleted only once that
// fork is gone, which waiting here would not bring about.
func (p *Provider) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if snapshotID == "" || strings.ContainsAny(snapshotID, "/?#%") {
		return fmt.Errorf("opensandbox: bad snapshot id %q: %w", snapshotID, provider.ErrSnapshotNotFound)
	}
	deadline := p.clk.Now().Add(p.opts.SnapshotTimeout)
	ctx, cancel := context.WithTimeout(ctx, p.opts.SnapshotTimeout+p.opTimeout())
	defer cancel()
	poll := p.poller("", deadline)
	for {
		resp, err := p.api(ctx, "delete snapshot", http.MethodDelete, "/snapshots/"+url.PathEscape(snapshotID), nil, true)
		switch {
		case err != nil:
			return err
		case resp.ok(), resp.status == http.StatusNotFound:
			return nil
		case resp.status != http.StatusConflict:
			return resp.apiError("delete snapshot")
		}
		if e := resp.apiError("delete snapshot"); e.Code == codeDeleteConflict {
			return fmt.Errorf("%w: %w", e, provider.ErrSnapshotInUse)
		}
		if !p.clk.Now().Before(deadline) {
			return fmt.Errorf("%w: still refused at the deadline", resp.apiError("delete snapshot"))
		}
		if err := poll.wait(ctx); err != nil {
			return err
		}
	}
}

// ListSandboxes lists the sandboxes carrying Options.ListLabels.
func (p *Provider) ListSandboxes(ctx context.Context) ([]provider.SandboxInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*p.opTimeout())
	defer cancel()
	var out []provider.SandboxInfo
	err := p.eachSandbox(ctx, p.opts.ListLabels, func(doc sandboxDoc) bool {
		md := ownerLabels(decodeLabels(doc.Metadata))
		if !hasLabels(md, p.opts.ListLabels) {
			return true
		}
		info := provider.SandboxInfo{
			Handle:       p.handle(doc.ID, ""),
			Status:       status(doc.Status.State),
			Metadata:     md,
			CreatedAt:    doc.CreatedAt,
			FromSnapshot: doc.SnapshotID,
		}
		if doc.ExpiresAt != nil {
			info.ExpiresAt = *doc.ExpiresAt
		}
		out = append(out, info)
		return true
	})
	return out, err
}

// ListSnapshots lists the snapshots this provider named whose labels carry
// Options.ListLabels.
func (p *Provider) ListSnapshots(ctx context.Context) ([]provider.SnapshotInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*p.opTimeout())
	defer cancel()
	var out []provider.SnapshotInfo
	err := p.eachSnapshot(ctx, url.Values{}, func(doc snapshotDoc) bool {
		name, _, md, ours := decodeSnapshotName(doc.Name)
		if !ours || !hasLabels(md, p.opts.ListLabels) {
			return true
		}
		out = append(out, provider.SnapshotInfo{ID: doc.ID, Name: name, SandboxID: doc.SandboxID, Metadata: md, CreatedAt: doc.CreatedAt})
		return true
	})
	return out, err
}

// ProbeSnapshots tells whether the lifecycle server's runtime takes
// snapshots: it starts a sandbox from spec, snapshots it, and deletes both.
// A runtime without snapshots answers 501 (provider.ErrUnsupported), and
// says so only of a running sandbox, hence the sandbox.
func (p *Provider) ProbeSnapshots(ctx context.Context, spec provider.Spec) error {
	h, err := p.Start(ctx, spec)
	if err != nil {
		return fmt.Errorf("opensandbox: probe snapshots: start: %w", err)
	}
	id, err := p.Snapshot(ctx, h, "snapshot-probe")
	// What the probe made is deleted even when its caller gave up.
	cleanup := context.WithoutCancel(ctx)
	stopErr := provider.StopRetrying(cleanup, p, h)
	if err != nil {
		return fmt.Errorf("opensandbox: probe snapshots: %w", err)
	}
	if err := p.DeleteSnapshot(cleanup, id); err != nil {
		return fmt.Errorf("opensandbox: probe snapshots: delete its snapshot %s: %w", id, err)
	}
	if stopErr != nil {
		return fmt.Errorf("opensandbox: probe snapshots: stop its sandbox %s: %w", h.SandboxID, stopErr)
	}
	return nil
}
