package core

import (
	"slices"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
)

// recordTimes keeps the step that ran from start to now with its stage
// timings among the last LastSteps.
func (c *Core) recordTimes(start, now time.Time, timings []StageTiming) {
	st := job.StepTiming{Step: c.steps.next, AtMS: job.Millis(start.Sub(c.status.Started)), WallMS: job.Millis(now.Sub(start)),
		Stages: make([]job.StageStepTiming, len(timings))}
	passes := make([][]job.PassTiming, len(timings))
	for k, t := range timings {
		var send time.Duration
		for _, l := range t.Links {
			send += l.Encode + l.Write
		}
		st.Stages[k] = job.StageStepTiming{ForwardMS: job.Millis(t.Forward), BackwardMS: job.Millis(t.Backward), UpdateMS: job.Millis(t.Update),
			WaitMS: job.Millis(t.Wait), SendMS: job.Millis(send), WallMS: job.Millis(t.Wall)}
		passes[k] = make([]job.PassTiming, len(t.Passes))
		for i, p := range t.Passes {
			passes[k][i] = job.PassTiming{Op: p.Op.String(), Micro: p.Micro, StartMS: job.Millis(p.Start), MS: job.Millis(p.Dur)}
		}
	}
	// A new slice each time: statuses handed out share the old one.
	last := c.status.LastSteps[max(0, len(c.status.LastSteps)-(job.LastSteps-1)):]
	c.status.LastSteps, c.status.Passes = append(slices.Clip(last), st), passes
}

// predictedPasses are the compute passes of r's simulated step, per stage.
func predictedPasses(r *balance.Report, stages int) [][]job.PassTiming {
	ps := make([][]job.PassTiming, stages)
	for _, e := range r.Events {
		if e.Link() || e.Stage < 0 || e.Stage >= stages || e.End <= e.Start {
			continue
		}
		ps[e.Stage] = append(ps[e.Stage], job.PassTiming{Op: e.Op.String(), Micro: e.Micro, StartMS: e.Start * 1e3, MS: (e.End - e.Start) * 1e3})
	}
	return ps
}

// stageTargets are the stages that sp sends activations to, in
// ascending order.
func stageTargets(sp balance.StagePlan) []int {
	var to []int
	for _, in := range sp.Program {
		if in.Op == balance.OpSendAct {
			to = append(to, in.Peer)
		}
	}
	slices.Sort(to)
	return slices.Compact(to)
}
