package core

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
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

// Core is the pure core of one pipelined job (DESIGN.md, "One training
// step" and "Re-planning is one mechanism"): a state machine that takes
// events ([Core.Step], [Core.Tick]) and returns the operations to carry
// out ([Core.Ready]). It plans the job over the live nodes, runs its steps
// one after the other, takes consistent cuts at an interval it chooses
// from their cost, follows the nodes' measured speeds, and changes the
// plan, by one transition, when a node fails, joins or leaves, when the
// speeds drift, when a user asks, and when a successor takes the job over.
// It owns no goroutine, socket or clock: time is an argument. It is used
// from one goroutine.
type Core struct {
	cfg  Config
	job  *job.Job
	spec job.Spec
	log  *slog.Logger

	// The plan: its simulated report, its description, the cluster it was
	// made for, its generation, the nodes a failure of which breaks the
	// job (the previous plan's too while moving), and the generation of
	// the stages started for it (0: none).
	plan    *balance.Plan
	report  *balance.Report
	text    string
	cl      *balance.Cluster
	gen     uint64
	inPlan  map[string]bool
	running uint64

	// The cluster: the live members, every node seen, measured speeds.
	members map[string]job.NodeInfo
	known   map[string]job.NodeInfo
	speed   map[string]float64
	links   map[[2]string]*linkState // by sending and receiving node
	// probeSpent is the time spent probing links while training;
	// slowChecks counts the checks in a row that found the steps slow.
	probeSpent time.Duration
	slowChecks int

	// Progress: the next step, what the result has accumulated, the
	// latest cut, every step's duration, the training time (recoveries
	// and moves excluded), the current step's start.
	g         int
	acc       Progress
	losses    job.LossHistory // since the start, or the resumed cut
	cut       Cut
	steps     []float64
	run       time.Duration
	stepStart time.Time

	// Cuts: the interval K, the state's size, what the last cut cost
	// (its pause, its persist, its measured cost to the steps around it),
	// the cut being persisted and the window measuring its cost.
	k                                 int
	autoK                             bool
	stateSize                         int64
	cutCost, persistTime, cutMeasured time.Duration
	persisting                        int // the step of the cut being persisted; -1: none
	persistStart                      time.Time
	win                               cutWindow

	// Re-planning: the step the plan started at, the evaluations in a row
	// that favoured a change, the last re-plan followed until measured, a
	// re-plan a user asked for.
	planStep, streak int
	// planFrom is the index in steps of the plan's first step.
	planFrom  int
	check     replanCheck
	requested *ReplanRequested

	status job.Status
	step   stepFunc // the state's
	change *change  // the plan change under way
	// The operations: the last one numbered, the one waited for (0: none),
	// its kind and start; when a paused job wakes; the actions not yet
	// returned by Ready.
	next, wait Op
	waitFor    opKind
	opStart    time.Time
	wakeAt     time.Time
	out        []Action
}

// opKind is what the core waits for.
type opKind int

const (
	opNone opKind = iota
	opStep
	opCut      // a periodic cut
	opEvaluate // a cut with the test accuracy, at an epoch's end or the job's
	opProbe
	opMeasure // probing links while training
	opStart
	opLoad
	opChangeCut // the cut a change through a cut starts with
)

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
	c := &Core{cfg: cfg, job: j, spec: j.Spec, log: cfg.Logger.With("job", j.Spec.ID), members: map[string]job.NodeInfo{},
		known: map[string]job.NodeInfo{}, speed: map[string]float64{}, links: map[[2]string]*linkState{}, inPlan: map[string]bool{}, persisting: -1, step: stepTraining}
	for _, n := range cfg.Nodes {
		c.members[n.Name] = n
	}
	c.status = job.Status{ID: j.Spec.ID, State: job.StatePlanning, Model: j.Spec.Model, Total: j.Total, Started: cfg.Now}
	if r := cfg.Resume; r != nil {
		if r.Step < 0 || r.Step > j.Total {
			return nil, fmt.Errorf("checkpoint at step %d of a %d-step job", r.Step, j.Total)
		}
		c.cut = *r
		c.g, c.acc = r.Step, r.Progress
	}
	// The first stages start at generation max(Generation, 1).
	c.gen = max(cfg.Generation, 1) - 1
	c.autoK = c.spec.CheckpointEvery == 0
	c.k = math.MaxInt
	if !c.autoK {
		c.setK(c.spec.CheckpointEvery)
	}
	c.stateSize = c.stateBytes(c.job.Graph.Params())
	cl := c.clusterOf(cfg.Nodes)
	res, err := c.search(cl, c.spec.Partition)
	if errors.Is(err, balance.ErrNoFit) {
		return nil, fmt.Errorf("%w: %w", job.ErrSpec, err)
	}
	if err != nil {
		return nil, err
	}
	c.adopt(res, cl, nil)
	return c, nil
}

