// Package nntest checks layers and models: GradCheck compares the gradients
// that Backward computes with central finite differences of the forward pass,
// on any layer or graph; SplitCheck checks that a layer's split backward pass
// computes Backward's gradients bit for bit.
package nntest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// Options tune a gradient check. The zero value is usable.
type Options struct {
	Batch int     // samples per pass; 0 means 3
	Eps   float64 // finite-difference step; 0 means 1e-2
	// RTol and ATol bound |analytic − numeric| ≤ ATol·max|numeric| + RTol·|numeric|
	// element by element; 0 means 2e-2 and 2e-3.
	RTol, ATol float64
	// Probes is how many elements of each tensor are checked; 0 means 24.
	Probes int
	// Input draws an input element; nil draws uniform in ±1 away from 0 by
	// at least 0.05, so ReLU kinks are not straddled.
	Input func(r *rand.Rand) float32
	Eval  bool // run in evaluation mode instead of training mode
	// MaxBad is the fraction of probes allowed beyond the tolerance, for deep
	// ReLU networks where a finite step crosses kinks; the median relative
	// error over all probes must still be within RTol. 0 allows none.
	MaxBad float64
	Seed   uint64
}

func (o *Options) defaults() {
	if o.Batch == 0 {
		o.Batch = 3
	}
	if o.Eps == 0 {
		o.Eps = 1e-2
	}
	if o.RTol == 0 {
		o.RTol = 2e-2
	}
	if o.ATol == 0 {
		o.ATol = 2e-3
	}
	if o.Probes == 0 {
		o.Probes = 24
	}
	if o.Input == nil {
		o.Input = func(r *rand.Rand) float32 {
			v := 0.05 + 0.95*r.Float64()
			if r.IntN(2) == 0 {
				v = -v
			}
			return float32(v)
		}
	}
}

// GradCheck builds a graph of the single layer l over inputs of the given
// per-sample shapes and checks its input and parameter gradients.
func GradCheck(t testing.TB, l nn.Layer, in [][]int, o Options) {
	t.Helper()
	b := nn.NewBuilder()
	names := make([]string, len(in))
	for i, s := range in {
		names[i] = b.Input(fmt.Sprintf("in%d", i), s...)
	}
	b.Add("layer", l, names...)
	g, err := b.Build("layer")
	if err != nil {
		t.Fatal(err)
	}
	GradCheckGraph(t, g, o)
}

// GradCheckGraph checks every input and parameter gradient of graph g, with
// the loss L = Σ out·r for a fixed random r.
func GradCheckGraph(t testing.TB, g *nn.Graph, o Options) {
	t.Helper()
	o.defaults()
	be, err := nn.NewBackend("ppnode-det", 1, true)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(o.Seed, 7))
	g.Init(o.Seed + 1)
	// Perturb the initial values so that zero biases and unit scales do not
	// hide mistakes.
	for _, p := range g.Params() {
		if p.Trainable() {
			for i, v := range nn.F32(p.Value) {
				nn.F32(p.Value)[i] = v + float32(0.1*r.NormFloat64())
			}
		}
	}
	st := g.Whole()
	st.WantInputGrads()
	ins := make([]*nn.Tensor, len(g.InputNames))
	for i, s := range g.InputShapes {
		ins[i] = nn.New(append([]int{o.Batch}, s...)...)
		for j := range nn.F32(ins[i]) {
			nn.F32(ins[i])[j] = o.Input(r)
		}
	}
	ctx := &nn.Ctx{Backend: be, Train: !o.Eval, Seed: o.Seed}
	outs := st.Forward(ctx, 0, ins)
	proj := make([]*nn.Tensor, len(outs))
	for i, out := range outs {
		proj[i] = nn.New(out.Shape()...)
		for j := range nn.F32(proj[i]) {
			nn.F32(proj[i])[j] = float32(r.NormFloat64())
		}
	}
	loss := func() float64 {
		outs := st.Forward(ctx, 0, ins)
		var s float64
		for i, out := range outs {
			for j, v := range nn.F32(out) {
				s += float64(v) * float64(nn.F32(proj[i])[j])
			}
		}
		return s
	}
	for _, p := range g.Params() {
		if p.Trainable() {
			clear(nn.F32(p.Grad))
		}
	}
	loss()
	din := st.Backward(ctx, 0, proj)
	// Copy what Backward returned: later passes reuse its buffers.
	type target struct {
		name  string
		value []float32
		grad  []float32
	}
	var targets []target
	for i, name := range g.InputNames {
		if din[i] == nil {
			t.Errorf("no gradient for input %s", name)
			continue
		}
		targets = append(targets, target{name: "input " + name, value: nn.F32(ins[i]), grad: append([]float32(nil), nn.F32(din[i])...)})
	}
	for _, p := range g.Params() {
		if p.Trainable() {
			targets = append(targets, target{name: p.Name, value: nn.F32(p.Value), grad: append([]float32(nil), nn.F32(p.Grad)...)})
		}
	}
	// Buffers (running statistics) change with every training forward pass;
	// they do not enter the training-mode output, but restore them anyway.
	var bufs [][]float32
	for _, p := range g.Params() {
		if !p.Trainable() {
			bufs = append(bufs, append([]float32(nil), nn.F32(p.Value)...))
		}
	}
	var rels []float64
	bad, probes := 0, 0
	for _, tg := range targets {
		maxNum := 0.0
		idx := r.Perm(len(tg.value))
		if len(idx) > o.Probes {
			idx = idx[:o.Probes]
		}
		num := make([]float64, len(idx))
		for k, i := range idx {
			orig := tg.value[i]
			tg.value[i] = orig + float32(o.Eps)
			lp := loss()
			tg.value[i] = orig - float32(o.Eps)
			lm := loss()
			tg.value[i] = orig
			h := float64(orig+float32(o.Eps)) - float64(orig-float32(o.Eps))
			num[k] = (lp - lm) / h
			maxNum = math.Max(maxNum, math.Abs(num[k]))
		}
		for k, i := range idx {
			a := float64(tg.grad[i])
			d := math.Abs(a - num[k])
			rels = append(rels, d/(math.Abs(num[k])+o.ATol*maxNum+1e-12))
			probes++
			if d > o.ATol*maxNum+o.RTol*math.Abs(num[k]) || math.IsNaN(a) {
				if o.MaxBad == 0 && bad < 5 {
					t.Errorf("%s[%d]: backward %.6g, finite difference %.6g", tg.name, i, a, num[k])
				}
				bad++
			}
		}
	}
	sort.Float64s(rels)
	if len(rels) > 0 && rels[len(rels)/2] > o.RTol {
		t.Errorf("median relative error %.3g over %d probes exceeds %.3g", rels[len(rels)/2], len(rels), o.RTol)
	}
	if o.MaxBad > 0 && float64(bad) > o.MaxBad*float64(probes) {
		t.Errorf("%d of %d probes beyond tolerance, more than %.0f%%", bad, probes, 100*o.MaxBad)
	}
	k := 0
	for _, p := range g.Params() {
		if !p.Trainable() {
			copy(nn.F32(p.Value), bufs[k])
			k++
		}
	}
}

