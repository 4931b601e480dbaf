package core

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
)

// A plan change (docs/DESIGN.md, "The life of a job") is one
// transition whatever asked for it: the start, a takeover, a failure, a
// node that leaves or joins, drifting speeds, a user. It chooses where the
// state comes from, plans over the live nodes, starts the new stages,
// loads their state and continues:
//
//	source     state from                      used by
//	live       each layer's old stage, direct   leaving, joined, speeds, requested
//	fresh cut  a cut taken now, then restored   requested through a cut
//	survivors  live, if the old stages on the   failure
//	           nodes that answer hold every
//	           layer (replicas); else cut
//	cut        the latest cut (replay from it)  start, takeover, failure
//
// A failed step's update is applied nowhere (each stage applies its update
// when the next step begins or its state is read), so the survivors hold
// the state before the failed step, which runs again on the new plan.
//
// Its steps, each an operation of the driver:
//
//	[fresh cut: TakeCut] -> [cut sources: StopStages(old, abandon)]
//	  -> [no plan yet: Probe, then plan over the nodes that answer]
//	  -> StartStages(new generation) -> Restore | Move
//	  -> [live: StopStages(old, wait)] -> training at the next boundary
//
// A change from live stages or a fresh cut that fails midway becomes a
// failure: the job goes back to its latest cut. A failure's change that
// fails tries again, paused, until it succeeds (a node joins, a link comes
// back). The start's (or a takeover's) tries again over the nodes that
// answer when a node fails under it, up to startAttempts times; a plan
// that cannot be made fails the job at once.
type change struct {
	trigger job.Trigger
	source  source
	// res is the plan to move to, made for cl (nil: plan over the nodes
	// that answer a probe); mv how the state moves (source live).
	res *balance.Result
	cl  *balance.Cluster
	mv  *stateMove
	// replan is the record of a re-plan being made.
	replan *job.Replan
	// A failure's: the cause, the step that failed, its start and when the
	// failure was known.
	cause     error
	step      int
	stepStart time.Time
	detected  time.Time
	// old is the generation of the stages the state moves from (source
	// live).
	old uint64
	// A failure's change whose attempts failed: how many did, the last
	// one's error (the job is paused until an attempt succeeds), and,
	// while it waits, when it tries again (zero: an attempt is under way).
	attempt int
	err     error
	wakeAt  time.Time
	probed  map[string]bool // the candidates of the last probe
	// t0..t2 time the phases: the change's start, the new stages started,
	// the state loaded.
	t0, t1 time.Time
}

// direct reports whether the state moves from the old stages to the new
// ones.
func (ch *change) direct() bool {
	return ch.mv != nil && (ch.source == sourceLive || ch.source == sourceSurvivors)
}

// paused reports whether the change waits to try again.
func (ch *change) paused() bool { return !ch.wakeAt.IsZero() }

// source is where a change gets the job's state from.
type source int

const (
	sourceLive      source = iota // the old plan's stages, straight to the new ones
	sourceFreshCut                // a cut taken at the change, restored into the new stages
	sourceSurvivors               // a failure's: live if the stages that survive hold every layer, else cut
	sourceCut                     // the latest cut: the steps after it are replayed
)

// changePlan carries out ch, the one plan-change transition.
func (c *Core) changePlan(now time.Time, ch *change) {
	c.change, ch.t0 = ch, now
	if ch.source == sourceFreshCut {
		gen, g, acc := c.plan.running, c.steps.next, c.steps.acc
		c.ops.issue(now, opChangeCut, func(op Op) Action { return TakeCut{Op: op, Gen: gen, Step: g, Progress: acc} })
		return
	}
	c.attempt(now)
}

