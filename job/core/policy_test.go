package core

import (
	"math"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
)

// The automatic checkpoint interval keeps a cut's cost within 2% of the
// training time from the first cut on: until a cut is measured its cost
// is estimated from the state's size; a measured pause counts with the
// last writing and copying, or the estimate while that has not ended.
func TestAutomaticCheckpointInterval(t *testing.T) {
	const mb = 1_000_000
	ms := time.Millisecond
	for _, tc := range []struct {
		name           string
		state          int64
		pause, persist time.Duration
		measured       time.Duration
		persists       bool
		step           float64
		wantCost       time.Duration
		wantK          int
	}{
		{"before any cut: 66 MB at the assumed 25 MB/s", 66 * mb, 0, 0, 0, true, 0.2, 2640 * ms, 660},
		{"before any cut, small state", 1 * mb, 0, 0, 0, true, 0.01, 40 * ms, 200},
		{"first cut's pause measured, still persisting", 66 * mb, 200 * ms, 0, 0, true, 0.2, 2840 * ms, 710},
		{"pause and persist measured", 270 * mb, 200 * ms, 900 * ms, 0, true, 0.1, 1100 * ms, 550},
		{"its cost to the steps measured", 270 * mb, 200 * ms, 900 * ms, 2 * time.Second, true, 0.1, 2 * time.Second, 1000},
		{"nothing persists", 270 * mb, 200 * ms, 0, 0, false, 0.1, 200 * ms, 100},
		{"tiny cuts: at least 5 steps", 1000, 1 * ms, 1 * ms, 0, true, 1, 2 * ms, 5},
	} {
		got := cutCost(tc.state, tc.pause, tc.persist, tc.measured, tc.persists)
		if got != tc.wantCost {
			t.Errorf("%s: cost %v, want %v", tc.name, got, tc.wantCost)
		}
		if k := chooseK(got, tc.step); k != tc.wantK {
			t.Errorf("%s: K %d, want %d", tc.name, k, tc.wantK)
		}
	}
}

// A cut's cost is the time the steps from it took beyond the median step
// before it, counted until it has been written and copied.
func TestCutWindow(t *testing.T) {
	steps := []float64{0.1, 0.1, 0.1, 0.1}
	w := cutWindow{open: true, start: len(steps), med: 0.1}
	steps = append(steps, 0.4) // the cut's pause is in this step
	if _, ok := w.measure(steps); ok {
		t.Fatal("measured before the cut's persist ended")
	}
	steps = append(steps, 0.15, 0.08) // faster steps do not pay it back
	w.persisted = true
	cost, ok := w.measure(steps)
	if !ok || cost != 350*time.Millisecond {
		t.Fatalf("cost %v %v, want 350ms", cost, ok)
	}
	if _, ok := w.measure(steps); ok {
		t.Fatal("measured twice")
	}
}

// A re-plan's measured gain discounts the next predicted gains: by the
// share of its prediction that held, within [realismFloor, 1], taken from
// the latest measured re-plan made for the measured speeds.
func TestRealism(t *testing.T) {
	speeds := func(gain, before, after float64) job.Replan {
		return job.Replan{Trigger: job.TriggerSpeeds, Gain: gain, MeasuredBeforeMS: before, MeasuredAfterMS: after}
	}
	for _, tc := range []struct {
		name    string
		replans []job.Replan
		want    float64
	}{
		{"none", nil, 1},
		{"held", []job.Replan{speeds(0.2, 100, 80)}, 1},
		{"did better", []job.Replan{speeds(0.2, 100, 70)}, 1},
		{"half", []job.Replan{speeds(0.4, 100, 80)}, 0.5},
		{"demo of session 6", []job.Replan{speeds(1-82.9/139.4, 127.3, 100.7)}, (1 - 100.7/127.3) / (1 - 82.9/139.4)},
		{"made it worse", []job.Replan{speeds(0.3, 100, 110)}, realismFloor},
		{"latest counts", []job.Replan{speeds(0.4, 100, 80), speeds(0.2, 100, 80)}, 1},
		{"not yet measured", []job.Replan{speeds(0.4, 100, 80), speeds(0.2, 100, 0)}, 0.5},
		{"leaving does not count", []job.Replan{speeds(0.4, 100, 80), {Trigger: job.TriggerLeaving, Gain: 0.5, MeasuredBeforeMS: 100, MeasuredAfterMS: 100}}, 0.5},
	} {
		if got := realism(tc.replans); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: realism %v, want %v", tc.name, got, tc.want)
		}
	}
}
