package actors

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
)

// Rebalancing (DESIGN.md, "Re-planning is one mechanism"): the coordinator
// keeps a smoothed speed per node from the stages' measured compute times,
// and every few steps asks the balancer for a plan over the live nodes at
// those speeds. It adopts the plan at a step boundary (the pipeline is
// drained there, so nothing is replayed), when
//
//   - a node of the plan is leaving the cluster (at once, whatever the
//     partitioner), or
//   - the new plan's predicted step is at least MinGain shorter than the
//     current plan's predicted step at the measured speeds, and the
//     migration pays for itself within MaxPayback steps, two evaluations
//     in a row, and at least a cool-down after the last change that
//     doubles with every change (hysteresis: a speed flickering around a
//     threshold, or noisy measurements, do not make plans flip back and
//     forth). The predicted gain counts only as far as the last re-plan's
//     prediction held (realism): if it saved half the step time it
//     predicted, the next must predict twice MinGain.
//
// Moving sends each layer's state (parameters and optimizer state) straight
// from its old owner to its new one, over the data plane between nodes and
// in process within a node; only the layers that change node cross the
// network, and nothing passes through the coordinator (see migrate.go).
// The latest cut stays the last periodic one; a failure while moving falls
// back to recovery from it.
const (
	rebalanceEvery    = 5    // steps between evaluations
	rebalanceCooldown = 20   // steps after the first plan change before the next; doubles with each
	rebalanceMinGain  = 0.10 // predicted step time saved, at least
	rebalanceStreak   = 2    // evaluations in a row that must agree
	rebalancePayback  = 50   // steps within which moving must pay off
	speedSmoothing    = 0.2  // weight of the newest measurement
	speedCap          = 1.25 // measured speed over the start-up GEMM speed, at most
	replanWindow      = 20   // steps whose median step time a re-plan reports before and after it
	realismFloor      = 0.25 // a missed prediction discounts the next ones' gains at most this far
)

// realism is the fraction of its predicted gain that the last measured
// re-plan made by the measured speeds saved, within [realismFloor, 1]: 1
// before any such re-plan has been measured, or if it saved what it
// predicted or more.
func realism(replans []job.Replan) float64 {
	for i := len(replans) - 1; i >= 0; i-- {
		r := replans[i]
		if r.Trigger != job.TriggerSpeeds || r.Gain <= 0 || r.MeasuredBeforeMS <= 0 || r.MeasuredAfterMS <= 0 {
			continue
		}
		saved := 1 - r.MeasuredAfterMS/r.MeasuredBeforeMS
		return min(1, max(realismFloor, saved/r.Gain))
	}
	return 1
}

// replanCheck follows the steps after a re-plan until its measured step
// time is known.
type replanCheck struct {
	active bool
	replan int // index in status.Replans
	start  int // index of the first step after it
}

// followReplan records the last re-plan's measured step time after it
// once replanWindow steps (all the job's step times so far) have run.
func (c *Coordinator) followReplan(steps []float64) {
	rc := c.replanCheck
	if !rc.active || len(steps)-rc.start < replanWindow {
		return
	}
	c.mu.Lock()
	c.status.Replans[rc.replan].MeasuredAfterMS = 1e3 * median(steps[rc.start:rc.start+replanWindow])
	c.mu.Unlock()
	c.replanCheck.active = false
}

// rebalances reports whether the job re-plans by itself: with a
// partitioner that weighs node speeds.
func (c *Coordinator) rebalances() bool {
	switch c.spec.Partition {
	case "auto", balance.Balanced, balance.GraphPP:
		return !c.spec.NoRebalance
	}
	return false
}