// attempt starts one try of the current change.
func (c *Core) attempt(now time.Time) {
	ch := c.change
	ch.wakeAt = time.Time{}
	if ch.source != sourceLive && ch.source != sourceSurvivors {
		c.stopRunning(false)
	}
	if ch.res == nil {
		cands := c.nodes.candidates()
		ch.probed = map[string]bool{}
		for _, n := range cands {
			ch.probed[n.Name] = true
		}
		pairs := c.links.unmeasured(now, cands)
		fresh := c.links.probeLinks(now, pairs)
		c.ops.issue(now, opProbe, func(op Op) Action { return Probe{Op: op, Nodes: cands, Links: pairs, Fresh: fresh} })
		return
	}
	c.startStages(now)
}

// startStages starts the stages of the change's plan under a new
// generation.
func (c *Core) startStages(now time.Time) {
	ch := c.change
	c.plan.gen++
	var sources [][]StateSource
	var old *balance.Plan
	if ch.direct() {
		ch.old, old = c.plan.running, c.plan.Plan
		sources = ch.mv.sources
	}
	c.adopt(ch.res, ch.cl, old)
	c.plan.running = c.plan.gen
	gen, plan := c.plan.gen, c.plan.Plan
	addrs := make([]string, len(plan.Stages))
	for k, sp := range plan.Stages {
		addrs[k] = c.nodes.known[sp.Node].ActorAddr
	}
	rates := c.stepRates()
	c.ops.issue(now, opStart, func(op Op) Action {
		return StartStages{Op: op, Gen: gen, Plan: plan, Addrs: addrs, Sources: sources, Rates: rates}
	})
}

// changeOutcome follows the outcome of a change's operation.
func (c *Core) changeOutcome(now time.Time, kind opKind, ev Event) {
	ch := c.change
	switch kind {
	case opChangeCut:
		e := ev.(CutTaken)
		if e.Err != nil {
			c.changeFailed(now, e.Err, false)
			return
		}
		c.cutGathered(now)
		c.attempt(now)
	case opProbe:
		e := ev.(Probed)
		c.status.ProbeMS += job.Millis(now.Sub(c.ops.start))
		c.links.probed(now, e.Links, c.log)
		if len(e.Live) == 0 {
			c.changeFailed(now, errors.New("no live node"), false)
			return
		}
		cl := c.clusterOf(e.Live)
		res, err := c.search(cl, c.livePartition(cl))
		if errors.Is(err, balance.ErrNoFit) {
			err = fmt.Errorf("waiting for nodes: %w", err)
		}
		if err != nil {
			c.changeFailed(now, err, false)
			return
		}
		ch.res, ch.cl = res, cl
		if ch.source == sourceSurvivors {
			c.survive(e.Live)
		}
		c.startStages(now)
	case opStart:
		e := ev.(StagesStarted)
		if e.Err != nil {
			c.changeFailed(now, e.Err, true)
			return
		}
		for k, p := range e.Params {
			if k < len(c.status.Stages) {
				c.status.Stages[k].Params = p
			}
		}
		ch.t1 = now
		gen := c.plan.gen
		switch {
		case ch.direct():
			step, sources, from := c.steps.next, ch.mv.sources, ch.old
			c.ops.issue(now, opLoad, func(op Op) Action { return Move{Op: op, Gen: gen, From: from, Step: step, Sources: sources} })
		case c.cuts.latest.Step > 0:
			step := c.cuts.latest.Step
			c.ops.issue(now, opLoad, func(op Op) Action { return Restore{Op: op, Gen: gen, Step: step} })
		default:
			c.changed(now, nil) // every stage starts from the seed's initial state
		}
	case opLoad:
		e := ev.(StateLoaded)
		if e.Err != nil {
			c.changeFailed(now, e.Err, true)
			return
		}
		c.changed(now, e.Moved)
	}
}

