package balance

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// passes reads "F0.0 B1.0 ..." (F or B, chunk, micro-batch).
func passes(t *testing.T, s string) []Pass {
	t.Helper()
	var out []Pass
	for _, f := range strings.Fields(s) {
		var c, m int
		if _, err := fmt.Sscanf(f[1:], "%d.%d", &c, &m); err != nil {
			t.Fatalf("%q: %v", f, err)
		}
		out = append(out, Pass{Chunk: c, Micro: m, Backward: f[0] == 'B'})
	}
	return out
}

// Megatron-LM's interleaved order worked by hand for P = 2 nodes, v = 2
// chunks, M = 4 and 6 micro-batches: node 0 warms up with (P-1)·2 +
// (v-1)·P = 4 forward passes, node 1 with 2; chunks alternate in groups
// of P micro-batches, backward passes from the last chunk down.
func TestInterleavedOrderMegatron(t *testing.T) {
	for _, c := range []struct {
		P, v, i, M int
		want       string
	}{
		{2, 2, 0, 4, "F0.0 F0.1 F1.0 F1.1 F0.2 B1.0 F0.3 B1.1 F1.2 B0.0 F1.3 B0.1 B1.2 B1.3 B0.2 B0.3"},
		{2, 2, 1, 4, "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 B0.2 B0.3"},
		{2, 2, 1, 6, "F0.0 F0.1 F1.0 B1.0 F1.1 B1.1 F0.2 B0.0 F0.3 B0.1 F1.2 B1.2 F1.3 B1.3 F0.4 B0.2 F0.5 B0.3 F1.4 B1.4 F1.5 B1.5 B0.4 B0.5"},
		// Node 0 of 3 with 3 chunks and M = 3: warm-up 4 + 6 = 10 > M·v = 9, all forward first.
		{3, 3, 0, 3, "F0.0 F0.1 F0.2 F1.0 F1.1 F1.2 F2.0 F2.1 F2.2 B2.0 B2.1 B2.2 B1.0 B1.1 B1.2 B0.0 B0.1 B0.2"},
	} {
		got, err := InterleavedOrder(c.P, c.v, c.i, c.M)
		if err != nil {
			t.Fatal(err)
		}
		if want := passes(t, c.want); !slices.Equal(got, want) {
			t.Errorf("P=%d v=%d node %d M=%d:\n got %v\nwant %v", c.P, c.v, c.i, c.M, got, want)
		}
	}
}

// For small P, v and M, every node runs each chunk's forward and backward
// pass of every micro-batch once, a backward pass after its forward pass,
// each chunk's backward passes in ascending order, and warms up with
// Megatron's count; M not a multiple of P is refused.
func TestInterleavedOrderProperties(t *testing.T) {
	for P := 2; P <= 4; P++ {
		for v := 2; v <= 4; v++ {
			for M := P; M <= 3*P; M += P {
				for i := 0; i < P; i++ {
					order, err := InterleavedOrder(P, v, i, M)
					if err != nil {
						t.Fatal(err)
					}
					if len(order) != 2*M*v {
						t.Fatalf("P=%d v=%d M=%d node %d: %d passes", P, v, M, i, len(order))
					}
					fwd := map[[2]int]bool{}
					lastB := make([]int, v)
					for c := range lastB {
						lastB[c] = -1
					}
					warm := slices.IndexFunc(order, func(p Pass) bool { return p.Backward })
					// The warm-up, then the steady state's first forward pass.
					if w := min((P-i-1)*2+(v-1)*P, M*v); warm != min(w+1, M*v) {
						t.Errorf("P=%d v=%d M=%d node %d: %d forward passes before the first backward, want a warm-up of %d", P, v, M, i, warm, w)
					}
					for _, p := range order {
						k := [2]int{p.Chunk, p.Micro}
						if !p.Backward {
							if fwd[k] {
								t.Fatalf("P=%d v=%d M=%d node %d: %v twice", P, v, M, i, p)
							}
							fwd[k] = true
							continue
						}
						if !fwd[k] || p.Micro != lastB[p.Chunk]+1 {
							t.Fatalf("P=%d v=%d M=%d node %d: %v out of order", P, v, M, i, p)
						}
						lastB[p.Chunk] = p.Micro
					}
				}
			}
		}
		if _, err := InterleavedOrder(P, 2, 0, P+1); err == nil || !strings.Contains(err.Error(), "multiple") {
			t.Errorf("P=%d M=%d: %v, want a refusal naming the multiple", P, P+1, err)
		}
	}
}

