package actors

import (
	"context"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/dataplane"
)

// TestMeasurePlanChange measures a real plan change of mlp32 at width
// 1024 on 3 nodes over TCP: the job moves from
// plan A to plan B (the plans the balancer chose before and after node c
// slowed 4x, BENCHMARKS.md) and back at successive step boundaries, in
// pairs (A -> B, B -> A) of one method, direct or through a cut (gather
// into the coordinator, restore from it), the methods in the order ABBA
// per round after a first round that warms the heap up and is not
// counted; the heap is collected before each move (untimed). It reports
// for each move its time, the state of the layers that changed node and
// the bytes that crossed the network, then the median time of each
// method. It is a measurement, not a test:
//
//	PPNODE_MEASURE=1 [PPNODE_MEASURE_ROUNDS=4] go test -tags openblas -count=1 -run TestMeasurePlanChange -v ./actors/
func TestMeasurePlanChange(t *testing.T) {
	if os.Getenv("PPNODE_MEASURE") == "" {
		t.Skip("a measurement: set PPNODE_MEASURE=1")
	}
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("PPNODE_MEASURE_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	const warm = 4
	const planA, planB = "fc1-fc11@c; fc12-fc21@b; fc22-fc32@a", "fc1-fc15@b; fc16-fc32@a"
	tc := newSystemCluster(t, 3, &dataplane.TCP{})
	spec := smallSpec("mlp32")
	spec.ID, spec.Width, spec.Batch, spec.MicroBatches = "measure-move", 1024, 48, 4
	spec.Partition, spec.Schedule, spec.NoRebalance = planA, "1f1b", true
	rounds++            // the first one warms up
	moves := 4 * rounds // per round: a pair of each method
	spec.Epochs, spec.Steps, spec.CheckpointEvery = 1, warm+moves+1, 1000
	spec.SyntheticSamples = spec.Batch * spec.Steps
	var c *Coordinator
	cfg := tc.config(3)
	cfg.OnStep = func(step int) {
		m := step - warm
		if m < 0 || m >= moves {
			return
		}
		round, pair := m/4, (m/2)%2
		viaCut := pair != round%2 // ABBA: direct first in even rounds
		if err := c.RequestReplan([]string{planB, planA}[m%2], viaCut, nodeNames(tc.nodes)); err != nil {
			t.Error(err)
		}
		// Every move starts from a collected heap (all nodes share this
		// process's): what the previous one left is not charged to the
		// next.
		runtime.GC()
	}
	c, err := newCoordinator(spec, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	times := map[string][]float64{}
	phases := map[string][]float64{}
	for i, r := range c.Status().Replans {
		dir := "A->B"
		if r.Plan == planA {
			dir = "B->A"
		}
		t.Logf("%-6s %s: %7.1f ms %v; state of the layers that changed node %d B, over the network %d B (%d B with framing), within nodes %d B",
			r.Method, dir, r.MovedMS, r.PhasesMS, r.StateBytes, r.MovedBytes, r.WireBytes, r.LocalBytes)
		if i >= 4 {
			times[r.Method] = append(times[r.Method], r.MovedMS)
			for k, v := range r.PhasesMS {
				phases[r.Method+" "+k] = append(phases[r.Method+" "+k], v)
			}
		}
		if r.Method == "direct" && r.MovedBytes != r.StateBytes {
			t.Errorf("a direct move sent %d bytes for %d bytes of moved state", r.MovedBytes, r.StateBytes)
		}
	}
	for _, m := range []string{"direct", "cut"} {
		v := slices.Sorted(slices.Values(times[m]))
		t.Logf("%s: median %.1f ms over %d moves %v", m, balance.Median(v), len(v), v)
	}
	for _, k := range slices.Sorted(maps.Keys(phases)) {
		t.Logf("  %s: median %.1f ms", k, balance.Median(phases[k]))
	}
	if d, k := balance.Median(times["direct"]), balance.Median(times["cut"]); d > 0 {
		t.Logf("a move through a cut takes %.2fx the time of a direct move", k/d)
	}
}