// SplitCheck checks a layer that splits its backward pass (nn.SplitLayer):
// BackwardInput and then BackwardWeight, with another micro-batch's passes
// in between, give Backward's input and parameter gradients bit for bit.
func SplitCheck(t testing.TB, l func() nn.Layer, in [][]int, o Options) {
	t.Helper()
	o.defaults()
	be, err := nn.NewBackend("ppnode-det", 1, true)
	if err != nil {
		t.Fatal(err)
	}
	run := func(split bool) [][]float32 {
		b := nn.NewBuilder()
		names := make([]string, len(in))
		for i, s := range in {
			names[i] = b.Input(fmt.Sprintf("in%d", i), s...)
		}
		b.Add("layer", l(), names...)
		g, err := b.Build("layer")
		if err != nil {
			t.Fatal(err)
		}
		g.Init(o.Seed + 1)
		st := g.Whole()
		st.WantInputGrads()
		ctx := &nn.Ctx{Backend: be, Train: !o.Eval, Seed: o.Seed}
		if split && !st.Splits(ctx) {
			t.Fatalf("%s does not split its backward pass", g.Nodes[0].Layer.Kind())
		}
		r := rand.New(rand.NewPCG(o.Seed, 9))
		var got [][]float32
		pass := func(slot int) ([]*nn.Tensor, []*nn.Tensor) {
			ins := make([]*nn.Tensor, len(g.InputShapes))
			for i, s := range g.InputShapes {
				ins[i] = nn.New(append([]int{o.Batch}, s...)...)
				for j := range nn.F32(ins[i]) {
					nn.F32(ins[i])[j] = o.Input(r)
				}
			}
			outs := st.Forward(ctx, slot, ins)
			dout := make([]*nn.Tensor, len(outs))
			for i, out := range outs {
				dout[i] = nn.New(out.Shape()...)
				for j := range nn.F32(dout[i]) {
					nn.F32(dout[i])[j] = float32(r.NormFloat64())
				}
			}
			return ins, dout
		}
		_, d0 := pass(0)
		_, d1 := pass(1)
		keep := func(ts []*nn.Tensor) {
			for _, t := range ts {
				if t != nil {
					got = append(got, append([]float32(nil), nn.F32(t)...))
				}
			}
		}
		if split {
			keep(st.BackwardInput(ctx, 0, d0))
			keep(st.BackwardInput(ctx, 1, d1))
			st.BackwardWeight(ctx, 0)
			st.BackwardWeight(ctx, 1)
		} else {
			keep(st.Backward(ctx, 0, d0))
			keep(st.Backward(ctx, 1, d1))
		}
		for _, p := range g.Params() {
			if p.Trainable() {
				got = append(got, nn.F32(p.Grad))
			}
		}
		return got
	}
	want, got := run(false), run(true)
	if len(got) != len(want) {
		t.Fatalf("split backward gives %d tensors, Backward %d", len(got), len(want))
	}
	for i := range want {
		for j := range want[i] {
			if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
				t.Fatalf("tensor %d element %d: split %v, Backward %v", i, j, got[i][j], want[i][j])
			}
		}
	}
}
