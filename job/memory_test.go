package job

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
	"github.com/ppnode/ppnode/tensorio"
)

// The memory estimate walks each model as nn/zoo builds it: the same
// parameters, trainable ones and layer outputs as the graphs built, for
// every model of the zoo.
func TestModelShapes(t *testing.T) {
	cases := []struct {
		model   string
		width   float64
		input   []int
		classes int
	}{
		{"mlp32", 0, []int{28, 28, 1}, 10},
		{"mlp32", 37, []int{8, 8, 1}, 4},
		{"vgg16", 0.125, []int{32, 32, 3}, 10},
		{"vgg16", 0.1, []int{5, 7, 2}, 3},
		{"resnet50", 0.25, []int{32, 32, 3}, 10},
		{"resnet50", 0.1, []int{9, 6, 1}, 5},
		{"uno", 0, []int{28, 28, 1}, 10},
		{"uno", 0.05, []int{100}, 2},
	}
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.model] = true
		name := fmt.Sprintf("%s width %v on %v", c.model, c.width, c.input)
		g, err := zoo.Build(c.model, zoo.Options{Width: c.width, Input: c.input, Classes: c.classes})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var params, trainable, outs int64
		for _, p := range g.Params() {
			params += int64(nn.Size(p.Value.Shape()))
			if p.Trainable() {
				trainable += int64(nn.Size(p.Value.Shape()))
			}
		}
		for _, n := range g.Nodes {
			outs += int64(nn.Size(n.Shape))
		}
		w, err := modelShapes(c.model, c.width, c.input, c.classes)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if w.params != params || w.trainable != trainable || w.outs != outs {
			t.Errorf("%s: estimated %d values (%d trainable), %d outputs per sample; built %d (%d), %d", name,
				w.params, w.trainable, w.outs, params, trainable, outs)
		}
		// Job.Evaluate sizes its chunks from the built graph, the estimate
		// from the shapes: the same bytes a sample.
		var built shapes
		built.graph(g)
		if w.evalBytes() != built.evalBytes() {
			t.Errorf("%s: evaluation %d bytes a sample estimated, %d built", name, w.evalBytes(), built.evalBytes())
		}
	}
	for _, m := range zoo.Names() {
		if !covered[m] {
			t.Errorf("model %s has no case here: its memory estimate is unchecked", m)
		}
	}
	if _, err := modelShapes("vgg16", 1, []int{784}, 10); err == nil {
		t.Error("vgg16 on a flat input: no error")
	}
}

// hugeMLP is mlp32 at the widest width the spec allows: 8 billion
// parameters, 30 GiB of them.
func hugeMLP() Spec {
	s := DefaultSpec()
	s.Width = 1 << 14
	return s
}

// allocated runs f and returns the bytes the heap allocated meanwhile
// (freed or not).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// A job too large for the members, or for the process that prepares it,
// is refused with both figures, before anything in proportion to its model
// is allocated: the heap allocates under 4 MB in all (it allocated about
// 64 GiB before).
func TestHugeJobIsRefused(t *testing.T) {
	const tolerance = 4 << 20
	c := mustCheck(t, hugeMLP())
	members := []NodeInfo{{Name: "a", Memory: 8 << 30}, {Name: "b", Memory: 8 << 30}}
	var errMembers, errLocal error
	var j *Job
	n := allocated(func() {
		errMembers = c.CheckMemory(members)
		j, errLocal = c.PrepareWithin(16 << 30)
	})
	t.Logf("refused after allocating %d bytes:\n%v\n%v", n, errMembers, errLocal)
	if n > tolerance {
		t.Errorf("allocated %d bytes to refuse the job; want at most %d", n, tolerance)
	}
	if !errors.Is(errMembers, ErrSpec) || !strings.Contains(errMembers.Error(), "job needs about 121.2 GiB (parameters 30.1 GiB") ||
		!strings.HasSuffix(errMembers.Error(), "the members have 16.0 GiB") {
		t.Errorf("members: %v; want the job's need and the members' 16.0 GiB", errMembers)
	}
	if j != nil || !errors.Is(errLocal, ErrSpec) || !strings.Contains(errLocal.Error(), "preparing the job needs about 121.1 GiB in this process") ||
		!strings.HasSuffix(errLocal.Error(), "this machine has 16.0 GiB available") {
		t.Errorf("local: %v; want the process's need and the 16.0 GiB available", errLocal)
	}
}

// Usual jobs pass: the default mlp32 and resnet50 at width 0.25 on
// CIFAR-sized inputs, on two members of 8 GiB, in a process of 8 GiB. (The
// latter's estimate, 5.6 GiB in the process, is above what `ppnode train
// --local` used: 4.9 GiB at most, resident.)
func TestUsualJobsFit(t *testing.T) {
	resnet := DefaultSpec()
	resnet.Model, resnet.Width, resnet.Data = "resnet50", 0.25, "synthetic:32x32x3:10"
	members := []NodeInfo{{Name: "a", Memory: 8 << 30}, {Name: "b", Memory: 8 << 30}}
	for _, s := range []Spec{DefaultSpec(), resnet} {
		f, err := mustCheck(t, s).Estimate()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s width %v: %+v; total %s, local %s", s.Model, s.Width, f, gib(f.Total()), gib(f.Local()))
		if err := mustCheck(t, s).CheckMemory(members); err != nil {
			t.Errorf("%s: %v", s.Model, err)
		}
		if err := checkLocal(f, 8<<30); err != nil {
			t.Errorf("%s: %v", s.Model, err)
		}
	}
}

