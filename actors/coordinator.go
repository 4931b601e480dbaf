package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
	"google.golang.org/protobuf/proto"
)

// CoordinatorConfig configures a [Coordinator].
type CoordinatorConfig struct {
	System    *System
	DataPlane dataplane.DataPlane
	// Nodes are the nodes the job may use.
	Nodes []job.NodeInfo
	// GFLOPS is this node's GEMM speed between the throttles of a CPU
	// quota (balance.MeasureGEMMBurst), on the backend the nodes measured
	// their GFLOPS with: the speed the layer profile measured here runs
	// at. A node's speed is its GFLOPS (sustained, over whole quota
	// periods) over this (0: all nodes count as equally fast).
	GFLOPS float64
	// Threads this node profiles with (0: all CPUs).
	Threads int
	Logger  *slog.Logger
	// Timeout bounds each control request (default 2 min); a step may take
	// StepTimeout (default 10 min) until a few steps are measured, then ten
	// times the median step (at least 3 s).
	Timeout, StepTimeout time.Duration
	// LiveNodes, if set, lists the nodes a recovery may re-plan over (the
	// cluster's live members); otherwise Nodes. Either way only nodes that
	// answer a ping are used.
	LiveNodes func() []job.NodeInfo
	// Store, if set, keeps the consistent cuts on disk; Replicate, if
	// set, then sends each cut to another node (a copy that outlives this
	// node).
	Store     *tensorio.Store
	Replicate func(*tensorio.Checkpoint) error
	// Resume, if set, is a cut of this job to continue from (a coordinator
	// taking a job over); Generation, if set, is the first plan generation
	// to use, above any a predecessor used (with or without a cut).
	Resume     *tensorio.Checkpoint
	Generation uint64
	// OnStep, if set, is called after every completed step (on the
	// coordinator's goroutine: it must not block).
	OnStep func(step int)
}

// Coordinator owns one pipelined job (DESIGN.md, "One training step"): it
// plans the job over the nodes, spawns a stage actor per stage on its
// node, wires their data-plane links, feeds micro-batches (inputs to the
// entry stages, labels to the loss stage), runs the steps, collects loss
// and timings, and gathers the weights to evaluate them. It talks to the
// stage actors by request and reply through the node's actor System; its
// own loop is a goroutine, Run.
type Coordinator struct {
	cfg  CoordinatorConfig
	job  *job.Job
	spec job.Spec
	log  *slog.Logger

	prof   *balance.ModelProfile
	cl     *balance.Cluster // the cluster the plan was made for
	plan   *balance.Plan
	report *balance.Report
	text   string // the plan's partition as a description
	gen    uint64

	copt    nn.Optimizer // the latest cut's optimizer state
	cut     cut
	cutCost time.Duration // what the last cut cost the pipeline
	// cutMeasured is what the last cut measurably cost the steps around
	// it (see cutWindow; 0: not measured).
	cutMeasured time.Duration
	// persisted is closed when the last cut has been written and
	// copied, or failed to be (closed already without a store).
	persisted chan struct{}
	stateSize int64 // bytes of parameters and optimizer state (0: not counted yet)
	// persistTime is how long the last cut took to write and replicate
	// (guarded by mu).
	persistTime time.Duration
	// replanCheck follows the last re-plan's steps (train's goroutine
	// only).
	replanCheck replanCheck

	known      map[string]job.NodeInfo // every node seen, by name
	speed      map[string]float64      // measured node speeds (see observe)
	planStep   int                     // the step the current plan started at
	streak     int                     // evaluations in a row that favoured a new plan
	persisting sync.WaitGroup          // a cut being written to the store

	xs     []*nn.Tensor // micro-batches and labels, reused step after step
	ys     [][]int32
	labels []*nn.Tensor

	feeds     []int // stages that read the graph input
	lossStage int
	pids      []*actor.PID
	links     map[int]dataplane.Link // to each stage
	stages    []*nn.Stage            // the coordinator's view of each stage (for gathering)

	mu     sync.Mutex
	status job.Status
	inPlan map[string]bool // nodes of the current plan, and the previous one while moving (guarded by mu)
	failed chan string     // nodes reported dead while in the plan

	// Seams for tests and measurements: viaCut makes plan changes go
	// through a cut (gather into the coordinator, restore from it) instead
	// of moving state directly; onMove, if set, is called once a direct
	// move has started the new stages, before any state moves; requested
	// is a partition to move to at the next step boundary.
	viaCut    bool
	onMove    func()
	requested string
}

// NewCoordinator prepares a job: it checks the spec, loads the data,
// builds the model, profiles it and plans it over cfg.Nodes. Nothing
// starts on any node until Run; an error here (a bad spec, a bad
// partition, more stages than nodes) leaves nothing behind.
func NewCoordinator(spec job.Spec, cfg CoordinatorConfig) (*Coordinator, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 10 * time.Minute
	}
	if spec.ID == "" {
		return nil, specErr("no job id")
	}
	if len(cfg.Nodes) == 0 {
		return nil, specErr("no nodes to run on")
	}
	if err := spec.Normalize(); err != nil {
		return nil, err
	}
	jb, err := spec.Prepare()
	if err != nil {
		return nil, err
	}
	c := &Coordinator{cfg: cfg, job: jb, spec: jb.Spec, log: cfg.Logger.With("job", spec.ID), gen: 1, failed: make(chan string, 16),
		speed: map[string]float64{}, known: map[string]job.NodeInfo{}}
	c.status = job.Status{ID: spec.ID, State: job.StatePlanning, Model: spec.Model, Total: jb.Total, Started: time.Now()}
	if c.copt, err = c.spec.NewOptimizer(1); err != nil {
		return nil, err
	}
	if cfg.Resume != nil {
		if err := c.loadCut(cfg.Resume); err != nil {
			return nil, err
		}
	}
	c.gen = max(cfg.Generation, 1) // a successor's, with or without a cut
	M := c.spec.MicroBatches
	c.xs, c.ys, c.labels = make([]*nn.Tensor, M), make([][]int32, M), make([]*nn.Tensor, M)
	be, err := c.spec.NewBackend(cfg.Threads)
	if err != nil {
		return nil, err
	}
	micro := (c.spec.Batch + M - 1) / M
	if c.prof, err = balance.Profile(jb.Graph, micro, be); err != nil {
		return nil, fmt.Errorf("profiling %s: %w", spec.Model, err)
	}
	c.prof.Model = spec.Model
	if err := c.makePlan(cfg.Nodes); errors.Is(err, balance.ErrNoFit) {
		return nil, fmt.Errorf("%w: %w", job.ErrSpec, err)
	} else if err != nil {
		return nil, err
	}
	return c, nil
}