// Start begins the job: its first plan change starts the stages and loads
// the resumed cut, if any.
func (c *Core) Start(now time.Time) {
	trigger := job.TriggerStart
	if c.cfg.Takeover {
		trigger = job.TriggerTakeover
	}
	ch := &change{trigger: trigger, source: sourceCut, res: &balance.Result{Plan: c.plan, Report: c.report, Spec: c.text}, cl: c.cl}
	if len(c.unmeasured(now, c.candidates())) > 0 {
		ch.res, ch.cl = nil, nil // plan once the links are measured
	}
	c.changePlan(now, ch)
}

// Ready returns the operations to carry out, in order, and forgets them.
func (c *Core) Ready() []Action {
	out := c.out
	c.out = nil
	return out
}

// Ended reports whether the job has ended (a [Finish] was returned).
func (c *Core) Ended() bool { return c.status.State.Ended() }

// Plan is the current plan.
func (c *Core) Plan() *balance.Plan { return c.plan }

// Report is the simulator's prediction for the current plan.
func (c *Core) Report() *balance.Report { return c.report }

// Describe is a one-line summary of the plan.
func (c *Core) Describe() string {
	return fmt.Sprintf("%s, %s, M=%d: predicted %.1f ms/step", c.text, c.plan.Schedule, c.plan.MicroBatches, c.report.StepTime*1e3)
}

// Status returns a copy of the job's progress.
func (c *Core) Status() job.Status {
	s := c.status
	s.Stages = slices.Clone(s.Stages)
	s.Accuracy = slices.Clone(s.Accuracy)
	s.Recoveries = slices.Clone(s.Recoveries)
	s.Replans = slices.Clone(s.Replans)
	s.LossHistory = c.losses.Points()
	s.LastSteps = slices.Clone(s.LastSteps)
	return s
}

// Generation is the generation of the newest stages (0: none started yet).
func (c *Core) Generation() uint64 { return c.gen }

// Step gives the core an event that happened at now. What the cluster
// and users say is recorded in any state; the rest is up to the step
// function of the state the job is in (as etcd-io/raft's stepFunc per
// role): stepTraining, stepChanging, stepPaused or stepEnded.
func (c *Core) Step(now time.Time, ev Event) {
	switch e := ev.(type) {
	case Members:
		c.members = map[string]job.NodeInfo{}
		for _, n := range e.Nodes {
			c.members[n.Name] = n
		}
	case NodeFailed:
		delete(c.members, e.Name)
	case ReplanRequested:
		c.requested = &e
	case CutPersisted:
		c.cutPersisted(now, e)
		return
	default:
		op, err := opOf(ev)
		if err != nil {
			c.log.Error("job: an event the core does not know", "event", fmt.Sprintf("%T", ev))
			return
		}
		if op != c.wait {
			c.log.Debug("job: the outcome of a cancelled operation", "op", op, "event", fmt.Sprintf("%T", ev))
			return
		}
		c.wait = 0
	}
	c.step(c, now, ev)
}

// stepFunc handles an event in one state of the job.
type stepFunc func(c *Core, now time.Time, ev Event)

// stepTraining: steps run and cuts are taken; a node of the plan that
// fails sends the job back to its latest cut.
func stepTraining(c *Core, now time.Time, ev Event) {
	switch e := ev.(type) {
	case NodeFailed:
		if c.inPlan[e.Name] {
			err := fmt.Errorf("node %s failed", e.Name)
			if c.waitFor == opStep {
				err = fmt.Errorf("step %d: %w", c.g, err)
			}
			c.failure(now, c.g, c.stepStart, err)
		}
	case StepFinished:
		c.stepFinished(now, e)
	case CutTaken:
		c.cutTaken(now, c.waitFor, e)
	case Probed:
		c.probeSpent += now.Sub(c.opStart)
		c.status.ProbeTrainMS += ms(now.Sub(c.opStart))
		c.probed(now, e.Links)
		c.boundary(now)
	}
}