// observe turns a step's stage timings into measured node speeds: a stage
// the plan expected to be busy for p seconds at speed v that was busy b
// seconds ran at v·p/b.
func (c *Coordinator) observe(timings []*StageTiming) {
	for k, t := range timings {
		if t == nil || k >= len(c.report.Stages) {
			continue
		}
		busy := float64(t.GetForwardNs()+t.GetBackwardNs()+t.GetUpdateNs()) / 1e9
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
		if capacity := t.GetCapacityGflops(); capacity > 0 && c.cfg.GFLOPS > 0 {
			v = min(v, capacity/c.cfg.GFLOPS)
		} else if n := c.node(node); n.GFLOPS > 0 {
			v = min(v, speedCap*c.gemmSpeed(n))
		}
		if old, ok := c.speed[node]; ok {
			v = (1-speedSmoothing)*old + speedSmoothing*v
		}
		c.speed[node] = v
	}
}

// candidates are the nodes a new plan may use, without pinging them.
func (c *Coordinator) candidates() []job.NodeInfo {
	if c.cfg.LiveNodes != nil {
		return c.cfg.LiveNodes()
	}
	return c.cfg.Nodes
}

// maybeRebalance runs after step g (the pipeline is drained): it evaluates
// and, if warranted, moves the job to a better plan. It returns an error
// only if the job cannot go on; a failed move returns an errRecover.
func (c *Coordinator) maybeRebalance(ctx context.Context, g int, acc progressAcc, steps []float64) error {
	if g >= c.job.Total {
		return nil
	}
	nodes := c.candidates()
	leaving := ""
	for _, sp := range c.plan.Stages {
		if !slices.ContainsFunc(nodes, func(n job.NodeInfo) bool { return n.Name == sp.Node }) {
			leaving = sp.Node
			break
		}
	}
	requested := c.requested
	c.requested = ""
	c.mu.Lock()
	cooldown := rebalanceCooldown << min(len(c.status.Replans), 6)
	held := realism(c.status.Replans)
	c.mu.Unlock()
	if leaving == "" && requested == "" && (!c.rebalances() || g-c.planStep < cooldown || g%rebalanceEvery != 0) {
		return nil
	}
	cl := c.clusterOf(nodes)
	part := c.spec.Partition
	if requested != "" {
		part = requested
	}
	res, err := c.searchWith(cl, part)
	if err != nil {
		c.log.Warn("rebalancing: no plan", "err", err)
		return nil
	}
	mv, err := c.planMove(c.plan, res.Plan)
	if err != nil {
		c.log.Warn("rebalancing: cannot move to the plan", "plan", res.Spec, "err", err)
		return nil
	}
	r := job.Replan{Step: g, AfterMS: res.Report.StepTime * 1e3, Plan: res.Spec, Speeds: map[string]float64{},
		StateBytes: mv.stateBytes, LocalBytes: mv.localBytes}
	for _, n := range cl.Nodes {
		r.Speeds[n.Name] = n.Speed
	}
	cost := c.moveCost(mv)
	r.CostMS = float64(cost.Microseconds()) / 1e3
	cur, err := balance.Simulate(c.plan, c.job.Graph, c.prof, cl, balance.SimOptions{Optimizer: c.spec.Optimizer})
	if err == nil {
		r.BeforeMS = cur.StepTime * 1e3
		r.Gain = 1 - res.Report.StepTime/cur.StepTime
	}
	switch {
	case leaving != "":
		r.Trigger, r.Reason = job.TriggerLeaving, fmt.Sprintf("node %s is leaving", leaving)
	case requested != "":
		r.Trigger, r.Reason = job.TriggerRequested, "requested: "+requested
	default:
		if err != nil {
			return nil
		}
		saved := held * (cur.StepTime - res.Report.StepTime)
		c.log.Debug("rebalancing: evaluated", "step", g, "plan", res.Spec, "gain", r.Gain, "realism", held,
			"before_ms", r.BeforeMS, "after_ms", r.AfterMS, "cost_ms", r.CostMS, "speeds", r.Speeds, "streak", c.streak)
		if res.Spec == c.text || held*r.Gain < rebalanceMinGain || cost.Seconds() > rebalancePayback*saved {
			c.streak = 0
			return nil
		}
		if c.streak++; c.streak < rebalanceStreak {
			return nil
		}
		r.Trigger = job.TriggerSpeeds
		r.Reason = fmt.Sprintf("measured speeds: predicted step %.1f ms -> %.1f ms", r.BeforeMS, r.AfterMS)
		if held < 1 {
			r.Reason += fmt.Sprintf(", counted as %.0f%% of that gain (the last re-plan's share)", 100*held)
		}
	}
	c.streak = 0
	c.log.Info("re-planning", "step", g, "reason", r.Reason, "plan", res.Spec, "gain", r.Gain)
	t0 := time.Now()
	if c.viaCut {
		r.Method, r.MovedBytes = "cut", 2*c.stateBytes()
		r.LocalBytes = 0
		if r.PhasesMS, err = c.moveThroughCut(g, acc, res, cl); err != nil {
			return err
		}
	} else {
		m, err := c.migrate(ctx, g, mv, res, cl)
		if err != nil {
			return err
		}
		r.Method, r.MovedBytes, r.WireBytes, r.Links, r.PhasesMS = "direct", m.moved, m.wire, m.links, m.phases
	}
	c.planStep = g
	r.MovedMS = msSince(t0, time.Now())
	c.log.Info("re-planned", "step", g, "method", r.Method, "moved_bytes", r.MovedBytes, "state_bytes", r.StateBytes, "ms", r.MovedMS, "phases_ms", r.PhasesMS)
	r.MeasuredBeforeMS = 1e3 * median(steps[max(0, len(steps)-replanWindow):])
	c.mu.Lock()
	c.status.Replans = append(c.status.Replans, r)
	c.replanCheck = replanCheck{active: true, replan: len(c.status.Replans) - 1, start: len(steps)}
	c.mu.Unlock()
	return nil
}

