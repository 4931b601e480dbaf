package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// Config configures a [Core].
type Config struct {
	// Job is the prepared job; its model's structure is what the core
	// plans (its weights are the driver's).
	Job     *job.Job
	Profile *balance.ModelProfile
	// Nodes are the live members the job may use at its start.
	Nodes []job.NodeInfo
	// GFLOPS is the speed the profile's layer timings ran at: the GEMM
	// speed of the node that measured them, between the throttles of a CPU
	// quota, on the backend the nodes measured their GFLOPS with. A node's
	// speed is its GFLOPS (sustained, over whole quota periods) over this
	// (0: all nodes count as equally fast).
	GFLOPS float64
	// Backend names the stages' compute backend, for the result.
	Backend string
	// Persists says that cuts are written and copied: a cut becomes the
	// latest (job.Status.LatestCut) once [CutPersisted] says so, and its cost
	// includes that work; otherwise once gathered.
	Persists bool
	// StepTimeout bounds a step until a few are measured (default 10
	// min); then ten times the median step, at least 3 s.
	StepTimeout time.Duration
	// Resume, if set, is a stored cut to continue from (a successor
	// taking the job over, or a restart).
	Resume *Cut
	// Generation, if set, is the first plan generation to use, above any a
	// predecessor used.
	Generation uint64
	// Takeover says a successor runs the job: its first plan change is a
	// takeover rather than a start.
	Takeover bool
	Logger   *slog.Logger
	// Self is the node the driver runs on, which sends the stages their
	// inputs; Inputs, if set, are the codec estimates of a micro-batch of
	// them (tensorio.SpeedTable.Estimates), which price the inputs on
	// links that have not carried any yet.
	Self   string
	Inputs []tensorio.Estimate
	// SelfMemory is what the driver itself holds on Self (the data set, a
	// copy of the model, the evaluation's activations): plans leave it to
	// the driver.
	SelfMemory int64
	// Links, if set, were measured just before (ProbePairs): the first
	// plan uses them, and the first plan change does not probe them again.
	Links []LinkMeasure
	// Now is when the job was submitted.
	Now time.Time
}

// Cut is a consistent cut as the core knows it: the state after Step
// steps (held by the driver) and the progress until then.
type Cut struct {
	Step int
	Progress
}

// Progress is what the result accumulates over steps; a cut keeps a copy
// so that replayed steps are not counted twice.
type Progress struct {
	Loss          float64 // the last step's mean training loss
	Correct, Seen int64
}

// Core is the pure core of one pipelined job (docs/DESIGN.md, "The life
// of a job"): a state machine that takes events ([Core.Step],
// [Core.Tick]) and returns the operations to carry out ([Core.Ready]).
// It plans the job over the live nodes, runs its steps one after the
// other, takes consistent cuts at an interval it chooses from their cost,
// follows the nodes' measured speeds, and changes the plan, by one
// transition, when a node fails, joins or leaves, when the speeds drift,
// when a user asks, and when a successor takes the job over.
// It owns no goroutine, socket or clock: time is an argument. It is used
// from one goroutine.
//
// Where the machine is follows from its state: ended once end is set,
// changing the plan while change is set (paused while the change waits to
// try again), else training. The job's State is read from the same (see
// state).
type Core struct {
	cfg Config
	job *job.Job // cfg.Job
	log *slog.Logger

	plan  planState
	nodes nodeSet
	links linkTable
	steps stepState
	cuts  cutState
	ops   opState
	rebal rebalancing
	// change is the plan change under way (nil: none).
	change *change
	// end is how the job ended (nil: it has not).
	end *Finish
	// status is the progress reported; Status fills in what it reads
	// from the groups above.
	status job.Status
}