// livePartition is the job's partitioner, or its hand-written partition
// without the replicas on nodes that cl lacks (gone, for a recovery).
func (c *Core) livePartition(cl *balance.Cluster) string {
	part := c.job.Spec.Partition
	var names []string
	for _, n := range cl.Nodes {
		names = append(names, n.Name)
	}
	all := slices.Clone(names)
	for n := range c.nodes.known {
		if !slices.Contains(all, n) {
			all = append(all, n)
		}
	}
	p, err := balance.ParseSpec(c.job.Graph, part, all)
	if err != nil || !p.Replicated() {
		return part
	}
	for i := range p.Stages {
		st := &p.Stages[i]
		nodes, shares := st.Nodes(), st.Shares
		var keep []string
		var kept []int
		for r, n := range nodes {
			if slices.Contains(names, n) {
				keep = append(keep, n)
				if shares != nil {
					kept = append(kept, shares[r])
				}
			}
		}
		if len(keep) == 0 {
			return part // the stage has no node left: the search says so
		}
		st.Node, st.Replicas, st.Shares = keep[0], keep[1:], nil
		if len(keep) > 1 && kept != nil {
			st.Shares = kept
		}
	}
	return balance.FormatSpec(c.job.Graph, p)
}

// survive decides where a failure's change takes the state from, once
// the nodes that answer are known: from the old plan's stages on them if
// they hold every layer with state, else from the latest cut.
func (c *Core) survive(live []job.NodeInfo) {
	ch := c.change
	alive := func(node string) bool {
		return slices.ContainsFunc(live, func(n job.NodeInfo) bool { return n.Name == node })
	}
	mv, err := planMove(c.job, c.plan.Plan, ch.res.Plan, alive)
	if err != nil {
		c.log.Info("recovering from the latest cut", "step", ch.step, "cut", c.cuts.latest.Step, "why", err)
		c.stopRunning(false)
		ch.source = sourceCut
		return
	}
	c.log.Info("recovering from the stages that survive, without replay", "step", ch.step)
	ch.mv = mv
}

// involves reports whether the current change needs node: it runs a
// stage of the new plan or holds state that moves, or (no plan yet) the
// running plan has a stage on it.
func (c *Core) involves(node string) bool {
	ch := c.change
	if ch.direct() && ch.mv.from[node] {
		return true
	}
	if ch.res != nil {
		return slices.ContainsFunc(ch.res.Plan.Stages, func(sp balance.StagePlan) bool { return sp.Node == node })
	}
	return c.plan.domain[node]
}

// startAttempts bounds the tries of a start's or a takeover's change
// whose stages fail to start or load (a node going down under it).
const startAttempts = 5

// changeFailed ends an attempt that failed with err; transient when
// starting or loading the stages failed or a node of the change did,
// which another plan over the nodes that answer may avoid.
func (c *Core) changeFailed(now time.Time, err error, transient bool) {
	ch := c.change
	switch {
	case ch.source != sourceCut:
		// Moving between live plans failed midway: back to the latest
		// cut, as after any failure.
		c.stopAll(false)
		c.change = nil
		c.failure(now, c.steps.next, now, fmt.Errorf("changing the plan: %w", err), false)
	case ch.trigger != job.TriggerFailure && (!transient || ch.attempt+1 >= startAttempts):
		c.stopAll(false)
		c.finish(nil, err)
	default:
		c.log.Warn("plan change attempt failed", "trigger", ch.trigger, "attempt", ch.attempt, "err", err)
		c.stopRunning(false)
		ch.attempt++
		ch.err = err
		ch.wakeAt = now.Add(min(time.Duration(ch.attempt)*200*time.Millisecond, 2*time.Second))
		c.ops.out = append(c.ops.out, Wake{At: ch.wakeAt})
	}
}

// retry tries a paused change again.
func (c *Core) retry(now time.Time) {
	c.change.res, c.change.cl = nil, nil
	c.attempt(now)
}

