package nodes

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/cgroup"
	"github.com/ppnode/ppnode/cluster"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/core"
	"github.com/ppnode/ppnode/linkprobe"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
	"github.com/ppnode/ppnode/trust"
)

// Version is the ppnode version gossiped in the node metadata.
var Version = func() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}()

// An Agent is one running node. Its methods are safe for concurrent use.
//
// The agent wires parts that each keep their own state under their own
// lock, and starts and stops them; no part's lock is held while another
// part's is taken.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	profile cluster.Profile

	members  *members  // the membership view
	jobs     *jobs     // the jobs coordinated here and the records held
	runner   *runner   // runs the jobs coordinated here
	failover *failover // keeps records, takes jobs over
	cuts     *cuts     // the local checkpoint store
	links    *links    // link probes and measurements
	capacity *capacity // the CPU limit's speed
	api      *api      // the HTTP API

	sys     *actors.System
	dp      *dataplane.TCP
	gates   gates // bound each listening port's connections
	host    *actors.StageHost
	dirLock *os.File   // holds the lock on the data dir; nil without one
	files   *job.Files // the directory jobs' files are read from; nil: any path

	joined   atomic.Bool     // the membership is up (members.node is set)
	ctx      context.Context // cancelled by Close and Leave: ends the jobs
	cancel   context.CancelFunc
	loops    sync.WaitGroup // event loop and HTTP server
	stopOnce sync.Once
	stopErr  error
}