// New plans the job over cfg.Nodes. Nothing is asked of any node
// until [Core.Start]. A job no set of the nodes can hold is a bad spec
// (ErrSpec wrapping balance.ErrNoFit).
func New(cfg Config) (*Core, error) {
	j := cfg.Job
	if j.Spec.ID == "" {
		return nil, specErr("no job id")
	}
	if len(cfg.Nodes) == 0 {
		return nil, specErr("no nodes to run on")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = 10 * time.Minute
	}
	c := &Core{cfg: cfg, job: j, log: cfg.Logger.With("job", j.Spec.ID),
		nodes: nodeSet{members: map[string]job.NodeInfo{}, known: map[string]job.NodeInfo{}, speed: map[string]float64{}, perCPU: map[string]float64{}},
		links: linkTable{m: map[[2]string]*linkState{}}, plan: planState{domain: map[string]bool{}}}
	c.links.noProbe = j.Spec.NoProbe
	if j.Spec.AutoCodecs() {
		c.links.inputs = cfg.Inputs
	}
	for _, n := range cfg.Nodes {
		c.nodes.members[n.Name] = n
	}
	c.status = job.Status{ID: j.Spec.ID, Model: j.Spec.Model, Total: j.Total, Started: cfg.Now, LossName: j.LossName(),
		NoAccuracy: !j.ScoresAccuracy()}
	if r := cfg.Resume; r != nil {
		if r.Step < 0 || r.Step > j.Total {
			return nil, fmt.Errorf("checkpoint at step %d of a %d-step job", r.Step, j.Total)
		}
		c.cuts.latest = *r
		c.steps.next, c.steps.acc = r.Step, r.Progress
	}
	// The first stages start at generation max(Generation, 1).
	c.plan.gen = max(cfg.Generation, 1) - 1
	c.cuts.auto = j.Spec.CheckpointEvery == 0
	c.cuts.every = math.MaxInt
	if !c.cuts.auto {
		c.cuts.every = j.Spec.CheckpointEvery
	}
	c.cuts.size = stateBytes(j.Spec, j.Graph.Params())
	c.cuts.persisting = -1
	c.links.probed(cfg.Now, cfg.Links, c.log)
	cl := c.clusterOf(cfg.Nodes)
	res, err := c.search(cl, j.Spec.Partition)
	if errors.Is(err, balance.ErrNoFit) {
		return nil, fmt.Errorf("%w: %w", job.ErrSpec, err)
	}
	if err != nil {
		return nil, err
	}
	c.adopt(res, cl, nil)
	return c, nil
}

// ProbePairs lists the links between nodes that a job of spec measures
// before its first plan: every ordered pair of the nodes that answer
// probes, none if the job does not probe.
func ProbePairs(spec job.Spec, nodes []job.NodeInfo) [][2]string {
	t := linkTable{noProbe: spec.NoProbe}
	return t.unmeasured(time.Time{}, nodes)
}

// ChooseMicroBatches plans cfg.Job over cfg.Nodes with every M the search
// tries, whatever the job's, and returns the M of the fastest plan and
// that plan's description. cfg.Profile should hold the layers at the
// smallest and the largest micro-batch tried.
func ChooseMicroBatches(cfg Config) (int, string, error) {
	j := *cfg.Job
	j.Spec.MicroBatches = 0
	cfg.Job = &j
	c, err := New(cfg)
	if err != nil {
		return 0, "", err
	}
	return c.plan.MicroBatches, c.Describe(), nil
}

// Start begins the job: its first plan change starts the stages and loads
// the resumed cut, if any.
func (c *Core) Start(now time.Time) {
	trigger := job.TriggerStart
	if c.cfg.Takeover {
		trigger = job.TriggerTakeover
	}
	ch := &change{trigger: trigger, source: sourceCut, res: &balance.Result{Plan: c.plan.Plan, Report: c.plan.report, Spec: c.plan.text}, cl: c.plan.cl}
	if len(c.links.unmeasured(now, c.nodes.candidates())) > 0 {
		ch.res, ch.cl = nil, nil // plan once the links are measured
	}
	c.changePlan(now, ch)
}

// Ready returns the operations to carry out, in order, and forgets them.
func (c *Core) Ready() []Action {
	out := c.ops.out
	c.ops.out = nil
	return out
}

// Ended reports whether the job has ended (a [Finish] was returned).
func (c *Core) Ended() bool { return c.end != nil }

// Plan is the current plan.
func (c *Core) Plan() *balance.Plan { return c.plan.Plan }

// Report is the simulator's prediction for the current plan.
func (c *Core) Report() *balance.Report { return c.plan.report }

// Describe is a one-line summary of the plan.
func (c *Core) Describe() string {
	return fmt.Sprintf("%s, %s, M=%d: predicted %.1f ms/step", c.plan.text, c.plan.Schedule, c.plan.MicroBatches, c.plan.report.StepTime*1e3)
}

