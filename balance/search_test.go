package balance

import (
	"fmt"
	"math"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// Search gives the same plan, bit for bit, on one goroutine and on many,
// run after run: a job's core, which searches on one goroutine, and
// `ppnode plan`, which searches on every CPU, agree. So does the search
// with replicas (here on a chain and on a DAG of stages).
func TestSearchIsDeterministic(t *testing.T) {
	for _, tc := range []struct {
		model    string
		o        zoo.Options
		part     string
		nodes    int
		replicas bool
	}{
		{"uno", zoo.Options{Width: 0.1}, GraphPP, 4, false},
		{"uno", zoo.Options{Width: 0.1}, Balanced, 5, false},
		{"resnet50", zoo.Options{Width: 0.25, Input: []int{32, 32, 3}}, Balanced, 6, false},
		{"uno", zoo.Options{Width: 1}, GraphPP, 16, true},
		{"mlp32", zoo.Options{Width: 64}, Balanced, 40, true},
	} {
		g := build(t, tc.model, tc.o)
		prof := Analytic(g, AnalyticOptions{})
		cl, batch := unequalNodes(tc.nodes), 64
		if tc.model == "uno" && tc.replicas {
			cl, batch = equalNodes(tc.nodes), 256
			cl.DefaultLink = LinkProfile{Bandwidth: 1.25e9, Latency: 50e-6}
		}
		var first string
		for run, workers := range []int{0, 1, 4, 0, 4} {
			res, err := Search(g, prof, cl, Options{Partitioner: tc.part, Batch: batch, Workers: workers, Replicas: tc.replicas})
			if err != nil {
				t.Fatalf("%s %s: %v", tc.model, tc.part, err)
			}
			if res.Plan.Replicated() != tc.replicas {
				t.Fatalf("%s %s: replicated plan %v, want %v", tc.model, tc.part, res.Plan.Replicated(), tc.replicas)
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

// mlp4 is a 4-layer MLP, 784 -> w -> w -> w -> 10, with ReLUs.
func mlp4(t *testing.T, w int) *nn.Graph {
	b := nn.NewBuilder()
	x := b.Input("x", 784)
	in := 784
	for i := 1; i <= 4; i++ {
		out := w
		if i == 4 {
			out = 10
		}
		x = b.Add(fmt.Sprintf("fc%d", i), nn.NewLinear(in, out), x)
		if i < 4 {
			x = b.Add(fmt.Sprintf("relu%d", i), &nn.LeakyReLU{}, x)
		}
		in = out
	}
	g, err := b.Build(x)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// A 4-layer MLP on 8 equal nodes joined by 10 Gbit/s: without replicas
// the planner can use 4 of them; with replicas it uses the others too,
// and its plan simulates faster than the best chain of 4 stages by more
// than 1.5x in the fast sum order, by more than 1.1x in the chained order
// (whose replicas run their backward passes one after the other).
func TestReplicasBeatChain(t *testing.T) {
	g := mlp4(t, 1024)
	prof := Analytic(g, AnalyticOptions{})
	c := equalNodes(8)
	c.DefaultLink = LinkProfile{Bandwidth: 1.25e9, Latency: 50e-6}
	chain, err := Search(g, prof, c, Options{Batch: 256})
	if err != nil {
		t.Fatal(err)
	}
	if len(chain.Plan.Stages) != 4 {
		t.Fatalf("without replicas the plan has %d stages: %s", len(chain.Plan.Stages), chain.Spec)
	}
	for _, tc := range []struct {
		chained bool
		speedup float64
	}{{false, 1.5}, {true, 1.1}} {
		res, err := Search(g, prof, c, Options{Batch: 256, Replicas: true, ChainedSums: tc.chained})
		if err != nil {
			t.Fatal(err)
		}
		if err := res.Plan.Validate(g); err != nil {
			t.Fatal(err)
		}
		sp := chain.Report.StepTime / res.Report.StepTime
		t.Logf("chained=%v: %s, %.1f ms; chain %s, %.1f ms: %.2fx", tc.chained, res.Spec, res.Report.StepTime*1e3, chain.Spec, chain.Report.StepTime*1e3, sp)
		if !res.Plan.Replicated() || res.Plan.ChainedSums != tc.chained || len(res.Plan.Stages) <= 4 || sp < tc.speedup {
			t.Errorf("chained=%v: %s (%d executors) is %.2fx the chain, want replicas and more than %.1fx", tc.chained, res.Spec, len(res.Plan.Stages), sp, tc.speedup)
		}
	}
}

// A stage with running statistics (BatchNorm) gets no replicas: each
// replica would update them from its own micro-batches. On ResNet every
// residual block has some, so only the head around fc may be replicated.
func TestSearchReplicatesNoStageWithBuffers(t *testing.T) {
	g := build(t, "resnet50", zoo.Options{Width: 0.25, Input: []int{32, 32, 3}})
	res, err := Search(g, Analytic(g, AnalyticOptions{}), equalNodes(24), Options{Partitioner: Balanced, Batch: 256, Replicas: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range res.Plan.Partition().Stages {
		if len(st.Replicas) == 0 {
			continue
		}
		s, err := g.Stage(st.Layers)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range s.Params() {
			if !p.Trainable() {
				t.Fatalf("stage %s has replicas %v and buffer %s", res.Spec, st.Replicas, p.Name)
			}
		}
	}
	t.Logf("plan %s", res.Spec)
}
