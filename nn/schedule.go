package nn

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Schedule gives the learning rate of each step, a pure function of the
// step number so that every stage of a pipeline, and every replay after a
// failure, uses the same rate.
type Schedule struct {
	// Kind is "constant", "cosine" (half a cosine from Base to Min, as
	// nanoGPT's) or "linear" (a straight line from Base to Min, Hugging
	// Face's default), after the warm-up.
	Kind   string
	Base   float64 // the peak rate
	Min    float64 // the rate cosine and linear reach at Total (and keep)
	Warmup int     // steps of linear warm-up from Base/Warmup to Base
	Total  int     // steps in the run
}

// ScheduleKinds lists the schedules NewSchedule knows.
func ScheduleKinds() []string { return []string{"cosine", "linear", "constant"} }

// NewSchedule checks the kind and the rates and returns the schedule.
func NewSchedule(kind string, base, floor float64, warmup, total int) (Schedule, error) {
	if !slices.Contains(ScheduleKinds(), kind) {
		return Schedule{}, fmt.Errorf("nn: unknown learning-rate schedule %q (want %s)", kind, strings.Join(ScheduleKinds(), ", "))
	}
	if warmup < 0 || total < 1 {
		return Schedule{}, fmt.Errorf("nn: bad schedule warm-up %d, total %d", warmup, total)
	}
	if floor != 0 && (kind == "constant" || !(floor > 0 && floor < base)) {
		return Schedule{}, fmt.Errorf("nn: a minimum rate %v needs a decaying schedule from a larger rate (%s from %v)", floor, kind, base)
	}
	return Schedule{Kind: kind, Base: base, Min: floor, Warmup: warmup, Total: total}, nil
}

// At returns the rate of step (counted from 0).
func (s Schedule) At(step int) float64 {
	if step < s.Warmup {
		return s.Base * float64(step+1) / float64(s.Warmup)
	}
	span := s.Total - s.Warmup
	if s.Kind == "constant" || span <= 0 {
		return s.Base
	}
	t := math.Min(float64(step-s.Warmup)/float64(span), 1)
	f := 1 - t // linear
	if s.Kind == "cosine" {
		f = 0.5 * (1 + cosPi(t))
	}
	// Rounded before the addition so that no machine fuses it: with Min 0,
	// Base·f as before.
	return s.Min + float64((s.Base-s.Min)*f)
}
