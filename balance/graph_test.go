package balance

import (
	"errors"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

func equalNodes(n int) *Cluster {
	c := &Cluster{}
	for i := 0; i < n; i++ {
		c.Nodes = append(c.Nodes, NodeProfile{Name: string(rune('a' + i)), Speed: 1})
	}
	return c
}

func build(t *testing.T, model string, o zoo.Options) *nn.Graph {
	t.Helper()
	g, err := zoo.Build(model, o)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// On uno the graph partitioner puts the three towers on three different
// nodes, whose forward passes of a micro-batch run at the same time, and
// beats the best sequential GPipe or 1F1B pipeline by more than GraphPipe's
// margin; auto keeps the graph schedule against the zero-bubble chain too.
func TestGraphRunsUnoTowersConcurrently(t *testing.T) {
	g := build(t, "uno", zoo.Options{Width: 0.1})
	prof := Analytic(g, AnalyticOptions{})
	c := equalNodes(4)
	o := Options{Partitioner: GraphPP, Batch: 64, MicroBatches: 4}
	res, err := Search(g, prof, c, o)
	if err != nil {
		t.Fatal(err)
	}
	tower := map[int]int{} // tower -> stage
	for s, st := range res.Plan.Stages {
		for _, l := range st.Layers {
			for k, tw := range []string{"tower1.fc", "tower2.fc", "tower3.fc"} {
				if strings.HasPrefix(l, tw) {
					if prev, ok := tower[k]; ok && prev != s {
						t.Fatalf("tower %d is split over stages %d and %d", k+1, prev, s)
					}
					tower[k] = s
				}
			}
		}
	}
	if len(tower) != 3 || tower[0] == tower[1] || tower[1] == tower[2] || tower[0] == tower[2] {
		t.Fatalf("towers on stages %v, want three different stages (plan %s)", tower, res.Spec)
	}
	if res.Plan.Schedule != GraphSchedule && res.Plan.Schedule != GPipe {
		t.Fatalf("schedule %s", res.Plan.Schedule)
	}
	// Every pair of tower stages computes at the same time at some point
	// (the stage that also runs the fork sends it after its forward pass,
	// so the others overlap its next micro-batch).
	var fwd [][2]float64
	var stage []int
	for _, e := range res.Report.Events {
		if !e.Link() && e.Op == OpForward {
			fwd = append(fwd, [2]float64{e.Start, e.End})
			stage = append(stage, e.Stage)
		}
	}
	for a := 0; a < 3; a++ {
		for b := a + 1; b < 3; b++ {
			overlap := false
			for i := range fwd {
				for j := range fwd {
					if stage[i] == tower[a] && stage[j] == tower[b] && fwd[i][0] < fwd[j][1] && fwd[j][0] < fwd[i][1] {
						overlap = true
					}
				}
			}
			if !overlap {
				t.Errorf("towers %d and %d never compute at the same time", a+1, b+1)
			}
		}
	}
	o.Partitioner = Balanced
	seqStep := func(sched string) float64 {
		o := o
		o.Schedule = sched
		seq, err := Search(g, prof, c, o)
		if err != nil {
			t.Fatal(err)
		}
		return seq.Report.StepTime
	}
	// GraphPipe's margin is over sequential pipelines of the same kind
	// (GPipe, 1F1B), not over the split backward passes of zero-bubble.
	seq := min(seqStep("gpipe"), seqStep("1f1b"))
	if ratio := res.Report.StepTime / seq; ratio > 0.77 {
		t.Errorf("graph step %.3g ms is %.2fx the sequential %.3g ms, want <= 0.77x", res.Report.StepTime*1e3, ratio, seq*1e3)
	}
	if auto := seqStep("auto"); res.Report.StepTime >= auto {
		t.Errorf("graph step %.3g ms is not below the best sequential plan's %.3g ms (auto)", res.Report.StepTime*1e3, auto*1e3)
	}
}

// On chain models the graph partitioner finds what the balanced one finds.
func TestGraphOnChainIsSequential(t *testing.T) {
	for _, m := range []struct {
		name string
		o    zoo.Options
	}{
		{"mlp32", zoo.Options{Width: 64}},
		{"vgg16", zoo.Options{Width: 0.125, Input: []int{16, 16, 3}}},
	} {
		g := build(t, m.name, m.o)
		prof := Analytic(g, AnalyticOptions{})
		c := &Cluster{Nodes: []NodeProfile{{Name: "a", Speed: 1}, {Name: "b", Speed: 0.5}, {Name: "c", Speed: 0.25}}}
		var plans []*Plan
		for _, part := range []string{Balanced, GraphPP} {
			res, err := Search(g, prof, c, Options{Partitioner: part, Batch: 32})
			if err != nil {
				t.Fatal(err)
			}
			res.Plan.Partitioner = ""
			plans = append(plans, res.Plan)
		}
		if plans[0].Hash() != plans[1].Hash() {
			t.Errorf("%s: graph plan %s differs from the balanced plan %s", m.name, FormatSpec(g, plans[1].Partition()), FormatSpec(g, plans[0].Partition()))
		}
	}
}

// mlp32 on nodes of speeds 1, 0.5 and 0.25: the balanced plan's predicted
// throughput is at least twice the uniform plan's (ideal 2.33).
func TestBalancedBeatsUniformOnUnequalNodes(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{})
	prof := Analytic(g, AnalyticOptions{})
	c := &Cluster{Nodes: []NodeProfile{{Name: "a", Speed: 1}, {Name: "b", Speed: 0.5}, {Name: "c", Speed: 0.25}}}
	var thr []float64
	for _, part := range []string{Uniform, Balanced} {
		res, err := Search(g, prof, c, Options{Partitioner: part, Batch: 64})
		if err != nil {
			t.Fatal(err)
		}
		thr = append(thr, res.Report.Throughput)
	}
	if thr[1] < 2*thr[0] {
		t.Fatalf("balanced %.1f samples/s, uniform %.1f: ratio %.2f < 2", thr[1], thr[0], thr[1]/thr[0])
	}
}

// The search keeps every stage within its node's memory: when GPipe's M
// micro-batches in flight do not fit but 1F1B's fewer do, it picks 1F1B,
// and when nothing fits it says so.
func TestSearchRespectsMemory(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 64})
	prof := Analytic(g, AnalyticOptions{})
	for k := range prof.Layers {
		prof.Layers[k].SlotBytes *= 100 // activations dominate memory
	}
	c := equalNodes(4)
	o := Options{Partitioner: Uniform, Batch: 64, MicroBatches: 16}
	peak := func(s string) float64 {
		o := o
		o.Schedule = s
		res, err := Search(g, prof, c, o)
		if err != nil {
			t.Fatal(err)
		}
		m := 0.0
		for _, st := range res.Report.Stages {
			m = max(m, st.PeakMemory)
		}
		return m
	}
	gp, ob := peak("gpipe"), peak("1f1b")
	if ob >= gp {
		t.Fatalf("1F1B peak %v not below GPipe's %v", ob, gp)
	}
	for i := range c.Nodes {
		c.Nodes[i].Memory = int64((gp + ob) / 2)
	}
	res, err := Search(g, prof, c, o)
	if err != nil {
		t.Fatal(err)
	}
	// auto may take zero-bubble (as many micro-batches in flight on the
	// first stage as 1F1B) when the simulator finds it faster; never GPipe.
	if res.Plan.Schedule != OneFOneB && res.Plan.Schedule != ZeroBubble {
		t.Fatalf("picked %s; only 1f1b and zb fit", res.Plan.Schedule)
	}
	for _, st := range res.Report.Stages {
		if st.PeakMemory > float64(st.MemoryLimit) {
			t.Fatalf("stage %d needs %v of %d", st.ID, st.PeakMemory, st.MemoryLimit)
		}
	}
	for i := range c.Nodes {
		c.Nodes[i].Memory = 1000
	}
	if _, err := Search(g, prof, c, o); err == nil || !strings.Contains(err.Error(), "memory") {
		t.Fatalf("got %v, want a memory error", err)
	}
}

// A model that fits no partition over the nodes' memory is refused as
// such (ErrNoFit, saying so), whatever the partitioner and schedule; not
// as a partition that is not a chain.
func TestNoFitIsReportedAsSuch(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 64})
	prof := Analytic(g, AnalyticOptions{})
	c := &Cluster{Nodes: []NodeProfile{{Name: "a", Speed: 1, Memory: 1 << 10}}}
	for _, part := range []string{Balanced, GraphPP, Uniform} {
		for _, sched := range []string{"1f1b", "gpipe", ""} {
			_, err := Search(g, prof, c, Options{Partitioner: part, Schedule: sched, Batch: 32})
			if !errors.Is(err, ErrNoFit) || strings.Contains(err.Error(), "chain") {
				t.Errorf("%s, schedule %q: %v; want ErrNoFit", part, sched, err)
			}
		}
	}
}
