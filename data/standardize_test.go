package data

import (
	"math"
	"testing"
)

func TestStandardize(t *testing.T) {
	set, err := Synthetic([]int{4, 4, 2}, 3, Options{Seed: 1, Train: 64, Test: 16})
	if err != nil {
		t.Fatal(err)
	}
	mean, std := set.Standardize()
	if len(mean) != 2 || len(std) != 2 {
		t.Fatalf("got %d means and %d deviations for 2 channels", len(mean), len(std))
	}
	for ch := 0; ch < 2; ch++ {
		var s, s2 float64
		n := 0
		for i := ch; i < len(set.Train.X); i += 2 {
			v := float64(set.Train.X[i])
			s += v
			s2 += v * v
			n++
		}
		m := s / float64(n)
		if v := s2/float64(n) - m*m; math.Abs(m) > 1e-5 || math.Abs(v-1) > 1e-4 {
			t.Errorf("channel %d: mean %v, variance %v after standardising", ch, m, v)
		}
	}
}
