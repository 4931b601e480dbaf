package nodes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/cluster"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/linkprobe"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// Version is the ppnode version gossiped in the node metadata.
var Version = func() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}()

// An Agent is one running node. Its methods are safe for concurrent use.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	profile cluster.Profile
	// burstGFLOPS is the GEMM speed between the throttles of a CPU quota
	// (profile.GEMMGFLOPS is over whole quota periods): the reference of
	// the profiles this node's coordinators measure.
	burstGFLOPS float64
	limitMu     sync.Mutex // guards limit and limitAt (see capacity)
	limit       float64
	limitAt     time.Time
	sys         *actors.System
	dp          *dataplane.TCP
	probe       *linkprobe.Server
	probeMu     sync.Mutex // one link probe from this node at a time
	host        *actors.StageHost
	node        *cluster.Node
	store       *tensorio.Store
	dirLock     *os.File // holds the lock on the data dir; nil without one
	httpLn      net.Listener
	srv         *http.Server
	hc          *http.Client  // calls to other nodes
	uploads     chan struct{} // a slot per checkpoint upload in progress

	ctx    context.Context // cancelled by Close and Leave: ends the jobs
	cancel context.CancelFunc
	loops  sync.WaitGroup // event loop and HTTP server
	runs   sync.WaitGroup // jobs' Run goroutines and submissions in progress

	mu      sync.Mutex // guards jobs, order, seq, closed, changed, records, httpOf, links and the jobs' rec
	jobs    map[string]*coordinated
	order   []string // job ids in submission order
	seq     int
	closed  bool
	changed chan struct{} // closed and replaced at every membership event
	// records are the records of jobs coordinated elsewhere that this
	// node holds (see failover.go).
	records map[string]*JobRecord
	// httpOf is every member's last known HTTP address, by name (a
	// failed member's too).
	httpOf map[string]string
	// links are the link measurements this node made or asked for.
	links map[[2]string]keptLink

	// cutMu guards cutRuns: the run of each job's cuts in the local store
	// (see cuts.go).
	cutMu   sync.Mutex
	cutRuns map[string]string

	stopOnce sync.Once
	stopErr  error
}

// coordinated is a job this node coordinates.
type coordinated struct {
	c      *actors.Coordinator
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned

	// rec is the job's record as last sent to its holders (guarded by
	// Agent.mu); takeover is how this node got the job (nil: submitted
	// here); superseded is set when a newer coordinator took it over
	// (guarded by Agent.mu).
	rec        JobRecord
	takeover   *Takeover
	superseded bool
	movedTo    string // the coordinator that superseded this node
	// dropped are former holders not yet told that they no longer hold
	// the job; warnedFew is set once a lack of holders was logged (both
	// used by the persisting goroutine and, after it, Run's).
	dropped   []string
	warnedFew bool
}

