package nn_test

import (
	"math"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

func TestSchedule(t *testing.T) {
	s, err := nn.NewSchedule("cosine", 0.1, 0, 10, 110)
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
	c, _ := nn.NewSchedule("constant", 0.1, 0, 0, 5)
	if c.At(0) != 0.1 || c.At(100) != 0.1 {
		t.Error("constant schedule changes")
	}
	if _, err := nn.NewSchedule("step", 0.1, 0, 0, 5); err == nil {
		t.Error("unknown schedule accepted")
	}
	// Hugging Face's linear decay, and both decays to a floor (nanoGPT's
	// min_lr).
	l, _ := nn.NewSchedule("linear", 0.1, 0, 10, 110)
	m, _ := nn.NewSchedule("cosine", 0.1, 0.01, 10, 110)
	ml, _ := nn.NewSchedule("linear", 0.1, 0.01, 10, 110)
	for _, c := range []struct {
		step                         int
		linear, cosineMin, linearMin float64
	}{{0, 0.01, 0.01, 0.01}, {10, 0.1, 0.1, 0.1}, {35, 0.075, 0.01 + 0.09*0.5*(1+math.Cos(math.Pi/4)), 0.0775}, {60, 0.05, 0.055, 0.055}, {110, 0, 0.01, 0.01}, {500, 0, 0.01, 0.01}} {
		if got := [3]float64{l.At(c.step), m.At(c.step), ml.At(c.step)}; math.Abs(got[0]-c.linear) > 1e-12 || math.Abs(got[1]-c.cosineMin) > 1e-12 || math.Abs(got[2]-c.linearMin) > 1e-12 {
			t.Errorf("step %d: linear, cosine to 0.01, linear to 0.01 give %v, want %v %v %v", c.step, got, c.linear, c.cosineMin, c.linearMin)
		}
	}
	for _, bad := range []struct {
		kind string
		min  float64
	}{{"constant", 0.01}, {"cosine", 0.1}, {"cosine", -0.01}, {"linear", math.NaN()}} {
		if _, err := nn.NewSchedule(bad.kind, 0.1, bad.min, 0, 5); err == nil {
			t.Errorf("%s to %v from 0.1 accepted", bad.kind, bad.min)
		}
	}
}
