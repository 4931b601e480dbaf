package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/clock"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/core"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// CoordinatorConfig configures a [Coordinator].
type CoordinatorConfig struct {
	Control   Control
	DataPlane dataplane.DataPlane
	// HandshakeTimeout bounds each of the coordinator's link dials and
	// handshakes (0: the data plane's default).
	HandshakeTimeout time.Duration
	// Nodes are the live members the job may use at its start; later
	// changes come as events (Members, NodeFailed).
	Nodes []job.NodeInfo
	// GFLOPS is this node's GEMM speed between the throttles of a CPU
	// quota (balance.MeasureGEMMBurst), on the backend the nodes measured
	// their GFLOPS with: the speed the layer profile measured here runs
	// at (see core.Config.GFLOPS).
	GFLOPS float64
	// Threads this node profiles with (0: all CPUs).
	Threads int
	// Quota, if set, reads the CPU quota this process runs under when a
	// profile is taken (balance.ProfileOptions.Quota); it may change while
	// the node runs.
	Quota func() balance.Quota
	// Profile, if set, is the layer profile to plan with instead of one
	// measured here (tests: balance.Analytic, for plans that do not
	// depend on timing).
	Profile *balance.ModelProfile
	Logger  *slog.Logger
	// Timeout bounds each control request (default 2 min); a step may take
	// StepTimeout (default 10 min) until a few steps are measured, then ten
	// times the median step (at least 3 s).
	Timeout, StepTimeout time.Duration
	// Store, if set, keeps the consistent cuts on disk; Replicas, if set,
	// then keeps a copy of each beyond this node (see Replicator).
	Store    *tensorio.Store
	Replicas Replicator
	// Resume, if set, is a cut of this job to continue from; Generation,
	// if set, is the first plan generation to use, above any a
	// predecessor used; Takeover says this node takes the job over from a
	// coordinator that died (with or without a cut).
	Resume     *tensorio.Checkpoint
	Generation uint64
	Takeover   bool
	// OnStep, if set, is called after every completed step (on the
	// coordinator's goroutine: it must not block). What it asks for
	// (RequestReplan) happens at the boundary after the next step.
	OnStep func(step int)
	// Clock is the time (default the wall clock).
	Clock clock.Clock
	// Self is this node's name: the coordinator feeds the stages from it.
	Self string
	// Links, if set, measures the links between nodes the core asks for
	// (core.Probe); without it no link is measured and the plan assumes
	// balance.DefaultLink.
	Links LinkProber
}

// LinkProber measures the link from one node to another, or returns a
// measurement at most maxAge old: nodes probe over their data-plane hosts;
// tests use a twin.
type LinkProber interface {
	MeasureLink(ctx context.Context, from, to job.NodeInfo, maxAge time.Duration) (core.LinkMeasure, error)
}

// Coordinator runs one pipelined job on this node: the driver around the
// job's pure core (core.Core), doing the I/O the core asks for. It spawns
// the stages of each plan on their nodes through the control plane, wires
// their data-plane links, feeds the micro-batches (inputs to the entry
// stages, labels to the loss stage), gathers the stages' state into its
// own model for each cut, persists cuts in the background, moves state
// between plans, and stops stages; each outcome and the cluster's news go
// back to the core as events. Run is its loop, on one goroutine; the
// other methods are safe for concurrent use.
type Coordinator struct {
	cfg     CoordinatorConfig
	core    *core.Core
	job     *job.Job
	checked job.Checked // the spec the stages get
	spec    job.Spec    // c.job.Spec
	// clipOrder names, with gradient clipping, the model's trainable
	// tensors (a tied one once) in the order their sums of squares add.
	clipOrder []string
	log       *slog.Logger
	clk       clock.Clock

	// The latest cut: the coordinator's model holds its weights, copt its
	// optimizer state.
	copt  nn.Optimizer
	twins map[*nn.Tensor]*nn.Tensor // where a gather receives each state tensor

	sets map[uint64]*stageSet // the stages started, by generation
	op   *operation           // the operation in flight, if any

	batches []nn.Batch   // micro-batches, reused step after step
	labels  []*nn.Tensor // their labels as sent

	persisting sync.WaitGroup // a cut being written and copied
	detached   sync.WaitGroup // cancelled operations not waited for

	meter jobMeter // what Meter returns

	mu      sync.Mutex // guards inbox, status, plan, report, text, final, changed, runs, ended, and job once Run ends
	inbox   []core.Event
	status  job.Status
	plan    *balance.Plan   // the core's, as of its last event
	report  *balance.Report // (both replaced, never changed, by a new plan)
	text    string          // the plan described
	final   *finalWeights   // a done job's (nil: released)
	changed chan struct{}   // closed when status changes
	runs    bool
	ended   bool          // Run has returned: events are dropped
	notify  chan struct{} // a token when the inbox has events
}

