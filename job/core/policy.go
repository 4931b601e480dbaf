package core

import (
	"math"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
)

// Rebalancing (docs/DESIGN.md, "The life of a job"): the core keeps
// a smoothed speed per node from the stages' measured compute times, and
// every few steps asks the balancer for a plan over the live nodes at those
// speeds. It changes the plan at a step boundary (the pipeline is drained
// there, so nothing is replayed), when
//
//   - a node of the plan is leaving the cluster (at once, whatever the
//     partitioner), or a user asked for another partition, or
//   - the new plan's predicted step is at least MinGain shorter than the
//     current plan's predicted step at the measured speeds, and the
//     move pays for itself within MaxPayback steps, two evaluations in a
//     row, and at least a cool-down after the last change that doubles
//     with every change (hysteresis: a speed flickering around a
//     threshold, or noisy measurements, do not make plans flip back and
//     forth). The predicted gain counts only as far as the last re-plan's
//     prediction held (realism): if it saved half the step time it
//     predicted, the next must predict twice MinGain. A node that joined
//     is taken into the plan by the same rule.
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
	maxRecoveries     = 20   // recoveries of one job, at most
	moveStartup       = 50 * time.Millisecond
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

// Checkpoint interval: cuts are taken every K steps, K chosen so that a
// cut costs at most 2% of the training time.
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

// cutCost is what the next cut of a state of stateBytes is expected to
// cost: what the last cut measurably cost the steps around it (measured,
// see cutWindow), or else its pause and persist time (0: not measured
// yet), persist counting if persists (cuts are written and copied), or
// else an estimate from the state's size.
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

// chooseK is the checkpoint interval that keeps a cut's cost within 2% of
// the training time, bounded to [5, 1000] steps.
func chooseK(cost time.Duration, stepSec float64) int {
	k := int(math.Ceil(cost.Seconds() / (0.02 * stepSec)))
	return min(max(k, 5), 1000)
}

// cutWindow measures what a cut cost the pipeline: the time the steps from
// the cut on took beyond the median step before it (the cut's pause is part
// of the step it precedes), until the cut has been written and copied.
// Writing and copying run beside the stages and take CPU from them (all of
// it they can under a CPU quota): on nodes at 30% of a CPU a cut slowed the
// steps around it by about twice its pause and persist time.
type cutWindow struct {
	open      bool
	cut       int     // the cut's step
	start     int     // index of the cut's step in steps
	med       float64 // median step before the cut, seconds
	persisted bool    // the cut is written and copied
}

// maxCutWindow bounds a window that a persist never ends.
const maxCutWindow = 1000

// measure returns the cut's cost once its persist has ended (the step
// during which it ended counts) and closes the window.
func (w *cutWindow) measure(steps []float64) (time.Duration, bool) {
	if !w.open || !w.persisted && len(steps)-w.start < maxCutWindow {
		return 0, false
	}
	w.open = false
	var excess float64
	for _, s := range steps[w.start:] {
		excess += max(0, s-w.med)
	}
	return time.Duration(excess * float64(time.Second)), true
}

// stepTimeout bounds a step: generous (max) until a few steps are
// measured, then a bounded factor of the median (a hung node must not
// stall the job).
func stepTimeout(steps []float64, max_ time.Duration) time.Duration {
	if len(steps) < 3 {
		return max_
	}
	d := time.Duration(10 * balance.Median(steps) * float64(time.Second))
	return min(max(d, 3*time.Second), max_)
}

// replanCheck follows the steps after a re-plan until its measured step
// time is known.
type replanCheck struct {
	active bool
	replan int // index in status.Replans
	start  int // index of the first step after it
}