// Start starts a node: it measures the node, starts the actor system, the
// HTTP listener and the membership, and returns once all are up.
func Start(cfg Config) (*Agent, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	key, err := cfg.gossipKey()
	if err != nil {
		return nil, err
	}
	if cfg.Identity == nil && cfg.TokenFile != "" {
		if cfg.Token, err = trust.LocalToken(cfg.TokenFile); err != nil {
			return nil, fmt.Errorf("nodes: %w", err)
		}
	}
	var files *job.Files
	if cfg.Files != "" {
		if fi, err := os.Stat(cfg.Files); err != nil {
			return nil, fmt.Errorf("nodes: the files directory: %w", err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("nodes: the files directory %s is not a directory", cfg.Files)
		}
		if files, err = job.OpenFiles(cfg.Files); err != nil {
			return nil, fmt.Errorf("nodes: %w", err)
		}
	}
	a := &Agent{cfg: cfg, log: cfg.Logger.With("node", cfg.Name), files: files}
	if cfg.Identity == nil {
		a.log.Warn("nodes: running without cluster credentials: the HTTP API asks for the local token, but anyone who reaches this node's other ports can disturb its stages (SECURITY.md)", "insecure", cfg.Insecure, "token_file", cfg.TokenFile)
	}
	a.gates = newGates(cfg.Conns)
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.members = newMembers(cfg.Name, cfg.httpClient())
	a.jobs = newJobs(cfg.Name, a.log)
	a.api = newAPI(a)
	err = a.measure()
	if err == nil {
		err = a.openStore()
	}
	if err == nil {
		err = a.startActors()
	}
	if err == nil {
		err = a.api.listen(cfg.HTTP)
	}
	if err == nil {
		err = a.join(key)
	}
	if err != nil {
		a.release()
		return nil, err
	}
	base := actors.CoordinatorConfig{Control: a.sys, DataPlane: a.dp, Store: a.cuts.store, GFLOPS: a.capacity.burst,
		Threads: cfg.Threads, Quota: cgroupQuota, Logger: a.log, Self: cfg.Name, Links: a.links, HandshakeTimeout: cfg.Conns.Handshake}
	a.runner = &runner{self: cfg.Name, log: a.log, ctx: a.ctx, jobs: a.jobs, members: a.members, cuts: a.cuts, files: a.files, base: base}
	a.failover = &failover{self: cfg.Name, log: a.log, ctx: a.ctx, jobs: a.jobs, members: a.members, cuts: a.cuts, runner: a.runner}
	a.loops.Go(a.watch)
	a.loops.Go(a.api.serve)
	a.log.Info("nodes: ready", "gossip", a.GossipAddr(), "actors", a.sys.Address(), "http", a.HTTPAddr(), "data_ports", cfg.DataPorts.String(), "data_links", a.dp.Protection(), "data_dir", cfg.DataDir, "files", cfg.Files)
	return a, nil
}

// measure measures the node's GEMM speed, over whole CPU-quota periods
// (the gossiped profile) and between throttles (capacity's reference).
func (a *Agent) measure() error {
	be, err := nn.NewBackend("", a.cfg.Threads, false)
	if err != nil {
		return fmt.Errorf("nodes: %w", err)
	}
	sustained, burst := balance.MeasureGEMMSpeeds(be, 256, a.cfg.ProfileFor)
	mem := max(job.AvailableMemory(), 0)
	if lim, ok := a.MemoryLimit(); ok {
		// What jobs may plan with under a limit: the limit less what the
		// process holds already and an eighth for the garbage collector's
		// headroom and what Go does not count (oneDNN's buffers).
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		usable := max(lim-int64(ms.Sys)-lim/8, 0)
		if mem == 0 || usable < mem {
			mem = usable
		}
	}
	a.profile = cluster.Profile{GEMMGFLOPS: sustained, MemoryBytes: uint64(mem), Threads: a.cfg.Threads}
	a.capacity = &capacity{burst: burst, threads: a.cfg.Threads}
	a.log.Info("nodes: measured", "gflops", sustained, "burst_gflops", burst, "memory", a.profile.MemoryBytes, "threads", a.cfg.Threads, "backend", nn.Describe(be))
	return nil
}

// openStore locks the data dir, if any, and opens the checkpoint store in
// it.
func (a *Agent) openStore() error {
	var store *tensorio.Store
	if dir := a.cfg.DataDir; dir != "" {
		var err error
		if a.dirLock, err = lockDataDir(dir); err != nil {
			return err
		}
		if store, err = tensorio.OpenStore(filepath.Join(dir, "checkpoints"), CheckpointsKept); err != nil {
			return fmt.Errorf("nodes: %w", err)
		}
	}
	a.cuts = newCuts(store, a.log)
	a.jobs.forget = a.cuts.drop
	return nil
}

// startActors starts what stages run on: the data plane, the link probe
// server, the stage host and the actor system.
func (a *Agent) startActors() error {
	cfg, addrs := a.cfg, a.cfg.addrs()
	a.dp = &dataplane.TCP{Host: addrs.dataHost, Ports: cfg.DataPorts, Gate: a.gates.data}
	if id := cfg.Identity; id != nil {
		a.dp.Key = id.DataPlaneKey()
		if cfg.EncryptData {
			a.dp.ServerTLS, a.dp.ClientTLS = id.ServerTLS(true), id.ClientTLS()
		}
	}
	probe, err := linkprobe.Listen(addrs.probeHost, cfg.DataPorts, a.gates.probe)
	if err != nil {
		return fmt.Errorf("nodes: %w", err)
	}
	a.links = newLinks(cfg.Name, a.log, a.members, probe)
	a.host = &actors.StageHost{DataPlane: a.dp, Threads: cfg.Threads, Logger: a.log, Capacity: a.capacity.now, Files: a.files,
		HandshakeTimeout: cfg.Conns.Handshake}
	acfg := actors.Config{
		Bind: cfg.ActorBind, Advertise: addrs.actorAdvertise,
		Kinds:  map[string]*actor.Props{actors.StageKind: actors.StageProps(a.host)},
		Logger: cfg.Logger, LogLevel: cfg.ActorLogLevel, Gate: a.gates.actor,
	}
	if id := cfg.Identity; id != nil {
		acfg.ServerTLS, acfg.ClientTLS = id.ServerTLS(true), id.ClientTLS()
		acfg.Authorize = func(cs *tls.ConnectionState) (string, error) {
			p, err := trust.Authorize(cs, trust.ActStages)
			return p.Name, err
		}
		acfg.Member = func(name string) bool { return a.joined.Load() && a.members.known(name) }
	}
	if a.sys, err = actors.Start(acfg); err != nil {
		return fmt.Errorf("nodes: %w", err)
	}
	return nil
}

// join joins the cluster with the node's metadata: its actor address,
// profile, and the tags of its HTTP API, probe server, store and CPU
// limit.
func (a *Agent) join(key []byte) error {
	tags := map[string]string{tagHTTP: a.api.addr(), tagProbe: a.links.server.Addr()}
	if a.cuts.store != nil {
		tags[tagStore] = "1"
	}
	if cpus, ok := cgroup.CPUs(); ok {
		tags[tagCPUs] = formatCPUs(cpus)
	}
	node, err := cluster.Start(cluster.Config{
		Name: a.cfg.Name, BindAddr: a.cfg.Bind, AdvertiseAddr: a.cfg.Advertise, Seeds: a.cfg.Seeds,
		Meta:      cluster.Meta{ActorAddr: a.sys.Address(), Version: Version, Profile: a.profile, Tags: tags},
		SecretKey: key, Logger: a.cfg.Logger, Gate: a.gates.gossip,
		Confirm: a.answers,
	})
	if err != nil {
		return fmt.Errorf("nodes: %w", err)
	}
	a.members.node = node
	a.joined.Store(true)
	return nil
}

// release undoes what a Start that failed had started.
func (a *Agent) release() {
	a.cancel()
	if a.api.ln != nil {
		a.api.ln.Close()
	}
	if a.sys != nil {
		a.sys.Stop()
	}
	if a.links != nil {
		a.links.server.Close()
	}
	if a.dirLock != nil {
		a.dirLock.Close()
	}
	a.closeFiles()
}

func (a *Agent) closeFiles() {
	if a.files != nil {
		a.files.Close()
	}
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

// watch follows the membership: members that fail or leave have their
// actor endpoints terminated, and the jobs whose coordinator they were
// are taken over (see failover.go).
func (a *Agent) watch() {
	actorAddr := map[string]string{} // member name -> its last known actor address
	for ev := range a.members.node.Events() {
		m := ev.Member
		switch ev.Kind {
		case cluster.EventJoin, cluster.EventUpdate:
			if m.MetaErr != nil {
				a.log.Warn("nodes: member with bad metadata", "member", m.Name, "err", m.MetaErr)
				break
			}
			if m.Meta.ActorAddr != "" {
				actorAddr[m.Name] = m.Meta.ActorAddr
			}
			a.members.seen(m)
		case cluster.EventLeave, cluster.EventFailed:
			addr := m.Meta.ActorAddr
			if addr == "" {
				addr = actorAddr[m.Name]
			}
			delete(actorAddr, m.Name)
			if ev.Kind == cluster.EventFailed {
				// A leaving node keeps its stages until they are moved
				// away; a failed one is gone: its jobs recover now.
				for _, j := range a.jobs.running() {
					j.c.NodeFailed(m.Name)
				}
				if m.Name != a.cfg.Name && addr != "" && addr != a.sys.Address() {
					a.sys.Forget(addr)
				}
			}
			a.failover.considerTakeovers()
		}
		// Every job hears of the members it may use now: a node of its plan
		// that is not among them is leaving (or gone).
		nodes := a.members.usable()
		for _, j := range a.jobs.running() {
			j.c.Members(nodes)
		}
		a.log.Info("nodes: member "+strings.ToLower(strings.TrimPrefix(ev.Kind.String(), "Event")), "member", m.Name, "gossip", m.Addr)
		a.members.notify()
	}
}

// Name is the node's name.
func (a *Agent) Name() string { return a.cfg.Name }

// GossipAddr is the node's gossip host:port (seeds of others use it).
func (a *Agent) GossipAddr() string { return a.members.node.Addr() }

// ActorAddr is the actor system's host:port.
func (a *Agent) ActorAddr() string { return a.sys.Address() }

// HTTPAddr is the API's host:port.
func (a *Agent) HTTPAddr() string { return a.api.addr() }

// ProbeAddr is the link probe server's host:port.
func (a *Agent) ProbeAddr() string { return a.links.server.Addr() }

// Profile is what the node measured about itself at start.
func (a *Agent) Profile() cluster.Profile { return a.profile }

// MemoryLimit is the memory this node may use, if anything limits it: its
// cgroup's limit or Config.Memory, whichever is smaller.
func (a *Agent) MemoryLimit() (int64, bool) {
	m, ok := cgroup.Memory()
	if c := a.cfg.Memory; c > 0 && (!ok || c < m) {
		m, ok = c, true
	}
	return m, ok
}

// Store is the local checkpoint store; nil without a DataDir.
func (a *Agent) Store() *tensorio.Store { return a.cuts.store }

// Members are the members this node believes alive, itself included.
func (a *Agent) Members() []cluster.Member { return a.members.list() }

// Submit plans spec over the live members and starts it in the
// background; this node coordinates it. An empty spec.ID gets a unique
// one. A bad spec (wrapping job.ErrSpec) starts nothing. The job's
// record goes to the nodes that will hold its copies before Submit
// returns (a holder that does not answer is logged, and sent the record
// again with the next cut). The submission is a new run of the id, with a
// new [JobRecord].Run: cuts of the id left in the local store by an
// earlier run are removed first.
func (a *Agent) Submit(spec job.Spec) (*actors.Coordinator, error) { return a.runner.submit(spec) }

// Job returns the status of a job this node coordinates.
func (a *Agent) Job(id string) (JobStatus, error) { return a.jobs.status(id) }

// Jobs returns the status of the jobs this node coordinates, oldest
// first.
func (a *Agent) Jobs() []JobStatus { return a.jobs.statuses() }

// Wait waits until a job this node coordinates has ended or ctx is done.
func (a *Agent) Wait(ctx context.Context, id string) (JobStatus, error) { return a.jobs.wait(ctx, id) }

// Cancel asks a job this node coordinates to stop; it stops at its next
// step, and its record tells the holders that it failed (they do not take
// it over).
func (a *Agent) Cancel(id string) error { return a.jobs.cancel(id) }

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
func (a *Agent) Replan(id string, r ReplanRequest) error { return a.runner.replan(id, r) }

// Records returns the records this node holds for jobs coordinated
// elsewhere, by job id.
func (a *Agent) Records() []JobRecord { return a.jobs.records() }

// Record returns the record of a job: the one this node holds, or, for a
// job it coordinates, the one it last sent (of a job that ended here and
// was submitted again elsewhere: the later run's, if held).
func (a *Agent) Record(id string) (JobRecord, error) { return a.jobs.record(id) }

// ProbeLink measures this node's link to the member called to.
func (a *Agent) ProbeLink(ctx context.Context, to string) (LinkProbeReply, error) {
	return a.links.probe(ctx, to)
}

// MeasureLink measures the link from one member to another, here or by
// asking from, unless a measurement at most maxAge old is kept
// (actors.LinkProber).
func (a *Agent) MeasureLink(ctx context.Context, from, to job.NodeInfo, maxAge time.Duration) (core.LinkMeasure, error) {
	return a.links.MeasureLink(ctx, from, to, maxAge)
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

// Status returns the node's status.
func (a *Agent) Status() Status {
	s := Status{
		Name: a.cfg.Name, Version: Version, Gossip: a.GossipAddr(), Actors: a.sys.Address(), HTTP: a.HTTPAddr(),
		DataDir: a.cfg.DataDir, Profile: toProfile(a.profile), Jobs: a.Jobs(), Records: a.Records(),
	}
	if cpus, ok := cgroup.CPUs(); ok {
		s.Profile.CPULimit = cpus
	}
	s.Members = a.members.statuses()
	return s
}

// Leave announces to the cluster that this node leaves, then stops it as
// Close does. ctx bounds the announcement.
func (a *Agent) Leave(ctx context.Context) error {
	announce := func() error { return a.members.node.Announce(ctx) }
	return a.stop(announce, func() error { return a.members.node.Leave(ctx) })
}

// Close stops the node without announcing it (others see a failure):
// new submissions are refused, the jobs it coordinates are cancelled and
// awaited, the HTTP server, the membership and the actor system stop.
// It returns once all the agent's goroutines and listeners are gone, or,
// if a job is stuck in a step, after [StopGrace] with that job's
// goroutines abandoned.
// Calling it again does nothing.
func (a *Agent) Close() error {
	return a.stop(nil, a.members.node.Close)
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
		a.jobs.close()
		a.host.Refuse() // a job that has not heard yet places no stage here
		a.cancel()
		errs = append(errs, a.api.shutdown(), leave())
		// Jobs end at their next step, submissions after planning. A job
		// stuck in a step (a stage that never answers) would hold the
		// node up to its step timeout: after StopGrace it is abandoned.
		if !a.jobs.awaitRuns(StopGrace) {
			a.log.Warn("nodes: jobs still running after the grace period; stopping under them", "grace", StopGrace)
		}
		a.stopStages(leaving)
		a.sys.Stop()
		a.links.server.Close()
		a.loops.Wait()
		if a.dirLock != nil {
			a.dirLock.Close() // releases the data dir
		}
		a.closeFiles()
		a.stopErr = errors.Join(errs...)
		a.log.Info("nodes: stopped", "err", a.stopErr)
	})
	return a.stopErr
}

// stopStages stops the stages this node hosts, once the coordinators
// elsewhere moved them away if it is leaving.
func (a *Agent) stopStages(leaving bool) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if err := a.host.Close(ctx); err != nil {
		a.log.Warn("nodes: stages did not stop", "err", err)
	}
	cancel()
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

// cgroupQuota is the CPU quota of the node's cgroup now.
func cgroupQuota() balance.Quota {
	cpus, held := cgroup.Throttled()
	return balance.Quota{CPUs: cpus, Held: held}
}
