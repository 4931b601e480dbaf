package job

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"testing"
)

func TestCheckLoss(t *testing.T) {
	for _, c := range []struct {
		loss float64
		want string
	}{
		{2.3, ""},
		{0, ""},
		{math.NaN(), "diverged at step 12: loss NaN"},
		{math.Inf(1), "diverged at step 12: loss +Inf"},
		{math.Inf(-1), "diverged at step 12: loss -Inf"},
	} {
		err := CheckLoss(12, c.loss)
		if c.want == "" {
			if err != nil {
				t.Errorf("loss %v: %v", c.loss, err)
			}
			continue
		}
		if !errors.Is(err, ErrDiverged) || err.Error() != c.want {
			t.Errorf("loss %v: %v; want %q wrapping ErrDiverged", c.loss, err, c.want)
		}
	}
}

// Local training with a learning rate of 1e308 fails at the step whose
// loss is no longer finite, as a pipelined job does, instead of ending
// with a loss of NaN.
func TestTrainLocalDiverges(t *testing.T) {
	s := DefaultSpec()
	s.Model, s.Data, s.SyntheticSamples, s.Width = "mlp32", "synthetic:8x8x1:4", 96, 16
	s.Batch, s.MicroBatches, s.Steps, s.Threads, s.Deterministic = 24, 4, 4, 1, true
	s.LR = 1e308
	j, err := prepare(s)
	if err != nil {
		t.Fatal(err)
	}
	var last int
	res, err := j.TrainLocal(1, LocalHooks{Step: func(step int, _, _ float64) { last = step }})
	if res != nil || !errors.Is(err, ErrDiverged) || !regexp.MustCompile(`^diverged at step \d+: loss (NaN|[+-]Inf)$`).MatchString(err.Error()) {
		t.Fatalf("result %+v, error %v; want it diverged", res, err)
	}
	// The steps done before it, as Status.Step counts them, number it.
	if want := fmt.Sprintf("diverged at step %d:", last); !strings.HasPrefix(err.Error(), want) {
		t.Errorf("%v after %d steps; want %q", err, last, want)
	}
}
