package balance

import (
	"encoding/json"
	"errors"
	"math"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// A recomputing stage runs OpRecompute m right before each backward pass's
// gradients arrive; its plan round-trips through JSON and validates, and
// Validate refuses the plans whose recomputation the runtime could not run.
func TestRecomputePlanValidates(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	nodes := []string{"a", "b", "c"}
	part, err := ParseSpec(g, "fc1-fc10@a; fc11-fc20@b; fc21-fc32@c", nodes)
	if err != nil {
		t.Fatal(err)
	}
	for _, sched := range []Schedule{GPipe, OneFOneB} {
		p, err := buildRecompute(g, part, nodes, sched, 4, 2, false, []bool{true, false, true})
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range p.Stages {
			n := 0
			for k, in := range st.Program {
				if in.Op != OpRecompute {
					continue
				}
				n++
				if nx := st.Program[k+1]; nx.Op != OpRecvGrad && nx.Op != OpBackward || nx.Micro != in.Micro {
					t.Errorf("%s stage %d: %v is followed by %v", sched, st.ID, in, nx)
				}
			}
			if want := map[bool]int{true: 4, false: 0}[st.Recompute]; n != want {
				t.Errorf("%s stage %d (recompute %v): %d recomputations, want %d", sched, st.ID, st.Recompute, n, want)
			}
		}
		b, _ := json.Marshal(p)
		var back Plan
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.Hash() != p.Hash() || !back.Stages[0].Recompute || back.Stages[1].Recompute {
			t.Fatalf("%s: the plan does not survive JSON", sched)
		}
		if err := back.Validate(g); err != nil {
			t.Fatalf("%s: %v", sched, err)
		}
		find := func(p *Plan, s int, op Op, m int) int { return findInstr(t, p, s, op, m) }
		for _, c := range []struct {
			name   string
			change func(p *Plan)
		}{
			{"flag without recomputation", func(p *Plan) { p.Stages[1].Recompute = true }},
			{"recomputation without flag", func(p *Plan) { p.Stages[0].Recompute = false }},
			{"recomputation dropped", func(p *Plan) {
				k := find(p, 0, OpRecompute, 2)
				p.Stages[0].Program = append(p.Stages[0].Program[:k], p.Stages[0].Program[k+1:]...)
			}},
			{"recomputation of another micro-batch", func(p *Plan) { p.Stages[2].Program[find(p, 2, OpRecompute, 1)].Micro = 0 }},
		} {
			var q Plan
			json.Unmarshal(b, &q)
			c.change(&q)
			if err := q.Validate(g); err == nil {
				t.Errorf("%s, %s: Validate accepted the plan", sched, c.name)
			}
		}
	}
}

// The simulator against the closed form with recomputation: S equal
// stages, 1F1B, every stage recomputing, takes (M+S-1)(f+b) + M·f: the
// first stage's recomputations lengthen the step, the later stages' fill
// their wait for gradients; each stage is busy M(2f+b). A
// recomputing stage's memory holds one micro-batch's buffers and its
// inputs per micro-batch in flight.
func TestSimulatorRecompute(t *testing.T) {
	const f, b = 0.003, 0.007
	S, M := 3, 6
	g, prof, c, part := equalStages(t, S, f, b)
	nodes := []string{"n0", "n1", "n2"}
	keep := mustSim(t, g, prof, c, part, nodes, OneFOneB, M)
	p, err := buildRecompute(g, part, nodes, OneFOneB, M, 1, false, []bool{true, true, true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := Simulate(p, g, prof, c, SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(M+S-1)*(f+b) + float64(M)*f; math.Abs(r.StepTime-want) > 1e-12 {
		t.Errorf("step %.6f, want %.6f", r.StepTime, want)
	}
	l := newLayout(g, prof)
	for k, st := range r.Stages {
		if want := float64(M) * (2*f + b); math.Abs(st.Busy-want) > 1e-12 {
			t.Errorf("stage %d busy %.6f, want %.6f", k, st.Busy, want)
		}
		if !st.Recompute || st.PeakInFlight != keep.Stages[k].PeakInFlight {
			t.Fatalf("stage %d: recompute %v, %d in flight (keeping activations: %d)", k, st.Recompute, st.PeakInFlight, keep.Stages[k].PeakInFlight)
		}
		lp := prof.Layers[k]
		in := float64(4 * nn.Size(g.InputShapes[0]))
		if k > 0 {
			in = l.tensorBytes(k-1, 1)
		}
		static := float64(lp.ParamBytes) + 2*float64(lp.TrainableBytes)
		if want := static + lp.SlotBytes + float64(st.PeakInFlight)*in; math.Abs(st.PeakMemory-want) > 1e-6*want {
			t.Errorf("stage %d: peak memory %.0f, want %.0f", k, st.PeakMemory, want)
		}
		if k < S-1 && st.PeakMemory >= keep.Stages[k].PeakMemory {
			t.Errorf("stage %d: recomputing needs %.0f bytes, keeping %.0f", k, st.PeakMemory, keep.Stages[k].PeakMemory)
		}
	}
}

// With a node whose memory holds the first stage recomputing but not
// keeping its activations in flight, --recompute none finds no plan, auto
// recomputes on that stage alone, and all on every stage.
func TestSearchRecomputesWhereMemoryRequires(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 64})
	prof := Analytic(g, AnalyticOptions{})
	spec := "fc1-fc16@a; fc17-fc32@b"
	o := Options{Partitioner: spec, Schedule: "1f1b", Batch: 1024, MicroBatches: 8}
	c := &Cluster{Nodes: []NodeProfile{{Name: "a", Speed: 1}, {Name: "b", Speed: 1}}, DefaultLink: DefaultLink}
	free, err := Search(g, prof, c, o)
	if err != nil {
		t.Fatal(err)
	}
	o.Recompute = RecomputeAll
	all, err := Search(g, prof, c, o)
	if err != nil {
		t.Fatal(err)
	}
	o.Recompute = ""
	keep, rec := free.Report.Stages[0].PeakMemory, all.Report.Stages[0].PeakMemory
	if rec > 0.8*keep {
		t.Fatalf("recomputing, stage 0 needs %.0f bytes; keeping its activations %.0f", rec, keep)
	}
	c.Nodes[0].Memory = int64((keep + rec) / 2)
	if _, err := Search(g, prof, c, o); !errors.Is(err, ErrNoFit) {
		t.Fatalf("recompute none: %v, want ErrNoFit", err)
	}
	for _, tc := range []struct {
		mode string
		want []bool
	}{{RecomputeAuto, []bool{true, false}}, {RecomputeAll, []bool{true, true}}} {
		o.Recompute = tc.mode
		res, err := Search(g, prof, c, o)
		if err != nil {
			t.Fatalf("%s: %v", tc.mode, err)
		}
		for k, st := range res.Plan.Stages {
			if st.Recompute != tc.want[k] {
				t.Errorf("%s: stage %d recomputes %v, want %v", tc.mode, k, st.Recompute, tc.want[k])
			}
		}
		if r := res.Report.Stages[0]; r.PeakMemory > float64(r.MemoryLimit) {
			t.Errorf("%s: stage 0 needs %.0f bytes of %d", tc.mode, r.PeakMemory, r.MemoryLimit)
		}
		if res.Report.StepTime <= free.Report.StepTime {
			t.Errorf("%s: step %.6f s, no faster than keeping activations (%.6f s)", tc.mode, res.Report.StepTime, free.Report.StepTime)
		}
		if err := res.Plan.Validate(g); err != nil {
			t.Fatal(err)
		}
	}
	o.Recompute = "some"
	if _, err := Search(g, prof, c, o); !errors.Is(err, ErrPlan) {
		t.Errorf("recompute %q: %v, want ErrPlan", o.Recompute, err)
	}
}