// Status returns a copy of the job's progress.
func (c *Core) Status() job.Status {
	s := c.status
	s.State, s.Reason = c.state()
	if e := c.end; e != nil && e.Err != nil {
		s.Error = e.Err.Error()
	} else if e != nil {
		s.Result = e.Result
	}
	cu := &c.cuts
	s.LatestCut, s.Cuts = cu.durable, cu.count
	if cu.every != math.MaxInt {
		s.CheckpointEvery = cu.every
	}
	s.CheckpointMS, s.PersistMS, s.CutCostMS = job.Millis(cu.pause), job.Millis(cu.persist), job.Millis(cu.measured)
	s.Stages = slices.Clone(s.Stages)
	s.Accuracy = slices.Clone(s.Accuracy)
	s.Recoveries = slices.Clone(s.Recoveries)
	s.Replans = slices.Clone(s.Replans)
	s.LossHistory = c.steps.losses.Points()
	s.LastSteps = slices.Clone(s.LastSteps)
	return s
}

// state is the job's State, and the Reason for it, from where the core is.
func (c *Core) state() (job.State, string) {
	ch := c.change
	switch {
	case c.end != nil && c.end.Err == nil:
		return job.StateDone, ""
	case c.end != nil && errors.Is(c.end.Err, job.ErrDiverged):
		return job.StateDiverged, ""
	case c.end != nil:
		return job.StateFailed, ""
	case ch != nil && (ch.trigger == job.TriggerStart || ch.trigger == job.TriggerTakeover):
		return job.StateStarting, ""
	case ch != nil && ch.trigger == job.TriggerFailure && ch.err != nil:
		return job.StatePaused, ch.err.Error() // until an attempt succeeds
	case ch != nil && ch.trigger == job.TriggerFailure:
		return job.StateRecovering, ch.cause.Error()
	case c.ops.last == 0:
		return job.StatePlanning, "" // Start asks for an operation at once
	case ch == nil && c.steps.next >= c.job.Total:
		return job.StateEvaluating, ""
	}
	return job.StateTraining, "" // re-plans included
}

// Generation is the generation of the newest stages (0: none started yet).
func (c *Core) Generation() uint64 { return c.plan.gen }

// Step gives the core an event that happened at now. What the cluster
// and users say is recorded in any state; the rest is up to the step
// function of the state the job is in (as etcd-io/raft's stepFunc per
// role): stepTraining, stepChanging or stepPaused; an ended job ignores it.
func (c *Core) Step(now time.Time, ev Event) {
	switch e := ev.(type) {
	case Members:
		c.nodes.members = map[string]job.NodeInfo{}
		for _, n := range e.Nodes {
			c.nodes.members[n.Name] = n
		}
	case NodeFailed:
		delete(c.nodes.members, e.Name)
	case ReplanRequested:
		c.rebal.requested = &e
	case CutPersisted:
		c.cuts.persisted(now, e, c.log)
		return
	case Evaluating:
		if c.ops.wait != 0 && c.ops.kind == opEvaluate && e.Step == c.steps.next {
			c.status.Evaluation = &job.Evaluation{Step: e.Step, Done: e.Done, Samples: e.Samples}
		}
		return
	default:
		op, err := opOf(ev)
		if err != nil {
			c.log.Error("job: an event the core does not know", "event", fmt.Sprintf("%T", ev))
			return
		}
		if op != c.ops.wait {
			c.log.Debug("job: the outcome of a cancelled operation", "op", op, "event", fmt.Sprintf("%T", ev))
			return
		}
		c.ops.wait = 0
		c.status.Evaluation = nil // an evaluation in progress ended with it
	}
	switch ch := c.change; {
	case c.end != nil:
	case ch == nil:
		stepTraining(c, now, ev)
	case ch.paused():
		stepPaused(c, now, ev)
	default:
		stepChanging(c, now, ev)
	}
}

