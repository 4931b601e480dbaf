package balance

import (
	"fmt"
	"math"
	"testing"

	"github.com/ppnode/ppnode/nn/zoo"
)

// Search gives the same plan, bit for bit, on one goroutine and on many,
// run after run: a job's core, which searches on one goroutine, and
// `ppnode plan`, which searches on every CPU, agree.
func TestSearchIsDeterministic(t *testing.T) {
	for _, tc := range []struct {
		model string
		o     zoo.Options
		part  string
		nodes int
	}{
		{"uno", zoo.Options{Width: 0.1}, GraphPP, 4},
		{"uno", zoo.Options{Width: 0.1}, Balanced, 5},
		{"resnet50", zoo.Options{Width: 0.25, Input: []int{32, 32, 3}}, Balanced, 6},
	} {
		g := build(t, tc.model, tc.o)
		prof := Analytic(g, AnalyticOptions{})
		cl := unequalNodes(tc.nodes)
		var first string
		for run, workers := range []int{0, 1, 4, 0, 4} {
			res, err := Search(g, prof, cl, Options{Partitioner: tc.part, Batch: 64, Workers: workers})
			if err != nil {
				t.Fatalf("%s %s: %v", tc.model, tc.part, err)
			}
			got := fmt.Sprintf("%s M=%d %s step=%x simulated=%d plan=%s", res.Plan.Schedule, res.Plan.MicroBatches, res.Spec,
				math.Float64bits(res.Report.StepTime), res.Simulated, res.Plan.Hash())
			if run == 0 {
				first = got
			} else if got != first {
				t.Errorf("%s %s, %d workers:\n%s\nwant (one goroutine)\n%s", tc.model, tc.part, workers, got, first)
			}
		}
	}
}
