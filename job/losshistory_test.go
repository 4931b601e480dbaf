package job

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// lossOracle is what a LossHistory holds after steps up to last were added
// (losses[s] the newest loss of step s), when the newest step ever added was
// top: the multiples up to last of the smallest power of two k with at most
// MaxLossPoints multiples up to top.
func lossOracle(losses map[int]float64, top, last int) []LossPoint {
	k := 1
	for top/k > MaxLossPoints {
		k *= 2
	}
	var want []LossPoint
	for s := k; s <= last; s += k {
		want = append(want, LossPoint{Step: s, Loss: losses[s]})
	}
	return want
}

// The history against its oracle, over seeded runs of steps with replays
// (a recovery goes back some steps and runs them again, with other losses).
func TestLossHistoryDownsamples(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var h LossHistory
		losses := map[int]float64{}
		steps := 1 + rng.IntN(5000)
		if seed < 3 {
			steps = []int{1, MaxLossPoints, MaxLossPoints + 1}[seed] // the edges
		}
		top, step := 0, 1
		for step <= steps {
			loss := rng.Float64()
			h.Add(step, loss)
			losses[step] = loss
			top = max(top, step)
			// Checked at the end, around the doublings (at multiples of
			// MaxLossPoints+1), and at an eighth of the other steps.
			if step == steps || step%(MaxLossPoints+1) <= 2 || rng.IntN(8) == 0 {
				if got, want := h.Points(), lossOracle(losses, top, step); !slices.Equal(got, want) {
					t.Fatalf("seed %d, after step %d (newest ever %d): %d points %v..., want %d %v...",
						seed, step, top, len(got), got[:min(3, len(got))], len(want), want[:min(3, len(want))])
				}
			}
			if rng.IntN(200) == 0 {
				step -= rng.IntN(min(step, 300)) // replay from a cut
			}
			step++
		}
		if n := len(h.Points()); n > MaxLossPoints || steps >= MaxLossPoints && n < MaxLossPoints/2 {
			t.Errorf("seed %d: %d points for %d steps", seed, n, steps)
		}
	}
}

func TestLossPointJSON(t *testing.T) {
	pts := []LossPoint{{1, 2.5}, {64, 0.125}, {128, math.Inf(1)}}
	b, err := json.Marshal(pts)
	if err != nil || string(b) != `[[1,2.5],[64,0.125],[128,null]]` {
		t.Fatalf("marshal: %s, %v", b, err)
	}
	var back []LossPoint
	if err := json.Unmarshal(b, &back); err != nil || len(back) != 3 || back[1] != pts[1] || back[2].Step != 128 || !math.IsNaN(back[2].Loss) {
		t.Fatalf("unmarshal: %v, %v", back, err)
	}
	for _, bad := range []string{`[1]`, `[1.5,2]`, `["1",2]`, `{"step":1}`, `[null,1]`} {
		var p LossPoint
		if err := json.Unmarshal([]byte(bad), &p); err == nil {
			t.Errorf("%s: decoded as %v, want an error", bad, p)
		}
	}
}
