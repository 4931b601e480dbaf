package nn_test

import (
	"math"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

func TestSchedule(t *testing.T) {
	s, err := nn.NewSchedule("cosine", 0.1, 10, 110)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		step int
		want float64
	}{{0, 0.01}, {9, 0.1}, {10, 0.1}, {60, 0.05}, {110, 0}, {500, 0}} {
		if got := s.At(c.step); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("cosine step %d: %v, want %v", c.step, got, c.want)
		}
	}
	c, _ := nn.NewSchedule("constant", 0.1, 0, 5)
	if c.At(0) != 0.1 || c.At(100) != 0.1 {
		t.Error("constant schedule changes")
	}
	if _, err := nn.NewSchedule("step", 0.1, 0, 5); err == nil {
		t.Error("unknown schedule accepted")
	}
}