// Start starts a node: it measures the node, starts the actor system, the
// HTTP listener and the membership, and returns once all are up.
func Start(cfg Config) (a *Agent, err error) {
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	key, err := cfg.gossipKey()
	if err != nil {
		return nil, err
	}
	addrs := cfg.addrs()

	a = &Agent{cfg: cfg, log: cfg.Logger.With("node", cfg.Name), jobs: map[string]*coordinated{}, changed: make(chan struct{}),
		records: map[string]*JobRecord{}, httpOf: map[string]string{}, links: map[[2]string]keptLink{}, cutRuns: map[string]string{},
		hc: HTTPClient(cfg.Identity), uploads: make(chan struct{}, MaxUploads)}
	if cfg.Identity == nil {
		a.log.Warn("nodes: running without cluster credentials: anyone who reaches this node's ports can submit, cancel and poison jobs (SECURITY.md)", "insecure", cfg.Insecure)
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	self := a // a is nil once an error is returned
	defer func() {
		if err != nil {
			self.cancel()
			if self.httpLn != nil {
				self.httpLn.Close()
			}
			if self.sys != nil {
				self.sys.Stop()
			}
			if self.probe != nil {
				self.probe.Close()
			}
			if self.dirLock != nil {
				self.dirLock.Close()
			}
		}
	}()

	be, err := nn.NewBackend("", cfg.Threads, false)
	if err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}
	sustained, burst := balance.MeasureGEMMSpeeds(be, 256, cfg.ProfileFor)
	a.profile = cluster.Profile{GEMMGFLOPS: sustained, MemoryBytes: uint64(max(job.AvailableMemory(), 0)), Threads: cfg.Threads}
	a.burstGFLOPS = burst
	a.log.Info("nodes: measured", "gflops", sustained, "burst_gflops", burst, "memory", a.profile.MemoryBytes, "threads", cfg.Threads, "backend", nn.Describe(be))

	if cfg.DataDir != "" {
		if a.dirLock, err = lockDataDir(cfg.DataDir); err != nil {
			return nil, err
		}
		if a.store, err = tensorio.OpenStore(filepath.Join(cfg.DataDir, "checkpoints"), CheckpointsKept); err != nil {
			return nil, fmt.Errorf("nodes: %w", err)
		}
	}

	a.dp = &dataplane.TCP{Host: addrs.dataHost, Ports: cfg.DataPorts}
	if id := cfg.Identity; id != nil {
		a.dp.Key = id.DataPlaneKey()
		if cfg.EncryptData {
			a.dp.ServerTLS, a.dp.ClientTLS = id.ServerTLS(true), id.ClientTLS()
		}
	}
	if a.probe, err = linkprobe.Listen(addrs.probeHost, cfg.DataPorts); err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}
	host := &actors.StageHost{DataPlane: a.dp, Threads: cfg.Threads, Logger: a.log, Capacity: a.capacity}
	a.host = host
	acfg := actors.Config{
		Bind: cfg.ActorBind, Advertise: addrs.actorAdvertise,
		Kinds:  map[string]*actor.Props{actors.StageKind: actors.StageProps(host)},
		Logger: cfg.Logger, LogLevel: cfg.ActorLogLevel,
	}
	if id := cfg.Identity; id != nil {
		acfg.ServerTLS, acfg.ClientTLS = id.ServerTLS(true), id.ClientTLS()
	}
	a.sys, err = actors.Start(acfg)
	if err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}

	if a.httpLn, err = net.Listen("tcp", cfg.HTTP); err != nil {
		return nil, fmt.Errorf("nodes: HTTP: %w", err)
	}
	tags := map[string]string{tagHTTP: a.httpLn.Addr().String(), tagProbe: a.probe.Addr()}
	if a.store != nil {
		tags[tagStore] = "1"
	}
	if cpus, ok := cpuLimit(); ok {
		tags[tagCPUs] = formatCPUs(cpus)
	}
	a.node, err = cluster.Start(cluster.Config{
		Name: cfg.Name, BindAddr: cfg.Bind, AdvertiseAddr: cfg.Advertise, Seeds: cfg.Seeds,
		Meta: cluster.Meta{
			ActorAddr: a.sys.Address(), Version: Version, Profile: a.profile, Tags: tags,
		},
		SecretKey: key, Logger: cfg.Logger,
		Confirm: a.answers,
	})
	if err != nil {
		return nil, fmt.Errorf("nodes: %w", err)
	}

	a.srv = a.newServer()
	a.srv.ErrorLog = slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)
	a.loops.Add(2)
	go a.watch()
	go func() {
		defer a.loops.Done()
		serve := a.srv.Serve
		if a.srv.TLSConfig != nil {
			serve = func(l net.Listener) error { return a.srv.ServeTLS(l, "", "") }
		}
		if err := serve(a.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("nodes: HTTP server", "err", err)
		}
	}()
	a.log.Info("nodes: ready", "gossip", a.node.Addr(), "actors", a.sys.Address(), "http", a.HTTPAddr(), "data_ports", cfg.DataPorts.String(), "data_dir", cfg.DataDir)
	return a, nil
}

// confirmTimeout bounds the direct check of a member memberlist declared
// failed. A killed node's port refuses at once; a stopped or cut-off one
// takes this long to be reported; a busy one has this long to answer.
const confirmTimeout = 2 * time.Second

// answers is the cluster's Config.Confirm: whether a member memberlist
// declared failed still answers on its actor port. memberlist's fast
// probes (100 ms) miss a node starved of CPU (a 30% quota writing a
// checkpoint copy was declared failed); a recovery then would cost far
// more than this check.
func (a *Agent) answers(ctx context.Context, m cluster.Member) error {
	if m.Meta.ActorAddr == "" {
		return errors.New("no actor address")
	}
	return a.sys.Ping(ctx, m.Meta.ActorAddr, confirmTimeout)
}

