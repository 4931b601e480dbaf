package balance

import (
	"fmt"
	"math"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// equalStages returns a chain model of S Linear layers whose profile gives
// every layer forward f and backward b seconds per micro-batch of one
// sample, no update time, and a cluster of S equal nodes joined by links
// that cost nothing.
func equalStages(t *testing.T, S int, f, b float64) (*nn.Graph, *ModelProfile, *Cluster, *Partition) {
	t.Helper()
	g := chainModel(t, S)
	prof := Analytic(g, AnalyticOptions{})
	c := &Cluster{DefaultLink: LinkProfile{Bandwidth: math.MaxFloat64, Latency: 0}}
	part := &Partition{}
	for k := range prof.Layers {
		prof.Layers[k].Forward = Timing{PerSample: f}
		prof.Layers[k].Backward = Timing{PerSample: b}
		prof.Layers[k].Update = 0
		name := fmt.Sprintf("n%d", k)
		c.Nodes = append(c.Nodes, NodeProfile{Name: name, Speed: 1})
		part.Stages = append(part.Stages, PartStage{Node: name, Layers: []string{g.Nodes[k].Name}})
	}
	return g, prof, c, part
}

// The simulator against the closed forms: S equal stages, M micro-batches,
// forward f, backward b: GPipe and 1F1B both take (M+S-1)(f+b) with bubble
// (S-1)/(M+S-1); GPipe keeps M micro-batches in flight on every stage,
// 1F1B min(S-k, M) on stage k.
func TestSimulatorClosedForms(t *testing.T) {
	const f, b = 0.003, 0.007
	for S := 1; S <= 5; S++ {
		g, prof, c, part := equalStages(t, S, f, b)
		var nodes []string
		for _, n := range c.Nodes {
			nodes = append(nodes, n.Name)
		}
		for M := 1; M <= 8; M++ {
			for _, sched := range []Schedule{GPipe, OneFOneB, GraphSchedule} {
				p, err := Build(g, part, nodes, sched, M, 1)
				if err != nil {
					t.Fatal(err)
				}
				r, err := Simulate(p, g, prof, c, SimOptions{})
				if err != nil {
					t.Fatal(err)
				}
				step := float64(M+S-1) * (f + b)
				bubble := float64(S-1) / float64(M+S-1)
				if math.Abs(r.StepTime-step) > 1e-12 || math.Abs(r.BubbleFraction-bubble) > 1e-12 {
					t.Errorf("S=%d M=%d %s: step %.6f bubble %.6f, want %.6f %.6f", S, M, sched, r.StepTime, r.BubbleFraction, step, bubble)
				}
				for k, st := range r.Stages {
					want := M
					if sched != GPipe {
						want = min(S-k, M)
					}
					if st.PeakInFlight != want {
						t.Errorf("S=%d M=%d %s: stage %d has %d micro-batches in flight, want %d", S, M, sched, k, st.PeakInFlight, want)
					}
				}
				if sched == OneFOneB && M > S && r.Stages[0].PeakMemory >= mustSim(t, g, prof, c, part, nodes, GPipe, M).Stages[0].PeakMemory {
					t.Errorf("S=%d M=%d: 1F1B does not use less memory than GPipe on the first stage", S, M)
				}
			}
		}
	}
}

func mustSim(t *testing.T, g *nn.Graph, prof *ModelProfile, c *Cluster, part *Partition, nodes []string, s Schedule, M int) *Report {
	t.Helper()
	p, err := Build(g, part, nodes, s, M, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Simulate(p, g, prof, c, SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A hand-worked schedule with transfers: two stages, f=1, b=2, a link of
// 0.5 s per tensor plus 0.25 s latency, M=2, GPipe.
//
//	s0: F0 [0,1] F1 [1,2]            B0 [7.5,9.5] B1 [9.5,11.5] -> 11.5
//	link s0->s1: F0 [1,1.75] F1 [2,2.75]
//	s1: F0 [1.75,2.75] F1 [2.75,3.75] B0 [3.75,5.75] B1 [5.75,7.75]
//	link s1->s0: B0 [5.75,6.5] B1 [7.75,8.5]   (B0 of s0 waits until 6.5)
//
// so s0's B0 starts at 6.5 and the step ends at 6.5+2+2 = 10.5.
func TestSimulatorHandWorked(t *testing.T) {
	g, prof, c, part := equalStages(t, 2, 1, 2)
	for k := range prof.Layers {
		prof.Layers[k].OutputBytes = 1000
	}
	hdr := float64(frameHeader(g, 0))
	c.DefaultLink = LinkProfile{Bandwidth: (1000 + hdr) / 0.5, Latency: 0.25}
	r := mustSim(t, g, prof, c, part, []string{"n0", "n1"}, GPipe, 2)
	if math.Abs(r.StepTime-10.5) > 1e-9 {
		t.Fatalf("step %.6f, want 10.5", r.StepTime)
	}
	if len(r.Links) != 2 || math.Abs(r.Links[0].Busy-1) > 1e-9 {
		t.Fatalf("links %+v", r.Links)
	}
}

func frameHeader(g *nn.Graph, j int) int {
	l := newLayout(g, Analytic(g, AnalyticOptions{}))
	return int(l.tensorBytes(j, 1)) - int(4*nn.Size(g.Nodes[j].Shape))
}

// A link's wire costs price its transfers: with a codec of ratio r and s
// seconds per raw byte, one transfer of n bytes occupies the link for
// n·s + n·r/bandwidth and puts n·r bytes on it; activations and gradients
// are priced apart.
func TestSimulatorWireCost(t *testing.T) {
	g, prof, c, part := equalStages(t, 2, 0.001, 0.001)
	nodes := []string{c.Nodes[0].Name, c.Nodes[1].Name}
	p, err := Build(g, part, nodes, GPipe, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	const bw = 1e6
	link := func(act, grad *WireCost) *Report {
		t.Helper()
		c.Links = []LinkProfile{{From: nodes[0], To: nodes[1], Bandwidth: bw, Act: act, Grad: grad}}
		r, err := Simulate(p, g, prof, c, SimOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	raw := link(nil, nil)
	act := &WireCost{Ratio: 0.25, Seconds: 1e-8}
	coded := link(act, nil)
	n := raw.Links[0].Bytes // the frame of one sample's activation
	want := raw.StepTime - n/bw + n*act.Seconds + n*act.Ratio/bw
	if math.Abs(coded.StepTime-want) > 1e-12 {
		t.Fatalf("step %.9f with a codec on activations, want %.9f (raw %.9f)", coded.StepTime, want, raw.StepTime)
	}
	var fwd, back float64
	for _, l := range coded.Links {
		if l.From == 0 {
			fwd = l.Bytes
		} else {
			back = l.Bytes
		}
	}
	if fwd != n*act.Ratio || back != n {
		t.Fatalf("bytes on the link %v forward and %v back, want %v and %v", fwd, back, n*act.Ratio, n)
	}
	c.Links[0].Grad = &WireCost{Ratio: 3}
	if _, err := Simulate(p, g, prof, c, SimOptions{}); err == nil {
		t.Fatal("a wire cost of ratio 3 was accepted")
	}
}

// The feeder's links carry the inputs: the simulator charges a first stage
// away from the feeder the wait for its inputs.
func TestFeeder(t *testing.T) {
	g := chainModel(t, 6)
	prof := Analytic(g, AnalyticOptions{GFLOPS: 1})
	c := &Cluster{Nodes: []NodeProfile{{Name: "a", Speed: 1}, {Name: "b", Speed: 1}},
		Links: []LinkProfile{{From: "a", To: "b", Bandwidth: 1e5}}, DefaultLink: LinkProfile{Bandwidth: 1e12}}
	// The same two-stage plan, fed from its first stage's node and from
	// the other: 4 micro-batches of 16 samples of 8 floats over 1e5 B/s.
	part := &Partition{Stages: []PartStage{{Node: "a", Layers: []string{"l0", "l1", "l2"}}, {Node: "b", Layers: []string{"l3", "l4", "l5"}}}}
	p, err := Build(g, part, []string{"a", "b"}, GPipe, 4, 16)
	if err != nil {
		t.Fatal(err)
	}
	c.Feeder = "a"
	near, err := Simulate(p, g, prof, c, SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Feeder = "b"
	far, err := Simulate(p, g, prof, c, SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if in := 4 * 16 * 8 * 4 / 1e5; far.StepTime < near.StepTime+in/4 {
		t.Errorf("step %.4f s fed from b, %.4f s fed from a: the inputs (%.4f s on the link) cost too little", far.StepTime, near.StepTime, in)
	}
}

// Two equal replicas of the one stage of a 4-layer model, M=8: each runs
// 4 micro-batches (interleaved, or blocks with chained sums), then the
// sum goes from replica 0 to 1 and the total back (x = trainable bytes /
// bandwidth + latency each way), then both step. In the fast order
// replica 1 passes the total back while the prefix arrives: half the
// compute time plus x and a latency. The chained order also waits for the
// prefix before replica 1's first backward pass, so the backward passes
// of the two replicas run one after the other. 1F1B warms up with one
// forward pass (2 nodes to the end: its own).
func TestSimulatorReplicas(t *testing.T) {
	const f, b, u, L = 0.003, 0.007, 0.001, 4
	g := chainModel(t, L)
	prof := Analytic(g, AnalyticOptions{})
	var all []string
	for k := range prof.Layers {
		lp := &prof.Layers[k]
		lp.Forward, lp.Backward, lp.Update = Timing{PerSample: f}, Timing{PerSample: b}, u
		lp.ParamBytes, lp.TrainableBytes, lp.SlotBytes = 1000, 1000, 100
		all = append(all, g.Nodes[k].Name)
	}
	c := &Cluster{Nodes: []NodeProfile{{Name: "a", Speed: 1}, {Name: "b", Speed: 1}}, DefaultLink: LinkProfile{Bandwidth: 1e6, Latency: 0.01}}
	x := float64(L*1000)/1e6 + 0.01
	F, B, U := L*f, L*b, L*u // one micro-batch through the stage, one step
	single := &Partition{Stages: []PartStage{{Node: "a", Layers: all}}}
	repl := &Partition{Stages: []PartStage{{Node: "a", Replicas: []string{"b"}, Layers: all}}}
	one := mustSim(t, g, prof, c, single, []string{"a", "b"}, GPipe, 8)
	if want := 8*(F+B) + U; math.Abs(one.StepTime-want) > 1e-12 {
		t.Fatalf("one node: step %.6f, want %.6f", one.StepTime, want)
	}
	for _, tc := range []struct {
		sched   Schedule
		chained bool
		want    float64
	}{
		{GPipe, false, 4*(F+B) + x + 0.01 + U},
		{OneFOneB, false, 4*(F+B) + x + 0.01 + U},
		// Replica 1 runs its forwards (GPipe; 1F1B: two), waits for
		// replica 0's sum, then runs its backward passes (and 1F1B's other
		// two forwards).
		{GPipe, true, 4*(F+B) + x + 4*B + x + U},
		{OneFOneB, true, 4*(F+B) + x + 4*B + 2*F + x + U},
	} {
		p, err := buildPlan(g, repl, []string{"a", "b"}, tc.sched, 8, 1, tc.chained)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Simulate(p, g, prof, c, SimOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(r.StepTime-tc.want) > 1e-12 {
			t.Errorf("%s chained=%v: step %.6f, want %.6f", tc.sched, tc.chained, r.StepTime, tc.want)
		}
		// The sums are on the links, both ways, 4000 bytes each.
		if len(r.Links) != 2 || r.Links[0].Bytes != L*1000 || r.Links[1].Bytes != L*1000 {
			t.Errorf("links %+v, want one sum of %d bytes each way", r.Links, L*1000)
		}
		// Memory: all parameters, gradients and momentum, the received sum,
		// and the replica's own micro-batches in flight.
		inflight := 4 // GPipe; 1F1B: one, or two of a block
		if tc.sched == OneFOneB {
			inflight = 1
			if tc.chained {
				inflight = 2
			}
		}
		for _, st := range r.Stages {
			want := float64(L)*(1000+2*1000+1000) + float64(inflight)*(L*100+float64(4*8))
			if st.PeakInFlight != inflight || math.Abs(st.PeakMemory-want) > 1e-9 || st.Group != 0 {
				t.Errorf("%s: executor %d (replica %d) peaks at %d in flight, %.0f bytes; want %d, %.0f", tc.sched, st.ID, st.Replica, st.PeakInFlight, st.PeakMemory, inflight, want)
			}
		}
	}
}