// stepTraining: steps run and cuts are taken; a node of the plan that
// fails sends the job back to its latest cut.
func stepTraining(c *Core, now time.Time, ev Event) {
	switch e := ev.(type) {
	case NodeFailed:
		if c.plan.domain[e.Name] {
			err := fmt.Errorf("node %s failed", e.Name)
			if c.ops.kind == opStep {
				err = fmt.Errorf("step %d: %w", c.steps.next, err)
			}
			c.failure(now, c.steps.next, c.steps.start, err, true)
		}
	case StepFinished:
		c.stepFinished(now, e)
	case CutTaken:
		c.cutTaken(now, c.ops.kind, e)
	case Probed:
		c.links.probeSpent += now.Sub(c.ops.start)
		c.status.ProbeTrainMS += job.Millis(now.Sub(c.ops.start))
		c.links.probed(now, e.Links, c.log)
		c.boundary(now)
	}
}

// stepChanging: a plan change is under way (see change.go).
func stepChanging(c *Core, now time.Time, ev Event) {
	switch e := ev.(type) {
	case NodeFailed:
		if !c.involves(e.Name) || c.ops.kind == opProbe {
			return // the next probe leaves it out
		}
		c.ops.wait = 0
		c.changeFailed(now, fmt.Errorf("node %s failed", e.Name), true)
	case Probed, StagesStarted, StateLoaded, CutTaken:
		c.changeOutcome(now, c.ops.kind, ev)
	}
}

// stepPaused: a failure's plan change failed and waits to try again; a
// node that joins ends the wait.
func stepPaused(c *Core, now time.Time, ev Event) {
	if _, ok := ev.(Members); ok && c.nodes.joinedSince(c.change.probed) {
		c.retry(now)
	}
}

// Tick tells the core the time; a paused job whose wait is over tries
// again.
func (c *Core) Tick(now time.Time) {
	if ch := c.change; ch != nil && ch.paused() && !now.Before(ch.wakeAt) {
		c.retry(now)
	}
}

// Cancel ends the job with err (its context ended): the stages are
// stopped.
func (c *Core) Cancel(now time.Time, err error) {
	if c.Ended() {
		return
	}
	c.stopAll(true)
	c.finish(nil, err)
}

func opOf(ev Event) (Op, error) {
	switch e := ev.(type) {
	case Probed:
		return e.Op, nil
	case StagesStarted:
		return e.Op, nil
	case StateLoaded:
		return e.Op, nil
	case StepFinished:
		return e.Op, nil
	case CutTaken:
		return e.Op, nil
	}
	return 0, errors.New("not an outcome")
}

// boundary decides what follows at the boundary before the next step, with
// the pipeline drained: the end, a cut, a re-plan or the step.
func (c *Core) boundary(now time.Time) {
	st, cu := &c.steps, &c.cuts
	if st.next >= c.job.Total {
		c.takeCut(now, opEvaluate)
		return
	}
	st.start = now
	if n := len(st.times); cu.auto && n >= autoKSteps && (cu.pause == 0 && n&(n-1) == 0 || st.next-cu.latest.Step == cu.every/2) {
		// Until the first cut, at 4, 8, 16... steps timed (the first ones
		// are slow); after a cut, halfway to the next, when its writing
		// and replication has likely ended.
		cu.every = chooseK(cu.expectedCost(c.cfg.Persists), balance.Median(st.times))
	}
	if st.next-cu.latest.Step >= cu.every {
		c.takeCut(now, opCut)
		return
	}
	if pairs := c.probeDue(now); len(pairs) > 0 {
		cands := c.nodes.candidates()
		fresh := c.links.probeLinks(now, pairs)
		c.ops.issue(now, opMeasure, func(op Op) Action { return Probe{Op: op, Nodes: cands, Links: pairs, Fresh: fresh} })
		return
	}
	c.runStep(now)
}

func (c *Core) runStep(now time.Time) {
	g := c.steps.next
	c.ops.issue(now, opStep, func(op Op) Action {
		return RunStep{Op: op, Gen: c.plan.running, Step: g, LR: c.job.LR.At(g), Timeout: stepTimeout(c.steps.times, c.cfg.StepTimeout), Rates: c.stepRates()}
	})
}

func (c *Core) takeCut(now time.Time, kind opKind) {
	if kind == opEvaluate {
		c.steps.start = now
	}
	g, acc := c.steps.next, c.steps.acc
	c.ops.issue(now, kind, func(op Op) Action {
		return TakeCut{Op: op, Gen: c.plan.running, Step: g, Progress: acc, Evaluate: kind == opEvaluate}
	})
}

