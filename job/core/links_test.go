package core

import (
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
)

// linkCore is a core planned over a and b with both links probed at 100
// Mbit/s, its plan over both.
func linkCore(t *testing.T) *Core {
	t.Helper()
	spec := job.DefaultSpec()
	spec.ID, spec.Data, spec.Threads, spec.Epochs = "links", "synthetic:8x8x1:4", 1, 100
	spec.Width, spec.Batch, spec.MicroBatches, spec.SyntheticSamples, spec.Steps = 128, 48, 4, 2880, 60
	spec.Partition = "fc1-fc16@a; fc17-fc32@b"
	j, err := prepare(spec)
	if err != nil {
		t.Fatal(err)
	}
	prof := balance.Analytic(j.Graph, balance.AnalyticOptions{GFLOPS: refGFLOPS})
	nodes := []job.NodeInfo{{Name: "a", ActorAddr: "a:1", ProbeAddr: "a:2"}, {Name: "b", ActorAddr: "b:1", ProbeAddr: "b:2"}}
	c, err := New(Config{Job: j, Profile: prof, Nodes: nodes, Self: "a", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	c.links.probed(now, []LinkMeasure{{From: "a", To: "b", BytesPerSec: 12.5e6}, {From: "b", To: "a", BytesPerSec: 12.5e6}}, c.log)
	return c
}

// The traffic's bound (bytes over the senders' write time) probes a link
// again when it stays below boundSlower of the planned rate two bounds of
// 512 KiB in a row while the steps are boundSteps slower than the plan's
// first and the senders waited at least boundWait of a step; traffic near
// or above the rate does not (a sender that does not wait says nothing of
// the link's rate), nor a low bound while the steps keep their pace (the
// senders waited for their receivers), nor waits too short to matter.
func TestPassiveBound(t *testing.T) {
	for _, tc := range []struct {
		name    string
		write   time.Duration // per MiB
		slowed  float64       // the last steps over the first
		step    float64       // the first steps' time, seconds
		reprobe bool
	}{
		{"near the rate", 90 * time.Millisecond, 1.5, 0.1, false},
		{"half the rate", 160 * time.Millisecond, 1.5, 0.1, false},
		{"10x slower", 800 * time.Millisecond, 1.5, 0.1, true},
		{"10x slower, steps at their pace", 800 * time.Millisecond, 1.05, 0.1, false},
		{"10x slower, a small share of the steps", 800 * time.Millisecond, 1.5, 2, false},
		{"no wait", 27 * time.Millisecond, 1.5, 0.1, false},
	} {
		c := linkCore(t)
		now := time.Unix(10, 0)
		for i := range 2 + 2*rebalanceEvery {
			step := tc.step
			if i >= 2+rebalanceEvery {
				step *= tc.slowed
			}
			c.steps.times = append(c.steps.times, step)
		}
		for range 4 { // 4 steps of 256 KiB: two bounds
			c.observeLinks(now, []StageTiming{{Links: []LinkSent{{Peer: 1, Kind: kindActivation, Codec: "raw", Frames: 4,
				RawBytes: 256 << 10, WireBytes: 256 << 10, Write: tc.write / 4}}}}, nil)
		}
		l := c.links.m[[2]string{"a", "b"}]
		if l.reprobe != tc.reprobe {
			t.Errorf("%s: reprobe %v, want %v (bound %.1f Mbit/s)", tc.name, l.reprobe, tc.reprobe, l.bound*8/1e6)
		}
		if got := c.links.unmeasured(now, c.nodes.candidates()); (len(got) == 1) != tc.reprobe {
			t.Errorf("%s: links to probe %v", tc.name, got)
		}
		if ks := l.kinds[kindActivation]; ks.raw != 1<<20 || ks.frames != 16 {
			t.Errorf("%s: totals %+v", tc.name, ks)
		}
	}
}

// Probing while training stays within its budget: past probeAllowance
// plus probeShare of the training time, links already measured wait;
// links never measured do not.
func TestProbeBudget(t *testing.T) {
	c := linkCore(t)
	now := time.Unix(10, 0)
	c.links.m[[2]string{"a", "b"}].reprobe = true
	c.steps.run = 10 * time.Second
	if got := c.probeDue(now); len(got) != 1 {
		t.Fatalf("within the budget: %v to probe, want a->b", got)
	}
	c.links.probeSpent = probeAllowance + 60*time.Millisecond // over 1 s + 0.5% of 10 s
	if got := c.probeDue(now); len(got) != 0 {
		t.Fatalf("over the budget: %v to probe, want none", got)
	}
	c.nodes.members["n"] = job.NodeInfo{Name: "n", ActorAddr: "n:1", ProbeAddr: "n:2"}
	if got := c.probeDue(now); len(got) != 4 {
		t.Fatalf("a node joined: %v to probe, want its 4 links", got)
	}
}

// Links measured refreshEvery ago are probed again while the probes took
// less than probeShare of the training time.
func TestProbeRefresh(t *testing.T) {
	c := linkCore(t)
	later := time.Unix(0, 0).Add(refreshEvery)
	c.steps.run = 10 * time.Minute
	if got := c.probeDue(later.Add(-time.Second)); len(got) != 0 {
		t.Fatalf("before refreshEvery: %v to probe", got)
	}
	if got := c.probeDue(later); len(got) != 2 {
		t.Fatalf("after refreshEvery: %v to probe, want a->b and b->a", got)
	}
	c.links.probeSpent = 4 * time.Second // over 0.5% of 10 min
	if got := c.probeDue(later); len(got) != 0 {
		t.Fatalf("over the budget: %v to probe", got)
	}
}

// What the driver holds on its own node is kept off the plan: with all of
// a's memory taken by the driver, every stage goes to b.
func TestDriverMemoryIsKeptOffThePlan(t *testing.T) {
	spec := job.DefaultSpec()
	spec.ID, spec.Data, spec.Threads, spec.Epochs = "self", "synthetic:8x8x1:4", 1, 1
	spec.Width, spec.Batch, spec.MicroBatches, spec.SyntheticSamples = 128, 48, 4, 480
	j, err := prepare(spec)
	if err != nil {
		t.Fatal(err)
	}
	prof := balance.Analytic(j.Graph, balance.AnalyticOptions{GFLOPS: refGFLOPS})
	nodes := []job.NodeInfo{{Name: "a", Memory: 1 << 30}, {Name: "b", Memory: 1 << 30}}
	for _, tc := range []struct {
		self  int64
		nodes []string
	}{{0, []string{"a", "b"}}, {1 << 30, []string{"b"}}} {
		c, err := New(Config{Job: j, Profile: prof, Nodes: nodes, Self: "a", SelfMemory: tc.self, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		used := map[string]bool{}
		for _, st := range c.plan.Stages {
			used[st.Node] = true
		}
		for _, n := range []string{"a", "b"} {
			if want := slices.Contains(tc.nodes, n); used[n] != want {
				t.Errorf("driver holding %d bytes on a: plan %s uses %s: %v, want %v", tc.self, c.plan.text, n, used[n], want)
			}
		}
	}
}

// Links measured before the core was made price its first plan, and its
// start does not probe them again; without them it probes every pair
// ProbePairs lists.
func TestPlanWithLinksMeasuredBefore(t *testing.T) {
	spec := job.DefaultSpec()
	spec.ID, spec.Data, spec.Threads, spec.Epochs = "links", "synthetic:8x8x1:4", 1, 100
	spec.Width, spec.Batch, spec.MicroBatches, spec.SyntheticSamples, spec.Steps = 128, 48, 4, 2880, 60
	j, err := prepare(spec)
	if err != nil {
		t.Fatal(err)
	}
	prof := balance.Analytic(j.Graph, balance.AnalyticOptions{GFLOPS: refGFLOPS})
	nodes := []job.NodeInfo{{Name: "a", ActorAddr: "a:1", ProbeAddr: "a:2", GFLOPS: refGFLOPS}, {Name: "b", ActorAddr: "b:1", ProbeAddr: "b:2", GFLOPS: refGFLOPS}}
	pairs := ProbePairs(spec, nodes)
	if want := [][2]string{{"a", "b"}, {"b", "a"}}; !slices.Equal(pairs, want) {
		t.Fatalf("ProbePairs: %v, want %v", pairs, want)
	}
	start := func(links []LinkMeasure) (*Core, []Action) {
		c, err := New(Config{Job: j, Profile: prof, Nodes: nodes, Self: "a", Links: links, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		c.Start(time.Unix(0, 0))
		return c, c.Ready()
	}
	slow := []LinkMeasure{{From: "a", To: "b", BytesPerSec: 1e5, RTT: time.Millisecond}, {From: "b", To: "a", BytesPerSec: 1e5, RTT: time.Millisecond}}
	c, acts := start(slow)
	for _, a := range acts {
		if p, ok := a.(Probe); ok {
			t.Errorf("probes %v after the links were measured", p.Links)
		}
	}
	if d := c.Describe(); strings.Contains(d, "@b") {
		t.Errorf("plan %q uses b over a 0.8 Mbit/s link", d)
	}
	c, acts = start(nil)
	if d := c.Describe(); !strings.Contains(d, "@b") {
		t.Errorf("plan %q at the default links leaves b out", d)
	}
	var probed [][2]string
	for _, a := range acts {
		if p, ok := a.(Probe); ok {
			probed = append(probed, p.Links...)
		}
	}
	if !slices.Equal(probed, pairs) {
		t.Errorf("without measurements the start probes %v, want %v", probed, pairs)
	}
}
