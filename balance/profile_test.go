package balance

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// Profile measures every layer, leaves the model's weights as they were,
// and its JSON reads back to a profile of the same model.
func TestProfileMeasures(t *testing.T) {
	g := build(t, "resnet50", zoo.Options{Width: 1.0 / 16, Input: []int{8, 8, 3}})
	g.Init(1)
	before := nn.WeightsSHA256(g.Params())
	be, err := nn.NewBackend("", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ProfileWith(g, be, ProfileOptions{Sizes: []int{2, 4}, MinReps: 1, MaxReps: 2, MinTime: 1})
	if err != nil {
		t.Fatal(err)
	}
	if after := nn.WeightsSHA256(g.Params()); after != before {
		t.Fatalf("profiling changed the weights")
	}
	if err := p.Check(g); err != nil {
		t.Fatal(err)
	}
	for i, l := range p.Layers {
		n := g.Nodes[i]
		if l.Forward.At(4) <= 0 && n.Layer.Kind() != "flatten" {
			t.Errorf("%s: forward time %v", l.Name, l.Forward)
		}
		if (l.Backward.At(4) > 0) != n.RequiresGrad && n.Layer.Kind() == "conv2d" {
			t.Errorf("%s: backward %v with RequiresGrad %v", l.Name, l.Backward, n.RequiresGrad)
		}
		if l.SlotBytes < float64(l.OutputBytes) || l.OutputBytes != int64(4*nn.Size(n.Shape)) {
			t.Errorf("%s: slot %v output %v", l.Name, l.SlotBytes, l.OutputBytes)
		}
	}
	b, _ := json.Marshal(p)
	var q ModelProfile
	if err := json.Unmarshal(b, &q); err != nil || q.Check(g) != nil {
		t.Fatalf("profile JSON: %v", err)
	}
	other := build(t, "resnet50", zoo.Options{Width: 1.0 / 8, Input: []int{8, 8, 3}})
	if err := p.Check(other); !errors.Is(err, ErrProfile) {
		t.Fatalf("a profile of another model passes Check: %v", err)
	}
}

// The analytic profile counts a Linear layer's GEMMs exactly: 2·in·out
// FLOPs forward, twice that backward when its input needs a gradient.
func TestAnalyticCounts(t *testing.T) {
	g := build(t, "mlp32", zoo.Options{Width: 10, Input: []int{3, 1, 1}})
	p := Analytic(g, AnalyticOptions{GFLOPS: 1, ElemPerSec: math.Inf(1)})
	fc1, fc2 := p.Layers[0], p.Layers[2]
	if fc1.Forward.PerSample != 2*3*10/1e9 || fc1.Backward.PerSample != 2*3*10/1e9 {
		t.Fatalf("fc1 %+v (input is data: no input gradient)", fc1)
	}
	if fc2.Forward.PerSample != 2*10*10/1e9 || fc2.Backward.PerSample != 4*10*10/1e9 {
		t.Fatalf("fc2 %+v", fc2)
	}
	if fc2.ParamBytes != 4*(100+10) || fc2.TrainableBytes != fc2.ParamBytes {
		t.Fatalf("fc2 bytes %+v", fc2)
	}
}

func TestParseCluster(t *testing.T) {
	ns, err := ParseNodes("a=1.0, b=0.5:4GiB,c=0.25")
	if err != nil || len(ns) != 3 || ns[1].Memory != 4<<30 || ns[2].Speed != 0.25 {
		t.Fatalf("%+v %v", ns, err)
	}
	for _, bad := range []string{"a", "a=0", "a=x", "a=1:lots", ""} {
		if _, err := ParseNodes(bad); !errors.Is(err, ErrCluster) {
			t.Errorf("ParseNodes(%q) = %v", bad, err)
		}
	}
	for s, want := range map[string]float64{"1Gbit": 125e6, "100Mbit": 12.5e6, "10Gbps": 1.25e9, "125MB/s": 125e6, "1GiB/s": 1 << 30} {
		if got, err := ParseBandwidth(s); err != nil || got != want {
			t.Errorf("ParseBandwidth(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, bad := range []string{"fast", "0Gbit", "1GB", "-1Mbit"} {
		if _, err := ParseBandwidth(bad); err == nil {
			t.Errorf("ParseBandwidth(%q) accepted", bad)
		}
	}
	c := &Cluster{Nodes: []NodeProfile{{Name: "a", Speed: 1}, {Name: "a", Speed: 1}}}
	if _, err := c.resolve(nil); !errors.Is(err, ErrCluster) {
		t.Fatalf("duplicate node accepted: %v", err)
	}
	c = &Cluster{Nodes: []NodeProfile{{Name: "a", GFLOPS: 20}}}
	net, err := c.resolve(&ModelProfile{GFLOPS: 10})
	if err != nil || net.nodes[0].Speed != 2 {
		t.Fatalf("speed from GFLOPS: %v %v", net, err)
	}
}

// A pass is timed less what a CPU quota held the process back during it,
// shared among the threads, but at least the quota's share of its wall
// time (the quota's count may hold another thread's stops too).
func TestPassTimerTakesOffHolds(t *testing.T) {
	var clock time.Time
	var held time.Duration
	pt := newPassTimer(Quota{CPUs: 0.5, Held: func() time.Duration { return held }}, 2)
	pt.now = func() time.Time { return clock }
	for _, tc := range []struct {
		wall, held time.Duration
		want       float64
	}{
		{10 * time.Millisecond, 0, 0.010},
		{10 * time.Millisecond, 12 * time.Millisecond, 0.004},
		{10 * time.Millisecond, 30 * time.Millisecond, 0.0025},
	} {
		pt.start()
		clock, held = clock.Add(tc.wall), held+tc.held
		if got := pt.seconds(); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("pass of %v held %v: %v s, want %v", tc.wall, tc.held, got, tc.want)
		}
	}
	if got := newPassTimer(Quota{}, 1); got.held != nil || got.threads != 1 {
		t.Errorf("without a quota: %+v", got)
	}
}

// A model with a layer the profile could not hold in the memory available
// is refused, with the figures, before anything is measured; one that
// fits, or a process whose memory is unknown, is profiled.
func TestProfileFits(t *testing.T) {
	g, err := zoo.Build("mlp32", zoo.Options{Width: 64, Input: []int{28, 28, 1}, Classes: 10})
	if err != nil {
		t.Fatal(err)
	}
	g.Init(1)
	be, err := nn.NewBackend("", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	o := ProfileOptions{Sizes: []int{256}, MinReps: 1, MaxReps: 1, MinTime: time.Microsecond}
	small := o
	small.Available = 1 << 14
	if _, err := ProfileWith(g, be, small); !errors.Is(err, ErrProfile) || !strings.Contains(err.Error(), "GiB available") {
		t.Errorf("16 KiB: %v, want ErrProfile with the figures", err)
	}
	for _, avail := range []int64{0, 1 << 30} {
		o.Available = avail
		if _, err := ProfileWith(g, be, o); err != nil {
			t.Errorf("%d bytes: %v", avail, err)
		}
	}
}