// stepFinished follows a step: the step's time and loss, the cut window,
// the measured speeds, then a re-plan or an evaluation if due, then the
// next boundary.
func (c *Core) stepFinished(now time.Time, e StepFinished) {
	st, cu := &c.steps, &c.cuts
	dt := now.Sub(st.start)
	st.run += dt
	if e.Err != nil {
		c.failure(now, st.next, st.start, fmt.Errorf("step %d: %w", st.next, e.Err), true)
		return
	}
	if err := job.CheckLoss(st.next, e.Loss); err != nil {
		// Going back to a cut would replay the same steps to the same
		// loss: the job has failed.
		c.stopAll(true)
		c.finish(nil, err)
		return
	}
	st.times = append(st.times, dt.Seconds())
	c.followReplan()
	if cost, ok := cu.win.measure(st.times); ok {
		cu.measured = max(cost, cu.pause)
		cu.every = chooseK(cu.expectedCost(c.cfg.Persists), balance.Median(st.times))
	}
	st.acc.Loss = e.Loss
	st.acc.Correct += e.Correct
	st.acc.Seen += e.Seen
	st.next++
	c.recordStep(e.Loss, e.Timings)
	c.recordTimes(c.ops.start, now, e.Timings)
	c.observe(e.Timings)
	c.observeLinks(now, e.Timings, e.Feeds)
	c.checkSlowSteps(now)
	c.status.Links = c.links.status()
	if c.maybeRebalance(now) {
		return
	}
	if c.job.EvalDue(st.next) {
		c.takeCut(now, opEvaluate)
		return
	}
	c.boundary(now)
}

// cutTaken follows a cut: it becomes the latest, and its cost sets the
// interval.
func (c *Core) cutTaken(now time.Time, kind opKind, e CutTaken) {
	st, cu := &c.steps, &c.cuts
	if e.Err != nil {
		if kind == opCut {
			st.run += now.Sub(st.start)
		}
		c.failure(now, st.next, st.start, fmt.Errorf("checkpoint at step %d: %w", st.next, e.Err), true)
		return
	}
	c.cutGathered(now)
	switch {
	case kind == opCut:
		if cu.auto && len(st.times) >= autoKSteps {
			med := balance.Median(st.times)
			cu.every = chooseK(cu.expectedCost(c.cfg.Persists), med)
			cu.win = cutWindow{open: true, cut: st.next, start: len(st.times), med: med, persisted: !c.cfg.Persists}
		}
		c.runStep(now)
	case st.next < c.job.Total:
		c.status.Accuracy = append(c.status.Accuracy, c.job.EvalResult(st.next, e.Accuracy, e.TestLoss, e.AUC))
		c.boundary(now)
	default:
		c.finishTraining(e)
	}
}

// cutGathered makes the state after the steps done the latest cut, held by
// the driver; with persisting cuts it counts once written and copied.
func (c *Core) cutGathered(now time.Time) {
	cu, g := &c.cuts, c.steps.next
	cu.latest = Cut{Step: g, Progress: c.steps.acc}
	cu.pause = now.Sub(c.ops.start)
	if !c.cfg.Persists {
		cu.durable, cu.count = g, cu.count+1
		return
	}
	cu.persisting, cu.persistStart = g, now
}

// persisted follows the report that a cut was written and copied, or
// failed to be.
func (cu *cutState) persisted(now time.Time, e CutPersisted, log *slog.Logger) {
	if e.Step != cu.persisting {
		return
	}
	cu.persisting = -1
	cu.persist = now.Sub(cu.persistStart)
	if e.Err != nil {
		log.Warn("writing or copying a checkpoint; the cut is not durable", "step", e.Step, "err", e.Err)
	} else {
		cu.durable, cu.count = max(cu.durable, e.Step), cu.count+1
	}
	if cu.win.open && cu.win.cut == e.Step {
		cu.win.persisted = true
	}
}

