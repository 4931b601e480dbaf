package job

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// mustCheck is Check for a spec the test knows is good.
func mustCheck(t testing.TB, s Spec) Checked {
	t.Helper()
	c, err := Check(s)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// prepare is Check, then Prepare.
func prepare(s Spec) (*Job, error) {
	c, err := Check(s)
	if err != nil {
		return nil, err
	}
	return c.Prepare()
}

func TestSpecBackendNames(t *testing.T) {
	for _, tc := range []struct {
		backend string
		det     bool
		ok      bool
	}{
		{"", true, true},
		{"ppnode-det", true, true},
		{"gonum", true, true}, // the deterministic backend's former name
		{"ppnode-det", false, true},
		{"nosuch", false, false},
		{"nosuch", true, false},
	} {
		s := DefaultSpec()
		s.Backend, s.Deterministic = tc.backend, tc.det
		_, err := Check(s)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrSpec) {
			t.Errorf("backend %q deterministic %v: %v, want ok=%v", tc.backend, tc.det, err, tc.ok)
		}
	}
}

// The wire formats `train --help` names are accepted; "lossless" is the
// default's name: links choose their codecs and nothing is lossy.
func TestWireFormats(t *testing.T) {
	for _, tc := range []struct {
		wire     string
		ok, auto bool
		codec    string
	}{
		{"", true, true, "raw"},
		{"lossless", true, true, "raw"},
		{"raw", true, false, "raw"},
		{"bf16", true, true, "bf16"},
		{"int8", true, true, "int8"},
		{"zstd", false, false, ""},
	} {
		s := DefaultSpec()
		s.Wire = tc.wire
		c, err := Check(s)
		if (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrSpec) {
			t.Errorf("wire %q: %v, want ok=%v", tc.wire, err, tc.ok)
			continue
		}
		if err == nil && (c.Spec().AutoCodecs() != tc.auto || c.Spec().WireCodec().String() != tc.codec) {
			t.Errorf("wire %q: links choose %v, codec %v; want %v, %s", tc.wire, c.Spec().AutoCodecs(), c.Spec().WireCodec(), tc.auto, tc.codec)
		}
	}
}

// Leaving one-dimensional tensors out of the weight decay needs a decay;
// the choice reaches the optimizer.
func TestNoDecay1DSpec(t *testing.T) {
	s := DefaultSpec()
	s.NoDecay1D = true
	if _, err := Check(s); !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "needs a weight decay") {
		t.Errorf("without a decay: %v", err)
	}
	s.WeightDecay, s.Optimizer = 0.1, "adamw"
	opt, err := mustCheck(t, s).Spec().NewOptimizer(1)
	if a, ok := opt.(*nn.Adam); err != nil || !ok || !a.NoDecay1D || !a.Decoupled {
		t.Errorf("optimizer %#v, %v", opt, err)
	}
}

// A positive weight is the bce loss's, and weighs its positive targets.
func TestPosWeightSpec(t *testing.T) {
	s := DefaultSpec()
	s.PosWeight = []float64{2}
	if _, err := Check(s); !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "a positive weight is the bce loss's") {
		t.Errorf("under ce: %v", err)
	}
	s.Loss, s.PosWeight = nn.LossBCE, []float64{-1}
	if _, err := Check(s); !errors.Is(err, ErrSpec) {
		t.Errorf("a negative weight: %v", err)
	}
	s.PosWeight = []float64{2}
	l := mustCheck(t, s).Spec().NewLoss(Sample{Classes: 2}, 1)
	if sum, _, _ := l.Forward(nn.FromData([]float32{-200}, 1), []float32{1}, 1); sum != 400 {
		t.Errorf("a missed positive's loss %v, want 400", sum)
	}
	// One weight a label: the second label's positives count three times.
	s.PosWeight = []float64{1, 3}
	l = mustCheck(t, s).Spec().NewLoss(Sample{Classes: 2}, 1)
	if sum, _, _ := l.Forward(nn.FromData([]float32{-200, -200, -200, -200}, 2, 2), []float32{1, 1, 0, 1}, 1); sum != 200+600+600 {
		t.Errorf("missed positives' loss %v, want 1400", sum)
	}
	if err := l.Check([]int{2, 3}, make([]float32, 6)); err == nil || !strings.Contains(err.Error(), "2 positive weights for an output of shape [2 3]") {
		t.Errorf("two weights for three outputs: %v", err)
	}
}

