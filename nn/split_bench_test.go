package nn_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// BenchmarkSplitBackward times half of mlp32 (width 512, 64 rows a
// micro-batch, 4 micro-batches) backward: fused, split with each weight
// pass right after its input pass, and split with the weight passes after
// all input passes.
func BenchmarkSplitBackward(b *testing.B) {
	be, err := nn.NewBackend("", 1, false)
	if err != nil {
		b.Fatal(err)
	}
	g, err := zoo.Build("mlp32", zoo.Options{Input: []int{28, 28, 1}})
	if err != nil {
		b.Fatal(err)
	}
	g.Init(1)
	var names []string
	in := false
	for _, n := range g.Nodes {
		if n.Name == "fc17" {
			in = true
		}
		if in && n.Name != "loss" {
			names = append(names, n.Name)
		}
	}
	st, err := g.Stage(names)
	if err != nil {
		b.Fatal(err)
	}
	const M, rows = 4, 64
	rng := rand.New(rand.NewPCG(1, 2))
	rnd := func(shape ...int) *nn.Tensor {
		t := nn.New(shape...)
		for i := range nn.F32(t) {
			nn.F32(t)[i] = float32(rng.NormFloat64())
		}
		return t
	}
	x := rnd(rows, 512)
	dy := rnd(rows, 10)
	ctx := &nn.Ctx{Backend: be, Train: true}
	for _, mode := range []string{"fused", "split-adjacent", "split-later"} {
		b.Run(mode, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				for m := range M {
					st.Forward(ctx, m, []*nn.Tensor{x})
				}
				switch mode {
				case "fused":
					for m := range M {
						st.Backward(ctx, m, []*nn.Tensor{dy})
					}
				case "split-adjacent":
					for m := range M {
						st.BackwardInput(ctx, m, []*nn.Tensor{dy})
						st.BackwardWeight(ctx, m)
					}
				case "split-later":
					for m := range M {
						st.BackwardInput(ctx, m, []*nn.Tensor{dy})
					}
					for m := range M {
						st.BackwardWeight(ctx, m)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N*M), "ms/micro-batch")
		})
	}
}