// chunked returns a chain of P·v single-layer stages, stage s on node n(s
// mod P), each layer f and b seconds per sample, and a cluster of P equal
// nodes with free links.
func chunked(t *testing.T, P, v int, f, b float64) (*nn.Graph, *ModelProfile, *Cluster, *Partition, []string) {
	t.Helper()
	g, prof, _, _ := equalStages(t, P*v, f, b)
	c := &Cluster{DefaultLink: LinkProfile{Bandwidth: math.MaxFloat64, Latency: 0}}
	var nodes []string
	for i := 0; i < P; i++ {
		nodes = append(nodes, fmt.Sprintf("n%d", i))
		c.Nodes = append(c.Nodes, NodeProfile{Name: nodes[i], Speed: 1})
	}
	part := &Partition{Chunks: v}
	for s := 0; s < P*v; s++ {
		part.Stages = append(part.Stages, PartStage{Node: nodes[s%P], Layers: []string{g.Nodes[s].Name}})
	}
	return g, prof, c, part, nodes
}

// The simulator against Megatron's closed form: P nodes of v equal chunks
// (forward f, backward b each), M a multiple of P: the bubble is (P-1)/(v·M)
// of the ideal step M·v·(f+b), where 1F1B on the same P nodes, one stage
// each, has (P-1)/M. Two chunks of a node never run at once.
func TestSimulatorInterleavedBubble(t *testing.T) {
	for _, c := range []struct{ f, b float64 }{{1, 2}, {0.003, 0.007}, {1, 1}} {
		for P := 2; P <= 4; P++ {
			for v := 2; v <= 4; v++ {
				g, prof, cl, part, nodes := chunked(t, P, v, c.f, c.b)
				for M := P; M <= 3*P; M += P {
					p, err := Build(g, part, nodes, Interleaved, M, 1)
					if err != nil {
						t.Fatal(err)
					}
					if err := p.Validate(g); err != nil {
						t.Fatal(err)
					}
					r, err := Simulate(p, g, prof, cl, SimOptions{})
					if err != nil {
						t.Fatal(err)
					}
					ideal := float64(M*v) * (c.f + c.b)
					if got, want := (r.StepTime-ideal)/ideal, float64(P-1)/float64(v*M); math.Abs(got-want) > 1e-9 {
						t.Errorf("f=%v b=%v P=%d v=%d M=%d: bubble %.6f of the ideal step, want (P-1)/(vM) = %.6f", c.f, c.b, P, v, M, got, want)
					}
					if want := float64(P-1) / float64(v*M+P-1); math.Abs(r.BubbleFraction-want) > 1e-9 {
						t.Errorf("P=%d v=%d M=%d: bubble fraction %.6f, want %.6f", P, v, M, r.BubbleFraction, want)
					}
					// One executor per node: its compute intervals never overlap.
					byNode := map[string][][2]float64{}
					for _, e := range r.Events {
						if !e.Link() && e.End > e.Start {
							n := p.Stages[e.Stage].Node
							byNode[n] = append(byNode[n], [2]float64{e.Start, e.End})
						}
					}
					for n, iv := range byNode {
						slices.SortFunc(iv, func(a, b [2]float64) int { return int(math.Copysign(1, a[0]-b[0])) })
						for k := 1; k < len(iv); k++ {
							if iv[k][0] < iv[k-1][1]-1e-12 {
								t.Fatalf("P=%d v=%d M=%d: node %s runs two passes at once: %v and %v", P, v, M, n, iv[k-1], iv[k])
							}
						}
					}
				}
			}
		}
	}
}