// changed completes the current change: the new stages hold the state.
func (c *Core) changed(now time.Time, moved *Moved) {
	ch := c.change
	c.change = nil
	if ch.old != 0 {
		// Survivors of a failure are not waited for: some stages of
		// their generation are gone.
		c.ops.out = append(c.ops.out, StopStages{Gen: ch.old, Wait: ch.source == sourceLive})
	}
	c.plan.domain = map[string]bool{}
	for _, sp := range c.plan.Stages {
		c.plan.domain[sp.Node] = true
	}
	st, cu, rb := &c.steps, &c.cuts, &c.rebal
	c.log.Info("plan changed", "trigger", ch.trigger, "plan", c.plan.text, "generation", c.plan.gen,
		"start_ms", job.Millis(ch.t1.Sub(ch.t0)), "load_ms", job.Millis(now.Sub(ch.t1)))
	switch ch.trigger {
	case job.TriggerStart, job.TriggerTakeover:
	case job.TriggerFailure:
		r := job.Recovery{Cause: ch.cause.Error(), Step: ch.step, From: job.FromSurvivors, Plan: c.plan.text, At: ch.detected,
			DetectMS: job.Millis(ch.detected.Sub(ch.stepStart)), RestoreMS: job.Millis(now.Sub(ch.detected))}
		if ch.source == sourceCut {
			rb.planStep = cu.latest.Step
			st.next, st.acc = cu.latest.Step, cu.latest.Progress
			r.From, r.Replayed = job.FromCut, ch.step-cu.latest.Step
		}
		rb.streak = 0
		cu.win.open, rb.check.active = false, false
		c.status.Recoveries = append(c.status.Recoveries, r)
	default:
		r := ch.replan
		switch ch.source {
		case sourceLive:
			r.Method = "direct"
			if moved != nil {
				r.MovedBytes, r.WireBytes, r.Links = moved.Bytes, moved.WireBytes, moved.Links
			}
			r.PhasesMS = map[string]float64{"start": job.Millis(ch.t1.Sub(ch.t0)), "transfer": job.Millis(now.Sub(ch.t1))}
		case sourceFreshCut:
			r.Method, r.MovedBytes, r.LocalBytes = "cut", 2*cu.size, 0
			r.PhasesMS = map[string]float64{"cut": job.Millis(cu.pause), "start": job.Millis(ch.t1.Sub(ch.t0) - cu.pause), "restore": job.Millis(now.Sub(ch.t1))}
		}
		rb.planStep = st.next
		r.MovedMS = job.Millis(now.Sub(ch.t0))
		c.log.Info("re-planned", "step", st.next, "method", r.Method, "moved_bytes", r.MovedBytes, "state_bytes", r.StateBytes, "ms", r.MovedMS, "phases_ms", r.PhasesMS)
		r.MeasuredBeforeMS = 1e3 * balance.Median(st.times[max(0, len(st.times)-replanWindow):])
		c.status.Replans = append(c.status.Replans, *r)
		rb.check = replanCheck{active: true, replan: len(c.status.Replans) - 1, start: len(st.times)}
	}
	st.planFrom = len(st.times)
	c.boundary(now)
}

// failure recovers from step g, started at stepStart, failed with cause:
// a plan change over the nodes that answer, from the stages that survive
// if survivors is set and they hold the whole model, else from the latest
// cut, whose later steps run again.
func (c *Core) failure(now time.Time, g int, stepStart time.Time, cause error, survivors bool) {
	if n := len(c.status.Recoveries); n >= maxRecoveries {
		c.stopAll(false)
		c.finish(nil, fmt.Errorf("giving up after %d recoveries: %w", n, cause))
		return
	}
	c.log.Warn("step failed; recovering", "step", g, "cut", c.cuts.latest.Step, "err", cause)
	c.ops.wait = 0 // the operation in flight, if any, is cancelled
	src := sourceCut
	if survivors && c.plan.running != 0 {
		src = sourceSurvivors
	}
	c.changePlan(now, &change{trigger: job.TriggerFailure, source: src, cause: cause, step: g, stepStart: stepStart, detected: now})
}