// stageSet is the stages of one plan generation.
type stageSet struct {
	gen   uint64
	plan  *balance.Plan
	refs  []StageRef
	links map[int]dataplane.Link  // the coordinator's link to each stage
	sent  map[int]dataplane.Stats // what each had sent at the last step's end
	views []*nn.Stage             // the coordinator's view of each stage (for gathering)
	feeds []feed                  // stages that read graph inputs
	loss  []int                   // the loss stage of each micro-batch
	// migrate is where each stage listens for the state of its layers
	// (a direct move).
	migrate [][]*LinkAddr
}

// operation is the core's operation in flight.
type operation struct {
	gens    []uint64  // the generations of the stages it works on
	step    int       // the step it runs (RunStep), else -1
	started time.Time // when it started
	// detached: a cancelled operation that touches nothing the next one
	// uses is not waited for (starting stages on a node that does not
	// answer takes up to a request timeout).
	detached bool
	cancel   context.CancelFunc
	done     chan outcome
}

// outcome is an operation's event for the core, and the stages it
// started, if any, for the coordinator.
type outcome struct {
	ev  core.Event
	set *stageSet
}

// NewCoordinator prepares a job: it loads the data, builds the model,
// profiles it and plans it over cfg.Nodes. Nothing starts on any node
// until Run; an error here (a job too large for this node, a bad
// partition, more stages than nodes) leaves nothing behind.
func NewCoordinator(spec job.Checked, cfg CoordinatorConfig) (*Coordinator, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	cfg.Clock = clock.Or(cfg.Clock)
	be, err := spec.Spec().NewBackend(cfg.Threads)
	if err != nil {
		return nil, err
	}
	var links []core.LinkMeasure
	if spec.AutoMicroBatches() {
		if spec, cfg.Profile, links, err = chooseMicroBatches(spec, cfg, be); err != nil {
			return nil, err
		}
	}
	jb, err := spec.PrepareToCoordinate()
	if err != nil {
		return nil, err
	}
	c := &Coordinator{cfg: cfg, job: jb, checked: spec, spec: jb.Spec, log: cfg.Logger.With("job", spec.ID()), clk: cfg.Clock,
		sets: map[uint64]*stageSet{}, notify: make(chan struct{}, 1), changed: make(chan struct{})}
	if c.copt, err = c.spec.NewOptimizer(1); err != nil {
		return nil, err
	}
	if c.spec.ClipGradNorm > 0 {
		for _, p := range nn.Normed(jb.Graph.Params()) {
			c.clipOrder = append(c.clipOrder, p.Name)
		}
	}
	var resume *core.Cut
	if cfg.Resume != nil {
		if resume, err = c.loadCut(cfg.Resume); err != nil {
			return nil, err
		}
	}
	M := c.spec.MicroBatches
	c.batches, c.labels = make([]nn.Batch, M), make([]*nn.Tensor, M)
	micro := (c.spec.Batch + M - 1) / M
	prof, err := profileOf(jb, cfg, be, micro, micro)
	if err != nil {
		return nil, err
	}
	cc := coreConfig(spec, jb, prof, cfg, be)
	cc.Resume, cc.Now, cc.Links = resume, c.clk.Now(), links
	if c.core, err = core.New(cc); err != nil {
		return nil, err
	}
	c.publish()
	return c, nil
}

// profileOf is cfg.Profile, or else jb's layers measured on be at micro-
// batches of lo and hi samples.
func profileOf(jb *job.Job, cfg CoordinatorConfig, be nn.Backend, lo, hi int) (*balance.ModelProfile, error) {
	var prof *balance.ModelProfile
	if cfg.Profile != nil {
		p := *cfg.Profile
		prof = &p
	} else {
		o := balance.ProfileOptions{Sizes: []int{lo, hi}}
		if cfg.Quota != nil {
			o.Quota = cfg.Quota()
		}
		var err error
		if prof, err = balance.ProfileWith(jb.Graph, be, o); err != nil {
			return nil, fmt.Errorf("profiling %s: %w", jb.Spec.Model, err)
		}
	}
	prof.Model = jb.Spec.Model
	return prof, nil
}

