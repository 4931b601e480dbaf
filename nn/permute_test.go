package nn_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/nntest"
)

func TestGradCheckPermuteReshape(t *testing.T) {
	var cases []gradCase
	add := func(name string, in []int, mk func() nn.Layer) {
		cases = append(cases, gradCase{fmt.Sprintf("%s%v", name, in), mk, [][]int{in}, nntest.Options{}})
	}
	perm := func(p ...int) func() nn.Layer { return func() nn.Layer { return &nn.Permute{Perm: p} } }
	add("permute[1 0]", []int{3, 4}, perm(1, 0))
	add("permute[0 1]", []int{3, 4}, perm(0, 1))
	add("permute[1 0]", []int{1, 5}, perm(1, 0)) // moves no data: a view
	for _, p := range permutations(3) {
		add(fmt.Sprintf("permute%v", p), []int{2, 3, 4}, perm(p...))
	}
	add("permute[2 1 0]", []int{2, 1, 3}, perm(2, 1, 0))
	add("permute[3 0 2 1]", []int{2, 1, 3, 2}, perm(3, 0, 2, 1))
	add("permute[0 2 3 1]", []int{2, 3, 4, 5}, perm(0, 2, 3, 1))
	add("reshape[4 6]", []int{2, 3, 4}, func() nn.Layer { return &nn.Reshape{Shape: []int{4, 6}} })
	add("reshape[1 2 3]", []int{6}, func() nn.Layer { return &nn.Reshape{Shape: []int{1, 2, 3}} })
	add("reshape[]", []int{1, 1}, func() nn.Layer { return &nn.Reshape{Shape: []int{}} })
	runGradCases(t, cases)
}

// permutations returns every permutation of 0..n-1.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int(nil), p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

// naivePermute permutes the per-sample axes of x ([n, dims...]) index by
// index: output axis i is input axis perm[i].
func naivePermute(x []float32, n int, dims, perm []int) []float32 {
	k := len(dims)
	out := make([]int, k)
	for i, a := range perm {
		out[i] = dims[a]
	}
	per := nn.Size(dims)
	y := make([]float32, len(x))
	idx := make([]int, k) // output index
	for b := 0; b < n; b++ {
		for o := 0; o < per; o++ {
			r := o
			for i := k - 1; i >= 0; i-- {
				idx[i] = r % out[i]
				r /= out[i]
			}
			src := 0
			for a := 0; a < k; a++ { // input axis a is output axis i with perm[i] = a
				for i := range perm {
					if perm[i] == a {
						src = src*dims[a] + idx[i]
					}
				}
			}
			y[b*per+o] = x[b*per+src]
		}
	}
	return y
}

// Permute's forward pass is the index-by-index permutation, and its
// backward pass the inverse one, for random shapes (with size-1 axes) and
// permutations of up to six axes, at several thread counts and batch sizes
// in the same slot.
func TestPermuteMatchesNaive(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 14))
	trials := 300
	if testing.Short() { // the race pass: two of the threaded copies
		trials = 31
	}
	for trial := 0; trial < trials; trial++ {
		k := 1 + r.IntN(6)
		dims := make([]int, k)
		for i := range dims {
			dims[i] = 1 + r.IntN(4)
		}
		batches := []int{3, 1, 4}
		if trial%30 == 0 {
			// Large enough for the copy to split over threads mid-sample.
			k = 3 + r.IntN(2)
			dims = []int{7, 5, 9, 11}[:k]
			batches = []int{127, 11}
		}
		perm := r.Perm(k)
		inv := make([]int, k)
		for i, a := range perm {
			inv[a] = i
		}
		l := &nn.Permute{Perm: perm}
		outDims, err := l.Build([][]int{dims})
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range perm {
			if outDims[i] != dims[a] {
				t.Fatalf("perm %v of %v: output shape %v", perm, dims, outDims)
			}
		}
		be, _ := nn.NewBackend("ppnode-det", 1+trial%4, true)
		c := &nn.Ctx{Backend: be}
		var s nn.Slot
		for _, n := range batches {
			x := nn.New(append([]int{n}, dims...)...)
			for i := range nn.F32(x) {
				nn.F32(x)[i] = float32(i) + 0.5
			}
			y := l.Forward(c, &s, []*nn.Tensor{x})
			if got, want := y.Shape(), append([]int{n}, outDims...); !nn.SameShape(got, want) {
				t.Fatalf("perm %v of %v: output %v, want %v", perm, dims, got, want)
			}
			what := fmt.Sprintf("perm %v of %v, batch %d", perm, dims, n)
			sameBits(t, what+" forward", nn.F32(y), naivePermute(nn.F32(x), n, dims, perm))
			dout := ramp(y.Shape()...)
			g := l.Backward(c, &s, []*nn.Tensor{x}, y, dout, []bool{true})
			if !nn.SameShape(g[0].Shape(), x.Shape()) {
				t.Fatalf("%s: gradient shape %v", what, g[0].Shape())
			}
			sameBits(t, what+" backward", nn.F32(g[0]), naivePermute(nn.F32(dout), n, outDims, inv))
		}
	}
}