// makePlan searches a plan over nodes with the job's profile.
func (c *Coordinator) makePlan(nodes []job.NodeInfo) error {
	cl := c.clusterOf(nodes)
	res, err := c.search(cl)
	if err != nil {
		return err
	}
	return c.adopt(res, cl)
}

// clusterOf describes nodes to the planner: the fastest first, at most
// MaxNodes, each at its measured speed if it ran a stage of this job, else
// at its GEMM speed relative to this node's.
func (c *Coordinator) clusterOf(nodes []job.NodeInfo) *balance.Cluster {
	for _, n := range nodes {
		c.known[n.Name] = n
	}
	nodes = slices.Clone(nodes)
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].GFLOPS > nodes[j].GFLOPS })
	if m := c.spec.MaxNodes; m > 0 && len(nodes) > m {
		nodes = nodes[:m]
	}
	cl := &balance.Cluster{DefaultLink: balance.DefaultLink}
	for _, n := range nodes {
		np := balance.NodeProfile{Name: n.Name, Memory: n.Memory, Speed: c.gemmSpeed(n)}
		if v, ok := c.speed[n.Name]; ok {
			np.Speed = v
		}
		cl.Nodes = append(cl.Nodes, np)
	}
	return cl
}

// gemmSpeed is n's speed relative to the profile from GEMM speeds: its
// sustained one (measured at its start over whole CPU-quota periods) over
// this node's between throttles (the speed the profile's median layer
// timings ran at), so that quotas count. Without them it is 1.
func (c *Coordinator) gemmSpeed(n job.NodeInfo) float64 {
	if n.GFLOPS > 0 && c.cfg.GFLOPS > 0 {
		return n.GFLOPS / c.cfg.GFLOPS
	}
	return 1
}

// search finds the best plan for cl with the job's partitioner.
func (c *Coordinator) search(cl *balance.Cluster) (*balance.Result, error) {
	return c.searchWith(cl, c.spec.Partition)
}

// searchWith finds the best plan for cl with partitioner part (a
// partitioner's name or a partition).
func (c *Coordinator) searchWith(cl *balance.Cluster, part string) (*balance.Result, error) {
	s := c.spec
	if part == "auto" {
		part = balance.GraphPP
	}
	res, err := balance.Search(c.job.Graph, c.prof, cl, balance.Options{
		Partitioner: part, Schedule: s.Schedule, Batch: s.Batch, MicroBatches: s.MicroBatches,
		Optimizer: s.Optimizer, Model: s.Model,
	})
	if errors.Is(err, balance.ErrNoFit) {
		// The nodes, not the spec: a recovery waits for more (see
		// replan); a new job is refused (see NewCoordinator).
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", job.ErrSpec, err)
	}
	for _, sp := range res.Plan.Stages {
		if !slices.ContainsFunc(cl.Nodes, func(n balance.NodeProfile) bool { return n.Name == sp.Node }) {
			return nil, specErr("the plan puts stage %d on %q, which is not a node of this job", sp.ID, sp.Node)
		}
	}
	return res, nil
}

// adopt makes res, planned for cl, the job's plan (its stages start with
// the next start).
func (c *Coordinator) adopt(res *balance.Result, cl *balance.Cluster) error {
	stages := make([]*nn.Stage, 0, len(res.Plan.Stages))
	for _, sp := range res.Plan.Stages {
		st, err := c.job.Graph.Stage(sp.Layers)
		if err != nil {
			return err
		}
		stages = append(stages, st)
	}
	c.plan, c.report, c.text, c.cl, c.stages = res.Plan, res.Report, res.Spec, cl, stages
	c.feeds, c.lossStage = feedTargets(res.Plan)
	c.mu.Lock()
	c.status.Plan, c.status.Schedule, c.status.MicroBatches = c.text, c.plan.Schedule.String(), c.plan.MicroBatches
	c.status.PredictedMS = c.report.StepTime * 1e3
	c.status.Stages = nil
	c.inPlan = map[string]bool{}
	for _, sp := range c.plan.Stages {
		c.inPlan[sp.Node] = true
		c.status.Stages = append(c.status.Stages, job.StageStatus{ID: sp.ID, Node: sp.Node, Layers: layerRange(sp.Layers)})
	}
	c.mu.Unlock()
	return nil
}

func layerRange(ls []string) string {
	if len(ls) == 1 {
		return ls[0]
	}
	return ls[0] + "-" + ls[len(ls)-1]
}

// NodeFailed tells the coordinator that the cluster declared node name
// dead. If the current plan uses it, the step in flight fails at once and
// recovery starts, instead of waiting for a broken link or the step
// timeout. Safe to call from any goroutine; it does not block.
func (c *Coordinator) NodeFailed(name string) {
	c.mu.Lock()
	used := c.inPlan[name]
	c.mu.Unlock()
	if used {
		select {
		case c.failed <- name:
		default:
		}
	}
}

// Plan is the job's plan.
func (c *Coordinator) Plan() *balance.Plan { return c.plan }