// stepChanging: a plan change is under way (see change.go).
func stepChanging(c *Core, now time.Time, ev Event) {
	switch e := ev.(type) {
	case NodeFailed:
		if !c.inPlan[e.Name] || c.waitFor == opProbe {
			return // the next probe leaves it out
		}
		c.wait = 0
		c.changeFailed(now, fmt.Errorf("node %s failed", e.Name))
	case Probed, StagesStarted, StateLoaded, CutTaken:
		c.changeOutcome(now, c.waitFor, ev)
	}
}

// stepPaused: a failure's plan change failed and waits to try again; a
// node that joins ends the wait.
func stepPaused(c *Core, now time.Time, ev Event) {
	if _, ok := ev.(Members); ok && c.joinedSince(c.change.probed) {
		c.retry(now)
	}
}

// stepEnded: the job has ended.
func stepEnded(*Core, time.Time, Event) {}

// Tick tells the core the time; a paused job whose wait is over tries
// again.
func (c *Core) Tick(now time.Time) {
	if c.change != nil && c.change.paused && !now.Before(c.wakeAt) {
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

// issue asks for an operation and waits for its outcome.
func (c *Core) issue(now time.Time, kind opKind, a func(Op) Action) {
	c.next++
	c.wait, c.waitFor, c.opStart = c.next, kind, now
	c.out = append(c.out, a(c.next))
}

// boundary decides what follows at the boundary before step c.g, with the
// pipeline drained: the end, a cut, a re-plan or the step.
func (c *Core) boundary(now time.Time) {
	if c.g >= c.job.Total {
		c.setState(job.StateEvaluating, "")
		c.takeCut(now, opEvaluate)
		return
	}
	c.stepStart = now
	if n := len(c.steps); c.autoK && n >= autoKSteps && (c.cutCost == 0 && n&(n-1) == 0 || c.g-c.cut.Step == c.k/2) {
		// Until the first cut, at 4, 8, 16... steps timed (the first ones
		// are slow); after a cut, halfway to the next, when its writing
		// and replication has likely ended.
		c.setK(chooseK(c.expectedCutCost(), balance.Median(c.steps)))
	}
	if c.g-c.cut.Step >= c.k {
		c.takeCut(now, opCut)
		return
	}
	if pairs := c.probeDue(now); len(pairs) > 0 {
		cands := c.candidates()
		fresh := c.probeLinks(now, pairs)
		c.issue(now, opMeasure, func(op Op) Action { return Probe{Op: op, Nodes: cands, Links: pairs, Fresh: fresh} })
		return
	}
	c.runStep(now)
}

func (c *Core) runStep(now time.Time) {
	g := c.g
	c.issue(now, opStep, func(op Op) Action {
		return RunStep{Op: op, Gen: c.running, Step: g, LR: c.job.LR.At(g), Timeout: stepTimeout(c.steps, c.cfg.StepTimeout), Rates: c.stepRates()}
	})
}

func (c *Core) takeCut(now time.Time, kind opKind) {
	if kind == opEvaluate {
		c.stepStart = now
	}
	g, acc := c.g, c.acc
	c.issue(now, kind, func(op Op) Action {
		return TakeCut{Op: op, Gen: c.running, Step: g, Progress: acc, Evaluate: kind == opEvaluate}
	})
}

// stepFinished follows a step: the step's time and loss, the cut window,
// the measured speeds, then a re-plan or an evaluation if due, then the
// next boundary.
func (c *Core) stepFinished(now time.Time, e StepFinished) {
	dt := now.Sub(c.stepStart)
	c.run += dt
	if e.Err != nil {
		c.failure(now, c.g, c.stepStart, fmt.Errorf("step %d: %w", c.g, e.Err))
		return
	}
	if err := job.CheckLoss(c.g, e.Loss); err != nil {
		// Going back to a cut would replay the same steps to the same
		// loss: the job has failed.
		c.stopAll(true)
		c.finish(nil, err)
		return
	}
	c.steps = append(c.steps, dt.Seconds())
	c.followReplan()
	if cost, ok := c.win.measure(c.steps); ok {
		c.cutMeasured = max(cost, c.cutCost)
		c.status.CutCostMS = ms(c.cutMeasured)
		c.setK(chooseK(c.expectedCutCost(), balance.Median(c.steps)))
	}
	c.acc.Loss = e.Loss
	c.acc.Correct += e.Correct
	c.acc.Seen += e.Seen
	c.g++
	c.recordStep(e.Loss, e.Timings)
	c.recordTimes(c.opStart, now, e.Timings)
	c.observe(e.Timings)
	c.observeLinks(now, e.Timings, e.Feeds)
	c.checkSlowSteps(now)
	c.status.Links = c.linkStatus()
	if c.maybeRebalance(now) {
		return
	}
	if c.spec.EvalEachEpoch && c.g%c.job.StepsPerEpoch == 0 && c.g < c.job.Total {
		c.takeCut(now, opEvaluate)
		return
	}
	c.boundary(now)
}

// cutTaken follows a cut: it becomes the latest, and its cost sets the
// interval.
func (c *Core) cutTaken(now time.Time, kind opKind, e CutTaken) {
	if e.Err != nil {
		if kind == opCut {
			c.run += now.Sub(c.stepStart)
		}
		c.failure(now, c.g, c.stepStart, fmt.Errorf("checkpoint at step %d: %w", c.g, e.Err))
		return
	}
	c.cutGathered(now)
	switch {
	case kind == opCut:
		if c.autoK && len(c.steps) >= autoKSteps {
			med := balance.Median(c.steps)
			c.setK(chooseK(c.expectedCutCost(), med))
			c.win = cutWindow{open: true, cut: c.g, start: len(c.steps), med: med, persisted: !c.cfg.Persists}
		}
		c.runStep(now)
	case c.g < c.job.Total:
		c.status.Accuracy = append(c.status.Accuracy, job.EpochAcc{Epoch: c.g / c.job.StepsPerEpoch, Accuracy: e.Accuracy})
		c.boundary(now)
	default:
		c.finishTraining(e)
	}
}

// cutGathered makes the state after c.g the latest cut, held by the
// driver; with persisting cuts it counts once written and copied.
func (c *Core) cutGathered(now time.Time) {
	c.cut = Cut{Step: c.g, Progress: c.acc}
	c.cutCost = now.Sub(c.opStart)
	c.status.CheckpointMS = ms(c.cutCost)
	if !c.cfg.Persists {
		c.status.LatestCut, c.status.Cuts = c.g, c.status.Cuts+1
		return
	}
	c.persisting, c.persistStart = c.g, now
}

func (c *Core) cutPersisted(now time.Time, e CutPersisted) {
	if e.Step != c.persisting {
		return
	}
	c.persisting = -1
	c.persistTime = now.Sub(c.persistStart)
	c.status.PersistMS = ms(c.persistTime)
	if e.Err != nil {
		c.log.Warn("writing or copying a checkpoint; the cut is not durable", "step", e.Step, "err", e.Err)
	} else {
		c.status.LatestCut, c.status.Cuts = max(c.status.LatestCut, e.Step), c.status.Cuts+1
	}
	if c.win.open && c.win.cut == e.Step {
		c.win.persisted = true
	}
}

// finishTraining ends the job with the final cut's accuracy.
func (c *Core) finishTraining(e CutTaken) {
	s, j := c.spec, c.job
	elapsed := c.run.Seconds()
	var nodes []string
	for _, sp := range c.plan.Stages {
		nodes = append(nodes, sp.Node)
	}
	res := &job.Result{
		ID: s.ID, Model: s.Model, Data: s.Data, Params: j.Graph.ParamCount(), Steps: j.Total,
		Epochs: float64(j.Total) / float64(j.StepsPerEpoch), Batch: s.Batch, MicroBatches: s.MicroBatches,
		SamplesPerSec: float64(j.Total*s.Batch) / elapsed, TrainLoss: c.acc.Loss,
		TrainAccuracy: float64(c.acc.Correct) / float64(max(c.acc.Seen, 1)), TestAccuracy: e.Accuracy,
		TestLoss: e.TestLoss, Perplexity: j.Perplexity(e.TestLoss),
		Backend: c.cfg.Backend, Threads: s.Threads, Deterministic: s.Deterministic, Seconds: elapsed,
		WeightsSHA256: e.WeightsSHA256, Plan: c.text, Schedule: c.plan.Schedule.String(),
		Nodes: nodes, PredictedStepMS: c.report.StepTime * 1e3, MeasuredStepMS: balance.Median(c.steps) * 1e3,
		LossHistory: c.losses.Points(),
	}
	c.status.Accuracy = append(c.status.Accuracy, job.EpochAcc{Epoch: (j.Total + j.StepsPerEpoch - 1) / j.StepsPerEpoch, Accuracy: e.Accuracy})
	c.stopAll(true)
	c.finish(res, nil)
}

// finish ends the job: done with res, else failed (diverged) with err.
func (c *Core) finish(res *job.Result, err error) {
	c.change, c.wait, c.step = nil, 0, stepEnded
	if err != nil {
		c.status.State, c.status.Reason, c.status.Error = job.StateFailed, "", err.Error()
		if errors.Is(err, job.ErrDiverged) {
			c.status.State = job.StateDiverged
		}
	} else {
		c.status.State, c.status.Reason, c.status.Result = job.StateDone, "", res
	}
	c.out = append(c.out, Finish{Result: res, Err: err})
}

// stopAll stops every stage the job has started.
func (c *Core) stopAll(wait bool) {
	if ch := c.change; ch != nil && ch.old != 0 {
		c.out = append(c.out, StopStages{Gen: ch.old, Wait: wait})
		ch.old = 0
	}
	c.stopRunning(wait)
}

// stopRunning stops the stages of the current plan (without waiting for them
// unless wait).
func (c *Core) stopRunning(wait bool) {
	if c.running != 0 {
		c.out = append(c.out, StopStages{Gen: c.running, Wait: wait})
		c.running = 0
	}
}

func (c *Core) setState(s job.State, reason string) { c.status.State, c.status.Reason = s, reason }

func (c *Core) setK(k int) {
	c.k = k
	c.status.CheckpointEvery = k
}

// recordStep updates the status after a step.
func (c *Core) recordStep(loss float64, timings []StageTiming) {
	c.status.Step, c.status.Loss = c.g, loss
	c.losses.Add(c.g, loss) // a replayed step replaces the points from it on
	c.status.SamplesPerSec = float64(c.g*c.spec.Batch) / c.run.Seconds()
	const a = 0.2 // exponential smoothing of the per-stage times
	for k, t := range timings {
		if k >= len(c.status.Stages) {
			continue
		}
		st := &c.status.Stages[k]
		sm := func(old float64, d time.Duration) float64 {
			v := ms(d)
			if c.g == 1 {
				return v
			}
			return (1-a)*old + a*v
		}
		st.ForwardMS, st.BackwardMS = sm(st.ForwardMS, t.Forward), sm(st.BackwardMS, t.Backward)
		st.UpdateMS, st.WaitMS = sm(st.UpdateMS, t.Update), sm(st.WaitMS, t.Wait)
		st.WallMS = sm(st.WallMS, t.Wall)
	}
}

// observe turns a step's stage timings into measured node speeds: a stage
// the plan expected to be busy for p seconds at speed v that was busy b
// seconds ran at v·p/b.
func (c *Core) observe(timings []StageTiming) {
	for k, t := range timings {
		if k >= len(c.report.Stages) {
			continue
		}
		busy := (t.Forward + t.Backward + t.Update).Seconds()
		pred := c.report.Stages[k].Busy
		node := c.plan.Stages[k].Node
		i := slices.IndexFunc(c.cl.Nodes, func(n balance.NodeProfile) bool { return n.Name == node })
		if busy <= 0 || pred <= 0 || i < 0 {
			continue
		}
		v := c.cl.Nodes[i].Speed * pred / busy
		// A node whose stage idles part of the time can look faster than
		// it is: under a CPU quota (or a share of a machine) short bursts
		// run at full speed until the quota is used up. What its CPU limit
		// allows now bounds it, or else, a little above, its GEMM speed
		// measured over whole quota periods at its start.
		if t.CapacityGFLOPS > 0 && c.cfg.GFLOPS > 0 {
			v = min(v, t.CapacityGFLOPS/c.cfg.GFLOPS)
		} else if n := c.known[node]; n.GFLOPS > 0 {
			v = min(v, speedCap*c.gemmSpeed(n))
		}
		if old, ok := c.speed[node]; ok {
			v = (1-speedSmoothing)*old + speedSmoothing*v
		}
		c.speed[node] = v
	}
}

// followReplan records the last re-plan's measured step time after it
// once replanWindow steps have run.
func (c *Core) followReplan() {
	rc := c.check
	if !rc.active || len(c.steps)-rc.start < replanWindow {
		return
	}
	c.status.Replans[rc.replan].MeasuredAfterMS = 1e3 * balance.Median(c.steps[rc.start:rc.start+replanWindow])
	c.check.active = false
}

// expectedCutCost is what the next cut is expected to cost (see cutCost).
func (c *Core) expectedCutCost() time.Duration {
	return cutCost(c.stateSize, c.cutCost, c.persistTime, c.cutMeasured, c.cfg.Persists)
}

// candidates are the live members a plan may use, by name.
func (c *Core) candidates() []job.NodeInfo {
	return slices.SortedFunc(maps.Values(c.members), func(a, b job.NodeInfo) int { return strings.Compare(a.Name, b.Name) })
}

// clusterOf describes nodes to the planner: the fastest first, at most
// MaxNodes, each at its measured speed if it ran a stage of this job, else
// at its GEMM speed relative to the reference.
func (c *Core) clusterOf(nodes []job.NodeInfo) *balance.Cluster {
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
	cl.Links = c.clusterLinks(cl.Nodes)
	cl.DefaultLink.Act, cl.DefaultLink.Grad = c.wireCost(nil, kindActivation), c.wireCost(nil, kindGradient)
	cl.DefaultLink.Input, cl.Feeder = c.wireCost(nil, kindInput), c.cfg.Self
	return cl
}

// gemmSpeed is n's speed relative to the profile from GEMM speeds: its
// sustained one over the reference (see Config.GFLOPS), so that quotas
// count. Without them it is 1.
func (c *Core) gemmSpeed(n job.NodeInfo) float64 {
	if n.GFLOPS > 0 && c.cfg.GFLOPS > 0 {
		return n.GFLOPS / c.cfg.GFLOPS
	}
	return 1
}

// search finds the best plan for cl with partitioner part (a
// partitioner's name or a partition).
func (c *Core) search(cl *balance.Cluster, part string) (*balance.Result, error) {
	s := c.spec
	if part == "auto" {
		part = balance.GraphPP
	}
	res, err := balance.Search(c.job.Graph, c.cfg.Profile, cl, balance.Options{
		Partitioner: part, Schedule: s.Schedule, Batch: s.Batch, MicroBatches: s.MicroBatches,
		Optimizer: s.Optimizer, Model: s.Model,
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
	return res, nil
}

// adopt makes res, planned for cl, the job's plan; the nodes of old (a plan
// the state moves from) stay in the plan's failure domain until the move
// ends.
func (c *Core) adopt(res *balance.Result, cl *balance.Cluster, old *balance.Plan) {
	c.plan, c.report, c.text, c.cl = res.Plan, res.Report, res.Spec, cl
	c.status.Plan, c.status.Schedule, c.status.MicroBatches = c.text, c.plan.Schedule.String(), c.plan.MicroBatches
	c.status.PredictedMS = c.report.StepTime * 1e3
	c.status.Stages = nil
	c.inPlan = map[string]bool{}
	for _, sp := range c.plan.Stages {
		c.inPlan[sp.Node] = true
		c.status.Stages = append(c.status.Stages, job.StageStatus{ID: sp.ID, Node: sp.Node, Layers: layerRange(sp.Layers), To: stageTargets(sp)})
	}
	if old != nil {
		for _, sp := range old.Stages {
			c.inPlan[sp.Node] = true
		}
	}
}

func layerRange(ls []string) string {
	if len(ls) == 1 {
		return ls[0]
	}
	return ls[0] + "-" + ls[len(ls)-1]
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

// specErr is a problem with the job's spec, wrapping job.ErrSpec.
func specErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", job.ErrSpec, fmt.Sprintf(format, a...))
}