// coreConfig is the core's configuration for jb planned with prof.
func coreConfig(spec job.Checked, jb *job.Job, prof *balance.ModelProfile, cfg CoordinatorConfig, be nn.Backend) core.Config {
	// What the codecs make of the inputs, for the planner: a micro-batch of
	// them, sampled.
	var b nn.Batch
	jb.Loader.Fill(0, 0, 0, &b)
	inputs := tensorio.DefaultSpeeds().Estimates(nn.F32(b.X[0]), dataplane.DefaultRate)
	cc := core.Config{Job: jb, Profile: prof, Nodes: cfg.Nodes, GFLOPS: cfg.GFLOPS, Backend: nn.Describe(be),
		Persists: cfg.Store != nil, StepTimeout: cfg.StepTimeout, Generation: cfg.Generation,
		Takeover: cfg.Takeover, Logger: cfg.Logger, Self: cfg.Self, Inputs: inputs}
	if f, err := spec.Estimate(); err == nil {
		cc.SelfMemory = f.Driver()
	}
	return cc
}

// chooseMicroBatches gives a job whose micro-batches are auto the M of
// its fastest plan on cfg.Nodes over their measured links, and returns
// the profile it planned with (the layers at the smallest micro-batch
// tried and at the whole batch) and the links, for the job's plan.
func chooseMicroBatches(spec job.Checked, cfg CoordinatorConfig, be nn.Backend) (job.Checked, *balance.ModelProfile, []core.LinkMeasure, error) {
	batch := spec.Spec().Batch
	most := job.MostMicroBatches(batch)
	probe, err := spec.WithMicroBatches(most)
	if err != nil {
		return job.Checked{}, nil, nil, err
	}
	jb, err := probe.PrepareToCoordinate()
	if err != nil {
		return job.Checked{}, nil, nil, err
	}
	prof, err := profileOf(jb, cfg, be, batch/most, batch)
	if err != nil {
		return job.Checked{}, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	links := measureLinks(ctx, cfg.Links, cfg.Logger, cfg.Nodes, core.ProbePairs(spec.Spec(), cfg.Nodes), core.LinkMaxAge)
	cancel()
	cc := coreConfig(probe, jb, prof, cfg, be)
	cc.Logger, cc.Links, cc.Now = slog.New(slog.DiscardHandler), links, cfg.Clock.Now()
	m, plan, err := core.ChooseMicroBatches(cc)
	if err != nil {
		return job.Checked{}, nil, nil, err
	}
	cfg.Logger.Info("micro-batches chosen", "job", spec.ID(), "micro_batches", m, "plan", plan, "links_measured", len(links))
	out, err := spec.WithMicroBatches(m)
	return out, prof, links, err
}

// Spec is the job's spec, its micro-batches chosen if they were auto.
func (c *Coordinator) Spec() job.Checked { return c.checked }

// Plan is the job's current plan.
func (c *Coordinator) Plan() *balance.Plan {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.plan
}

// Report is the simulator's prediction for the plan.
func (c *Coordinator) Report() *balance.Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.report
}

// Describe is a one-line summary of the plan.
func (c *Coordinator) Describe() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.text
}

// Status returns a copy of the job's progress.
func (c *Coordinator) Status() job.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// Weights returns the final weights of a job that is done (the model's
// parameters and buffers, gathered at its last cut) as the tensors of a
// weights file (job.WeightsEntries) with their metadata
// (job.Job.WeightsMeta); ErrWeightsReleased after ReleaseWeights.
func (c *Coordinator) Weights() ([]tensorio.Entry, map[string]string, error) {
	st := c.Status()
	if st.State != job.StateDone || st.Result == nil {
		return nil, nil, fmt.Errorf("actors: job %s is %s, not done: no final weights", c.spec.ID, st.State)
	}
	c.mu.Lock()
	fw := c.final
	c.mu.Unlock()
	if fw == nil {
		return nil, nil, fmt.Errorf("%w: job %s", ErrWeightsReleased, c.spec.ID)
	}
	es, err := job.WeightsEntries(fw.params, st.Result.Steps, c.spec.MicroBatches)
	if err != nil {
		return nil, nil, err
	}
	return es, fw.meta, nil
}