// Tags of the gossiped node metadata.
const (
	tagHTTP  = "http"  // the HTTP API's host:port
	tagStore = "store" // "1": the node keeps checkpoints (it can hold cuts)
	tagProbe = "probe" // the link probe server's host:port (linkprobe)
	tagCPUs  = "cpus"  // the CPU limit at the node's start, in CPUs (none: no limit)
)

// watch follows the membership: members that fail or leave have their
// actor endpoints terminated, and the jobs whose coordinator they were
// are taken over (see failover.go).
func (a *Agent) watch() {
	defer a.loops.Done()
	actorAddr := map[string]string{} // member name -> its last known actor address
	for ev := range a.node.Events() {
		m := ev.Member
		switch ev.Kind {
		case cluster.EventJoin, cluster.EventUpdate:
			if m.MetaErr != nil {
				a.log.Warn("nodes: member with bad metadata", "member", m.Name, "err", m.MetaErr)
			} else {
				if m.Meta.ActorAddr != "" {
					actorAddr[m.Name] = m.Meta.ActorAddr
				}
				if h := m.Meta.Tags[tagHTTP]; h != "" {
					a.mu.Lock()
					a.httpOf[m.Name] = h
					a.mu.Unlock()
				}
			}
		case cluster.EventLeave, cluster.EventFailed:
			addr := m.Meta.ActorAddr
			if addr == "" {
				addr = actorAddr[m.Name]
			}
			delete(actorAddr, m.Name)
			if ev.Kind == cluster.EventFailed {
				// A leaving node keeps its stages until they are moved
				// away; a failed one is gone: its jobs recover now.
				for _, j := range a.runningJobs() {
					j.c.NodeFailed(m.Name)
				}
				if m.Name != a.cfg.Name && addr != "" && addr != a.sys.Address() {
					a.sys.Forget(addr)
				}
			}
			a.considerTakeovers()
		}
		// Every job hears of the members it may use now: a node of its plan
		// that is not among them is leaving (or gone).
		nodes := a.nodeInfos()
		for _, j := range a.runningJobs() {
			j.c.Members(nodes)
		}
		a.log.Info("nodes: member "+strings.ToLower(strings.TrimPrefix(ev.Kind.String(), "Event")), "member", m.Name, "gossip", m.Addr)
		a.mu.Lock()
		close(a.changed)
		a.changed = make(chan struct{})
		a.mu.Unlock()
	}
}

// membersChanged returns a channel closed at the next membership event.
func (a *Agent) membersChanged() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changed
}

// Name is the node's name.
func (a *Agent) Name() string { return a.cfg.Name }

// GossipAddr is the node's gossip host:port (seeds of others use it).
func (a *Agent) GossipAddr() string { return a.node.Addr() }

// ActorAddr is the actor system's host:port.
func (a *Agent) ActorAddr() string { return a.sys.Address() }

// HTTPAddr is the API's host:port.
func (a *Agent) HTTPAddr() string { return a.httpLn.Addr().String() }

// Profile is what the node measured about itself at start.
func (a *Agent) Profile() cluster.Profile { return a.profile }

// Store is the local checkpoint store; nil without a DataDir.
func (a *Agent) Store() *tensorio.Store { return a.store }

// Members are the members this node believes alive, itself included.
func (a *Agent) Members() []cluster.Member { return a.node.Members() }

// nodeInfos are the members a new job may use: alive, not leaving, with
// valid metadata and an actor address.
func (a *Agent) nodeInfos() []job.NodeInfo {
	var out []job.NodeInfo
	for _, m := range a.node.Members() {
		if m.State != cluster.StateAlive || m.Leaving || m.MetaErr != nil || m.Meta.ActorAddr == "" {
			continue
		}
		out = append(out, job.NodeInfo{
			Name: m.Name, ActorAddr: m.Meta.ActorAddr, GFLOPS: m.Meta.Profile.GEMMGFLOPS,
			Memory: int64(min(m.Meta.Profile.MemoryBytes, 1<<62)), Threads: m.Meta.Profile.Threads,
			ProbeAddr: m.Meta.Tags[tagProbe],
		})
	}
	return out
}

