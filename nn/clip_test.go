package nn_test

import (
	"math"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// ClipGrads scales the gradients to the bound when their norm over the
// parameters is above it, counts a tied tensor once, and leaves them alone
// below it.
func TestClipGrads(t *testing.T) {
	a := &nn.Param{Name: "a", Value: nn.New(2), Grad: nn.FromData([]float32{3, 0}, 2)}
	tied := &nn.Param{Name: "t", Value: nn.New(1), Grad: nn.FromData([]float32{4}, 1)}
	copyOf := &nn.Param{Name: "t", Value: nn.New(1), Grad: nn.FromData([]float32{4}, 1)}
	ps := []*nn.Param{a, tied, copyOf}
	nn.ClipGrads(ps, 1) // the norm is 5, the copy not counted
	scale := 1 / (5 + 1e-6)
	for _, c := range []struct {
		p   *nn.Param
		was float64
	}{{a, 3}, {tied, 4}, {copyOf, 4}} {
		if g := float64(nn.F32(c.p.Grad)[0]); math.Abs(g-c.was*scale) > 1e-7 {
			t.Fatalf("%s's gradient %v after clipping to 1, want %v", c.p.Name, g, c.was*scale)
		}
	}
	before := nn.F32(a.Grad)[0]
	nn.ClipGrads(ps, 10)
	if g := nn.F32(a.Grad)[0]; g != before {
		t.Fatalf("below the bound the gradient changed: %v, was %v", g, before)
	}
}

// The pass over the gradients that clipping adds to a step: the README's
// GPT has 3.3 M parameters.
func BenchmarkClipGrads(b *testing.B) {
	p := &nn.Param{Name: "w", Value: nn.New(3323392), Grad: nn.New(3323392)}
	for i := range nn.F32(p.Grad) {
		nn.F32(p.Grad)[i] = 1e-4
	}
	b.SetBytes(4 * 3323392)
	for b.Loop() {
		nn.ClipGrads([]*nn.Param{p}, 1e9)
	}
}