// A checked spec travels as a Spec and is checked again where it is
// decoded: defaults filled, a bad spec or an unknown field refused.
func TestCheckedJSON(t *testing.T) {
	s := DefaultSpec()
	s.ID, s.Files = "j", map[string]string{"/x": "00"}
	c := mustCheck(t, s)
	s.Files["/x"] = "11" // the caller's map is not the checked spec's
	if c.Spec().LR != 3e-4 || c.Spec().Replicas != DefaultReplicas || c.ID() != "j" || c.Spec().Files["/x"] != "00" {
		t.Fatalf("checked spec %+v", c.Spec())
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var plain Spec
	if err := json.Unmarshal(b, &plain); err != nil || !reflect.DeepEqual(plain, c.Spec()) {
		t.Fatalf("marshalled as %s: %+v (%v)", b, plain, err)
	}
	var back Checked
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back.Spec(), c.Spec()) {
		t.Fatalf("decoded %+v (%v), want %+v", back.Spec(), err, c.Spec())
	}
	for name, in := range map[string]string{
		"bad model":     `{"model":"nosuch","data":"mnist","batch":8,"micro_batches":2,"epochs":1,"optimizer":"adam","lr_schedule":"cosine"}`,
		"unknown field": `{"model":"mlp32","data":"mnist","batch":8,"micro_batches":2,"epochs":1,"optimizer":"adam","lr_schedule":"cosine","colour":1}`,
		"bad recompute": `{"model":"mlp32","data":"mnist","batch":8,"micro_batches":2,"epochs":1,"optimizer":"adam","lr_schedule":"cosine","recompute":"some"}`,
		"null":          `null`,
		"not an object": `[1]`,
	} {
		var got Checked
		if err := json.Unmarshal([]byte(in), &got); !errors.Is(err, ErrSpec) {
			t.Errorf("%s: %v, want an error wrapping ErrSpec", name, err)
		}
	}
}

// The interleaved schedule is checked at the edge: chunks 2 or more (0:
// the planner's choice), and only with it; neither replicated stages, the
// graph partitioner's DAGs, recomputation, nor micro-batches that are no
// multiple of --max-nodes.
func TestCheckInterleaved(t *testing.T) {
	for _, c := range []struct {
		mod  func(*Spec)
		want string // "" for accepted
	}{
		{func(s *Spec) { s.Chunks = 2 }, ""},
		{func(s *Spec) { s.Chunks = 0 }, ""},
		{func(s *Spec) { s.Chunks, s.MaxNodes, s.MicroBatches = 3, 2, 4 }, ""},
		{func(s *Spec) { s.Chunks = 1 }, "2 or more"},
		{func(s *Spec) { s.Chunks = -2 }, "2 or more"},
		{func(s *Spec) { s.Chunks = MaxChunks + 1 }, "at most"},
		{func(s *Spec) { s.Schedule, s.Chunks = "1f1b", 2 }, "chunks are for the interleaved schedule"},
		{func(s *Spec) { s.Partition = "fc1-fc16@a,b; fc17-fc32@c" }, "replicated stages"},
		{func(s *Spec) { s.Partition = "graph" }, "chain of stages"},
		{func(s *Spec) { s.Recompute = "auto" }, "recompute"},
		{func(s *Spec) { s.MaxNodes, s.MicroBatches = 3, 4 }, "multiple of the nodes"},
	} {
		s := DefaultSpec()
		s.Schedule, s.Batch, s.MicroBatches = "interleaved", 16, 4
		c.mod(&s)
		_, err := Check(s)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: %v, want %q", s, err, c.want)
		}
	}
}

// Micro-batches auto (0) pass the check, except where M decides the
// result or the schedule; a job is prepared only with a number, which
// WithMicroBatches gives; the memory check counts the smallest
// micro-batches auto may choose.
func TestAutoMicroBatches(t *testing.T) {
	s := DefaultSpec()
	s.Data, s.Batch, s.MicroBatches = "synthetic:8x8x1:4", 256, 0
	c, err := Check(s)
	if err != nil || !c.AutoMicroBatches() {
		t.Fatalf("auto: %v", err)
	}
	if _, err := c.Prepare(); !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "auto") {
		t.Errorf("Prepare with auto micro-batches: %v", err)
	}
	m, err := c.WithMicroBatches(8)
	if err != nil || m.AutoMicroBatches() || m.Spec().MicroBatches != 8 || c.Spec().MicroBatches != 0 {
		t.Fatalf("WithMicroBatches(8): %+v %v", m.Spec(), err)
	}
	if _, err := c.WithMicroBatches(0); err == nil {
		t.Error("WithMicroBatches(0): no error")
	}
	for _, mod := range []func(*Spec){
		func(s *Spec) { s.Deterministic = true },
		func(s *Spec) { s.Schedule, s.Partition = "interleaved", "balanced" },
	} {
		bad := s
		mod(&bad)
		if _, err := Check(bad); !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "not auto") {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	for batch, want := range map[int]int{256: 32, 24: 24, 96: 32, 50: 25, 37: 1, 1: 1} {
		if got := MostMicroBatches(batch); got != want {
			t.Errorf("MostMicroBatches(%d) = %d, want %d", batch, got, want)
		}
	}
}