// Errors of [Agent.Submit].
var (
	ErrClosed  = errors.New("nodes: node is shutting down")
	ErrJobID   = errors.New("nodes: job id in use")
	ErrBadID   = errors.New("nodes: bad job id")
	ErrNoJob   = errors.New("nodes: no such job")
	maxIDBytes = 64
)

// Submit plans spec over the live members and starts it in the
// background; this node coordinates it. An empty spec.ID gets a unique
// one. A bad spec (wrapping job.ErrSpec) starts nothing. The job's
// record goes to the nodes that will hold its copies before Submit
// returns (a holder that does not answer is logged, and sent the record
// again with the next cut). The submission is a new run of the id, with a
// new [JobRecord].Run: cuts of the id left in the local store by an
// earlier run are removed first.
func (a *Agent) Submit(spec job.Spec) (*actors.Coordinator, error) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, ErrClosed
	}
	if spec.ID == "" {
		a.seq++
		spec.ID = fmt.Sprintf("%s-%d-%s", a.cfg.Name, a.seq, strconv.FormatInt(time.Now().UnixMilli()%(1<<30), 36))
	} else if err := checkID(spec.ID); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	_, coordinated := a.jobs[spec.ID]
	if _, held := a.records[spec.ID]; coordinated || held {
		a.mu.Unlock()
		return nil, fmt.Errorf("%w: %q", ErrJobID, spec.ID)
	}
	a.jobs[spec.ID] = nil // reserved while planning
	a.runs.Add(1)
	a.mu.Unlock()

	// The job against the members' memory first, from shapes alone: the
	// coordinator then checks its own share against this node's memory
	// before it builds the model.
	err := spec.CheckMemory(a.nodeInfos())
	var c *actors.Coordinator
	if err == nil {
		c, err = actors.NewCoordinator(spec, a.coordinatorConfig(nil, 0, false))
	}
	if err == nil {
		err = spec.Normalize() // as the coordinator did: the record carries the normalised spec
	}
	run := newRun()
	if err == nil {
		// A new run: cuts of this id left in the store by an earlier run
		// must neither be taken for this run's nor outrank them.
		err = a.claimCuts(spec.ID, run)
	}
	if err != nil {
		a.mu.Lock()
		delete(a.jobs, spec.ID)
		a.mu.Unlock()
		a.runs.Done()
		return nil, err
	}
	rec := JobRecord{ID: spec.ID, Run: run, Spec: spec, Coordinator: a.cfg.Name, Generation: 1, Revision: 1, State: RecordRunning}
	rec.Holders = chooseHolders(nil, peerNames(a.peers()), spec.Replicas-1)
	if err := a.launch(c, rec, rec, nil); err != nil {
		return nil, err
	}
	return c, nil
}

// capacity is the GEMM speed this node's CPU limit allows now (see
// cpuLimit), 0 without a limit: its speed between throttles times the
// share of its threads the limit leaves. Stages ask every step; the limit
// is read at most once a second.
func (a *Agent) capacity() float64 {
	a.limitMu.Lock()
	defer a.limitMu.Unlock()
	if now := time.Now(); now.Sub(a.limitAt) >= time.Second {
		a.limitAt = now
		a.limit = 0
		if cpus, ok := cpuLimit(); ok {
			a.limit = a.burstGFLOPS * min(1, cpus/float64(a.cfg.Threads))
		}
	}
	return a.limit
}

// coordinatorConfig configures a coordinator of this node; resume, gen
// and takeover are CoordinatorConfig's Resume, Generation and Takeover (a
// takeover's).
func (a *Agent) coordinatorConfig(resume *tensorio.Checkpoint, gen uint64, takeover bool) actors.CoordinatorConfig {
	return actors.CoordinatorConfig{
		Control: a.sys, DataPlane: a.dp, Nodes: a.nodeInfos(), Store: a.store, Replicate: a.replicate,
		GFLOPS: a.burstGFLOPS, Threads: a.cfg.Threads, Logger: a.log, Resume: resume, Generation: gen, Takeover: takeover,
		Self: a.cfg.Name, Links: a,
	}
}

