package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/nn"
	"google.golang.org/protobuf/proto"
)

// NodeInfo is a node a job may use, as the cluster describes it.
type NodeInfo struct {
	Name      string  `json:"name"`
	ActorAddr string  `json:"actor_addr"`
	GFLOPS    float64 `json:"gflops,omitempty"`
	Memory    int64   `json:"memory_bytes,omitempty"`
	Threads   int     `json:"threads,omitempty"`
}

// CoordinatorConfig configures a [Coordinator].
type CoordinatorConfig struct {
	System    *System
	DataPlane DataPlane
	// Nodes are the nodes the job may use.
	Nodes []NodeInfo
	// GFLOPS is this node's GEMM speed: the layer profile measured here is
	// scaled to the others by their GFLOPS over this (0: all nodes count
	// as equally fast).
	GFLOPS float64
	// Threads this node profiles with (0: all CPUs).
	Threads int
	Logger  *slog.Logger
	// Timeout bounds each control request (default 2 min); a step may take
	// StepTimeout (default 10 min).
	Timeout, StepTimeout time.Duration
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
	job  *Job
	spec JobSpec
	log  *slog.Logger

	plan   *balance.Plan
	report *balance.Report
	text   string // the plan's partition as a description
	gen    uint64

	pids   []*actor.PID
	links  map[int]Link // to each stage
	stages []*nn.Stage  // the coordinator's view of each stage (for gathering)

	mu     sync.Mutex
	status JobStatus
}

// JobStatus is a job's progress, for `ppnode status` and the train client.
type JobStatus struct {
	ID    string `json:"id"`
	State string `json:"state"` // planning, starting, training, evaluating, done, failed
	Error string `json:"error,omitempty"`
	Model string `json:"model"`
	Step  int    `json:"step"`
	Total int    `json:"total"`
	// Loss is the last step's mean training loss.
	Loss          float64        `json:"loss"`
	SamplesPerSec float64        `json:"samples_per_sec"`
	Plan          string         `json:"plan,omitempty"`
	Schedule      string         `json:"schedule,omitempty"`
	MicroBatches  int            `json:"micro_batches,omitempty"`
	PredictedMS   float64        `json:"predicted_step_ms,omitempty"`
	Stages        []StageStatus  `json:"stages,omitempty"`
	Accuracy      []EpochAcc     `json:"accuracy,omitempty"`
	Result        *JobResult     `json:"result,omitempty"`
	Started       time.Time      `json:"started"`
	Events        []string       `json:"events,omitempty"`
	Extra         map[string]any `json:"extra,omitempty"`
}

// StageStatus is one stage of a running job.
type StageStatus struct {
	ID     int    `json:"id"`
	Node   string `json:"node"`
	Layers string `json:"layers"`
	Params int64  `json:"params"`
	// Mean milliseconds per step over the last steps.
	ForwardMS  float64 `json:"forward_ms"`
	BackwardMS float64 `json:"backward_ms"`
	UpdateMS   float64 `json:"update_ms"`
	WaitMS     float64 `json:"wait_ms"`
}

// EpochAcc is the test accuracy after an epoch.
type EpochAcc struct {
	Epoch    int     `json:"epoch"`
	Accuracy float64 `json:"accuracy"`
}

// NewCoordinator prepares a job: it checks the spec, loads the data,
// builds the model, profiles it and plans it over cfg.Nodes. Nothing
// starts on any node until Run; an error here (a bad spec, a bad
// partition, more stages than nodes) leaves nothing behind.
func NewCoordinator(spec JobSpec, cfg CoordinatorConfig) (*Coordinator, error) {
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
	job, err := spec.Prepare()
	if err != nil {
		return nil, err
	}
	c := &Coordinator{cfg: cfg, job: job, spec: job.Spec, log: cfg.Logger.With("job", spec.ID), gen: 1}
	c.status = JobStatus{ID: spec.ID, State: "planning", Model: spec.Model, Total: job.Total, Started: time.Now()}
	if err := c.makePlan(); err != nil {
		return nil, err
	}
	return c, nil
}