// Report is the simulator's prediction for the plan.
func (c *Coordinator) Report() *balance.Report { return c.report }

// Status returns a copy of the job's progress; it is safe to call at any
// time.
func (c *Coordinator) Status() job.Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.status
	s.Stages = slices.Clone(s.Stages)
	s.Accuracy = slices.Clone(s.Accuracy)
	s.Recoveries = slices.Clone(s.Recoveries)
	s.Replans = slices.Clone(s.Replans)
	return s
}

func (c *Coordinator) setState(state job.State, reason string) {
	c.mu.Lock()
	c.status.State, c.status.Reason = state, reason
	c.mu.Unlock()
}

func (c *Coordinator) header() *Header { return &Header{JobId: c.spec.ID, Generation: c.gen} }

// node is what the coordinator last learnt about a node.
func (c *Coordinator) node(name string) job.NodeInfo { return c.known[name] }

// Run trains the job to its end and returns the result. Cancelling ctx
// stops it: the stages are stopped and Run returns ctx's error.
func (c *Coordinator) Run(ctx context.Context) (res *job.Result, err error) {
	defer func() {
		c.teardown()
		c.mu.Lock()
		if err != nil {
			c.status.State, c.status.Reason, c.status.Error = job.StateFailed, "", err.Error()
		} else {
			c.status.State, c.status.Reason, c.status.Result = job.StateDone, "", res
		}
		c.mu.Unlock()
	}()
	c.setState(job.StateStarting, "")
	if err := c.start(); err != nil {
		return nil, err
	}
	if err := c.restoreAll(); err != nil {
		return nil, err
	}
	c.setState(job.StateTraining, "")
	return c.train(ctx)
}

// start spawns, sets up and connects the stages.
func (c *Coordinator) start() error {
	_, err := c.startStages(nil)
	return err
}