// maybeRebalance runs after a step, the pipeline drained: it evaluates
// the plan and, if warranted, changes it. It reports whether it started
// a change.
func (c *Core) maybeRebalance(now time.Time) bool {
	g, rb, spec := c.steps.next, &c.rebal, c.job.Spec
	if g >= c.job.Total {
		return false
	}
	nodes := c.nodes.candidates()
	leaving := ""
	for _, sp := range c.plan.Stages {
		if !slices.ContainsFunc(nodes, func(n job.NodeInfo) bool { return n.Name == sp.Node }) {
			leaving = sp.Node
			break
		}
	}
	req := rb.requested
	rb.requested = nil
	cooldown := rebalanceCooldown << min(len(c.status.Replans), 6)
	held := realism(c.status.Replans)
	if leaving == "" && req == nil && (!rebalances(spec) || g-rb.planStep < cooldown || g%rebalanceEvery != 0) {
		return false
	}
	cl := c.clusterOf(nodes)
	part := c.livePartition(cl)
	if req != nil {
		part = req.Partition
	}
	res, err := c.search(cl, part)
	if err != nil {
		c.log.Warn("rebalancing: no plan", "err", err)
		return false
	}
	mv, err := planMove(c.job, c.plan.Plan, res.Plan, nil)
	if err != nil {
		c.log.Warn("rebalancing: cannot move to the plan", "plan", res.Spec, "err", err)
		return false
	}
	viaCut := req != nil && req.ViaCut
	r := job.Replan{Step: g, AfterMS: res.Report.StepTime * 1e3, Plan: res.Spec, Speeds: map[string]float64{},
		StateBytes: mv.stateBytes, LocalBytes: mv.localBytes}
	for _, n := range cl.Nodes {
		r.Speeds[n.Name] = n.Speed
	}
	cost := c.cuts.moveCost(mv, viaCut)
	r.CostMS = job.Millis(cost)
	cur, err := balance.Simulate(c.plan.Plan, c.job.Graph, c.cfg.Profile, cl, balance.SimOptions{Optimizer: spec.Optimizer})
	if err == nil {
		r.BeforeMS = cur.StepTime * 1e3
		r.Gain = 1 - res.Report.StepTime/cur.StepTime
	}
	switch {
	case leaving != "":
		r.Trigger, r.Reason = job.TriggerLeaving, fmt.Sprintf("node %s is leaving", leaving)
	case req != nil:
		r.Trigger, r.Reason = job.TriggerRequested, "requested: "+req.Partition
	default:
		if err != nil {
			return false
		}
		saved := held * (cur.StepTime - res.Report.StepTime)
		c.log.Debug("rebalancing: evaluated", "step", g, "plan", res.Spec, "gain", r.Gain, "realism", held,
			"before_ms", r.BeforeMS, "after_ms", r.AfterMS, "cost_ms", r.CostMS, "speeds", r.Speeds, "streak", rb.streak)
		if res.Spec == c.plan.text || held*r.Gain < rebalanceMinGain || cost.Seconds() > rebalancePayback*saved {
			rb.streak = 0
			return false
		}
		if rb.streak++; rb.streak < rebalanceStreak {
			return false
		}
		r.Trigger = job.TriggerSpeeds
		r.Reason = fmt.Sprintf("measured speeds: predicted step %.1f ms -> %.1f ms", r.BeforeMS, r.AfterMS)
		if l := c.links.changed(c.plan.cl); l != "" && c.linksMatter(cl, cur.StepTime) {
			r.Trigger = job.TriggerLinks
			r.Reason = fmt.Sprintf("measured links (%s): predicted step %.1f ms -> %.1f ms", l, r.BeforeMS, r.AfterMS)
		}
		if n := c.plan.newNode(res.Plan); n != "" {
			r.Trigger = job.TriggerJoined
			r.Reason = fmt.Sprintf("node %s joined: predicted step %.1f ms -> %.1f ms", n, r.BeforeMS, r.AfterMS)
		}
		if held < 1 {
			r.Reason += fmt.Sprintf(", counted as %.0f%% of that gain (the last re-plan's share)", 100*held)
		}
	}
	rb.streak = 0
	c.log.Info("re-planning", "step", g, "reason", r.Reason, "plan", res.Spec, "gain", r.Gain)
	src := sourceLive
	if viaCut {
		src = sourceFreshCut
	}
	c.changePlan(now, &change{trigger: r.Trigger, source: src, res: res, cl: cl, mv: mv, replan: &r})
	return true
}