// launch starts a planned job whose id is reserved in a.jobs (with a.runs
// counting it): it sends the record rec to the holders (and to those of
// prev, the record they knew before, if they are no longer holders) and
// runs the job in the background. It releases the reservation if the node
// is closing.
func (a *Agent) launch(c *actors.Coordinator, prev, rec JobRecord, takeover *Takeover) error {
	id := rec.ID
	a.mu.Lock()
	if a.closed {
		delete(a.jobs, id)
		a.mu.Unlock()
		a.runs.Done()
		return ErrClosed
	}
	ctx, cancel := context.WithCancel(a.ctx)
	j := &coordinated{c: c, cancel: cancel, done: make(chan struct{}), rec: prev.clone(), takeover: takeover}
	a.jobs[id] = j
	a.order = append(a.order, id)
	a.mu.Unlock()
	c.Members(a.nodeInfos()) // the members may have changed while it was planned
	a.log.Info("nodes: job planned", "job", id, "plan", c.Describe(), "holders", rec.Holders)
	a.sendRecord(j, rec, recordTimeout)
	go func() {
		defer a.runs.Done()
		defer close(j.done)
		defer cancel()
		res, err := c.Run(ctx)
		if err != nil {
			a.log.Warn("nodes: job failed", "job", id, "err", err)
		} else {
			a.log.Info("nodes: job done", "job", id, "seconds", res.Seconds, "weights_sha256", res.WeightsSHA256)
		}
		a.finish(j, res, err)
	}()
	return nil
}

func checkID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrBadID)
	}
	if len(id) > maxIDBytes {
		return fmt.Errorf("%w: longer than %d bytes", ErrBadID, maxIDBytes)
	}
	for _, r := range id {
		// The checkpoint store's rule: the id names a directory.
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("%w: %q (use letters, digits, '-' and '_')", ErrBadID, id)
		}
	}
	return nil
}

// runningJobs are the jobs this node coordinates whose coordinator exists.
func (a *Agent) runningJobs() []*coordinated {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*coordinated
	for _, j := range a.jobs {
		if j != nil {
			out = append(out, j)
		}
	}
	return out
}

// JobStatus is a job as the node that coordinates it reports it: the
// coordinator's progress, and where the job's copies are.
type JobStatus struct {
	job.Status
	// Coordinator is this node; Holders are the nodes that keep the job's
	// record and a copy of its cuts.
	Coordinator string   `json:"coordinator"`
	Holders     []string `json:"holders"`
	Replicas    int      `json:"replicas"`
	// Takeover, if set, is how this node took the job over from a dead
	// coordinator.
	Takeover *Takeover `json:"takeover,omitempty"`
	// MovedTo, if set, is the node that took the job over from this one
	// (this node had been declared dead): follow the job there.
	MovedTo string `json:"moved_to,omitempty"`
}

// status returns j's status; a.mu must be held.
func (a *Agent) status(j *coordinated) JobStatus {
	st := JobStatus{Status: j.c.Status(), Coordinator: a.cfg.Name, Holders: slices.Clone(j.rec.Holders), Replicas: j.rec.Spec.Replicas,
		MovedTo: j.movedTo}
	if j.takeover != nil {
		t := *j.takeover
		st.Takeover = &t
	}
	return st
}

// Job returns the status of a job this node coordinates.
func (a *Agent) Job(id string) (JobStatus, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	j := a.jobs[id]
	if j == nil {
		return JobStatus{}, fmt.Errorf("%w: %q", ErrNoJob, id)
	}
	return a.status(j), nil
}

// Cancel asks a job this node coordinates to stop; it stops at its next
// step, and its record tells the holders that it failed (they do not take
// it over).
func (a *Agent) Cancel(id string) error {
	a.mu.Lock()
	j := a.jobs[id]
	a.mu.Unlock()
	if j == nil {
		return fmt.Errorf("%w: %q", ErrNoJob, id)
	}
	j.cancel()
	return nil
}