// startStages spawns, sets up and connects the stages; sources, if set,
// are where each stage's layers' state will come from (see migrate). It
// returns the addresses at which each stage listens for that state.
func (c *Coordinator) startStages(sources [][]StateSource) ([][]*LinkAddr, error) {
	S := len(c.plan.Stages)
	c.pids = make([]*actor.PID, S)
	c.links = map[int]dataplane.Link{}
	listen := make([][]*LinkAddr, S)
	migrate := make([][]*LinkAddr, S)
	err := c.forEachStage(func(k int) error {
		sp := c.plan.Stages[k]
		addr := c.node(sp.Node).ActorAddr
		pid, err := c.cfg.System.SpawnRemote(addr, &SpawnStage{Header: c.header(), Kind: StageKind, Stage: int32(k)}, c.cfg.Timeout)
		if err != nil {
			return fmt.Errorf("stage %d on %s: %w", k, sp.Node, err)
		}
		c.pids[k] = pid
		spec := StageSpec{Job: c.spec, Generation: c.gen, Input: c.job.Set.Train.Shape,
			Classes: c.job.Set.Classes, Graph: c.plan.Graph, Plan: sp}
		if sources != nil {
			spec.Sources = sources[k]
		}
		b, err := marshalStageSpec(spec)
		if err != nil {
			return err
		}
		r, err := c.request(pid, &SetupStage{Header: c.header(), Spec: b}, c.cfg.Timeout)
		if err != nil {
			return fmt.Errorf("setting up stage %d on %s: %w", k, sp.Node, err)
		}
		rep, ok := r.(*SetupStageReply)
		if !ok {
			return fmt.Errorf("stage %d: unexpected reply %s", k, proto.MessageName(r))
		}
		if rep.GetError() != "" {
			return fmt.Errorf("stage %d on %s: %s", k, sp.Node, rep.GetError())
		}
		listen[k], migrate[k] = rep.GetListen(), rep.GetMigrate()
		c.mu.Lock()
		c.status.Stages[k].Params = rep.GetParams()
		c.mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The coordinator dials its link to every stage first; then every
	// stage dials its downstream links and waits for its incoming ones.
	dials := make([][]*LinkAddr, S)
	for k := range S {
		for _, la := range listen[k] {
			from := int(la.GetFrom())
			if from == balance.Coordinator {
				h := dataplane.Hello{JobID: c.spec.ID, Generation: c.gen, Link: linkID(from, k), From: stageWire(from), To: stageWire(k)}
				lk, err := c.cfg.DataPlane.Dial(la.GetAddr(), h, dataplane.Options{IOTimeout: c.cfg.StepTimeout})
				if err != nil {
					return nil, fmt.Errorf("coordinator link to stage %d: %w", k, err)
				}
				c.links[k] = lk
				continue
			}
			if from < 0 || from >= S {
				return nil, fmt.Errorf("stage %d listens for a link from unknown stage %d", k, from)
			}
			dials[from] = append(dials[from], la)
		}
		if c.links[k] == nil {
			return nil, fmt.Errorf("stage %d has no link from the coordinator", k)
		}
	}
	return migrate, c.forEachStage(func(k int) error {
		r, err := c.request(c.pids[k], &ConnectStage{Header: c.header(), Dial: dials[k]}, c.cfg.Timeout)
		if err != nil {
			return fmt.Errorf("connecting stage %d: %w", k, err)
		}
		if err := ackErr(k, r); err != nil {
			return fmt.Errorf("connecting %w", err)
		}
		return nil
	})
}

func ackErr(k int, r proto.Message) error {
	a, ok := r.(*Ack)
	if !ok {
		return fmt.Errorf("stage %d: unexpected reply %s", k, proto.MessageName(r))
	}
	if !a.GetOk() {
		return fmt.Errorf("stage %d: %s", k, a.GetError())
	}
	return nil
}

// forEachStage runs f for every stage concurrently and returns the first
// error by stage order.
func (c *Coordinator) forEachStage(f func(k int) error) error {
	errs := make([]error, len(c.plan.Stages))
	var wg sync.WaitGroup
	for k := range c.plan.Stages {
		wg.Go(func() { errs[k] = f(k) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (c *Coordinator) request(pid *actor.PID, msg proto.Message, timeout time.Duration) (proto.Message, error) {
	return c.cfg.System.Request(pid, msg, timeout)
}

// progressAcc is what the result accumulates over steps; a cut keeps a
// copy so that replayed steps are not counted twice.
type progressAcc struct {
	last          float64
	correct, seen int64
}

// cut is the latest consistent cut: the state after steps steps, held in
// the coordinator's model and c.copt (steps 0: the initial state, which
// every stage rebuilds from the seed).
type cut struct {
	steps int
	acc   progressAcc
}

// train runs the steps from the latest cut to the end, evaluating at the
// end (and at epoch ends if the spec asks). A failed step starts recovery:
// re-plan over the live nodes, restore the cut, replay.
func (c *Coordinator) train(ctx context.Context) (*job.Result, error) {
	j, s := c.job, c.spec
	K, autoK := s.CheckpointEvery, s.CheckpointEvery == 0
	setK := func(k int) {
		K = k
		c.mu.Lock()
		c.status.CheckpointEvery = k
		c.mu.Unlock()
	}
	if autoK {
		// K follows from a cut's cost (estimated until one is measured)
		// once a few steps are timed.
		K = math.MaxInt
	} else {
		setK(K)
	}
	var (
		acc   = c.cut.acc
		steps []float64
		run   time.Duration // training time, recoveries included
		win   cutWindow     // measuring the last cut's cost
	)
	for g := c.cut.steps; g < j.Total; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t0 := time.Now()
		var err error
		if n := len(steps); autoK && n >= autoKSteps && (c.cutCost == 0 && n&(n-1) == 0 || g-c.cut.steps == K/2) {
			// Until the first cut, at 4, 8, 16... steps timed (the first
			// ones are slow); after a cut, halfway to the next, when its
			// writing and replication has likely ended.
			setK(chooseK(c.expectedCutCost(), median(steps)))
		}
		if g-c.cut.steps >= K {
			if _, err = c.checkpoint(g, acc); err == nil && autoK && len(steps) >= autoKSteps {
				med := median(steps)
				setK(chooseK(c.expectedCutCost(), med))
				win = cutWindow{open: true, start: len(steps), med: med, persisted: c.persisted}
			}
		}
		var loss float64
		var timings []*StageTiming
		if err == nil {
			loss, timings, err = c.step(ctx, g, steps, &acc)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			run += time.Since(t0)
			if err := c.recover(ctx, g, t0, err); err != nil {
				return nil, err
			}
			g, acc = c.cut.steps, c.cut.acc
			win.open, c.replanCheck.active = false, false
			continue
		}
		dt := time.Since(t0)
		run += dt
		steps = append(steps, dt.Seconds())
		c.followReplan(steps)
		if cost, ok := win.measure(steps); ok {
			c.cutMeasured = max(cost, c.cutCost)
			c.mu.Lock()
			c.status.CutCostMS = float64(c.cutMeasured.Microseconds()) / 1e3
			c.mu.Unlock()
			setK(chooseK(c.expectedCutCost(), median(steps)))
		}
		acc.last = loss
		g++
		c.recordStep(g, loss, float64(g*s.Batch)/run.Seconds(), timings)
		if c.cfg.OnStep != nil {
			c.cfg.OnStep(g)
		}
		c.observe(timings)
		if err := c.maybeRebalance(ctx, g, acc, steps); err != nil {
			var re errRecover
			if !errors.As(err, &re) {
				return nil, err
			}
			if err := c.recover(ctx, g, time.Now(), err); err != nil {
				return nil, err
			}
			g, acc = c.cut.steps, c.cut.acc
			win.open, c.replanCheck.active = false, false
			continue
		}
		if s.EvalEachEpoch && g%j.StepsPerEpoch == 0 && g < j.Total {
			acc, err := c.evaluate(g, acc)
			if err != nil {
				return nil, err
			}
			c.mu.Lock()
			c.status.Accuracy = append(c.status.Accuracy, job.EpochAcc{Epoch: g / j.StepsPerEpoch, Accuracy: acc})
			c.mu.Unlock()
		}
	}
	elapsed := run.Seconds()
	c.setState(job.StateEvaluating, "")
	testAcc, err := c.evaluate(j.Total, acc)
	if err != nil {
		return nil, err
	}
	be, _ := s.NewBackend(0)
	var nodes []string
	for _, sp := range c.plan.Stages {
		nodes = append(nodes, sp.Node)
	}
	res := &job.Result{
		ID: s.ID, Model: s.Model, Data: s.Data, Params: j.Graph.ParamCount(), Steps: j.Total,
		Epochs: float64(j.Total) / float64(j.StepsPerEpoch), Batch: s.Batch, MicroBatches: s.MicroBatches,
		SamplesPerSec: float64(j.Total*s.Batch) / elapsed, TrainLoss: acc.last,
		TrainAccuracy: float64(acc.correct) / float64(max(acc.seen, 1)), TestAccuracy: testAcc,
		Backend: be.Name(), Threads: s.Threads, Deterministic: s.Deterministic, Seconds: elapsed,
		WeightsSHA256: nn.WeightsSHA256(j.Graph.Params()), Plan: c.text, Schedule: c.plan.Schedule.String(),
		Nodes: nodes, PredictedStepMS: c.report.StepTime * 1e3, MeasuredStepMS: median(steps) * 1e3,
	}
	c.mu.Lock()
	c.status.Accuracy = append(c.status.Accuracy, job.EpochAcc{Epoch: (j.Total + j.StepsPerEpoch - 1) / j.StepsPerEpoch, Accuracy: testAcc})
	c.mu.Unlock()
	return res, nil
}

// persistCost is how long writing and replicating the last cut took, in
// the background: it competes with the stages for the node's CPU (all of
// it under a CPU quota), so it counts in a cut's cost.
func (c *Coordinator) persistCost() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.persistTime
}

const (
	// autoKSteps are the steps timed before the automatic checkpoint
	// interval is chosen.
	autoKSteps = 3
	// assumedCutRate is the state bytes per second a cut is assumed to
	// cost until one is measured. Cuts of 66 MB measured here on loopback
	// cost the steps around them about 1 s on nodes at 60% of a CPU and
	// 2.6-5.2 s at 30% (writing and copying take CPU from the stages);
	// over a real network a cut also crosses a link once.
	assumedCutRate = 25e6
)

// expectedCutCost is what the next cut is expected to cost: the pause of
// the pipeline to gather it and its writing and replication in the
// background (which compete with the stages for the node's CPU), each as
// last measured, or else estimated from the state's size.
func (c *Coordinator) expectedCutCost() time.Duration {
	if c.stateSize == 0 {
		c.stateSize = c.stateBytes()
	}
	return cutCost(c.stateSize, c.cutCost, c.persistCost(), c.cutMeasured, c.cfg.Store != nil)
}

// cutCost is expectedCutCost for a state of stateBytes: what the last cut
// measurably cost the steps around it (measured, see cutWindow), or else
// its pause and persist time (0: not measured yet), persist counting if
// persists (cuts are written and copied).
func cutCost(stateBytes int64, pause, persist, measured time.Duration, persists bool) time.Duration {
	estimate := time.Duration(float64(stateBytes) / assumedCutRate * float64(time.Second))
	switch {
	case measured > 0:
		return measured
	case pause == 0:
		return estimate
	case persist > 0 || !persists:
		return pause + persist
	}
	return pause + estimate
}

// cutWindow measures what a cut cost the pipeline: the time the steps from
// the cut on took beyond the median step before it (the cut's pause is part
// of the step it precedes), until the cut has been written and copied.
// Writing and copying run beside the stages and take CPU from them (all of
// it they can under a CPU quota): on nodes at 30% of a CPU a cut slowed the
// steps around it by about twice its pause and persist time.
type cutWindow struct {
	open      bool
	start     int             // index of the cut's step in steps
	med       float64         // median step before the cut, seconds
	persisted <-chan struct{} // closed when the cut is written and copied
}

// maxCutWindow bounds a window that a persist never ends.
const maxCutWindow = 1000

// measure returns the cut's cost once its persist has ended (the step
// during which it ended counts) and closes the window.
func (w *cutWindow) measure(steps []float64) (time.Duration, bool) {
	if !w.open {
		return 0, false
	}
	select {
	case <-w.persisted:
	default:
		if len(steps)-w.start < maxCutWindow {
			return 0, false
		}
	}
	w.open = false
	var excess float64
	for _, s := range steps[w.start:] {
		excess += max(0, s-w.med)
	}
	return time.Duration(excess * float64(time.Second)), true
}

// chooseK is the checkpoint interval that keeps a cut's cost within 2% of
// the training time, bounded to [5, 1000] steps.
func chooseK(cost time.Duration, stepSec float64) int {
	k := int(math.Ceil(cost.Seconds() / (0.02 * stepSec)))
	return min(max(k, 5), 1000)
}

// stepTimeout bounds a step: generous until a few steps are measured, then
// a bounded factor of the median (a hung node must not stall the job).
func (c *Coordinator) stepTimeout(steps []float64) time.Duration {
	if len(steps) < 3 {
		return c.cfg.StepTimeout
	}
	d := time.Duration(10 * median(steps) * float64(time.Second))
	return min(max(d, 3*time.Second), c.cfg.StepTimeout)
}

// step runs training step g on every stage: StepBegin to all, the
// micro-batches and labels over the coordinator's links, then every
// stage's StepDone.
func (c *Coordinator) step(ctx context.Context, g int, steps []float64, acc *progressAcc) (float64, []*StageTiming, error) {
	j, s := c.job, c.spec
	M := s.MicroBatches
	epoch, step := g/j.StepsPerEpoch, g%j.StepsPerEpoch
	timeout := c.stepTimeout(steps)
	dones := make([]*actor.Future, len(c.pids))
	for k, pid := range c.pids {
		dones[k] = c.cfg.System.Actor.Root.RequestFuture(pid, &StepBegin{Header: c.header(), Step: uint64(g), MicroBatches: uint32(M), Lr: j.LR.At(g)}, timeout)
	}
	input, _ := tensorID(j.Graph, j.Graph.InputNames[0])
	for m := 0; m < M; m++ {
		c.xs[m], c.ys[m] = j.Loader.Micro(epoch, step, m, c.xs[m], c.ys[m])
		c.labels[m] = labelTensor(c.ys[m], c.labels[m])
		for _, k := range c.feeds {
			if err := c.links[k].Send(dataplane.Tag{Kind: dataplane.KindInput, MicroBatch: uint32(m), Tensor: input}, c.xs[m]); err != nil {
				return 0, nil, fmt.Errorf("step %d: feeding stage %d: %w", g, k, err)
			}
		}
		if err := c.links[c.lossStage].Send(dataplane.Tag{Kind: dataplane.KindInput, MicroBatch: uint32(m), Tensor: labelsTensor}, c.labels[m]); err != nil {
			return 0, nil, fmt.Errorf("step %d: labels to stage %d: %w", g, c.lossStage, err)
		}
	}
	var loss float64
	var correct, seen int64
	timings := make([]*StageTiming, len(c.pids))
	err := waitAll(ctx, c.failed, dones, func(k int, r any) error {
		d, ok := r.(*StepDone)
		if !ok {
			return fmt.Errorf("stage %d: unexpected reply %T", k, r)
		}
		if d.GetError() != "" {
			return fmt.Errorf("stage %d: %s", k, d.GetError())
		}
		if len(d.GetTimings()) > 0 {
			timings[k] = d.GetTimings()[0]
		}
		if d.GetHasLoss() {
			loss = d.GetLoss() / float64(max(d.GetSamples(), 1))
			correct, seen = d.GetCorrect(), d.GetSamples()
		}
		return nil
	})
	if err != nil {
		return 0, nil, fmt.Errorf("step %d: %w", g, err)
	}
	acc.correct += correct
	acc.seen += seen
	return loss, timings, nil
}

// checkpoint makes the state after step g the latest consistent cut: every
// stage's parameters and optimizer state are gathered into the
// coordinator's model (the pipeline is drained between steps, so the cut
// is consistent). job.Recovery may use it at once, from memory. With a store
// it is then written to disk and replicated (cfg.Replicate) in the
// background, and reported as the latest cut (job.Status.LatestCut, Cuts)
// only once every copy is written and acknowledged; without a store, at
// once. It returns what the cut cost the pipeline.
func (c *Coordinator) checkpoint(g int, acc progressAcc) (time.Duration, error) {
	t0 := time.Now()
	c.persisting.Wait() // the model's tensors are the previous cut's until written
	if err := c.gather(true); err != nil {
		return 0, fmt.Errorf("checkpoint at step %d: %w", g, err)
	}
	c.cut = cut{steps: g, acc: acc}
	cost := time.Since(t0)
	c.cutCost = cost
	c.mu.Lock()
	c.status.CheckpointMS = float64(cost.Microseconds()) / 1e3
	if c.cfg.Store == nil {
		c.status.LatestCut, c.status.Cuts = g, c.status.Cuts+1
	}
	c.mu.Unlock()
	done := make(chan struct{})
	c.persisted = done
	if c.cfg.Store == nil {
		close(done)
		return cost, nil
	}
	ck := c.checkpointFile(g)
	c.persisting.Go(func() {
		t0 := time.Now()
		defer func() {
			c.mu.Lock()
			c.persistTime = time.Since(t0)
			c.status.PersistMS = float64(c.persistTime.Microseconds()) / 1e3
			c.mu.Unlock()
			close(done)
		}()
		if _, err := c.cfg.Store.Save(ck); err != nil {
			c.log.Warn("writing a checkpoint; the cut is not durable", "step", g, "err", err)
			return
		}
		t1 := time.Now()
		if c.cfg.Replicate != nil {
			if err := c.cfg.Replicate(ck); err != nil {
				c.log.Warn("replicating a checkpoint; the cut is not durable", "step", g, "err", err)
				return
			}
		}
		c.log.Debug("cut persisted", "step", g, "pause_ms", float64(cost.Microseconds())/1e3, "write_ms", msSince(t0, t1), "replicate_ms", msSince(t1, time.Now()))
		c.mu.Lock()
		c.status.LatestCut, c.status.Cuts = max(c.status.LatestCut, g), c.status.Cuts+1
		c.mu.Unlock()
	})
	return cost, nil
}

// checkpointFile describes the cut as a whole-model tensorio checkpoint.
func (c *Coordinator) checkpointFile(g int) *tensorio.Checkpoint {
	ck := &tensorio.Checkpoint{JobID: c.spec.ID, Step: int64(g), PlanHash: c.plan.Hash(),
		Data: tensorio.DataPos{Epoch: int64(g / c.job.StepsPerEpoch), Step: int64(g % c.job.StepsPerEpoch)},
		Meta: map[string]string{"model": c.spec.Model, "optimizer": c.spec.Optimizer, "generation": strconv.FormatUint(c.gen, 10),
			"train_loss": strconv.FormatFloat(c.cut.acc.last, 'g', -1, 64), "train_correct": strconv.FormatInt(c.cut.acc.correct, 10),
			"train_seen": strconv.FormatInt(c.cut.acc.seen, 10)}}
	for _, p := range nn.SortByName(c.job.Graph.Params()) {
		ck.Params = append(ck.Params, tensorio.Named{Name: p.Name, T: p.Value})
		if p.Trainable() {
			st := c.copt.State(p)
			for _, k := range slices.Sorted(maps.Keys(st)) {
				ck.Optim = append(ck.Optim, tensorio.OptimState{Param: p.Name, Slot: k, T: st[k]})
			}
		}
	}
	return ck
}

// loadCut makes a checkpoint of this job the latest cut.
func (c *Coordinator) loadCut(ck *tensorio.Checkpoint) error {
	if ck.JobID != c.spec.ID {
		return fmt.Errorf("checkpoint of job %q, this is job %q", ck.JobID, c.spec.ID)
	}
	if ck.Step < 0 || ck.Step > int64(c.job.Total) {
		return fmt.Errorf("checkpoint at step %d of a %d-step job", ck.Step, c.job.Total)
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
			return err
		}
		if p.Trainable() && ck.Step > 0 {
			for slot, t := range c.copt.State(p) {
				if err := load(p.Name+" "+slot, t, optim[[2]string{p.Name, slot}]); err != nil {
					return err
				}
			}
		}
	}
	c.cut = cut{steps: int(ck.Step)}
	c.cut.acc.last, _ = strconv.ParseFloat(ck.Meta["train_loss"], 64)
	c.cut.acc.correct, _ = strconv.ParseInt(ck.Meta["train_correct"], 10, 64)
	c.cut.acc.seen, _ = strconv.ParseInt(ck.Meta["train_seen"], 10, 64)
	return nil
}

// evaluate makes the state after step g a cut and measures the test
// accuracy of its weights.
func (c *Coordinator) evaluate(g int, acc progressAcc) (float64, error) {
	if _, err := c.checkpoint(g, acc); err != nil {
		return 0, err
	}
	be, err := c.spec.NewBackend(c.cfg.Threads)
	if err != nil {
		return 0, err
	}
	opt, _ := c.spec.NewOptimizer(1)
	return c.job.Evaluate(nn.NewTrainer(c.job.Graph, opt, be, c.spec.Seed)), nil
}

// gather reads every stage's state (with withOpt, optimizer state too)
// into the coordinator's model and c.copt.
func (c *Coordinator) gather(withOpt bool) error {
	return c.moveState("gathering", withOpt, &GatherWeights{Header: c.header(), Optimizer: withOpt}, func(lk dataplane.Link, i int, t *nn.Tensor) error {
		tag, got, err := lk.Recv(t)
		if err != nil {
			return err
		}
		if tag.Kind != dataplane.KindWeights || tag.Tensor != uint32(i) || got != t || !nn.SameShape(got.Shape(), t.Shape()) {
			return fmt.Errorf("got %v %d of shape %v, want state tensor %d of shape %v", tag.Kind, tag.Tensor, got.Shape(), i, t.Shape())
		}
		return nil
	})
}

// explain returns the stage's own failure, if it reports one promptly,
// for an error on the link: a refusal explains a closed link better.
func explain(err error, reply <-chan error) error {
	select {
	case r := <-reply:
		if r != nil {
			return r
		}
	case <-time.After(100 * time.Millisecond): // a dead stage does not answer
	}
	return err
}

// abortOnFailure waits for a stage's reply to a request whose data moves
// over lk; if the stage fails or refuses, lk is closed so that the other
// end of the transfer does not wait for data that will not come. The
// channel yields the failure, or nil.
func abortOnFailure(f *actor.Future, lk dataplane.Link) <-chan error {
	ch := make(chan error, 1)
	go func() {
		r, err := f.Result()
		if err == nil {
			if d, ok := r.(*StepDone); !ok {
				err = fmt.Errorf("unexpected reply %T", r)
			} else if d.GetError() != "" {
				err = errors.New(d.GetError())
			}
		}
		if err != nil {
			lk.Close()
		}
		ch <- err
	}()
	return ch
}

// stateLists is each stage's state tensors in the coordinator's model
// (made here, on one goroutine: the optimizer's state map is not safe for
// concurrent use).
func (c *Coordinator) stateLists(withOpt bool) [][]*nn.Tensor {
	out := make([][]*nn.Tensor, len(c.stages))
	for k, st := range c.stages {
		out[k] = stateTensors(st.Params(), c.copt, withOpt)
	}
	return out
}

// restoreAll loads the latest cut into freshly started stages.
func (c *Coordinator) restoreAll() error {
	if c.cut.steps == 0 {
		return nil // every stage starts from the seed's initial state
	}
	return c.moveState("restoring", true, &RestoreStage{Header: c.header(), Steps: int64(c.cut.steps)}, func(lk dataplane.Link, i int, t *nn.Tensor) error {
		return lk.Send(dataplane.Tag{Kind: dataplane.KindWeights, Tensor: uint32(i)}, t)
	})
}

// moveState moves every stage's state tensors over its coordinator link,
// one call of move per tensor, while the stage serves the request msg; a
// stage that fails or refuses closes the transfer (see
// abortOnFailure).
func (c *Coordinator) moveState(what string, withOpt bool, msg proto.Message, move func(lk dataplane.Link, i int, t *nn.Tensor) error) error {
	state := c.stateLists(withOpt)
	return c.forEachStage(func(k int) error {
		reply := abortOnFailure(c.cfg.System.Actor.Root.RequestFuture(c.pids[k], msg, c.cfg.Timeout), c.links[k])
		for i, t := range state[k] {
			if err := move(c.links[k], i, t); err != nil {
				return fmt.Errorf("%s stage %d: %w", what, k, explain(err, reply))
			}
		}
		if err := <-reply; err != nil {
			return fmt.Errorf("%s stage %d: %w", what, k, err)
		}
		return nil
	})
}

// maxRecoveries bounds the recoveries of one job.
const maxRecoveries = 20

// recover brings the job back after step g failed with cause: the stages
// of the current plan are abandoned, the plan generation advances (old
// stages' messages and links are refused from then on), the live nodes are
// re-planned, the new stages are started and restored from the latest
// cut. Training then replays from the cut. With no usable node the job
// pauses, retrying until ctx ends.
func (c *Coordinator) recover(ctx context.Context, g int, stepStart time.Time, cause error) error {
	detected := time.Now()
	c.mu.Lock()
	n := len(c.status.Recoveries)
	c.mu.Unlock()
	if n >= maxRecoveries {
		return fmt.Errorf("giving up after %d recoveries: %w", n, cause)
	}
	c.log.Warn("step failed; recovering from the latest cut", "step", g, "cut", c.cut.steps, "err", cause)
	c.setState(job.StateRecovering, cause.Error())
	for attempt := 0; ; attempt++ {
		c.abandon()
		c.gen++
		t0 := time.Now()
		err := c.replan(ctx)
		t1 := time.Now()
		var t2 time.Time
		if err == nil {
			if err = c.start(); err == nil {
				t2 = time.Now()
				err = c.restoreAll()
			}
		}
		c.log.Info("recovery attempt", "attempt", attempt, "replan", t1.Sub(t0), "start", t2.Sub(t1), "restore", time.Since(t2), "err", err)
		if err == nil {
			for len(c.failed) > 0 { // reports about the old plan's nodes
				<-c.failed
			}
			break
		}
		c.log.Warn("recovery attempt failed", "attempt", attempt, "err", err)
		c.setState(job.StatePaused, err.Error())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(time.Duration(attempt+1)*200*time.Millisecond, 2*time.Second)):
		}
	}
	c.planStep, c.streak = c.cut.steps, 0
	r := job.Recovery{Cause: cause.Error(), Step: g, Replayed: g - c.cut.steps, Plan: c.text, At: detected,
		DetectMS:  float64(detected.Sub(stepStart).Microseconds()) / 1e3,
		RestoreMS: float64(time.Since(detected).Microseconds()) / 1e3}
	c.mu.Lock()
	c.status.Recoveries = append(c.status.Recoveries, r)
	c.status.State, c.status.Reason = job.StateTraining, ""
	c.mu.Unlock()
	return nil
}

// replan plans the job again over the nodes that answer now.
func (c *Coordinator) replan(ctx context.Context) error {
	cands := c.cfg.Nodes
	if c.cfg.LiveNodes != nil {
		cands = c.cfg.LiveNodes()
	}
	live := make([]bool, len(cands))
	var wg sync.WaitGroup
	for i, n := range cands {
		wg.Go(func() { live[i] = c.cfg.System.Ping(ctx, n.ActorAddr, time.Second) == nil })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err // the pings were cut short: they say nothing of the nodes
	}
	var nodes []job.NodeInfo
	for i, n := range cands {
		if live[i] {
			nodes = append(nodes, n)
		} else {
			// Drop the endpoint: remote would keep redialling it.
			c.cfg.System.EndpointTerminated(n.ActorAddr)
		}
	}
	if len(nodes) == 0 {
		return errors.New("no live node")
	}
	err := c.makePlan(nodes)
	if errors.Is(err, balance.ErrNoFit) {
		return fmt.Errorf("waiting for nodes: %w", err)
	}
	return err
}

// abandon drops the current plan's stages without waiting for them: they
// are told to stop, their links are closed, and whatever they still send
// carries an old generation.
func (c *Coordinator) abandon() {
	c.dropStages(c.pids, c.links)
	c.links, c.pids = nil, nil
}

// dropStages tells stages to stop and closes the coordinator's links to
// them, without waiting.
func (c *Coordinator) dropStages(pids []*actor.PID, links map[int]dataplane.Link) {
	for _, lk := range links {
		lk.Close()
	}
	for _, pid := range pids {
		if pid != nil {
			_ = c.cfg.System.Send(pid, &StopStage{Header: c.header()})
		}
	}
}

// Graph is the job's model as the coordinator holds it: after Run, the
// trained weights gathered from the stages.
func (c *Coordinator) Graph() *nn.Graph { return c.job.Graph }

// feedTargets returns the stages of p that read the graph input and the
// loss stage.
func feedTargets(p *balance.Plan) (feeds []int, loss int) {
	for k, sp := range p.Stages {
		for _, in := range sp.Program {
			if in.Op == balance.OpRecvAct && in.Peer == balance.Coordinator {
				feeds = append(feeds, k)
				break
			}
		}
		if sp.Loss {
			loss = k
		}
	}
	return feeds, loss
}

func labelTensor(y []int32, t *nn.Tensor) *nn.Tensor {
	if t == nil || nn.Size(t.Shape()) != len(y) {
		t = nn.New(len(y))
	}
	v := nn.F32(t)
	for i, c := range y {
		v[i] = float32(c)
	}
	return t
}

func (c *Coordinator) recordStep(step int, loss, rate float64, timings []*StageTiming) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status.Step, c.status.Loss, c.status.SamplesPerSec = step, loss, rate
	const a = 0.2 // exponential smoothing of the per-stage times
	for k, t := range timings {
		if t == nil || k >= len(c.status.Stages) {
			continue
		}
		st := &c.status.Stages[k]
		sm := func(old float64, ns int64) float64 {
			v := float64(ns) / 1e6
			if step == 1 {
				return v
			}
			return (1-a)*old + a*v
		}
		st.ForwardMS, st.BackwardMS = sm(st.ForwardMS, t.GetForwardNs()), sm(st.BackwardMS, t.GetBackwardNs())
		st.UpdateMS, st.WaitMS = sm(st.UpdateMS, t.GetUpdateNs()), sm(st.WaitMS, t.GetWaitNs())
		st.WallMS = sm(st.WallMS, t.GetWallNs())
	}
}

