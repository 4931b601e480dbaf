package balance

import (
	"encoding/json"
	"math"
	"slices"
	"testing"

	"github.com/ppnode/ppnode/nn/zoo"
)

// The simulator against ZB-H1's closed form: S equal stages of Linear
// layers (whose backward pass splits into halves B = W = b/2), M >= S
// micro-batches: M(f+b) + (S-1)(f+B-min(W, f)) (a weight pass fills at
// most the wait of a forward pass), the bubble a third of 1F1B's (S-1)(f+b)
// when f = B = W. Stage k keeps up to min(S, M) micro-batches'
// activations (1F1B: S-k), its weight passes lagging by k.
func TestSimulatorZeroBubble(t *testing.T) {
	for _, c := range []struct{ f, b float64 }{{1, 2}, {0.003, 0.007}} {
		for S := 1; S <= 5; S++ {
			g, prof, cl, part := equalStages(t, S, c.f, c.b)
			var nodes []string
			for _, n := range cl.Nodes {
				nodes = append(nodes, n.Name)
			}
			for M := 1; M <= 9; M++ {
				r := mustSim(t, g, prof, cl, part, nodes, ZeroBubble, M)
				one := mustSim(t, g, prof, cl, part, nodes, OneFOneB, M)
				if r.StepTime > one.StepTime+1e-12 {
					t.Errorf("f=%v b=%v S=%d M=%d: zb %.4f, 1f1b %.4f", c.f, c.b, S, M, r.StepTime, one.StepTime)
				}
				if M >= S {
					B, W := c.b/2, c.b/2
					if want := float64(M)*(c.f+c.b) + float64(S-1)*(c.f+B-min(W, c.f)); math.Abs(r.StepTime-want) > 1e-9 {
						t.Errorf("f=%v b=%v S=%d M=%d: zb step %.4f, want %.4f", c.f, c.b, S, M, r.StepTime, want)
					}
				}
				for k, st := range r.Stages {
					if st.PeakInFlight != min(S, M) {
						t.Errorf("S=%d M=%d stage %d: %d micro-batches in flight, want %d", S, M, k, st.PeakInFlight, min(S, M))
					}
				}
			}
		}
	}
}

// A zb plan validates, survives JSON, and runs each weight pass once, in
// ascending order, after its backward pass; Validate refuses the orders
// that would add the weight gradients unlike one process.
func TestZeroBubblePlanValidates(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	nodes := []string{"a", "b", "c"}
	part, err := ParseSpec(g, "fc1-fc10@a; fc11-fc20@b; fc21-fc32@c", nodes)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Build(g, part, nodes, ZeroBubble, 5, 2)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(p)
	var back Plan
	if err := json.Unmarshal(b, &back); err != nil || back.Hash() != p.Hash() || back.Schedule != ZeroBubble {
		t.Fatalf("plan does not survive JSON: %v", err)
	}
	if err := back.Validate(g); err != nil {
		t.Fatal(err)
	}
	if _, err := buildRecompute(g, part, nodes, ZeroBubble, 5, 2, false, []bool{true, false, false}); err == nil {
		t.Error("zb with recomputation was built")
	}
	find := func(p *Plan, s int, op Op, m int) int { return findInstr(t, p, s, op, m) }
	for _, c := range []struct {
		name   string
		change func(p *Plan)
	}{
		{"weight passes swapped", func(p *Plan) {
			a, b := find(p, 1, OpWeight, 1), find(p, 1, OpWeight, 2)
			p.Stages[1].Program[a].Micro, p.Stages[1].Program[b].Micro = 2, 1
		}},
		{"weight pass before its backward pass", func(p *Plan) {
			prog := p.Stages[2].Program
			w, bi := find(p, 2, OpWeight, 4), find(p, 2, OpBackwardInput, 4)
			prog[w], prog[bi] = prog[bi], prog[w]
		}},
		{"weight pass dropped", func(p *Plan) {
			k := find(p, 0, OpWeight, 3)
			p.Stages[0].Program = append(p.Stages[0].Program[:k], p.Stages[0].Program[k+1:]...)
		}},
		{"whole backward pass under zb", func(p *Plan) { p.Stages[1].Program[find(p, 1, OpBackwardInput, 0)].Op = OpBackward }},
		{"weight pass under 1f1b", func(p *Plan) { p.Schedule = OneFOneB }},
	} {
		var q Plan
		json.Unmarshal(b, &q)
		c.change(&q)
		if err := q.Validate(g); err == nil {
			t.Errorf("%s: Validate accepted the plan", c.name)
		}
	}
}

// auto tries zero-bubble beside GPipe and 1F1B and takes it only when its
// simulated step is shorter than the best other plan's by zbMargin; it
// never takes it where a node's memory does not hold its extra micro-batches
// in flight, nor under --recompute all.
func TestAutoChoosesZeroBubbleByMargin(t *testing.T) {
	for _, tc := range []struct {
		nodes, M int
		want     bool // zb beats the others by the margin
	}{
		{4, 4, true},  // zb 15% faster
		{2, 8, false}, // zb about 3% faster: within the margin
	} {
		g := build(t, "mlp32", zoo.Options{Width: 64})
		prof := Analytic(g, AnalyticOptions{})
		c := equalNodes(tc.nodes)
		o := Options{Partitioner: Uniform, Batch: 64, MicroBatches: tc.M}
		search := func(c *Cluster, sched, recompute string) *Result {
			t.Helper()
			o := o
			o.Schedule, o.Recompute = sched, recompute
			res, err := Search(g, prof, c, o)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		zb, other := search(c, "zb", ""), search(c, "gpipe", "")
		if ob := search(c, "1f1b", ""); ob.Report.StepTime < other.Report.StepTime {
			other = ob
		}
		r := zb.Report.StepTime / other.Report.StepTime
		if (r < 1-zbMargin) != tc.want || r >= 1 {
			t.Fatalf("%d nodes, M=%d: zb/best other = %.3f; the case is not what it tests", tc.nodes, tc.M, r)
		}
		want := other
		if tc.want {
			want = zb
		}
		if got := search(c, "auto", ""); got.Plan.Hash() != want.Plan.Hash() {
			t.Errorf("%d nodes, M=%d (zb/other %.3f): auto picked %s, want %s", tc.nodes, tc.M, r, got.Plan.Schedule, want.Plan.Schedule)
		}
		if got := search(c, "auto", RecomputeAll); got.Plan.Schedule == ZeroBubble {
			t.Errorf("%d nodes, M=%d: auto picked zb under --recompute all", tc.nodes, tc.M)
		}
		if !tc.want {
			continue
		}
		// Each node's memory just holds its 1F1B stage: zb's later
		// stages, which keep S micro-batches in flight against S-k, do
		// not fit, and auto falls back to the best plan that does.
		ob := search(c, "1f1b", "")
		mem := &Cluster{Nodes: slices.Clone(c.Nodes)}
		for _, st := range ob.Report.Stages {
			mem.Nodes[st.Node[0]-'a'].Memory = int64(st.PeakMemory * 1.001)
		}
		over := false
		for _, st := range zb.Report.Stages {
			over = over || st.PeakMemory > float64(mem.Nodes[st.Node[0]-'a'].Memory)
		}
		if !over {
			t.Fatalf("zb's stages fit in 1F1B's memory: the case does not test memory")
		}
		if got := search(mem, "auto", ""); got.Plan.Schedule == ZeroBubble {
			t.Errorf("auto picked zb, which does not fit its nodes' memory")
		}
	}
}