// Validate accepts the plan Build writes and refuses: a chunk's passes in
// another order than its node's interleaved order, a chunk on another
// node, chunks without the interleaved schedule and the reverse, M not a
// multiple of the nodes, one chunk, and replicas.
func TestInterleavedValidateRefuses(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	nodes := []string{"a", "b"}
	part, err := ParseSpec(g, "fc1-fc8@a; fc9-fc16@b; fc17-fc24@a; fc25-fc32@b", nodes)
	if err != nil {
		t.Fatal(err)
	}
	if part.Chunks != 2 {
		t.Fatalf("a description that names 2 nodes for 4 stages in a cycle: %d chunks, want 2", part.Chunks)
	}
	if got := FormatSpec(g, part); got != "fc1-fc8@a; fc9-fc16@b; fc17-fc24@a; fc25-fc32@b" {
		t.Errorf("FormatSpec: %q", got)
	}
	ok, err := Build(g, part, nodes, Interleaved, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := ok.Validate(g); err != nil {
		t.Fatal(err)
	}
	order, err := ok.NodeOrder("a")
	if err != nil || len(order) != len(ok.Stages[0].Program)+len(ok.Stages[2].Program) {
		t.Fatalf("node a's order: %d slots, %v", len(order), err)
	}
	clonePlan := func() *Plan {
		q := *ok
		q.Stages = slices.Clone(ok.Stages)
		for k := range q.Stages {
			q.Stages[k].Program = slices.Clone(q.Stages[k].Program)
		}
		return &q
	}
	swap := clonePlan()
	// Stage 2 (node a's second chunk): swap its first two forward passes'
	// receives and forwards, keeping each micro-batch's instructions together.
	prog := swap.Stages[2].Program
	f0, f1 := findInstr(t, swap, 2, OpForward, 0), findInstr(t, swap, 2, OpForward, 1)
	prog[f0].Micro, prog[f1].Micro = 1, 0
	prog[f0-1].Micro, prog[f1-1].Micro = 1, 0
	prog[f0+1].Micro, prog[f1+1].Micro = 1, 0
	moved := clonePlan()
	moved.Stages[2].Node = "b"
	noChunks := clonePlan()
	noChunks.Chunks = 0
	oneF := clonePlan()
	oneF.Schedule = OneFOneB
	for name, c := range map[string]struct {
		p    *Plan
		want string
	}{
		"order":            {swap, "interleaved"},
		"chunk elsewhere":  {moved, "chunk"},
		"no chunks":        {noChunks, "chunks"},
		"1f1b with chunks": {oneF, "chunks"},
	} {
		if err := c.p.Validate(g); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate = %v, want an error mentioning %q", name, err, c.want)
		}
	}
	if _, err := Build(g, part, nodes, Interleaved, 3, 2); err == nil || !strings.Contains(err.Error(), "multiple of the 2 nodes") {
		t.Errorf("M=3 on 2 nodes: %v", err)
	}
	one := &Partition{Chunks: 1, Stages: part.Stages[:2]}
	if err := one.Validate(g, nodes); err == nil || !strings.Contains(err.Error(), "2 at least") {
		t.Errorf("one chunk: %v", err)
	}
	rep := &Partition{Chunks: 2, Stages: slices.Clone(part.Stages)}
	rep.Stages[0].Replicas = []string{"c"}
	if err := rep.Validate(g, []string{"a", "b", "c"}); err == nil || !strings.Contains(err.Error(), "replicas") {
		t.Errorf("replicas: %v", err)
	}
}

