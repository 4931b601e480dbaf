package nn_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// Freeze marks the parameters its prefixes name, and the layers before
// the first trainable one need no gradient; a prefix that names nothing,
// or freezing everything, is refused.
func TestFreeze(t *testing.T) {
	g, err := zoo.Build("mlp32", zoo.Options{Width: 8, Input: []int{6}, Classes: 3})
	if err != nil {
		t.Fatal(err)
	}
	all := g.ParamCount()
	if err := g.Freeze([]string{"fc1.", "fc2.weight"}); err != nil {
		t.Fatal(err)
	}
	var frozen []string
	for _, p := range g.Params() {
		if p.Frozen {
			frozen = append(frozen, p.Name)
		}
	}
	if !slices.Equal(frozen, []string{"fc1.weight", "fc1.bias", "fc2.weight"}) || g.ParamCount() != all-(6*8+8+8*8) {
		t.Fatalf("frozen %v, %d trainable of %d", frozen, g.ParamCount(), all)
	}
	for _, n := range g.Nodes {
		if want := n.Name != "fc1" && n.Name != "relu1"; n.RequiresGrad != want {
			t.Errorf("node %s needs a gradient: %v, want %v", n.Name, n.RequiresGrad, want)
		}
	}
	if err := g.Freeze([]string{"decoder."}); err == nil || !strings.Contains(err.Error(), `no trainable parameter's name starts with "decoder."`) {
		t.Errorf("a prefix of nothing: %v", err)
	}
	if err := g.Freeze([]string{"fc"}); err == nil || !strings.Contains(err.Error(), "leaves nothing to train") {
		t.Errorf("everything frozen: %v", err)
	}
}

// A frozen layer after a trainable one passes its input gradients back and
// adds nothing to its parameters' gradients; the trainable parameters get
// the full backward pass's gradients, fused or split, on oneDNN's path and
// off it: bit for bit on the deterministic backend, within 1e-5 of the
// largest on the other (whose oneDNN convolutions' weight gradients vary
// from run to run in the last bits).
func TestFrozenLayerSkipsWeightGradients(t *testing.T) {
	for _, tc := range []struct {
		model  string
		opt    zoo.Options
		freeze []string
		rows   int
	}{
		{"mlp32", zoo.Options{Width: 16, Input: []int{6}, Classes: 3}, []string{"fc3.", "fc4."}, 5},
		{"vgg16", zoo.Options{Width: 1.0 / 16, Input: []int{8, 8, 3}, Classes: 3}, []string{"conv3.", "conv4."}, 2},
	} {
		for _, det := range []bool{false, true} {
			be, err := nn.NewBackend("", 1, det)
			if err != nil {
				t.Fatal(err)
			}
			t.Run(tc.model+"/"+be.Name(), func(t *testing.T) { checkFrozenBackward(t, be, det, tc.model, tc.opt, tc.freeze, tc.rows) })
		}
	}
}

func checkFrozenBackward(t *testing.T, be nn.Backend, exact bool, model string, opt zoo.Options, freeze []string, rows int) {
	build := func(freeze ...string) (*nn.Graph, *nn.Stage) {
		g, err := zoo.Build(model, opt)
		if err != nil {
			t.Fatal(err)
		}
		g.Init(1)
		if len(freeze) > 0 {
			if err := g.Freeze(freeze); err != nil {
				t.Fatal(err)
			}
		}
		var names []string
		for _, n := range g.Nodes {
			if n.Name != "loss" {
				names = append(names, n.Name)
			}
		}
		st, err := g.Stage(names)
		if err != nil {
			t.Fatal(err)
		}
		return g, st
	}
	g, st := build(freeze...)
	ref, refSt := build()
	rng := rand.New(rand.NewPCG(1, 2))
	rnd := func(shape ...int) *nn.Tensor {
		x := nn.New(shape...)
		for i := range nn.F32(x) {
			nn.F32(x)[i] = float32(rng.NormFloat64())
		}
		return x
	}
	x, dy := rnd(append([]int{rows}, opt.Input...)...), rnd(rows, opt.Classes)
	ctx := &nn.Ctx{Backend: be, Train: true}
	for _, split := range []bool{false, true} {
		for _, p := range append(g.Params(), ref.Params()...) {
			if p.Grad != nil {
				clear(nn.F32(p.Grad))
			}
		}
		for _, s := range []*nn.Stage{st, refSt} {
			s.Forward(ctx, 0, []*nn.Tensor{x})
			if split {
				s.BackwardInput(ctx, 0, []*nn.Tensor{dy})
				s.BackwardWeight(ctx, 0)
			} else {
				s.Backward(ctx, 0, []*nn.Tensor{dy})
			}
		}
		for i, p := range g.Params() {
			if p.Grad == nil {
				continue
			}
			got, want := nn.F32(p.Grad), nn.F32(ref.Params()[i].Grad)
			if p.Frozen {
				want = make([]float32, len(got))
			}
			var diff, most float64
			for j := range got {
				diff, most = max(diff, math.Abs(float64(got[j]-want[j]))), max(most, math.Abs(float64(want[j])))
			}
			if exact && !slices.Equal(got, want) || diff > 1e-5*most {
				t.Errorf("split %v: %s's gradient differs by %g of %g (frozen %v)", split, p.Name, diff, most, p.Frozen)
			}
		}
	}
}