// rebalances reports whether the job re-plans by itself: with a
// partitioner that weighs node speeds (an interleaved node's speed comes
// from its chunks' timings together, see observe).
func rebalances(spec job.Spec) bool {
	switch spec.Partition {
	case "auto", balance.Balanced, balance.GraphPP:
		return !spec.NoRebalance
	}
	return false
}

// stateMove is how a plan change moves the state of the job's layers.
type stateMove struct {
	sources [][]StateSource // per stage of the new plan
	from    map[string]bool // the nodes the state moves from
	// stateBytes is the state (parameters and optimizer) of the layers
	// that change node, localBytes that of the layers that stay on theirs.
	stateBytes, localBytes int64
}

// planMove maps every layer of jb's model with state in plan to to an
// owner in plan from, grouped per pair of stages. Of a layer's owners
// (replicas hold the same state) it takes one on the new stage's node,
// else the first; only those on nodes for which live is true, if set.
func planMove(jb *job.Job, from, to *balance.Plan, live func(node string) bool) (*stateMove, error) {
	owners := map[string][]int{}
	for k, sp := range from.Stages {
		if live != nil && !live(sp.Node) {
			continue
		}
		for _, l := range sp.Layers {
			owners[l] = append(owners[l], k)
		}
	}
	mv := &stateMove{sources: make([][]StateSource, len(to.Stages)), from: map[string]bool{}}
	for j, sp := range to.Stages {
		idx := map[int]int{} // old stage -> index in sources[j]
		for _, l := range sp.Layers {
			n := jb.Graph.Node(l)
			if n == nil {
				return nil, fmt.Errorf("the new plan has a layer %q the model does not", l)
			}
			ps := n.Layer.Params()
			if len(ps) == 0 {
				continue
			}
			ks := owners[l]
			if len(ks) == 0 {
				return nil, fmt.Errorf("layer %q is on no live stage of the current plan", l)
			}
			k := ks[0]
			if i := slices.IndexFunc(ks, func(k int) bool { return from.Stages[k].Node == sp.Node }); i >= 0 {
				k = ks[i]
			}
			i, ok := idx[k]
			if !ok {
				i = len(mv.sources[j])
				idx[k] = i
				mv.sources[j] = append(mv.sources[j], StateSource{From: k, Local: from.Stages[k].Node == sp.Node})
				mv.from[from.Stages[k].Node] = true
			}
			mv.sources[j][i].Layers = append(mv.sources[j][i].Layers, l)
			if b := stateBytes(jb.Spec, ps); mv.sources[j][i].Local {
				mv.localBytes += b
			} else {
				mv.stateBytes += b
			}
		}
	}
	return mv, nil
}

// stateBytes is the state of params: values and buffers, and the
// optimizer's tensors of the trainable ones.
func stateBytes(spec job.Spec, params []*nn.Param) int64 {
	slots := int64(0)
	switch {
	case nn.IsAdam(spec.Optimizer):
		slots = 2
	case spec.Momentum != 0:
		slots = 1
	}
	var b int64
	for _, p := range params {
		n := 4 * int64(p.Value.Shape().TotalSize())
		if p.Trainable() {
			n *= 1 + slots
		}
		b += n
	}
	return b
}