// finalWeights are a done job's weights: its model's parameters and
// buffers, and the weights file's metadata.
type finalWeights struct {
	params []*nn.Param
	meta   map[string]string
}

// ErrWeightsReleased: the final weights of a done job are no longer in
// memory (its last cut, on the nodes that hold it, has them).
var ErrWeightsReleased = errors.New("actors: final weights released")

// ReleaseWeights drops the final weights a done job holds in memory.
func (c *Coordinator) ReleaseWeights() {
	c.mu.Lock()
	c.final = nil
	c.mu.Unlock()
}

// release drops, once Run ends, what only a running job needs: the core,
// the data, the optimizer state and the gather's buffers; the model too
// unless the job is done with res (its weights are the job's result).
func (c *Coordinator) release(res *job.Result, done bool) {
	c.copt, c.twins, c.batches, c.labels, c.core = nil, nil, nil, nil, nil
	c.mu.Lock()
	if done && res != nil {
		c.final = &finalWeights{params: c.job.Graph.Params(), meta: c.job.WeightsMeta(*res)}
	}
	c.job = nil
	c.mu.Unlock()
}

// Changed returns a channel that is closed when the status changes next.
func (c *Coordinator) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// NodeFailed tells the coordinator that the cluster declared node name
// dead. If the plan uses it, the step in flight is abandoned at once and
// the job recovers, instead of waiting for a broken link or the step
// timeout. It does not block.
func (c *Coordinator) NodeFailed(name string) { c.post(core.NodeFailed{Name: name}) }

// Members tells the coordinator the live members the job may use now; a
// node of the plan that is not among them is leaving. It does not block.
func (c *Coordinator) Members(nodes []job.NodeInfo) { c.post(core.Members{Nodes: slices.Clone(nodes)}) }

// RequestReplan asks to move the job to partition (a partitioner's name,
// or a partition of the model over nodes, the names of the live members)
// at the next step boundary, through a cut if viaCut. A partition that
// does not fit the model is an error wrapping job.ErrSpec. It does not
// block.
func (c *Coordinator) RequestReplan(partition string, viaCut bool, nodes []string) error {
	c.mu.Lock()
	jb := c.job
	c.mu.Unlock()
	if jb == nil {
		return fmt.Errorf("actors: job %s has ended", c.spec.ID)
	}
	switch partition {
	case "auto", balance.Uniform, balance.Params, balance.Balanced, balance.GraphPP:
	default:
		if _, err := balance.ParseSpec(jb.Graph, partition, nodes); err != nil {
			return fmt.Errorf("%w: %w", job.ErrSpec, err)
		}
	}
	c.post(core.ReplanRequested{Partition: partition, ViaCut: viaCut})
	return nil
}

