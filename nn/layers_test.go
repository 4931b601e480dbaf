package nn_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/nntest"
)

func TestGradCheckLayers(t *testing.T) {
	// Max pooling has kinks where two inputs tie: draw values at least 5ε
	// apart so that no finite difference crosses one.
	perm := rand.New(rand.NewPCG(1, 2)).Perm(4096)
	next := 0
	distinct := func(r *rand.Rand) float32 {
		next++
		return float32(perm[next%len(perm)]-2048) * 0.05
	}
	cases := []struct {
		name  string
		layer func() nn.Layer
		in    [][]int
		opt   nntest.Options
	}{
		{"linear", func() nn.Layer { return nn.NewLinear(6, 4) }, [][]int{{6}}, nntest.Options{}},
		{"linear-flattens", func() nn.Layer { return nn.NewLinear(12, 3) }, [][]int{{2, 3, 2}}, nntest.Options{}},
		{"relu", func() nn.Layer { return nn.ReLU{} }, [][]int{{7}}, nntest.Options{}},
		{"conv3x3", func() nn.Layer { return nn.NewConv2D(3, 4, 3, 1, 1) }, [][]int{{5, 5, 3}}, nntest.Options{}},
		{"conv3x3-stride2", func() nn.Layer { return nn.NewConv2D(2, 3, 3, 2, 1) }, [][]int{{6, 5, 2}}, nntest.Options{}},
		{"conv1x1", func() nn.Layer { return nn.NewConv2D(4, 5, 1, 1, 0) }, [][]int{{3, 3, 4}}, nntest.Options{}},
		{"conv1x1-stride2", func() nn.Layer { return nn.NewConv2D(4, 5, 1, 2, 0) }, [][]int{{4, 4, 4}}, nntest.Options{}},
		{"conv-bias", func() nn.Layer { c := nn.NewConv2D(2, 3, 2, 1, 0); c.Bias = true; return c }, [][]int{{4, 4, 2}}, nntest.Options{}},
		{"maxpool", func() nn.Layer { return &nn.MaxPool2D{K: 2, Stride: 2} }, [][]int{{4, 4, 3}}, nntest.Options{Input: distinct}},
		{"maxpool-overlap-pad", func() nn.Layer { return &nn.MaxPool2D{K: 3, Stride: 2, Pad: 1} }, [][]int{{5, 5, 2}}, nntest.Options{Input: distinct}},
		{"globalavgpool", func() nn.Layer { return &nn.GlobalAvgPool{} }, [][]int{{3, 2, 4}}, nntest.Options{}},
		{"batchnorm-features", func() nn.Layer { return nn.NewBatchNorm() }, [][]int{{5}}, nntest.Options{Batch: 6}},
		{"batchnorm-nhwc", func() nn.Layer { return nn.NewBatchNorm() }, [][]int{{3, 3, 4}}, nntest.Options{}},
		{"batchnorm-eval", func() nn.Layer { return nn.NewBatchNorm() }, [][]int{{3, 3, 4}}, nntest.Options{Eval: true}},
		{"flatten", func() nn.Layer { return nn.Flatten{} }, [][]int{{2, 3, 2}}, nntest.Options{}},
		{"add", func() nn.Layer { return nn.Add{} }, [][]int{{4}, {4}, {4}}, nntest.Options{}},
		{"concat", func() nn.Layer { return &nn.Concat{} }, [][]int{{2, 2, 3}, {2, 2, 1}}, nntest.Options{}},
		{"slice", func() nn.Layer { return &nn.Slice{From: 2, To: 5} }, [][]int{{7}}, nntest.Options{}},
		{"dropout", func() nn.Layer { return nn.NewDropout(0.3) }, [][]int{{20}}, nntest.Options{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nntest.GradCheck(t, c.layer(), c.in, c.opt)
		})
	}
}

// The layers that split their backward pass (zero-bubble schedules) give
// Backward's gradients bit for bit, the weight halves run after another
// micro-batch's input half.
func TestSplitLayers(t *testing.T) {
	for _, c := range []struct {
		name  string
		layer func() nn.Layer
		in    [][]int
	}{
		{"linear", func() nn.Layer { return nn.NewLinear(6, 4) }, [][]int{{6}}},
		{"linear-flattens", func() nn.Layer { return nn.NewLinear(12, 3) }, [][]int{{2, 3, 2}}},
		{"linear-nobias", func() nn.Layer { l := nn.NewLinear(5, 7); l.NoBias = true; return l }, [][]int{{5}}},
		{"conv3x3-stride2", func() nn.Layer { return nn.NewConv2D(2, 3, 3, 2, 1) }, [][]int{{6, 5, 2}}},
		{"conv1x1", func() nn.Layer { return nn.NewConv2D(4, 5, 1, 1, 0) }, [][]int{{3, 3, 4}}},
		{"conv-bias", func() nn.Layer { c := nn.NewConv2D(2, 3, 2, 1, 0); c.Bias = true; return c }, [][]int{{4, 4, 2}}},
	} {
		t.Run(c.name, func(t *testing.T) { nntest.SplitCheck(t, c.layer, c.in, nntest.Options{}) })
	}
}