// finishTraining ends the job with the final cut's accuracy.
func (c *Core) finishTraining(e CutTaken) {
	s, j, st := c.job.Spec, c.job, &c.steps
	elapsed := st.run.Seconds()
	var nodes []string
	for _, sp := range c.plan.Stages {
		if !slices.Contains(nodes, sp.Node) { // an interleaved node's chunks: once
			nodes = append(nodes, sp.Node)
		}
	}
	final := j.EvalResult(j.Total, e.Accuracy, e.TestLoss, e.AUC)
	res := &job.Result{
		ID: s.ID, Model: s.Model, Data: s.Data, Params: j.Graph.ParamCount(), Steps: j.Total,
		Epochs: float64(j.Total) / float64(j.StepsPerEpoch), Batch: s.Batch, MicroBatches: s.MicroBatches,
		SamplesPerSec: float64(j.Total*s.Batch) / elapsed, TrainLoss: st.acc.Loss,
		TrainAccuracy: float64(st.acc.Correct) / float64(max(st.acc.Seen, 1)), TestAccuracy: final.Accuracy,
		TestLoss: final.TestLoss, Perplexity: final.Perplexity, TestAUC: final.AUC, Loss: j.LossName(),
		Backend: c.cfg.Backend, Threads: s.Threads, Deterministic: s.Deterministic, Seconds: elapsed,
		EvalSeconds: e.Evaluated.Seconds(), EvaluatedOn: evaluatedOn(e.OnStages), WeightsSHA256: e.WeightsSHA256, Plan: c.plan.text, Schedule: c.plan.ScheduleText(),
		Nodes: nodes, PredictedStepMS: c.plan.report.StepTime * 1e3, MeasuredStepMS: balance.Median(st.times) * 1e3,
		LossHistory: st.losses.Points(),
	}
	c.status.Accuracy = append(c.status.Accuracy, final)
	res.Evaluations = slices.Clone(c.status.Accuracy)
	c.stopAll(true)
	c.finish(res, nil)
}

func evaluatedOn(stages bool) string {
	if stages {
		return "stages"
	}
	return "coordinator"
}

// finish ends the job: done with res, else failed (diverged) with err.
func (c *Core) finish(res *job.Result, err error) {
	c.change, c.ops.wait = nil, 0
	c.end = &Finish{Result: res, Err: err}
	c.ops.out = append(c.ops.out, *c.end)
}

// stopAll stops every stage the job has started.
func (c *Core) stopAll(wait bool) {
	if ch := c.change; ch != nil && ch.old != 0 {
		c.ops.out = append(c.ops.out, StopStages{Gen: ch.old, Wait: wait})
		ch.old = 0
	}
	c.stopRunning(wait)
}

// stopRunning stops the stages of the current plan (without waiting for them
// unless wait).
func (c *Core) stopRunning(wait bool) {
	if c.plan.running != 0 {
		c.ops.out = append(c.ops.out, StopStages{Gen: c.plan.running, Wait: wait})
		c.plan.running = 0
	}
}

// recordStep updates the status after a step.
func (c *Core) recordStep(loss float64, timings []StageTiming) {
	g := c.steps.next
	c.status.Step, c.status.Loss = g, loss
	c.steps.losses.Add(g, loss) // a replayed step replaces the points from it on
	c.status.SamplesPerSec = float64(g*c.job.Spec.Batch) / c.steps.run.Seconds()
	const a = 0.2 // exponential smoothing of the per-stage times
	for k, t := range timings {
		if k >= len(c.status.Stages) {
			continue
		}
		st := &c.status.Stages[k]
		sm := func(old float64, d time.Duration) float64 {
			v := job.Millis(d)
			if g == 1 {
				return v
			}
			return (1-a)*old + a*v
		}
		st.ForwardMS, st.BackwardMS = sm(st.ForwardMS, t.Forward), sm(st.BackwardMS, t.Backward)
		st.UpdateMS, st.WaitMS = sm(st.UpdateMS, t.Update), sm(st.WaitMS, t.Wait)
		st.WallMS = sm(st.WallMS, t.Wall)
	}
}