// makePlan profiles the model here and searches a plan over the nodes.
func (c *Coordinator) makePlan() error {
	s := c.spec
	nodes := slices.Clone(c.cfg.Nodes)
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].GFLOPS > nodes[j].GFLOPS })
	if s.MaxNodes > 0 && len(nodes) > s.MaxNodes {
		nodes = nodes[:s.MaxNodes]
	}
	cl := &balance.Cluster{DefaultLink: balance.DefaultLink}
	for _, n := range nodes {
		np := balance.NodeProfile{Name: n.Name, Memory: n.Memory, Speed: 1}
		if c.cfg.GFLOPS > 0 && n.GFLOPS > 0 {
			np.Speed = n.GFLOPS / c.cfg.GFLOPS
		}
		cl.Nodes = append(cl.Nodes, np)
	}
	part := s.Partition
	if part == "auto" {
		part = balance.GraphPP
	}
	be, err := s.NewBackend(c.cfg.Threads)
	if err != nil {
		return err
	}
	micro := (s.Batch + s.MicroBatches - 1) / s.MicroBatches
	prof, err := balance.Profile(c.job.Graph, micro, be)
	if err != nil {
		return fmt.Errorf("profiling %s: %w", s.Model, err)
	}
	prof.Model = s.Model
	res, err := balance.Search(c.job.Graph, prof, cl, balance.Options{
		Partitioner: part, Schedule: s.Schedule, Batch: s.Batch, MicroBatches: s.MicroBatches,
		Optimizer: s.Optimizer, Model: s.Model,
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSpec, err)
	}
	c.plan, c.report, c.text = res.Plan, res.Report, res.Spec
	byName := map[string]NodeInfo{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	for _, sp := range c.plan.Stages {
		if _, ok := byName[sp.Node]; !ok {
			return specErr("the plan puts stage %d on %q, which is not a node of this job", sp.ID, sp.Node)
		}
		st, err := c.job.Graph.Stage(sp.Layers)
		if err != nil {
			return err
		}
		c.stages = append(c.stages, st)
	}
	c.mu.Lock()
	c.status.Plan, c.status.Schedule, c.status.MicroBatches = c.text, c.plan.Schedule.String(), c.plan.MicroBatches
	c.status.PredictedMS = c.report.StepTime * 1e3
	for _, sp := range c.plan.Stages {
		c.status.Stages = append(c.status.Stages, StageStatus{ID: sp.ID, Node: sp.Node, Layers: layerRange(sp.Layers)})
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

// Plan is the job's plan.
func (c *Coordinator) Plan() *balance.Plan { return c.plan }

// Report is the simulator's prediction for the plan.
func (c *Coordinator) Report() *balance.Report { return c.report }

// Status returns a copy of the job's progress; it is safe to call at any
// time.
func (c *Coordinator) Status() JobStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.status
	s.Stages = slices.Clone(s.Stages)
	s.Accuracy = slices.Clone(s.Accuracy)
	s.Events = slices.Clone(s.Events)
	return s
}

func (c *Coordinator) setState(state string) {
	c.mu.Lock()
	c.status.State = state
	c.mu.Unlock()
}

func (c *Coordinator) header() *Header { return &Header{JobId: c.spec.ID, Generation: c.gen} }

func (c *Coordinator) node(name string) NodeInfo {
	for _, n := range c.cfg.Nodes {
		if n.Name == name {
			return n
		}
	}
	return NodeInfo{}
}

// Run trains the job to its end and returns the result. Cancelling ctx
// stops it: the stages are stopped and Run returns ctx's error.
func (c *Coordinator) Run(ctx context.Context) (res *JobResult, err error) {
	defer func() {
		c.teardown()
		c.mu.Lock()
		if err != nil {
			c.status.State, c.status.Error = "failed", err.Error()
		} else {
			c.status.State, c.status.Result = "done", res
		}
		c.mu.Unlock()
	}()
	c.setState("starting")
	if err := c.start(); err != nil {
		return nil, err
	}
	c.setState("training")
	return c.train(ctx)
}

// start spawns, sets up and connects the stages.
func (c *Coordinator) start() error {
	S := len(c.plan.Stages)
	c.pids = make([]*actor.PID, S)
	c.links = map[int]Link{}
	listen := make([][]*LinkAddr, S)
	err := c.forEachStage(func(k int) error {
		sp := c.plan.Stages[k]
		addr := c.node(sp.Node).ActorAddr
		pid, err := c.cfg.System.SpawnRemote(addr, &SpawnStage{Header: c.header(), Kind: StageKind, Stage: int32(k)}, c.cfg.Timeout)
		if err != nil {
			return fmt.Errorf("stage %d on %s: %w", k, sp.Node, err)
		}
		c.pids[k] = pid
		b, err := marshalStageSpec(StageSpec{Job: c.spec, Generation: c.gen, Input: c.job.Set.Train.Shape,
			Classes: c.job.Set.Classes, Graph: c.plan.Graph, Plan: sp})
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
		listen[k] = rep.GetListen()
		c.mu.Lock()
		c.status.Stages[k].Params = rep.GetParams()
		c.mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	// The coordinator dials its link to every stage first; then every
	// stage dials its downstream links and waits for its incoming ones.
	dials := make([][]*LinkAddr, S)
	for k := range S {
		for _, la := range listen[k] {
			from := int(la.GetFrom())
			if from == balance.Coordinator {
				h := Hello{JobID: c.spec.ID, Generation: c.gen, Link: linkID(from, k), From: stageWire(from), To: stageWire(k)}
				lk, err := c.cfg.DataPlane.Dial(la.GetAddr(), h, Options{IOTimeout: c.cfg.StepTimeout})
				if err != nil {
					return fmt.Errorf("coordinator link to stage %d: %w", k, err)
				}
				c.links[k] = lk
				continue
			}
			if from < 0 || from >= S {
				return fmt.Errorf("stage %d listens for a link from unknown stage %d", k, from)
			}
			dials[from] = append(dials[from], la)
		}
		if c.links[k] == nil {
			return fmt.Errorf("stage %d has no link from the coordinator", k)
		}
	}
	return c.forEachStage(func(k int) error {
		r, err := c.request(c.pids[k], &ConnectStage{Header: c.header(), Dial: dials[k]}, c.cfg.Timeout)
		if err != nil {
			return fmt.Errorf("connecting stage %d: %w", k, err)
		}
		return ackErr(k, r)
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

// train runs every step, evaluating at the end (and at epoch ends if the
// spec asks).
func (c *Coordinator) train(ctx context.Context) (*JobResult, error) {
	j, s := c.job, c.spec
	M := s.MicroBatches
	feeds, lossStage := c.feedTargets()
	var (
		xs      = make([]*nn.Tensor, M)
		ys      = make([][]int32, M)
		labels  = make([]*nn.Tensor, M)
		last    float64
		correct int64
		seen    int64
		steps   []float64
	)
	start := time.Now()
	for g := 0; g < j.Total; g++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		epoch, step := g/j.StepsPerEpoch, g%j.StepsPerEpoch
		t0 := time.Now()
		dones := make([]*actor.Future, len(c.pids))
		for k, pid := range c.pids {
			dones[k] = c.cfg.System.Actor.Root.RequestFuture(pid, &StepBegin{Header: c.header(), Step: uint64(g), MicroBatches: uint32(M), Lr: j.LR.At(g)}, c.cfg.StepTimeout)
		}
		for m := 0; m < M; m++ {
			xs[m], ys[m] = j.Loader.Micro(epoch, step, m, xs[m], ys[m])
			labels[m] = labelTensor(ys[m], labels[m])
			for _, k := range feeds {
				if err := c.links[k].Send(Tag{Kind: KindInput, MicroBatch: uint32(m), Tensor: c.inputID()}, xs[m]); err != nil {
					return nil, fmt.Errorf("step %d: feeding stage %d: %w", g, k, err)
				}
			}
			if err := c.links[lossStage].Send(Tag{Kind: KindInput, MicroBatch: uint32(m), Tensor: labelsTensor}, labels[m]); err != nil {
				return nil, fmt.Errorf("step %d: labels to stage %d: %w", g, lossStage, err)
			}
		}
		var loss float64
		timings := make([]*StageTiming, len(c.pids))
		err := waitAll(dones, func(k int, r any) error {
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
				correct += d.GetCorrect()
				seen += d.GetSamples()
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", g, err)
		}
		steps = append(steps, time.Since(t0).Seconds())
		last = loss
		c.recordStep(g+1, loss, float64((g+1)*s.Batch)/time.Since(start).Seconds(), timings)
		if s.EvalEachEpoch && step == j.StepsPerEpoch-1 && g+1 < j.Total {
			acc, err := c.evaluate()
			if err != nil {
				return nil, err
			}
			c.mu.Lock()
			c.status.Accuracy = append(c.status.Accuracy, EpochAcc{Epoch: epoch + 1, Accuracy: acc})
			c.mu.Unlock()
		}
	}
	elapsed := time.Since(start).Seconds()
	c.setState("evaluating")
	acc, err := c.evaluate()
	if err != nil {
		return nil, err
	}
	be, _ := s.NewBackend(0)
	var nodes []string
	for _, sp := range c.plan.Stages {
		nodes = append(nodes, sp.Node)
	}
	res := &JobResult{
		ID: s.ID, Model: s.Model, Data: s.Data, Params: j.Graph.ParamCount(), Steps: j.Total,
		Epochs: float64(j.Total) / float64(j.StepsPerEpoch), Batch: s.Batch, MicroBatches: M,
		SamplesPerSec: float64(j.Total*s.Batch) / elapsed, TrainLoss: last,
		TrainAccuracy: float64(correct) / float64(max(seen, 1)), TestAccuracy: acc,
		Backend: be.Name(), Threads: s.Threads, Deterministic: s.Deterministic, Seconds: elapsed,
		WeightsSHA256: nn.WeightsSHA256(j.Graph.Params()), Plan: c.text, Schedule: c.plan.Schedule.String(),
		Nodes: nodes, PredictedStepMS: c.report.StepTime * 1e3, MeasuredStepMS: median(steps) * 1e3,
	}
	c.mu.Lock()
	c.status.Accuracy = append(c.status.Accuracy, EpochAcc{Epoch: (j.Total + j.StepsPerEpoch - 1) / j.StepsPerEpoch, Accuracy: acc})
	c.mu.Unlock()
	return res, nil
}

// Graph is the job's model as the coordinator holds it: after Run, the
// trained weights gathered from the stages.
func (c *Coordinator) Graph() *nn.Graph { return c.job.Graph }

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func (c *Coordinator) inputID() uint32 {
	id, _ := tensorID(c.job.Graph, c.job.Graph.InputNames[0])
	return id
}

// feedTargets returns the stages that read the graph input and the loss
// stage.
func (c *Coordinator) feedTargets() (feeds []int, loss int) {
	for k, sp := range c.plan.Stages {
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
	}
}

// evaluate gathers the stages' weights into the coordinator's model and
// measures test accuracy on it.
func (c *Coordinator) evaluate() (float64, error) {
	err := c.forEachStage(func(k int) error {
		f := c.cfg.System.Actor.Root.RequestFuture(c.pids[k], &GatherWeights{Header: c.header()}, c.cfg.Timeout)
		params := c.stages[k].Params()
		for i, p := range params {
			tag, t, err := c.links[k].Recv(p.Value)
			if err != nil {
				return fmt.Errorf("gathering stage %d: %w", k, err)
			}
			if tag.Kind != KindWeights || tag.Tensor != uint32(i) || t != p.Value || !nn.SameShape(t.Shape(), p.Value.Shape()) {
				return fmt.Errorf("gathering stage %d: got %v %d of shape %v, want weights %d (%s) of shape %v",
					k, tag.Kind, tag.Tensor, t.Shape(), i, p.Name, p.Value.Shape())
			}
		}
		r, err := f.Result()
		if err != nil {
			return fmt.Errorf("gathering stage %d: %w", k, err)
		}
		if d, ok := r.(*StepDone); !ok || d.GetError() != "" {
			return fmt.Errorf("gathering stage %d: %v", k, r)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	be, err := c.spec.NewBackend(c.cfg.Threads)
	if err != nil {
		return 0, err
	}
	opt, _ := c.spec.NewOptimizer(1)
	return c.job.Evaluate(nn.NewTrainer(c.job.Graph, opt, be, c.spec.Seed)), nil
}

// teardown stops every stage and closes the coordinator's links.
func (c *Coordinator) teardown() {
	for _, lk := range c.links {
		lk.Close()
	}
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
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %s, M=%d: ", c.text, c.plan.Schedule, c.plan.MicroBatches)
	fmt.Fprintf(&b, "predicted %.1f ms/step", c.report.StepTime*1e3)
	return b.String()
}

// waitAll waits for the futures' replies and checks each with check (called
// on this goroutine, in arrival order). It returns at the first failure,
// without waiting for the others: the caller tears the job down, which
// ends the steps still running.
func waitAll(fs []*actor.Future, check func(k int, reply any) error) error {
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
		r := <-ch
		if r.err != nil {
			return fmt.Errorf("stage %d: %w", r.k, r.err)
		}
		if err := check(r.k, r.r); err != nil {
			return err
		}
	}
	return nil
}
