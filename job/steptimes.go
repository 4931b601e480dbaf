package job

import (
	"slices"
	"time"

	"github.com/ppnode/ppnode/balance"
)

// LastSteps is how many steps Status.LastSteps keeps.
const LastSteps = 8

// StepTiming is one step of a job as measured, for a Gantt chart of the
// last steps: when the coordinator started it, how long it waited for it,
// and what each stage of the plan measured of it.
type StepTiming struct {
	// Step counts the steps done with this one (as Status.Step).
	Step int `json:"step"`
	// AtMS is the step's start in milliseconds after Status.Started;
	// WallMS runs from there to the last stage's answer. A gap between
	// steps is time spent between them (a cut, probing links).
	AtMS   float64 `json:"at_ms"`
	WallMS float64 `json:"wall_ms"`
	// Stages are in the order of the plan's stages at that step.
	Stages []StageStepTiming `json:"stages"`
}

// StageStepTiming is what one stage measured of one step, in
// milliseconds, summed over the step's micro-batches (not smoothed, unlike
// StageStatus).
type StageStepTiming struct {
	ForwardMS  float64 `json:"forward_ms"`
	BackwardMS float64 `json:"backward_ms"`
	UpdateMS   float64 `json:"update_ms"`
	// WaitMS is the time the stage was blocked on the data plane: for a
	// peer's tensors, or for its own to leave at the step's end.
	WaitMS float64 `json:"wait_ms"`
	// SendMS is the time its links spent encoding and writing what it
	// sent; they do it on their own goroutines, so it overlaps the rest.
	SendMS float64 `json:"send_ms"`
	// WallMS is the stage's whole step.
	WallMS float64 `json:"wall_ms"`
}

// recordTimes keeps the step that ran from start to now with its stage
// timings among the last LastSteps.
func (c *Core) recordTimes(start, now time.Time, timings []StageTiming) {
	st := StepTiming{Step: c.g, AtMS: ms(start.Sub(c.status.Started)), WallMS: ms(now.Sub(start)),
		Stages: make([]StageStepTiming, len(timings))}
	for k, t := range timings {
		var send time.Duration
		for _, l := range t.Links {
			send += l.Encode + l.Write
		}
		st.Stages[k] = StageStepTiming{ForwardMS: ms(t.Forward), BackwardMS: ms(t.Backward), UpdateMS: ms(t.Update),
			WaitMS: ms(t.Wait), SendMS: ms(send), WallMS: ms(t.Wall)}
	}
	// A new slice each time: statuses handed out share the old one.
	last := c.status.LastSteps[max(0, len(c.status.LastSteps)-(LastSteps-1)):]
	c.status.LastSteps = append(slices.Clip(last), st)
}

// stageTargets are the stages that sp sends activations to, in
// ascending order.
func stageTargets(sp balance.StagePlan) []int {
	var to []int
	for _, o := range sp.Outputs {
		for _, k := range o.To {
			if k >= 0 {
				to = append(to, k)
			}
		}
	}
	slices.Sort(to)
	return slices.Compact(to)
}