// observe turns a step's stage timings into measured node speeds: a node
// whose stages (an interleaved node's chunks) the plan expected to be busy
// for p seconds in all at speed v, and that were busy b seconds, ran at
// v·p/b.
func (c *Core) observe(timings []StageTiming) {
	for _, np := range c.plan.cl.Nodes {
		// Over its stages: the lowest capacity and CPUs; the process's CPU
		// time, which each stage measured over its own step.
		var busy, pred, capacity, cpus, cpu float64
		for k, t := range timings {
			if k >= len(c.plan.report.Stages) || k >= len(c.plan.Stages) || c.plan.Stages[k].Node != np.Name {
				continue
			}
			busy += (t.Forward + t.Backward + t.Update).Seconds()
			pred += c.plan.report.Stages[k].Busy
			if t.CapacityGFLOPS > 0 && (capacity == 0 || t.CapacityGFLOPS < capacity) {
				capacity = t.CapacityGFLOPS
			}
			if t.CPUs > 0 && (cpus == 0 || t.CPUs < cpus) {
				cpus = t.CPUs
			}
			cpu = max(cpu, t.CPU.Seconds())
		}
		if busy <= 0 || pred <= 0 {
			continue
		}
		node := np.Name
		v := np.Speed * pred / busy
		// A node whose stage idles part of the time can look faster than
		// it is: under a CPU quota (or a share of a machine) short bursts
		// run at full speed until the quota is used up. What its CPU limit
		// allows now bounds it, or else, a little above, its GEMM speed
		// measured over whole quota periods at its start.
		bound := math.Inf(1)
		if capacity > 0 && c.cfg.GFLOPS > 0 {
			bound = capacity / c.cfg.GFLOPS
		} else if n := c.nodes.known[node]; n.GFLOPS > 0 {
			bound = speedCap * gemmSpeed(n, c.cfg.GFLOPS)
		}
		// Under a limit, the node does at most its CPUs' worth of the work
		// its process does per CPU second.
		if cpus > 0 && cpu > 0 {
			bound = min(bound, cpus*smooth(c.nodes.perCPU, node, np.Speed*pred/cpu))
		}
		// The smoothing is for noisy measurements: a limit that falls (a
		// quota cut) holds at once.
		c.nodes.speed[node] = min(smooth(c.nodes.speed, node, min(v, bound)), bound)
	}
}

// smooth records m[key], the newest measurement v weighed against the
// ones before, and returns it.
func smooth(m map[string]float64, key string, v float64) float64 {
	if old, ok := m[key]; ok {
		v = (1-speedSmoothing)*old + speedSmoothing*v
	}
	m[key] = v
	return v
}

// followReplan records the last re-plan's measured step time after it
// once replanWindow steps have run.
func (c *Core) followReplan() {
	rc, times := &c.rebal.check, c.steps.times
	if !rc.active || len(times)-rc.start < replanWindow {
		return
	}
	c.status.Replans[rc.replan].MeasuredAfterMS = 1e3 * balance.Median(times[rc.start:rc.start+replanWindow])
	rc.active = false
}

// clusterOf describes nodes to the planner: the fastest first, at most
// MaxNodes, each at its measured speed if it ran a stage of this job, else
// at its GEMM speed relative to the reference.
func (c *Core) clusterOf(nodes []job.NodeInfo) *balance.Cluster {
	for _, n := range nodes {
		c.nodes.known[n.Name] = n
	}
	nodes = slices.Clone(nodes)
	sort.SliceStable(nodes, func(i, j int) bool { return nodes[i].GFLOPS > nodes[j].GFLOPS })
	if m := c.job.Spec.MaxNodes; m > 0 && len(nodes) > m {
		nodes = nodes[:m]
	}
	cl := &balance.Cluster{DefaultLink: balance.DefaultLink}
	for _, n := range nodes {
		np := balance.NodeProfile{Name: n.Name, Memory: n.Memory, Speed: gemmSpeed(n, c.cfg.GFLOPS)}
		if n.Name == c.cfg.Self && n.Memory > 0 {
			np.Memory = max(1, n.Memory-c.cfg.SelfMemory)
		}
		if v, ok := c.nodes.speed[n.Name]; ok {
			np.Speed = v
		}
		cl.Nodes = append(cl.Nodes, np)
	}
	cl.Links = c.links.profiles(cl.Nodes)
	cl.DefaultLink.Act, cl.DefaultLink.Grad = c.links.wireCost(nil, kindActivation), c.links.wireCost(nil, kindGradient)
	cl.DefaultLink.Input, cl.Feeder = c.links.wireCost(nil, kindInput), c.cfg.Self
	return cl
}