// A permutation that moves no data, and Reshape, return views of the
// input and of dout.
func TestPermuteReshapeViews(t *testing.T) {
	c := &nn.Ctx{Backend: gonum1(t)}
	for _, tc := range []struct {
		l       nn.Layer
		in, out []int
	}{
		{&nn.Permute{Perm: []int{0, 1, 2}}, []int{2, 3, 4}, []int{2, 3, 4}},
		{&nn.Permute{Perm: []int{0, 2, 1}}, []int{6, 1, 4}, []int{6, 4, 1}},
		{&nn.Permute{Perm: []int{1, 0, 2}}, []int{1, 1, 4}, []int{1, 1, 4}},
		{&nn.Reshape{Shape: []int{4, 6}}, []int{2, 3, 4}, []int{4, 6}},
		{&nn.Reshape{Shape: []int{24}}, []int{2, 3, 4}, []int{24}},
	} {
		name := fmt.Sprintf("%s%v", tc.l.Kind(), tc.in)
		out, err := tc.l.Build([][]int{tc.in})
		if err != nil {
			t.Fatal(err)
		}
		if !nn.SameShape(out, tc.out) {
			t.Fatalf("%s: output shape %v, want %v", name, out, tc.out)
		}
		var s nn.Slot
		for _, n := range []int{2, 5, 2} {
			x := ramp(append([]int{n}, tc.in...)...)
			y := tc.l.Forward(c, &s, []*nn.Tensor{x})
			if !nn.SameShape(y.Shape(), append([]int{n}, tc.out...)) || &nn.F32(y)[0] != &nn.F32(x)[0] {
				t.Fatalf("%s: output %v is not a view of the input", name, y.Shape())
			}
			dout := ramp(y.Shape()...)
			g := tc.l.Backward(c, &s, []*nn.Tensor{x}, y, dout, []bool{true})
			if !nn.SameShape(g[0].Shape(), x.Shape()) || &nn.F32(g[0])[0] != &nn.F32(dout)[0] {
				t.Fatalf("%s: gradient %v is not a view of dout", name, g[0].Shape())
			}
			if g := tc.l.Backward(c, &s, []*nn.Tensor{x}, y, dout, []bool{false}); g[0] != nil {
				t.Fatalf("%s: gradient returned without need", name)
			}
		}
	}
}

func TestPermuteReshapeBuildErrors(t *testing.T) {
	for _, c := range []struct {
		l  nn.Layer
		in [][]int
	}{
		{&nn.Permute{Perm: []int{1, 0}}, [][]int{{2, 3, 4}}},
		{&nn.Permute{Perm: []int{0, 0, 1}}, [][]int{{2, 3, 4}}},
		{&nn.Permute{Perm: []int{0, 3, 1}}, [][]int{{2, 3, 4}}},
		{&nn.Permute{Perm: []int{-1, 0}}, [][]int{{2, 3}}},
		{&nn.Permute{Perm: []int{1, 0}}, [][]int{{2, 0}}},
		{&nn.Permute{Perm: []int{1, 0}}, [][]int{{2, 3}, {2, 3}}},
		{&nn.Reshape{Shape: []int{5, 5}}, [][]int{{2, 3, 4}}},
		{&nn.Reshape{Shape: []int{-1, 6}}, [][]int{{2, 3, 4}}},
		{&nn.Reshape{Shape: []int{0, 6}}, [][]int{{0, 3}}},
	} {
		if _, err := c.l.Build(c.in); err == nil {
			t.Errorf("%s %+v built on %v", c.l.Kind(), c.l, c.in)
		}
	}
}
