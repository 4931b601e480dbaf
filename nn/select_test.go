package nn_test

import (
	"math"
	"slices"
	"testing"

	"github.com/ppnode/ppnode/nn"
)

// MaskBy fills x where a condition from the data holds, the condition
// broadcast along the axes where it has size 1, and passes the gradient
// where it does not; Select maps a condition to two constants.
func TestMaskByAndSelect(t *testing.T) {
	be, _ := nn.NewBackend("ppnode-det", 2, true)
	ctx := &nn.Ctx{Backend: be, Train: true}
	// Two samples of [2, 3]; the condition [1, 3] per sample.
	x := nn.FromData([]float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 2, 2, 3)
	cond := nn.FromData([]float32{0, 1, 0, 1, 1, 0}, 2, 1, 3)
	dy := nn.FromData([]float32{.1, .2, .3, .4, .5, .6, .7, .8, .9, 1, 1.1, 1.2}, 2, 2, 3)
	for _, c := range []struct {
		l     *nn.MaskBy
		y, dx []float32
	}{
		{&nn.MaskBy{Fill: -9}, []float32{1, -9, 3, 4, -9, 6, -9, -9, 9, -9, -9, 12}, []float32{.1, 0, .3, .4, 0, .6, 0, 0, .9, 0, 0, 1.2}},
		{&nn.MaskBy{Fill: -9, Invert: true}, []float32{-9, 2, -9, -9, 5, -9, 7, 8, -9, 10, 11, -9}, []float32{0, .2, 0, 0, .5, 0, .7, .8, 0, 1, 1.1, 0}},
	} {
		if _, err := c.l.Build([][]int{{2, 3}, {1, 3}}); err != nil {
			t.Fatal(err)
		}
		var s nn.Slot
		y := c.l.Forward(ctx, &s, []*nn.Tensor{x, cond})
		g := c.l.Backward(ctx, &s, []*nn.Tensor{x, cond}, y, dy, []bool{true, false})
		if !slices.Equal(nn.F32(y), c.y) || !slices.Equal(nn.F32(g[0]), c.dx) || g[1] != nil {
			t.Errorf("invert %v: y %v, dx %v, dcond %v; want %v, %v and none", c.l.Invert, nn.F32(y), nn.F32(g[0]), g[1], c.y, c.dx)
		}
	}
	if _, err := (&nn.MaskBy{}).Build([][]int{{2, 3}, {2, 2}}); err == nil {
		t.Error("a condition that does not broadcast to x accepted")
	}
	var s nn.Slot
	sel := nn.Select{A: -100, B: 0}
	if got := nn.F32(sel.Forward(ctx, &s, []*nn.Tensor{cond})); !slices.Equal(got, []float32{0, -100, 0, -100, -100, 0}) {
		t.Errorf("select: %v", got)
	}
}

// Pick takes each sample's row named by its index (a negative one from the
// end) and passes the gradient back into that row alone; argmax names the
// first largest value, a NaN the largest.
func TestPickAndArgMax(t *testing.T) {
	be, _ := nn.NewBackend("ppnode-det", 2, true)
	ctx := &nn.Ctx{Backend: be, Train: true}
	// Two samples of [3, 2] rows.
	x := nn.FromData([]float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 2, 3, 2)
	idx := nn.FromData([]float32{2, -3}, 2)
	l := &nn.Pick{}
	if _, err := l.Build([][]int{{3, 2}, {}}); err != nil {
		t.Fatal(err)
	}
	var s nn.Slot
	y := l.Forward(ctx, &s, []*nn.Tensor{x, idx})
	g := l.Backward(ctx, &s, []*nn.Tensor{x, idx}, y, nn.FromData([]float32{.1, .2, .3, .4}, 2, 2), []bool{true, false})
	if !slices.Equal(nn.F32(y), []float32{5, 6, 7, 8}) || !slices.Equal(nn.F32(g[0]), []float32{0, 0, 0, 0, .1, .2, .3, .4, 0, 0, 0, 0}) || g[1] != nil {
		t.Errorf("pick: y %v, dx %v, didx %v", nn.F32(y), nn.F32(g[0]), g[1])
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("an index out of range picked a row")
			}
		}()
		l.Forward(ctx, &s, []*nn.Tensor{x, nn.FromData([]float32{3, 0}, 2)})
	}()
	nan := float32(math.NaN())
	am := &nn.Reduce{Op: "argmax"}
	if _, err := am.Build([][]int{{4}}); err != nil {
		t.Fatal(err)
	}
	rows := nn.FromData([]float32{1, 3, 3, 2, 5, nan, 7, nan, -1, -1, -2, -3}, 3, 4)
	if got := nn.F32(am.Forward(ctx, &s, []*nn.Tensor{rows})); !slices.Equal(got, []float32{1, 1, 0}) {
		t.Errorf("argmax of [1 3 3 2], [5 NaN 7 NaN], [-1 -1 -2 -3]: %v, want [1 1 0]", got)
	}
	// amax and amin propagate a NaN wherever it stands in the row.
	nanRows := nn.FromData([]float32{1, 3, 3, 2, 5, nan, 7, 1, nan, -1, -2, -3}, 3, 4)
	for _, op := range []string{"max", "min"} {
		l := &nn.Reduce{Op: op}
		if _, err := l.Build([][]int{{4}}); err != nil {
			t.Fatal(err)
		}
		got := nn.F32(l.Forward(ctx, &s, []*nn.Tensor{nanRows}))
		if want := map[string]float32{"max": 3, "min": 1}[op]; got[0] != want || got[1] == got[1] || got[2] == got[2] {
			t.Errorf("%s of [1 3 3 2], [5 NaN 7 1], [NaN -1 -2 -3]: %v, want [%v NaN NaN]", op, got, want)
		}
	}
}