// moveCost predicts what moving as mv costs: starting the new stages and
// sending the layers that change node, at the throughput the last cut
// measured (a cut moves the whole state once), or at the default link's
// bandwidth before the first cut. Moving through a cut costs about two
// cuts.
func (c *Coordinator) moveCost(mv *stateMove) time.Duration {
	const startup = 50 * time.Millisecond
	if c.viaCut {
		return 2*c.cutCost + startup
	}
	bw := balance.DefaultLink.Bandwidth
	if c.cutCost > 0 {
		bw = float64(c.stateBytes()) / c.cutCost.Seconds()
	}
	return startup + time.Duration(float64(mv.stateBytes)/bw*float64(time.Second))
}

// moveThroughCut moves the job to the plan res the way a recovery does:
// a cut at step g gathers every stage's state into the coordinator, the
// old stages are abandoned, and the new ones are restored from the cut.
// It is kept to compare with a direct move.
func (c *Coordinator) moveThroughCut(g int, acc progressAcc, res *balance.Result, cl *balance.Cluster) (phases map[string]float64, err error) {
	t0 := time.Now()
	if _, err := c.checkpoint(g, acc); err != nil {
		// The old plan broke while being cut: recover from the last cut.
		return nil, errRecover{err}
	}
	c.abandon()
	c.gen++
	if err := c.adopt(res, cl); err != nil {
		return nil, errRecover{err}
	}
	t1 := time.Now()
	if err := c.start(); err != nil {
		return nil, errRecover{err}
	}
	t2 := time.Now()
	if err := c.restoreAll(); err != nil {
		return nil, errRecover{err}
	}
	return map[string]float64{"cut": msSince(t0, t1), "start": msSince(t1, t2), "restore": msSince(t2, time.Now())}, nil
}

// errRecover says a plan change failed midway; the job recovers from its
// latest cut as after any failure.
type errRecover struct{ err error }

func (e errRecover) Error() string { return "changing the plan: " + e.err.Error() }
func (e errRecover) Unwrap() error { return e.err }
