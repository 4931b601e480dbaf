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
	for k, t := range timings {
		var send time.Duration
		for _, l := range t.Links {
			send += l.Encode + l.Write
		}
		st.Stages[k] = job.StageStepTiming{ForwardMS: job.Millis(t.Forward), BackwardMS: job.Millis(t.Backward), UpdateMS: job.Millis(t.Update),
			WaitMS: job.Millis(t.Wait), SendMS: job.Millis(send), WallMS: job.Millis(t.Wall)}
	}
	// A new slice each time: statuses handed out share the old one.
	last := c.status.LastSteps[max(0, len(c.status.LastSteps)-(job.LastSteps-1)):]
	c.status.LastSteps = append(slices.Clip(last), st)
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