// teardown stops every stage and closes the coordinator's links.
func (c *Coordinator) teardown() {
	defer c.persisting.Wait()
	// Stages first: one whose link from the coordinator closes stops by
	// itself, and would not answer.
	defer func() {
		for _, lk := range c.links {
			lk.Close()
		}
	}()
	var wg sync.WaitGroup
	for _, pid := range c.pids {
		if pid == nil {
			continue
		}
		wg.Go(func() {
			if _, err := c.request(pid, &StopStage{Header: c.header()}, 10*time.Second); err != nil {
				c.log.Warn("stopping a stage", "pid", pid.String(), "err", err)
			}
		})
	}
	wg.Wait()
}

// Describe is a one-line summary of the plan.
func (c *Coordinator) Describe() string {
	return fmt.Sprintf("%s, %s, M=%d: predicted %.1f ms/step", c.text, c.plan.Schedule, c.plan.MicroBatches, c.report.StepTime*1e3)
}

// waitAll waits for the futures' replies and checks each with check (called
// on this goroutine, in arrival order). It returns at the first failure
// (or node reported on failed),
// without waiting for the others: the caller tears the job down, which
// ends the steps still running.
func waitAll(ctx context.Context, failed <-chan string, fs []*actor.Future, check func(k int, reply any) error) error {
	type result struct {
		k   int
		r   any
		err error
	}
	ch := make(chan result, len(fs))
	for k, f := range fs {
		go func() {
			r, err := f.Result()
			ch <- result{k, r, err}
		}()
	}
	for range fs {
		var r result
		select {
		case r = <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case name := <-failed:
			return fmt.Errorf("node %s failed", name)
		}
		if r.err != nil {
			return fmt.Errorf("stage %d: %w", r.k, r.err)
		}
		if err := check(r.k, r.r); err != nil {
			return err
		}
	}
	return nil
}

func specErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", job.ErrSpec, fmt.Sprintf(format, a...))
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