// ReplanRequest asks to move a job to another partition (POST
// /v1/jobs/{id}/replan).
type ReplanRequest struct {
	// Partition is a partitioner's name (auto, uniform, params, balanced,
	// graph) or a partition such as "fc1-fc16@a; fc17-fc32@b".
	Partition string `json:"partition"`
	// ViaCut moves the state through a cut (gathered into the
	// coordinator, restored into the new stages) instead of straight from
	// each layer's old stage to its new one.
	ViaCut bool `json:"via_cut,omitempty"`
}

// Replan asks a job this node coordinates to move to another partition at
// its next step boundary. A partition that does not fit the model or the
// members is an error wrapping job.ErrSpec.
func (a *Agent) Replan(id string, r ReplanRequest) error {
	a.mu.Lock()
	j := a.jobs[id]
	a.mu.Unlock()
	if j == nil {
		return fmt.Errorf("%w: %q", ErrNoJob, id)
	}
	var names []string
	for _, n := range a.nodeInfos() {
		names = append(names, n.Name)
	}
	return j.c.RequestReplan(r.Partition, r.ViaCut, names)
}

// Wait waits until a job this node coordinates has ended or ctx is done.
func (a *Agent) Wait(ctx context.Context, id string) (JobStatus, error) {
	a.mu.Lock()
	j := a.jobs[id]
	a.mu.Unlock()
	if j == nil {
		return JobStatus{}, fmt.Errorf("%w: %q", ErrNoJob, id)
	}
	var err error
	select {
	case <-j.done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status(j), err
}

// Jobs returns the status of the jobs this node coordinates, oldest
// first.
func (a *Agent) Jobs() []JobStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]JobStatus, 0, len(a.order))
	for _, id := range a.order {
		if j := a.jobs[id]; j != nil {
			out = append(out, a.status(j))
		}
	}
	return out
}

// Status is a node's view of itself and the cluster (GET /v1/status).
type Status struct {
	Name    string         `json:"name"`
	Version string         `json:"version"`
	Gossip  string         `json:"gossip"`
	Actors  string         `json:"actors"`
	HTTP    string         `json:"http"`
	DataDir string         `json:"data_dir,omitempty"`
	Profile Profile        `json:"profile"`
	Members []MemberStatus `json:"members"`
	Jobs    []JobStatus    `json:"jobs"`
	// Records are the records of jobs coordinated elsewhere that this
	// node holds.
	Records []JobRecord `json:"records,omitempty"`
}

// Profile is a node's measured speed and size.
type Profile struct {
	GFLOPS  float64 `json:"gflops"`
	Memory  uint64  `json:"memory_bytes"`
	Threads int     `json:"threads"`
	// CPULimit is the node's CPU limit in CPUs (its cgroup's quota; 0:
	// none): this node's now, a member's as it was at its start.
	CPULimit float64 `json:"cpu_limit,omitempty"`
}

// MemberState is what a node sees of a member.
type MemberState string

// The states of a member.
const (
	MemberAlive   MemberState = "alive"
	MemberLeaving MemberState = "leaving" // alive, announced it leaves
	MemberLeft    MemberState = "left"
	MemberFailed  MemberState = "failed"
)

// Usable reports whether a member in state s still runs (alive, or alive
// and leaving).
func (s MemberState) Usable() bool { return s == MemberAlive || s == MemberLeaving }

// MemberStatus is one member as this node sees it.
type MemberStatus struct {
	Name    string      `json:"name"`
	State   MemberState `json:"state"`
	Gossip  string      `json:"gossip"`
	Actors  string      `json:"actors,omitempty"`
	HTTP    string      `json:"http,omitempty"`
	Version string      `json:"version,omitempty"`
	Profile Profile     `json:"profile"`
	Error   string      `json:"error,omitempty"`
}

// Status returns the node's status.
func (a *Agent) Status() Status {
	s := Status{
		Name: a.cfg.Name, Version: Version, Gossip: a.node.Addr(), Actors: a.sys.Address(), HTTP: a.HTTPAddr(),
		DataDir: a.cfg.DataDir, Profile: toProfile(a.profile), Jobs: a.Jobs(), Records: a.Records(),
	}
	if cpus, ok := cpuLimit(); ok {
		s.Profile.CPULimit = cpus
	}
	for _, m := range a.node.Members() {
		ms := MemberStatus{Name: m.Name, Gossip: m.Addr, Actors: m.Meta.ActorAddr, HTTP: m.Meta.Tags[tagHTTP],
			Version: m.Meta.Version, Profile: toProfile(m.Meta.Profile)}
		ms.Profile.CPULimit = parseCPUs(m.Meta.Tags[tagCPUs])
		switch {
		case m.State == cluster.StateAlive && m.Leaving:
			ms.State = MemberLeaving
		case m.State == cluster.StateAlive:
			ms.State = MemberAlive
		case m.State == cluster.StateLeft:
			ms.State = MemberLeft
		default:
			ms.State = MemberFailed
		}
		if m.MetaErr != nil {
			ms.Error = m.MetaErr.Error()
		}
		s.Members = append(s.Members, ms)
	}
	return s
}