// search finds the best plan for cl with partitioner part (a
// partitioner's name or a partition), on this goroutine.
func (c *Core) search(cl *balance.Cluster, part string) (*balance.Result, error) {
	s := c.job.Spec
	if part == "auto" {
		part = balance.GraphPP
	}
	replan := c.plan.Plan != nil || c.cfg.Takeover
	if n := len(cl.Nodes); s.Schedule == balance.Interleaved.String() && replan && s.MicroBatches > 0 && s.MicroBatches%n != 0 {
		// A running job, or one a successor takes over, re-plans over
		// nodes that do not divide its micro-batches (a node failed or
		// left): interleaved runs on the most of the fastest nodes that
		// do. A submission's first plan refuses instead.
		for n > 2 && s.MicroBatches%n != 0 {
			n--
		}
		c.log.Info("interleaved: planning over the nodes that divide the micro-batches", "nodes", n, "of", len(cl.Nodes), "micro_batches", s.MicroBatches)
		trimmed := *cl
		trimmed.Nodes, trimmed.Links = cl.Nodes[:n], nil
		for _, l := range cl.Links {
			kept := func(name string) bool {
				return slices.ContainsFunc(trimmed.Nodes, func(np balance.NodeProfile) bool { return np.Name == name })
			}
			if kept(l.From) && kept(l.To) {
				trimmed.Links = append(trimmed.Links, l)
			}
		}
		cl = &trimmed
	}
	res, err := balance.Search(c.job.Graph, c.cfg.Profile, cl, balance.Options{
		Partitioner: part, Schedule: s.Schedule, Chunks: s.Chunks, Batch: s.Batch, MicroBatches: s.MicroBatches, MaxMicroBatches: job.MaxAutoMicroBatches,
		Optimizer: s.Optimizer, Model: s.Model, Workers: 1, Replicas: true, ChainedSums: s.Deterministic, Recompute: s.Recompute,
	})
	if errors.Is(err, balance.ErrNoFit) {
		// The nodes, not the spec: a recovery waits for more; a new job
		// is refused (see New).
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
	if c.log.Enabled(context.Background(), slog.LevelDebug) {
		b, _ := json.Marshal(cl) // what `ppnode plan --nodes FILE` reads
		c.log.Debug("planned", "partitioner", part, "plan", res.Spec, "predicted_ms", res.Report.StepTime*1e3, "cluster", string(b))
	}
	return res, nil
}

// adopt makes res, planned for cl, the job's plan; the nodes of old (a plan
// the state moves from) stay in the plan's failure domain until the move
// ends.
func (c *Core) adopt(res *balance.Result, cl *balance.Cluster, old *balance.Plan) {
	p := &c.plan
	p.Plan, p.report, p.text, p.cl = res.Plan, res.Report, res.Spec, cl
	c.status.Plan, c.status.Schedule, c.status.MicroBatches = p.text, p.ScheduleText(), p.MicroBatches
	c.status.PredictedMS, c.status.PredictedBubble = p.report.StepTime*1e3, p.report.BubbleFraction
	c.status.PredictedPasses = predictedPasses(p.report, len(p.Stages))
	c.status.Tied = nil
	for _, t := range p.TiedAcross(c.job.Graph) {
		c.status.Tied = append(c.status.Tied, t.String())
	}
	c.status.Stages = nil
	p.domain = map[string]bool{}
	for _, sp := range p.Stages {
		p.domain[sp.Node] = true
		c.status.Stages = append(c.status.Stages, job.StageStatus{ID: sp.ID, Group: sp.Group, Replica: sp.Replica, MicroBatches: len(sp.Micros()),
			Node: sp.Node, Layers: layerRange(sp.Layers), To: stageTargets(sp), Recompute: sp.Recompute})
	}
	if old != nil {
		for _, sp := range old.Stages {
			p.domain[sp.Node] = true
		}
	}
}

func layerRange(ls []string) string {
	if len(ls) == 1 {
		return ls[0]
	}
	return ls[0] + "-" + ls[len(ls)-1]
}

// specErr is a problem with the job's spec, wrapping job.ErrSpec.
func specErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", job.ErrSpec, fmt.Sprintf(format, a...))
}
