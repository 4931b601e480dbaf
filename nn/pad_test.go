package nn_test

import (
	"slices"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/nntest"
)

func TestPad2D(t *testing.T) {
	for _, p := range []*nn.Pad2D{{Top: 1, Left: 1, Bottom: 1, Right: 1}, {Top: 0, Left: 2, Bottom: 1, Right: 0}} {
		nntest.GradCheck(t, p, [][]int{{3, 2, 2}}, nntest.Options{})
	}
	// Zeros around, the input inside.
	b := nn.NewBuilder()
	x := b.Input("x", 1, 2, 1)
	b.Add("pad", &nn.Pad2D{Top: 1, Right: 1}, x)
	g, err := b.Build("pad")
	if err != nil {
		t.Fatal(err)
	}
	be, _ := nn.NewBackend("ppnode-det", 1, true)
	out := g.Whole().Forward(&nn.Ctx{Backend: be}, 0, []*nn.Tensor{nn.FromData([]float32{5, 6}, 1, 1, 2, 1)})
	if got, want := nn.F32(out[0]), []float32{0, 0, 0, 5, 6, 0}; !slices.Equal(got, want) || !slices.Equal(out[0].Shape(), []int{1, 2, 3, 1}) {
		t.Errorf("padded %v of shape %v, want %v of [1 2 3 1]", got, out[0].Shape(), want)
	}
}

// Reflect padding mirrors about the edge without repeating it, edge
// padding repeats the edge (PyTorch's reflect and replicate).
func TestPadModes(t *testing.T) {
	be, _ := nn.NewBackend("ppnode-det", 1, true)
	ctx := &nn.Ctx{Backend: be}
	x := nn.FromData([]float32{1, 2, 3}, 1, 3)
	for _, c := range []struct {
		mode string
		want []float32
	}{
		{"reflect", []float32{3, 2, 1, 2, 3, 2, 1}},
		{"edge", []float32{1, 1, 1, 2, 3, 3, 3}},
		{"", []float32{0, 0, 1, 2, 3, 0, 0}},
	} {
		l := &nn.Pad{Axis: 0, Before: 2, After: 2, Mode: c.mode}
		if _, err := l.Build([][]int{{3}}); err != nil {
			t.Fatal(err)
		}
		var s nn.Slot
		if got := nn.F32(l.Forward(ctx, &s, []*nn.Tensor{x})); !slices.Equal(got, c.want) {
			t.Errorf("%q padding of [1 2 3] by 2: %v, want %v", c.mode, got, c.want)
		}
	}
}
