package nn

import (
	"fmt"
	"math"
)

// Schedule gives the learning rate of each step, a pure function of the
// step number so that every stage of a pipeline, and every replay after a
// failure, uses the same rate.
type Schedule struct {
	Kind   string  // "constant" or "cosine"
	Base   float64 // the peak rate
	Warmup int     // steps of linear warm-up from Base/Warmup to Base
	Total  int     // steps in the run (cosine decays to 0 at Total)
}

// NewSchedule checks the kind and returns the schedule.
func NewSchedule(kind string, base float64, warmup, total int) (Schedule, error) {
	if kind != "constant" && kind != "cosine" {
		return Schedule{}, fmt.Errorf("nn: unknown learning-rate schedule %q (want constant or cosine)", kind)
	}
	if warmup < 0 || total < 1 {
		return Schedule{}, fmt.Errorf("nn: bad schedule warm-up %d, total %d", warmup, total)
	}
	return Schedule{Kind: kind, Base: base, Warmup: warmup, Total: total}, nil
}

// At returns the rate of step (counted from 0).
func (s Schedule) At(step int) float64 {
	if step < s.Warmup {
		return s.Base * float64(step+1) / float64(s.Warmup)
	}
	if s.Kind != "cosine" {
		return s.Base
	}
	span := s.Total - s.Warmup
	if span <= 0 {
		return s.Base
	}
	t := math.Min(float64(step-s.Warmup)/float64(span), 1)
	return s.Base * 0.5 * (1 + cosPi(t))
}
