package nn_test

import (
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
// the full backward pass's gradients bit for bit, fused or split.
func TestFrozenLayerSkipsWeightGradients(t *testing.T) {
	be, err := nn.NewBackend("", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	build := func(freeze ...string) (*nn.Graph, *nn.Stage) {
		g, err := zoo.Build("mlp32", zoo.Options{Width: 16, Input: []int{6}, Classes: 3})
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
	g, st := build("fc3.", "fc4.")
	ref, refSt := build()
	rng := rand.New(rand.NewPCG(1, 2))
	rnd := func(shape ...int) *nn.Tensor {
		x := nn.New(shape...)
		for i := range nn.F32(x) {
			nn.F32(x)[i] = float32(rng.NormFloat64())
		}
		return x
	}
	x, dy := rnd(5, 6), rnd(5, 3)
	ctx := &nn.Ctx{Backend: be, Train: true}
	for _, split := range []bool{false, true} {
		for _, p := range append(g.Params(), ref.Params()...) {
			clear(nn.F32(p.Grad))
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
			got, want := nn.F32(p.Grad), nn.F32(ref.Params()[i].Grad)
			if p.Frozen {
				want = make([]float32, len(got))
			}
			if !slices.Equal(got, want) {
				t.Errorf("split %v: %s's gradient differs (frozen %v)", split, p.Name, p.Frozen)
			}
		}
	}
}