// Search plans interleaved with the chunks given or chooses v by
// simulation, and refuses what it cannot plan with the reason.
func TestSearchInterleaved(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}})
	prof := Analytic(g, AnalyticOptions{})
	cl := equalNodes(4)
	cl.DefaultLink = LinkProfile{Bandwidth: math.MaxFloat64}
	for _, v := range []int{0, 2, 3} {
		res, err := Search(g, prof, cl, Options{Schedule: "interleaved", Chunks: v, Batch: 32, MicroBatches: 8})
		if err != nil {
			t.Fatal(err)
		}
		p := res.Plan
		if p.Schedule != Interleaved || p.Chunks < 2 || v != 0 && p.Chunks != v || len(p.Stages) != 4*p.Chunks {
			t.Fatalf("chunks %d: %s with %d chunks, %d stages", v, p.Schedule, p.Chunks, len(p.Stages))
		}
		for s, st := range p.Stages {
			if st.Node != p.Stages[s%4].Node {
				t.Errorf("stage %d on %s, stage %d on %s", s, st.Node, s%4, p.Stages[s%4].Node)
			}
		}
		if err := p.Validate(g); err != nil {
			t.Fatal(err)
		}
		one, err := Search(g, prof, cl, Options{Schedule: "1f1b", Partitioner: Uniform, Batch: 32, MicroBatches: 8})
		if err != nil {
			t.Fatal(err)
		}
		if res.Report.BubbleFraction >= one.Report.BubbleFraction {
			t.Errorf("chunks %d: bubble %.3f, 1f1b's %.3f", v, res.Report.BubbleFraction, one.Report.BubbleFraction)
		}
	}
	for name, c := range map[string]struct {
		o    Options
		c    *Cluster
		want string
	}{
		"M not a multiple": {Options{Schedule: "interleaved", Batch: 30, MicroBatches: 6}, cl, "multiple of the nodes: 6 micro-batches on 4 nodes"},
		"one chunk":        {Options{Schedule: "interleaved", Chunks: 1, Batch: 32, MicroBatches: 8}, cl, "2 at least"},
		"too few layers":   {Options{Schedule: "interleaved", Chunks: 4, Batch: 24, MicroBatches: 12}, equalNodes(12), "too few"},
		"chunks elsewhere": {Options{Schedule: "1f1b", Chunks: 2, Batch: 32, MicroBatches: 8}, cl, "--schedule interleaved"},
		"one node":         {Options{Schedule: "interleaved", Batch: 32, MicroBatches: 8}, equalNodes(1), "2 nodes"},
	} {
		if _, err := Search(g, prof, c.c, c.o); err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrPlan) {
			t.Errorf("%s: %v, want an ErrPlan mentioning %q", name, err, c.want)
		}
	}
}

// An interleaved plan run as its programs say trains, bit for bit, what
// one process trains.
func TestInterleavedTrainsBitIdentical(t *testing.T) {
	model := func() *nn.Graph { return build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}}) }
	data := newFixedData([]int{4, 4, 1}, 8, 4, 10)
	want := trainOneProcess(model(), data, 2)
	for _, spec := range []string{
		"fc1-fc8@a; fc9-fc16@b; fc17-fc24@a; fc25-fc32@b",
		"fc1-fc4@a; fc5-fc8@b; fc9-fc12@a; fc13-fc16@b; fc17-fc20@a; fc21-fc24@b; fc25-fc28@a; fc29-fc32@b",
	} {
		g := model()
		g.Init(1)
		part, err := ParseSpec(g, spec, []string{"a", "b"})
		if err != nil {
			t.Fatal(err)
		}
		p, err := Build(g, part, []string{"a", "b"}, Interleaved, data.M, data.n)
		if err != nil {
			t.Fatal(err)
		}
		if got := runPlan(t, g, nil, p, data, 2); got != want {
			t.Fatalf("%s: weights %s, single process %s", spec, got[:16], want[:16])
		}
	}
}
