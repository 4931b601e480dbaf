package nn

import (
	"math"
	"math/rand/v2"
	"testing"
)

// AUC counts, over every positive and negative pair, 1 where the positive
// scores higher and a half for a tie; it is NaN without both classes or
// with a soft target.
func TestAUC(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{2, 7, 100, 1000} {
		s, y := make([]float32, n), make([]float32, n)
		for i := range s {
			s[i] = float32(rng.IntN(9)) / 4 // many ties
			if rng.Float64() < 0.3+0.05*float64(s[i]) {
				y[i] = 1
			}
		}
		y[0], y[1] = 0, 1
		var sum, pairs float64
		for i := range s {
			for j := range s {
				if y[i] == 1 && y[j] == 0 {
					pairs++
					switch {
					case s[i] > s[j]:
						sum++
					case s[i] == s[j]:
						sum += 0.5
					}
				}
			}
		}
		if got, want := AUC(s, y), sum/pairs; math.Abs(got-want) > 1e-12 {
			t.Errorf("n %d: AUC %v, pairs give %v", n, got, want)
		}
	}
	if got := AUC([]float32{0.1, 0.9, 0.4}, []float32{0, 1, 0}); got != 1 {
		t.Errorf("separated: %v", got)
	}
	if got := AUC([]float32{0.1, 0.9}, []float32{1, 0}); got != 0 {
		t.Errorf("reversed: %v", got)
	}
	for _, y := range [][]float32{{0, 0}, {1, 1}, {0, 0.5}} {
		if got := AUC([]float32{0.1, 0.9}, y); !math.IsNaN(got) {
			t.Errorf("targets %v: %v, want NaN", y, got)
		}
	}
}