func (c *Coordinator) post(ev core.Event) {
	c.mu.Lock()
	if !c.ended {
		c.inbox = append(c.inbox, ev)
	}
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// Run trains the job to its end and returns the result. Cancelling ctx
// stops it: the stages are stopped and Run returns ctx's error. It may be
// called once.
func (c *Coordinator) Run(ctx context.Context) (*job.Result, error) {
	c.mu.Lock()
	if c.runs {
		c.mu.Unlock()
		return nil, errors.New("actors: the job runs already")
	}
	c.runs = true
	c.mu.Unlock()
	c.core.Start(c.clk.Now())
	var wake clock.Timer
	defer func() {
		if wake != nil {
			wake.Stop()
		}
	}()
	for {
		for _, a := range c.core.Ready() {
			switch a := a.(type) {
			case core.Finish:
				c.cancelOp()
				for gen, s := range c.sets {
					delete(c.sets, gen)
					c.stopStages(s, true)
				}
				c.persisting.Wait()
				c.detached.Wait()
				c.publish()
				c.mu.Lock()
				c.ended, c.inbox = true, nil
				c.mu.Unlock()
				c.release(a.Result, a.Err == nil)
				return a.Result, a.Err
			case core.Wake:
				if wake != nil {
					wake.Stop()
				}
				wake = c.clk.NewTimer(a.At.Sub(c.clk.Now()))
			default:
				c.exec(ctx, a)
			}
		}
		c.publish()
		var opDone <-chan outcome
		if c.op != nil {
			opDone = c.op.done
		}
		var wakeC <-chan time.Time
		if wake != nil {
			wakeC = wake.C()
		}
		select {
		case out := <-opDone:
			c.deliverInbox() // news that came while the operation ran goes first
			op := c.op
			c.op = nil
			op.cancel() // its context ends with it
			if out.set != nil {
				c.sets[out.set.gen] = out.set
			}
			if err := ctx.Err(); err != nil {
				// The cancel cut the operation short: its outcome is not
				// the job's (a probe cut short finds no live node).
				c.core.Cancel(c.clk.Now(), err)
			}
			now := c.clk.Now()
			before := c.core.Status().Step
			c.core.Step(now, out.ev)
			if e, ok := out.ev.(core.StepFinished); ok && e.Err == nil && c.core.Status().Step != before {
				c.meter.step(now.Sub(op.started), c.sets[op.gens[0]], e.Timings)
				if c.cfg.OnStep != nil {
					c.cfg.OnStep(op.step + 1)
				}
			}
		case <-c.notify:
			c.deliverInbox()
		case <-wakeC:
			wake = nil
			c.core.Tick(c.clk.Now())
		case <-ctx.Done():
			c.core.Cancel(c.clk.Now(), ctx.Err())
		}
	}
}

// deliverInbox gives the core the events posted to the coordinator.
func (c *Coordinator) deliverInbox() {
	c.mu.Lock()
	evs := c.inbox
	c.inbox = nil
	c.mu.Unlock()
	for _, ev := range evs {
		c.core.Step(c.clk.Now(), ev)
	}
}

// publish makes the core's status and plan the ones the coordinator's
// methods return.
func (c *Coordinator) publish() {
	st, plan, report, text := c.core.Status(), c.core.Plan(), c.core.Report(), c.core.Describe()
	c.mu.Lock()
	c.status, c.plan, c.report, c.text = st, plan, report, text
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// exec carries out one action of the core.
func (c *Coordinator) exec(ctx context.Context, a core.Action) {
	switch a := a.(type) {
	case core.StopStages:
		if c.op != nil && slices.Contains(c.op.gens, a.Gen) {
			c.cancelOp()
		}
		if s := c.sets[a.Gen]; s != nil {
			delete(c.sets, a.Gen)
			c.stopStages(s, a.Wait)
		}
	case core.Probe:
		c.start(ctx, nil, func(ctx context.Context) outcome {
			live := c.probe(ctx, a.Nodes)
			maxAge := core.LinkMaxAge
			if a.Fresh {
				maxAge = 0
			}
			return outcome{ev: core.Probed{Op: a.Op, Live: live, Links: measureLinks(ctx, c.cfg.Links, c.log, live, a.Links, maxAge)}}
		})
	case core.StartStages:
		c.start(ctx, []uint64{a.Gen}, func(ctx context.Context) outcome {
			s, params, err := c.startStages(ctx, a)
			return outcome{ev: core.StagesStarted{Op: a.Op, Params: params, Err: err}, set: s}
		})
		c.op.detached = true
	case core.Restore:
		s := c.sets[a.Gen]
		c.start(ctx, []uint64{a.Gen}, func(context.Context) outcome {
			return outcome{ev: core.StateLoaded{Op: a.Op, Err: c.restore(s, a.Step)}}
		})
	case core.Move:
		news, olds := c.sets[a.Gen], c.sets[a.From]
		c.start(ctx, []uint64{a.Gen, a.From}, func(ctx context.Context) outcome {
			moved, err := c.move(ctx, news, olds, a)
			return outcome{ev: core.StateLoaded{Op: a.Op, Moved: moved, Err: err}}
		})
	case core.RunStep:
		s := c.sets[a.Gen]
		c.start(ctx, []uint64{a.Gen}, func(ctx context.Context) outcome { return outcome{ev: c.step(ctx, s, a)} })
		c.op.step = a.Step
	case core.TakeCut:
		s := c.sets[a.Gen]
		c.start(ctx, []uint64{a.Gen}, func(ctx context.Context) outcome { return outcome{ev: c.takeCut(ctx, s, a)} })
	default:
		c.log.Error("actors: an action the coordinator does not know", "action", fmt.Sprintf("%T", a))
	}
}

// start runs an operation on a goroutine of its own; its outcome comes
// back through c.op.done. An operation still in flight is cancelled
// first: one runs at a time.
func (c *Coordinator) start(ctx context.Context, gens []uint64, run func(context.Context) outcome) {
	c.cancelOp()
	ctx, cancel := context.WithCancel(ctx)
	op := &operation{gens: gens, step: -1, started: c.clk.Now(), cancel: cancel, done: make(chan outcome, 1)}
	c.op = op
	go func() { op.done <- run(ctx) }()
}

// cancelOp cancels the operation in flight and waits for it to end
// (unless it is detached); its outcome is dropped (the core no longer
// waits for it), and stages it started are stopped.
func (c *Coordinator) cancelOp() {
	op := c.op
	if op == nil {
		return
	}
	c.op = nil
	op.cancel()
	if op.detached {
		c.detached.Go(func() {
			if out := <-op.done; out.set != nil {
				c.stopStages(out.set, false)
			}
		})
		return
	}
	if op.step >= 0 {
		// A step ends with its context and leaves its stages be: a
		// recovery may take the state of those that survive. Only a step
		// stuck on a link has its links closed.
		t := c.clk.NewTimer(2 * time.Second)
		defer t.Stop()
		select {
		case <-op.done:
			return
		case <-t.C():
		}
	}
	// Closing the links of its stages ends any transfer it waits on.
	for _, gen := range op.gens {
		if s := c.sets[gen]; s != nil {
			for _, lk := range s.links {
				lk.Close()
			}
		}
	}
	if out := <-op.done; out.set != nil {
		c.stopStages(out.set, false)
	}
}

// stopStages stops the stages of s: the one way stages stop. With wait,
// each is asked to stop and waited for (bounded), then the coordinator's
// links to them close (a stage whose coordinator link closes stops by
// itself, and would not answer); without, the links close at once and the
// stages are told to stop.
func (c *Coordinator) stopStages(s *stageSet, wait bool) {
	h := &Header{JobId: c.spec.ID, Generation: s.gen}
	if !wait {
		for _, lk := range s.links {
			lk.Close()
		}
	}
	var wg sync.WaitGroup
	for _, ref := range s.refs {
		if ref == (StageRef{}) {
			continue
		}
		if !wait {
			_ = c.cfg.Control.Send(ref, &StopStage{Header: h})
			continue
		}
		wg.Go(func() {
			if err := c.stopAndWait(ref, h); err != nil {
				c.log.Warn("stopping a stage", "stage", ref.String(), "generation", s.gen, "err", err)
			}
		})
	}
	wg.Wait()
	for _, lk := range s.links {
		lk.Close()
	}
}

// stopAndWait asks a stage to stop and waits for its answer, at most
// 10 s, or until its node does not answer a ping: the stages of a node
// that is gone are gone, and a request to it would only time out. A node
// that answers is pinged again every second while the answer is due: it
// may stop meanwhile, and the request with it.
func (c *Coordinator) stopAndWait(ref StageRef, h *Header) error {
	answer := make(chan error, 1)
	go func() {
		_, err := c.cfg.Control.Request(ref, &StopStage{Header: h}, 10*time.Second)
		answer <- err
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		pinged := make(chan error, 1)
		go func() { pinged <- c.cfg.Control.Ping(ctx, ref.Addr, 10*time.Second) }()
		select {
		case err := <-answer:
			return err
		case err := <-pinged:
			if err != nil {
				return fmt.Errorf("its node is gone: %w", err)
			}
		}
		t := c.clk.NewTimer(time.Second)
		select {
		case err := <-answer:
			t.Stop()
			return err
		case <-t.C():
		}
	}
}

// loadCut makes a checkpoint of this job the coordinator's latest cut.
func (c *Coordinator) loadCut(ck *tensorio.Checkpoint) (*core.Cut, error) {
	if ck.JobID != c.spec.ID {
		return nil, fmt.Errorf("checkpoint of job %q, this is job %q", ck.JobID, c.spec.ID)
	}
	if ck.Step < 0 || ck.Step > int64(c.job.Total) {
		return nil, fmt.Errorf("checkpoint at step %d of a %d-step job", ck.Step, c.job.Total)
	}
	meta, err := job.ParseCutMeta(ck.Meta)
	if err != nil {
		return nil, fmt.Errorf("checkpoint of step %d: %w", ck.Step, err)
	}
	params := map[string]*nn.Tensor{}
	for _, p := range ck.Params {
		params[p.Name] = p.T
	}
	optim := map[[2]string]*nn.Tensor{}
	for _, o := range ck.Optim {
		optim[[2]string{o.Param, o.Slot}] = o.T
	}
	load := func(what string, dst, src *nn.Tensor) error {
		if src == nil {
			return fmt.Errorf("checkpoint of step %d has no %s", ck.Step, what)
		}
		if !nn.SameShape(dst.Shape(), src.Shape()) {
			return fmt.Errorf("checkpoint's %s has shape %v, the model's %v", what, src.Shape(), dst.Shape())
		}
		copy(nn.F32(dst), nn.F32(src))
		return nil
	}
	for _, p := range c.job.Graph.Params() {
		if err := load(p.Name, p.Value, params[p.Name]); err != nil {
			return nil, err
		}
		if p.Trainable() && ck.Step > 0 {
			for slot, t := range c.copt.State(p) {
				if err := load(p.Name+" "+slot, t, optim[[2]string{p.Name, slot}]); err != nil {
					return nil, err
				}
			}
		}
	}
	return &core.Cut{Step: int(ck.Step), Progress: core.Progress{Loss: meta.TrainLoss, Correct: meta.TrainCorrect, Seen: meta.TrainSeen}}, nil
}

// checkpointFile describes the cut after step g, gathered from the stages
// of s, as a whole-model tensorio checkpoint.
func (c *Coordinator) checkpointFile(s *stageSet, g int, acc core.Progress) *tensorio.Checkpoint {
	meta := job.CutMeta{Model: c.spec.Model, Optimizer: c.spec.Optimizer, Generation: s.gen, MicroBatches: c.spec.MicroBatches,
		TrainLoss: acc.Loss, TrainCorrect: acc.Correct, TrainSeen: acc.Seen, Layouts: map[string][]int{}, Aliases: map[string][]string{}}
	ck := &tensorio.Checkpoint{JobID: c.spec.ID, Step: int64(g), PlanHash: s.plan.Hash(),
		Data: tensorio.DataPos{Epoch: int64(g / c.job.StepsPerEpoch), Step: int64(g % c.job.StepsPerEpoch)}}
	for _, p := range nn.SortByName(nn.Unique(c.job.Graph.Params())) { // a tied tensor once
		ck.Params = append(ck.Params, tensorio.Named{Name: p.Name, T: p.Value})
		if p.Layout != nil { // for ckpt export
			meta.Layouts[p.Name] = p.Layout
		}
		if p.Aliases != nil {
			meta.Aliases[p.Name] = p.Aliases
		}
		if p.Trainable() {
			st := c.copt.State(p)
			for _, k := range slices.Sorted(maps.Keys(st)) {
				ck.Optim = append(ck.Optim, tensorio.OptimState{Param: p.Name, Slot: k, T: st[k]})
			}
		}
	}
	ck.Meta = meta.Encode()
	return ck
}

// feedTargets returns the stages of p that read the graph input and the
// stage that computes the loss of each micro-batch (with replicas, the
// replica that runs it).
func feedTargets(p *balance.Plan) (feeds []feed, loss []int) {
	loss = make([]int, p.MicroBatches)
	for k, sp := range p.Stages {
		var f *feed
		for _, in := range sp.Program {
			switch {
			case in.Op == balance.OpRecvAct && in.Peer == balance.Coordinator:
				if f == nil {
					feeds = append(feeds, feed{stage: k, inputs: in.Tensors, micros: make([]bool, p.MicroBatches)})
					f = &feeds[len(feeds)-1]
				}
				f.micros[in.Micro] = true
			case in.Op == balance.OpLoss:
				loss[in.Micro] = k
			}
		}
	}
	return feeds, loss
}

// feed is a stage that reads graph inputs, which, and for which
// micro-batches.
type feed struct {
	stage  int
	inputs []string
	micros []bool
}

func labelTensor(y []float32, t *nn.Tensor) *nn.Tensor {
	if t == nil || nn.Size(t.Shape()) != len(y) {
		t = nn.New(len(y))
	}
	copy(nn.F32(t), y)
	return t
}