// The members counted are those the job may use, and a member of unknown
// memory leaves the job unchecked.
func TestCheckMemoryMembers(t *testing.T) {
	s := hugeMLP()
	s.Optimizer = "sgd" // 90 GiB: parameters, gradients, momentum
	big := []NodeInfo{{Name: "a", Memory: 64 << 30}, {Name: "b", Memory: 64 << 30}, {Name: "c", Memory: 1 << 30}}
	if err := mustCheck(t, s).CheckMemory(big); err != nil {
		t.Errorf("128 GiB over three members: %v", err)
	}
	s.MaxNodes = 1
	if err := mustCheck(t, s).CheckMemory(big); err == nil || !strings.HasSuffix(err.Error(), "the members have 64.0 GiB") {
		t.Errorf("one member at most: %v; want the 64 GiB of the largest", err)
	}
	s.MaxNodes = 0
	unknown := slices.Concat(big[2:], []NodeInfo{{Name: "d"}})
	if err := mustCheck(t, s).CheckMemory(unknown); err != nil {
		t.Errorf("a member of unknown memory: %v", err)
	}
}

// An ONNX model on a data file is estimated from the file's initializers
// and the graph's layer shapes, the data from its file's headers: the
// estimate counts the model's parameters, and a batch too large for the
// members is refused with both figures.
func TestONNXModelEstimate(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "tokens.safetensors")
	const n, T = 100, 6
	ids := make([]int64, n*T)
	for i := range ids {
		ids[i] = int64(i % 5)
	}
	es := []tensorio.Entry{tensorio.I64Entry("x", ids, n, T), tensorio.I64Entry("y", ids, n, T)}
	if err := tensorio.SaveSafetensorsEntries(data, es, nil); err != nil {
		t.Fatal(err)
	}
	s := DefaultSpec()
	s.Model, s.Data, s.Batch, s.MicroBatches = "../onnx/testdata/gpt.onnx", data, 64, 4
	f, err := mustCheck(t, s).Estimate()
	if err != nil {
		t.Fatal(err)
	}
	j, err := mustCheck(t, s).Prepare()
	if err != nil {
		t.Fatal(err)
	}
	params := 0
	for _, p := range j.Graph.Params() {
		params += nn.Size(p.Value.Shape())
	}
	if f.Params != int64(4*params) || f.Activations <= 0 || f.Data <= 0 {
		t.Errorf("estimate %+v; the graph has %d parameter values", f, params)
	}
	s.Batch, s.MicroBatches = MaxBatch, 1
	big := mustCheck(t, s)
	g, _ := big.Estimate()
	members := []NodeInfo{{Name: "a", Memory: g.Total() / 3}, {Name: "b", Memory: g.Total() / 3}}
	if err := big.CheckMemory(members); err == nil || !strings.Contains(err.Error(), "job needs about") || !strings.Contains(err.Error(), "the members have") {
		t.Errorf("batch %d on members of a third of its need each: %v", s.Batch, err)
	}
}

// With recomputation allowed the estimate counts one micro-batch's
// activations, the least a plan can keep, and nothing else changes.
func TestEstimateWithRecomputation(t *testing.T) {
	s := DefaultSpec()
	s.MicroBatches = 4
	keep, err := mustCheck(t, s).Estimate()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"auto", "all"} {
		s.Recompute = mode
		rec, err := mustCheck(t, s).Estimate()
		if err != nil {
			t.Fatal(err)
		}
		if rec.MicroBatches != 1 || rec.Activations*int64(keep.MicroBatches) != keep.Activations || rec.Params != keep.Params || rec.LocalActivations != keep.LocalActivations {
			t.Errorf("%s: %+v, keeping activations %+v", mode, rec, keep)
		}
	}
}

// A coordinator trains nothing itself: a job whose micro-batch of the
// whole model would not fit this process can still be coordinated from
// it, within the coordinator's own share (the data, the model, an
// evaluation chunk and a profile's window).
func TestCoordinatorShare(t *testing.T) {
	s := DefaultSpec()
	s.Model, s.Width, s.Data, s.SyntheticSamples = "resnet50", 0.25, "synthetic:32x32x3:10", 2048
	s.Batch, s.MicroBatches = 256, 4
	f, err := mustCheck(t, s).Estimate()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkLocal(f, 1<<30); !errors.Is(err, ErrSpec) {
		t.Errorf("training it in 1 GiB: %v, want refused", err)
	}
	if err := checkDriver(f, 1<<30); err != nil {
		t.Errorf("coordinating it in 1 GiB: %v", err)
	}
	if err := checkDriver(f, f.Driver()); !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "coordinating the job needs about") {
		t.Errorf("coordinating it in its driver's share alone: %v, want refused", err)
	}
}
