package actors

import (
	"fmt"
	"slices"
	"time"

	"github.com/ppnode/ppnode/balance"
)

// Rebalancing (DESIGN.md, "Re-planning is one mechanism"): the coordinator
// keeps a smoothed speed per node from the stages' measured compute times,
// and every few steps asks the balancer for a plan over the live nodes at
// those speeds. It adopts the plan at a step boundary, through a cut at
// that very step (so nothing is replayed), when
//
//   - a node of the plan is leaving the cluster (at once, whatever the
//     partitioner), or
//   - the new plan's predicted step is at least MinGain shorter than the
//     current plan's predicted step at the measured speeds, and the
//     migration pays for itself within MaxPayback steps, two evaluations
//     in a row, and at least a cool-down after the last change that
//     doubles with every change (hysteresis: a speed flickering around a
//     threshold, or noisy measurements, do not make plans flip back and
//     forth).
//
// Moving goes through the coordinator: the cut gathers every stage's state
// and the new stages are restored from it. A failure while moving falls
// back to recovery from that cut.
const (
	rebalanceEvery    = 5    // steps between evaluations
	rebalanceCooldown = 20   // steps after the first plan change before the next; doubles with each
	rebalanceMinGain  = 0.10 // predicted step time saved, at least
	rebalanceStreak   = 2    // evaluations in a row that must agree
	rebalancePayback  = 50   // steps within which moving must pay off
	speedSmoothing    = 0.2  // weight of the newest measurement
	speedCap          = 1.25 // measured speed over the start-up GEMM speed, at most
)

// Replan is one change of a running job's plan.
type Replan struct {
	Step   int    `json:"step"`
	Reason string `json:"reason"`
	// Gain is the predicted fraction of step time saved; BeforeMS and
	// AfterMS the predicted step times at the measured speeds.
	Gain     float64 `json:"gain"`
	BeforeMS float64 `json:"before_ms"`
	AfterMS  float64 `json:"after_ms"`
	// CostMS is the predicted cost of moving, MovedMS what it took.
	CostMS  float64            `json:"cost_ms"`
	MovedMS float64            `json:"moved_ms"`
	Plan    string             `json:"plan"`
	Speeds  map[string]float64 `json:"speeds"`
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
		// run at full speed until the quota is used up. Its GEMM speed,
		// measured over whole quota periods at start, bounds it.
		if n := c.node(node); n.GFLOPS > 0 && c.cfg.GFLOPS > 0 {
			v = min(v, speedCap*n.GFLOPS/c.cfg.GFLOPS)
		}
		if old, ok := c.speed[node]; ok {
			v = (1-speedSmoothing)*old + speedSmoothing*v
		}
		c.speed[node] = v
	}
}

// candidates are the nodes a new plan may use, without pinging them.
func (c *Coordinator) candidates() []NodeInfo {
	if c.cfg.LiveNodes != nil {
		return c.cfg.LiveNodes()
	}
	return c.cfg.Nodes
}

// maybeRebalance runs after step g (the pipeline is drained): it evaluates
// and, if warranted, moves the job to a better plan. It returns an error
// only if the job cannot go on; a failed move recovers from the cut.
func (c *Coordinator) maybeRebalance(g int, acc progressAcc) error {
	if g >= c.job.Total {
		return nil
	}
	nodes := c.candidates()
	leaving := ""
	for _, sp := range c.plan.Stages {
		if !slices.ContainsFunc(nodes, func(n NodeInfo) bool { return n.Name == sp.Node }) {
			leaving = sp.Node
			break
		}
	}
	c.mu.Lock()
	cooldown := rebalanceCooldown << min(len(c.status.Replans), 6)
	c.mu.Unlock()
	if leaving == "" && (!c.rebalances() || g-c.planStep < cooldown || g%rebalanceEvery != 0) {
		return nil
	}
	cl := c.clusterOf(nodes)
	res, err := c.search(cl)
	if err != nil {
		c.log.Warn("rebalancing: no plan", "err", err)
		return nil
	}
	r := Replan{Step: g, AfterMS: res.Report.StepTime * 1e3, Plan: res.Spec, Speeds: map[string]float64{}}
	for _, n := range cl.Nodes {
		r.Speeds[n.Name] = n.Speed
	}
	// What moving costs: a cut plus a restore, each about the last cut's
	// measured cost, and starting the stages.
	cost := 2*c.cutCost + 50*time.Millisecond
	r.CostMS = float64(cost.Microseconds()) / 1e3
	if leaving != "" {
		r.Reason = fmt.Sprintf("node %s is leaving", leaving)
	} else {
		cur, err := balance.Simulate(c.plan, c.job.Graph, c.prof, cl, balance.SimOptions{Optimizer: c.spec.Optimizer})
		if err != nil {
			return nil
		}
		r.BeforeMS = cur.StepTime * 1e3
		r.Gain = 1 - res.Report.StepTime/cur.StepTime
		saved := cur.StepTime - res.Report.StepTime
		if res.Spec == c.text || r.Gain < rebalanceMinGain || cost.Seconds() > rebalancePayback*saved {
			c.streak = 0
			return nil
		}
		if c.streak++; c.streak < rebalanceStreak {
			return nil
		}
		r.Reason = fmt.Sprintf("measured speeds: predicted step %.1f ms -> %.1f ms", r.BeforeMS, r.AfterMS)
	}
	c.streak = 0
	c.log.Info("re-planning", "step", g, "reason", r.Reason, "plan", res.Spec, "gain", r.Gain)
	t0 := time.Now()
	if _, err := c.checkpoint(g, acc); err != nil {
		// The old plan broke while being cut: recover from the last cut.
		return errRecover{err}
	}
	c.abandon()
	c.gen++
	if err := c.adopt(res, cl); err != nil {
		return errRecover{err}
	}
	if err := c.start(); err != nil {
		return errRecover{err}
	}
	if err := c.restoreAll(); err != nil {
		return errRecover{err}
	}
	c.planStep = g
	r.MovedMS = float64(time.Since(t0).Microseconds()) / 1e3
	c.mu.Lock()
	c.status.Replans = append(c.status.Replans, r)
	c.mu.Unlock()
	return nil
}

// errRecover says a plan change failed midway; the job recovers from its
// latest cut as after any failure.
type errRecover struct{ err error }

func (e errRecover) Error() string { return "changing the plan: " + e.err.Error() }
func (e errRecover) Unwrap() error { return e.err }