func toProfile(p cluster.Profile) Profile {
	return Profile{GFLOPS: p.GEMMGFLOPS, Memory: p.MemoryBytes, Threads: p.Threads}
}

// Leave announces to the cluster that this node leaves, then stops it as
// Close does. ctx bounds the announcement.
func (a *Agent) Leave(ctx context.Context) error {
	announce := func() error { return a.node.Announce(ctx) }
	return a.stop(announce, func() error { return a.node.Leave(ctx) })
}

// Close stops the node without announcing it (others see a failure):
// new submissions are refused, the jobs it coordinates are cancelled and
// awaited, the HTTP server, the membership and the actor system stop.
// It returns once all the agent's goroutines and listeners are gone, or,
// if a job is stuck in a step, after [StopGrace] with that job's
// goroutines abandoned.
// Calling it again does nothing.
func (a *Agent) Close() error {
	return a.stop(nil, a.node.Close)
}

// stop stops the agent; announce, if not nil, first tells the cluster
// that it leaves, so that jobs elsewhere move their stages away while the
// HTTP server drains.
func (a *Agent) stop(announce, leave func() error) error {
	leaving := announce != nil
	a.stopOnce.Do(func() {
		var errs []error
		if leaving {
			errs = append(errs, announce())
		}
		a.mu.Lock()
		a.closed = true
		a.mu.Unlock()
		a.host.Refuse() // a job that has not heard yet places no stage here
		a.cancel()

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := a.srv.Shutdown(ctx)
		cancel()
		if err != nil {
			err = a.srv.Close()
		}
		errs = append(errs, err, leave())
		// Jobs end at their next step, submissions after planning. A job
		// stuck in a step (a stage that never answers) would hold the
		// node up to its step timeout: after StopGrace it is abandoned.
		ended := make(chan struct{})
		go func() {
			a.runs.Wait()
			close(ended)
		}()
		grace := time.NewTimer(StopGrace)
		select {
		case <-ended:
		case <-grace.C:
			a.log.Warn("nodes: jobs still running after the grace period; stopping under them", "grace", StopGrace)
		}
		grace.Stop()
		if leaving {
			// The coordinators elsewhere move this node's stages away at
			// their next step; stopping before would fail their jobs.
			ctx, cancel := context.WithTimeout(context.Background(), StopGrace)
			if err := a.host.WaitIdle(ctx); err != nil {
				a.log.Warn("nodes: stages still here after the grace period; stopping under them", "grace", StopGrace)
			}
			cancel()
		}
		// Stages left (not leaving, or past the grace) stop with their
		// links before the actor system does, which would leave them
		// running, reachable by their peers and by no one's control.
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		if err := a.host.Close(ctx); err != nil {
			a.log.Warn("nodes: stages did not stop", "err", err)
		}
		cancel()
		a.sys.Stop()
		a.probe.Close()
		a.loops.Wait()
		if a.dirLock != nil {
			a.dirLock.Close() // releases the data dir
		}
		a.stopErr = errors.Join(errs...)
		a.log.Info("nodes: stopped", "err", a.stopErr)
	})
	return a.stopErr
}

// lockDataDir creates dir if needed and takes an exclusive lock on
// dir/lock, which the returned file holds until it is closed (or the
// process ends): two nodes must not share a checkpoint store.
func lockDataDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("nodes: data dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("nodes: data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("nodes: data dir %s is in use by another node (one data dir per node: give each its own)", dir)
		}
		return nil, fmt.Errorf("nodes: locking data dir %s: %w", dir, err)
	}
	return f, nil
}