// A gradient check must fail on a wrong backward pass, or it proves nothing.
func TestGradCheckCatchesWrongBackward(t *testing.T) {
	ft := &fakeT{}
	nntest.GradCheck(ft, wrongScale{}, [][]int{{4}}, nntest.Options{})
	if !ft.failed {
		t.Fatal("GradCheck accepted a backward pass that is off by 10%")
	}
}

type fakeT struct {
	testing.TB
	failed bool
}

func (f *fakeT) Helper()               {}
func (f *fakeT) Errorf(string, ...any) { f.failed = true }
func (f *fakeT) Fatal(...any)          { f.failed = true }
func (f *fakeT) Fatalf(string, ...any) { f.failed = true }

// wrongScale is y = 2x with a backward pass of 2.2.
type wrongScale struct{}

func (wrongScale) Kind() string                    { return "wrong" }
func (wrongScale) Params() []*nn.Param             { return nil }
func (wrongScale) Build(in [][]int) ([]int, error) { return in[0], nil }
func (wrongScale) Forward(c *nn.Ctx, s *nn.Slot, in []*nn.Tensor) *nn.Tensor {
	y := s.Buf(0, in[0].Shape()...)
	for i, v := range nn.F32(in[0]) {
		nn.F32(y)[i] = 2 * v
	}
	return y
}
func (wrongScale) Backward(c *nn.Ctx, s *nn.Slot, in []*nn.Tensor, out, dout *nn.Tensor, need []bool) []*nn.Tensor {
	g := s.Grads(1)
	d := s.Buf(1, dout.Shape()...)
	for i, v := range nn.F32(dout) {
		nn.F32(d)[i] = 2.2 * v
	}
	g[0] = d
	return g
}

// A BatchNorm that applies the ReLU after it (as a Stage fuses them) gives
// the bits of the two layers run one after the other, forward and
// backward, on the deterministic backend, in training and evaluation: the
// output and every parameter's gradient (the convolution's takes the
// BatchNorm's input gradient).
func TestBatchNormReLUFusedIsBatchNormThenReLU(t *testing.T) {
	be, err := nn.NewBackend("", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	b := nn.NewBuilder()
	b.Add("relu", nn.ReLU{}, b.Add("bn", nn.NewBatchNorm(), b.Add("conv", nn.NewConv2D(3, 13, 3, 1, 1), b.Input("x", 6, 5, 3))))
	g, err := b.Build("relu")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 6))
	x, dy := nn.New(4, 6, 5, 3), nn.New(4, 6, 5, 13)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(1 + 2*r.NormFloat64())
	}
	for i := range nn.F32(dy) {
		nn.F32(dy)[i] = float32(r.NormFloat64())
	}
	run := func(fused bool) [][]float32 {
		g.Init(3)
		for _, p := range g.Params() {
			if p.Grad != nil {
				clear(nn.F32(p.Grad))
			}
		}
		s := g.Whole()
		if !fused {
			s.WantInputGrads() // every node's own gradient: no fusion
		}
		var out [][]float32
		for _, train := range []bool{true, false} {
			c := &nn.Ctx{Backend: be, Train: train}
			y := s.Forward(c, 0, []*nn.Tensor{x})
			s.Backward(c, 0, []*nn.Tensor{dy})
			out = append(out, slices.Clone(nn.F32(y[0])))
		}
		for _, p := range g.Params() {
			if p.Grad != nil {
				out = append(out, slices.Clone(nn.F32(p.Grad)))
			}
			out = append(out, slices.Clone(nn.F32(p.Value)))
		}
		return out
	}
	fused, apart := run(true), run(false)
	for i := range apart {
		for j := range apart[i] {
			if math.Float32bits(fused[i][j]) != math.Float32bits(apart[i][j]) {
				t.Fatalf("result %d value %d: fused %g, apart %g", i, j, fused[i][j], apart[i][j])
			}
		}
	}
}
