package nn_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/nntest"
)

// newP returns a trainable parameter of the given shape, made as an
// importer makes BroadcastOp's and ParamBroadcast's.
// Its initial values (Given) lie in [0.75, 1.25], away from 0 for div.
// broadcastConst is x op c for the constant c of the given shape.
func broadcastConst(op string, shape []int, c []float32) *nn.BroadcastOp {
	return &nn.BroadcastOp{Op: op, Shape: shape, Const: c}
}

// broadcastParam is x op c for c taken from the trainable p through m
// (nil: p's values in order).
func broadcastParam(op string, shape []int, p *nn.Param, m []int32) *nn.BroadcastOp {
	return &nn.BroadcastOp{Op: op, Shape: shape, P: p, Map: m}
}

func newP(shape ...int) *nn.Param {
	p := &nn.Param{Name: "p", Value: nn.New(shape...), Grad: nn.New(shape...), Given: make([]float32, nn.Size(shape))}
	for i := range p.Given {
		p.Given[i] = 0.75 + 0.5*float32(i%5)/4
	}
	return p
}

// noInputGrad wraps a layer whose input gets no gradient (ids, or an input
// read only for its batch size) for GradCheck, which wants one for every
// input: the ids are rounded to integers, so that a finite difference of
// them changes nothing, and their gradient is zero.
type noInputGrad struct{ nn.Layer }

func (w noInputGrad) Forward(c *nn.Ctx, s *nn.Slot, in []*nn.Tensor) *nn.Tensor {
	x := nn.New(in[0].Shape()...)
	for i, v := range nn.F32(in[0]) {
		nn.F32(x)[i] = float32(math.Round(float64(v)))
	}
	return w.Layer.Forward(c, s, []*nn.Tensor{x})
}

func (w noInputGrad) Backward(c *nn.Ctx, s *nn.Slot, in []*nn.Tensor, out, dout *nn.Tensor, need []bool) []*nn.Tensor {
	if g := w.Layer.Backward(c, s, in, out, dout, need); g[0] != nil {
		panic("the layer returned an input gradient")
	}
	return []*nn.Tensor{nn.New(in[0].Shape()...)}
}

// ids draws integer ids in [0, n).
func ids(n int) func(r *rand.Rand) float32 {
	return func(r *rand.Rand) float32 { return float32(r.IntN(n)) }
}

func TestGradCheckTransformerLayers(t *testing.T) {
	causal := []bool{false, true, true, false, false, true, false, false, false}
	cases := []gradCase{
		{"layernorm", func() nn.Layer { return &nn.LayerNorm{Eps: 1e-5} }, [][]int{{9}}, nntest.Options{Batch: 5}},
		{"layernorm-rows", func() nn.Layer { return &nn.LayerNorm{Eps: 1e-5} }, [][]int{{3, 7, 6}}, nntest.Options{}},
		{"layernorm-noaffine", func() nn.Layer { return &nn.LayerNorm{Eps: 1e-3, NoAffine: true} }, [][]int{{2, 11}}, nntest.Options{}},
		{"embedding", func() nn.Layer { return noInputGrad{&nn.Embedding{Num: 7, Dim: 5}} }, [][]int{{4}}, nntest.Options{Input: ids(7), Probes: 40}},
		{"embedding-2d", func() nn.Layer { return noInputGrad{&nn.Embedding{Num: 3, Dim: 4}} }, [][]int{{2, 3}}, nntest.Options{Input: ids(3)}},
		{"matmul", func() nn.Layer { return &nn.MatMul{} }, [][]int{{3, 4}, {4, 5}}, nntest.Options{}},
		{"matmul-heads", func() nn.Layer { return &nn.MatMul{} }, [][]int{{2, 3, 4}, {2, 4, 5}}, nntest.Options{}},
		{"matmul-tA", func() nn.Layer { return &nn.MatMul{TransA: true} }, [][]int{{2, 4, 3}, {2, 4, 5}}, nntest.Options{}},
		{"matmul-tB", func() nn.Layer { return &nn.MatMul{TransB: true} }, [][]int{{2, 3, 4}, {2, 5, 4}}, nntest.Options{}},
		{"matmul-tAB", func() nn.Layer { return &nn.MatMul{TransA: true, TransB: true} }, [][]int{{2, 2, 4, 3}, {2, 2, 5, 4}}, nntest.Options{}},
		{"mask", func() nn.Layer { return &nn.Mask{Shape: []int{1, 3, 3}, Mask: causal, Fill: -4} }, [][]int{{2, 3, 3}}, nntest.Options{}},
		{"mask-rows", func() nn.Layer { return &nn.Mask{Shape: []int{3, 1}, Mask: []bool{true, false, true}, Fill: 2} }, [][]int{{3, 4}}, nntest.Options{}},
		{"cumsum", func() nn.Layer { return nn.CumSum{} }, [][]int{{2, 5}}, nntest.Options{}},
		{"cumsum-exclusive-reverse", func() nn.Layer { return nn.CumSum{Exclusive: true, Reverse: true} }, [][]int{{3, 4}}, nntest.Options{}},
		{"expand", func() nn.Layer { return &nn.Expand{Shape: []int{3, 2, 4}} }, [][]int{{1, 2, 1}}, nntest.Options{}},
		{"expand-middle", func() nn.Layer { return &nn.Expand{Shape: []int{2, 3, 4}} }, [][]int{{2, 1, 4}}, nntest.Options{}},
		{"take-first", func() nn.Layer { return &nn.Take{Axis: 0, Index: []int{2, 0, 2}} }, [][]int{{3, 4}}, nntest.Options{}},
		{"take-middle", func() nn.Layer { return &nn.Take{Axis: 1, Index: []int{1, 1, 0, 3}} }, [][]int{{2, 4, 3}}, nntest.Options{}},
		{"take-last", func() nn.Layer { return &nn.Take{Axis: 2, Index: []int{4, 0, 4}} }, [][]int{{2, 3, 5}}, nntest.Options{}},
		{"concat-last", func() nn.Layer { return &nn.Concat{} }, [][]int{{2, 2, 3}, {2, 2, 1}}, nntest.Options{}},
		{"concat-axis1", func() nn.Layer { return &nn.Concat{Axis: 1} }, [][]int{{2, 1, 3}, {2, 4, 3}, {2, 2, 3}}, nntest.Options{}},
		{"concat-axis2", func() nn.Layer { return &nn.Concat{Axis: 2} }, [][]int{{1, 2, 3}, {2, 2, 3}}, nntest.Options{}},
		{"slice-last", func() nn.Layer { return &nn.Slice{From: 2, To: 5} }, [][]int{{7}}, nntest.Options{}},
		{"slice-axis1", func() nn.Layer { return &nn.Slice{From: 1, To: 3, Axis: 1} }, [][]int{{2, 4, 3}}, nntest.Options{}},
		{"slice-step", func() nn.Layer { return &nn.Slice{From: 1, To: 7, Step: 2} }, [][]int{{3, 8}}, nntest.Options{}},
		{"slice-axis2-step3", func() nn.Layer { return &nn.Slice{From: 0, To: 5, Axis: 2, Step: 3} }, [][]int{{5, 2, 2}}, nntest.Options{}},
		{"pad-first", func() nn.Layer { return &nn.Pad{Axis: 0, Before: 1, After: 2, Value: 0.5} }, [][]int{{2, 3}}, nntest.Options{}},
		{"pad-last", func() nn.Layer { return &nn.Pad{Axis: 1, Before: 0, After: 1, Value: -1} }, [][]int{{2, 3}}, nntest.Options{}},
		{"pad-reflect", func() nn.Layer { return &nn.Pad{Axis: 1, Before: 2, After: 2, Mode: "reflect"} }, [][]int{{2, 3}}, nntest.Options{}},
		{"pad-edge", func() nn.Layer { return &nn.Pad{Axis: 0, Before: 1, After: 3, Mode: "edge"} }, [][]int{{2, 3}}, nntest.Options{}},
		{"reduce-sum", func() nn.Layer { return &nn.Reduce{Op: "sum"} }, [][]int{{3, 5}}, nntest.Options{}},
		{"reduce-mean", func() nn.Layer { return &nn.Reduce{Op: "mean"} }, [][]int{{3, 5}}, nntest.Options{}},
		{"reduce-max", func() nn.Layer { return &nn.Reduce{Op: "max"} }, [][]int{{3, 5}}, nntest.Options{}},
		{"reduce-min", func() nn.Layer { return &nn.Reduce{Op: "min"} }, [][]int{{4, 2}}, nntest.Options{}},
		{"reduce-l2", func() nn.Layer { return &nn.Reduce{Op: "l2"} }, [][]int{{3, 6}}, nntest.Options{}},
		{"parambroadcast", func() nn.Layer { return noInputGrad{&nn.ParamBroadcast{Shape: []int{1, 4}, P: newP(4)}} }, [][]int{{2}}, nntest.Options{}},
		{"parambroadcast-map", func() nn.Layer {
			return noInputGrad{&nn.ParamBroadcast{Shape: []int{2, 3}, P: newP(2), Map: []int32{0, 1, 1, 0, 0, 0}}}
		}, [][]int{{5}}, nntest.Options{}},
	}
	for _, op := range []string{"add", "sub", "mul", "div"} {
		opt := nntest.Options{}
		if op == "div" {
			opt.Input = awayIn(0.5, 1.5)
		}
		for _, sh := range [][2][]int{{{3, 1, 4}, {3, 2, 1}}, {{2, 3}, {2, 3}}, {{1, 4}, {3, 4}}, {{1, 1}, {2, 3}}, {{2, 5}, {2, 1}}} {
			cases = append(cases, gradCase{fmt.Sprintf("broadcast-%s%v%v", op, sh[0], sh[1]),
				func() nn.Layer { return &nn.Broadcast{Op: op} }, [][]int{sh[0], sh[1]}, opt})
		}
	}
	for _, op := range []string{"add", "sub", "rsub", "mul", "div", "rdiv", "pow", "prelu"} {
		opt := nntest.Options{}
		if op == "div" || op == "rdiv" || op == "pow" {
			opt.Input = uniformIn(0.5, 1.5)
		}
		for _, sh := range [][2][]int{{{3, 4}, {1, 4}}, {{3, 4}, {3, 1}}, {{2, 3, 4}, {1, 1, 1}}, {{2, 3, 4}, {1, 3, 4}}, {{2, 3, 4}, {2, 1, 4}}} {
			x, s := sh[0], sh[1]
			konst := make([]float32, nn.Size(s))
			for i := range konst {
				konst[i] = 0.6 + 0.13*float32(i%7)
			}
			cases = append(cases, gradCase{fmt.Sprintf("broadcastop-%s-const%v%v", op, x, s),
				func() nn.Layer { return broadcastConst(op, s, konst) }, [][]int{x}, opt})
			if op == "pow" {
				continue
			}
			pOpt := opt
			pOpt.Probes = 40
			cases = append(cases, gradCase{fmt.Sprintf("broadcastop-%s-param%v%v", op, x, s),
				func() nn.Layer { return broadcastParam(op, s, newP(s...), nil) }, [][]int{x}, pOpt})
			m := make([]int32, nn.Size(s))
			for i := range m {
				m[i] = int32(i*5) % 3 // repeats: P has 3 values
			}
			cases = append(cases, gradCase{fmt.Sprintf("broadcastop-%s-map%v%v", op, x, s),
				func() nn.Layer { return broadcastParam(op, s, newP(3), m) }, [][]int{x}, pOpt})
		}
	}
	runGradCases(t, cases)
}

// Compare and Truncate compute what they say and return no gradient; Mask
// fills −∞ and passes no gradient there; Embedding panics on a bad id.
func TestCompareTruncateMaskEmbeddingValues(t *testing.T) {
	x := nn.FromData([]float32{-1.5, -1, 0, 0.5, 1, 2.7, float32(math.NaN()), 1}, 2, 4)
	want := map[string][]float32{
		"eq": {0, 0, 0, 0, 1, 0, 0, 1}, "ne": {1, 1, 1, 1, 0, 1, 1, 0},
		"lt": {1, 1, 1, 1, 0, 0, 0, 0}, "gt": {0, 0, 0, 0, 0, 1, 0, 0},
		"le": {1, 1, 1, 1, 1, 0, 0, 1}, "ge": {0, 0, 0, 0, 1, 1, 0, 1},
	}
	c := &nn.Ctx{Backend: gonum1(t)}
	for op, w := range want {
		l := &nn.Compare{Op: op, C: 1}
		sameBits(t, "compare "+op, nn.F32(forward(t, l, x)), w)
		var s nn.Slot
		y := l.Forward(c, &s, []*nn.Tensor{x})
		if g := l.Backward(c, &s, []*nn.Tensor{x}, y, y, []bool{true}); g[0] != nil {
			t.Errorf("compare %s returned a gradient", op)
		}
	}
	tr := nn.F32(forward(t, nn.Truncate{}, x))
	for i, w := range []float32{-1, -1, 0, 0, 1, 2, float32(math.NaN()), 1} {
		if tr[i] != w && !(math.IsNaN(float64(w)) && math.IsNaN(float64(tr[i]))) {
			t.Errorf("trunc(%v) = %v, want %v", nn.F32(x)[i], tr[i], w)
		}
	}
	if tr := nn.F32(forward(t, nn.Truncate{}, nn.FromData([]float32{-0.5}, 1, 1))); !math.Signbit(float64(tr[0])) {
		t.Errorf("trunc(-0.5) = %v, want -0", tr[0])
	}

	inf := float32(math.Inf(-1))
	m := &nn.Mask{Shape: []int{2, 2}, Mask: []bool{false, true, false, false}, Fill: inf}
	xm := ramp(3, 2, 2)
	y := forward(t, m, xm)
	var s nn.Slot
	y = m.Forward(c, &s, []*nn.Tensor{xm})
	dx := nn.F32(m.Backward(c, &s, []*nn.Tensor{xm}, y, ramp(3, 2, 2), []bool{true})[0])
	for i, v := range nn.F32(y) {
		if masked := i%4 == 1; masked != (v == inf) || masked != (dx[i] == 0) || !masked && v != nn.F32(xm)[i] {
			t.Errorf("mask at %d: y %v dx %v", i, v, dx[i])
		}
	}

	e := &nn.Embedding{Num: 4, Dim: 2}
	if limit, ok := e.IntInput(0); limit != 4 || !ok {
		t.Errorf("IntInput(0) = %d, %v", limit, ok)
	}
	for _, bad := range []float32{4, -1, 1.5, float32(math.NaN())} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "not an integer in [0, 4)") {
					t.Errorf("id %v: panic %v", bad, r)
				}
			}()
			forward(t, e, nn.FromData([]float32{1, bad}, 1, 2))
		}()
	}
}

// Build rejects configurations that cannot work.
func TestTransformerLayersBuildErrors(t *testing.T) {
	p := newP(3)
	cases := []struct {
		name string
		l    nn.Layer
		in   [][]int
	}{
		{"broadcast-shapes", &nn.Broadcast{Op: "add"}, [][]int{{2, 3}, {3, 3}}},
		{"broadcast-rank", &nn.Broadcast{Op: "add"}, [][]int{{2, 3}, {3}}},
		{"broadcast-op", &nn.Broadcast{Op: "pow"}, [][]int{{3}, {3}}},
		{"broadcastop-const", broadcastConst("add", []int{1, 3}, []float32{1, 2}), [][]int{{2, 3}}},
		{"broadcastop-shape", broadcastConst("add", []int{2, 1}, []float32{1, 2}), [][]int{{3, 3}}},
		{"broadcastop-map", broadcastParam("mul", []int{1, 2}, p, []int32{0, 3}), [][]int{{2, 2}}},
		{"broadcastop-size", broadcastParam("mul", []int{1, 2}, p, nil), [][]int{{2, 2}}},
		{"broadcastop-pow-param", broadcastParam("pow", []int{1, 3}, p, nil), [][]int{{2, 3}}},
		{"matmul-inner", &nn.MatMul{}, [][]int{{2, 3}, {4, 5}}},
		{"matmul-lead", &nn.MatMul{}, [][]int{{2, 2, 3}, {3, 3, 5}}},
		{"mask-size", &nn.Mask{Shape: []int{1, 3}, Mask: []bool{true}}, [][]int{{2, 3}}},
		{"take-index", &nn.Take{Axis: 1, Index: []int{3}}, [][]int{{2, 3}}},
		{"slice-axis", &nn.Slice{From: 0, To: 1, Axis: 2}, [][]int{{2, 3}}},
		{"concat-dims", &nn.Concat{Axis: 1}, [][]int{{2, 3}, {2, 4}}},
		{"pad-negative", &nn.Pad{Axis: 0, Before: -1}, [][]int{{2}}},
		{"pad-reflect-wide", &nn.Pad{Axis: 0, Before: 2, Mode: "reflect"}, [][]int{{2}}},
		{"pad-mode", &nn.Pad{Axis: 0, Before: 1, Mode: "wrap"}, [][]int{{2}}},
		{"reduce-op", &nn.Reduce{Op: "prod"}, [][]int{{2}}},
		{"embedding-empty", &nn.Embedding{Num: 0, Dim: 2}, [][]int{{2}}},
	}
	for _, c := range cases {
		if _, err := c.l.Build(c.in); err == nil {
			t.Errorf("%s: Build(%v) succeeded", c.name, c.in)
		}
	}
}

// torchLayerCase is one layer run here and in torch_layers_tf.py.
type torchLayerCase struct {
	name  string
	kind  string
	attrs map[string]any
	layer nn.Layer
	in    []*nn.Tensor
	ints  []bool // inputs holding ids
}

type torchSpec struct {
	Shape []int     `json:"shape"`
	Data  []float64 `json:"data"`
	Int   bool      `json:"int,omitempty"`
}

func specOf(t *nn.Tensor) torchSpec {
	d := make([]float64, len(nn.F32(t)))
	for i, v := range nn.F32(t) {
		d[i] = float64(v)
	}
	return torchSpec{Shape: t.Shape(), Data: d}
}

// normal is a tensor of normal values scaled by sd and shifted by mean.
func normal(r *rand.Rand, mean, sd float64, shape ...int) *nn.Tensor {
	x := nn.New(shape...)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(mean + sd*r.NormFloat64())
	}
	return x
}

// The layers' forward outputs and all their gradients agree with
// PyTorch's float64 on the same float32 values within 1e-5 of each
// tensor's largest magnitude.
func TestTransformerLayersMatchTorch(t *testing.T) {
	needTorch(t)
	r := rand.New(rand.NewPCG(11, 12))
	causal := make([]bool, 6*6)
	for i := 0; i < 6; i++ {
		for j := i + 1; j < 6; j++ {
			causal[i*6+j] = true
		}
	}
	tok := nn.New(3, 7)
	for i := range nn.F32(tok) {
		nn.F32(tok)[i] = float32(r.IntN(9))
	}
	cases := []torchLayerCase{
		{name: "layernorm", kind: "layernorm", attrs: map[string]any{"eps": 1e-5}, layer: &nn.LayerNorm{Eps: 1e-5}, in: []*nn.Tensor{normal(r, 3, 2, 4, 6, 37)}},
		{name: "layernorm-noaffine", kind: "layernorm", attrs: map[string]any{"eps": 1e-3}, layer: &nn.LayerNorm{Eps: 1e-3, NoAffine: true}, in: []*nn.Tensor{normal(r, -1, 0.5, 5, 64)}},
		{name: "embedding", kind: "embedding", layer: &nn.Embedding{Num: 9, Dim: 12}, in: []*nn.Tensor{tok}, ints: []bool{true}},
		{name: "mask-causal", kind: "mask", attrs: map[string]any{"shape": []int{1, 6, 6}, "mask": causal, "fill": -3.5},
			layer: &nn.Mask{Shape: []int{1, 6, 6}, Mask: causal, Fill: -3.5}, in: []*nn.Tensor{normal(r, 0, 1, 2, 3, 6, 6)}},
		{name: "take-axis1", kind: "take", attrs: map[string]any{"axis": 1, "index": []int{4, 0, 4, 2}},
			layer: &nn.Take{Axis: 1, Index: []int{4, 0, 4, 2}}, in: []*nn.Tensor{normal(r, 0, 1, 3, 2, 5, 3)}},
		{name: "take-last", kind: "take", attrs: map[string]any{"axis": 1, "index": []int{1, 1, 0}},
			layer: &nn.Take{Axis: 1, Index: []int{1, 1, 0}}, in: []*nn.Tensor{normal(r, 0, 1, 3, 4, 2)}},
		{name: "reduce-mean", kind: "reduce", attrs: map[string]any{"op": "mean"}, layer: &nn.Reduce{Op: "mean"}, in: []*nn.Tensor{normal(r, 0, 1, 3, 4, 50)}},
		{name: "pad", kind: "pad", attrs: map[string]any{"axis": 1, "before": 2, "after": 1, "value": 0.25},
			layer: &nn.Pad{Axis: 1, Before: 2, After: 1, Value: 0.25}, in: []*nn.Tensor{normal(r, 0, 1, 2, 3, 4, 2)}},
	}
	for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
		a, b := []int{2, 3, 5, 4}, []int{2, 3, 4, 6}
		if tr[0] {
			a[2], a[3] = a[3], a[2]
		}
		if tr[1] {
			b[2], b[3] = b[3], b[2]
		}
		cases = append(cases, torchLayerCase{name: fmt.Sprintf("matmul-%v-%v", tr[0], tr[1]), kind: "matmul",
			attrs: map[string]any{"transA": tr[0], "transB": tr[1]}, layer: &nn.MatMul{TransA: tr[0], TransB: tr[1]},
			in: []*nn.Tensor{normal(r, 0, 1, a...), normal(r, 0, 1, b...)}})
	}
	for _, op := range []string{"add", "sub", "mul", "div"} {
		for k, sh := range [][2][]int{{{3, 1, 5}, {1, 4, 5}}, {{4, 5}, {4, 5}}, {{4, 1}, {1, 6}}} {
			cases = append(cases, torchLayerCase{name: fmt.Sprintf("broadcast-%s-%d", op, k), kind: "broadcast",
				attrs: map[string]any{"op": op}, layer: &nn.Broadcast{Op: op},
				in: []*nn.Tensor{normal(r, 2, 0.5, append([]int{3}, sh[0]...)...), normal(r, 2, 0.5, append([]int{3}, sh[1]...)...)}})
		}
	}
	for _, op := range []string{"add", "sub", "rsub", "mul", "div", "rdiv", "pow"} {
		for k, sh := range [][2][]int{{{4, 6}, {1, 6}}, {{2, 3, 4}, {2, 1, 4}}, {{3, 5}, {1, 1}}} {
			x, s := sh[0], sh[1]
			konst := nn.F32(normal(r, 1.5, 0.3, nn.Size(s)))
			in := []*nn.Tensor{normal(r, 1.5, 0.3, append([]int{3}, x...)...)}
			cases = append(cases, torchLayerCase{name: fmt.Sprintf("broadcastop-%s-const-%d", op, k), kind: "broadcastop",
				attrs: map[string]any{"op": op, "shape": s, "const": konst}, layer: broadcastConst(op, s, konst), in: in})
			if op == "pow" {
				continue
			}
			m := make([]int32, nn.Size(s))
			for i := range m {
				m[i] = int32(i*7) % 4
			}
			cases = append(cases, torchLayerCase{name: fmt.Sprintf("broadcastop-%s-map-%d", op, k), kind: "broadcastop",
				attrs: map[string]any{"op": op, "shape": s, "map": m}, layer: broadcastParam(op, s, newP(4), m), in: in})
		}
	}
	cases = append(cases, torchLayerCase{name: "parambroadcast", kind: "parambroadcast",
		attrs: map[string]any{"shape": []int{2, 3}, "map": []int32{0, 2, 2, 1, 0, 0}},
		layer: &nn.ParamBroadcast{Shape: []int{2, 3}, P: newP(3), Map: []int32{0, 2, 2, 1, 0, 0}}, in: []*nn.Tensor{nn.New(4, 2)}})

	type result struct {
		out    []float32
		grads  [][]float32
		pgrads [][]float32
	}
	var reqCases []map[string]any
	got := map[string]result{}
	be, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := &nn.Ctx{Backend: be, Train: true}
	for _, c := range cases {
		shapes := make([][]int, len(c.in))
		for i, x := range c.in {
			shapes[i] = x.Shape()[1:]
		}
		if _, err := c.layer.Build(shapes); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		params := []torchSpec{}
		for _, p := range c.layer.Params() {
			copy(nn.F32(p.Value), nn.F32(normal(r, 1, 0.4, len(nn.F32(p.Value)))))
			clear(nn.F32(p.Grad))
			params = append(params, torchSpec{Shape: p.Value.Shape(), Data: specOf(p.Value).Data})
		}
		var s nn.Slot
		y := c.layer.Forward(ctx, &s, c.in)
		dout := normal(r, 0, 1, y.Shape()...)
		res := result{out: append([]float32(nil), nn.F32(y)...)}
		need := make([]bool, len(c.in))
		for i := range need {
			need[i] = true
		}
		for _, g := range c.layer.Backward(ctx, &s, c.in, y, dout, need) {
			if g == nil {
				res.grads = append(res.grads, nil)
			} else {
				res.grads = append(res.grads, append([]float32(nil), nn.F32(g)...))
			}
		}
		for _, p := range c.layer.Params() {
			res.pgrads = append(res.pgrads, append([]float32(nil), nn.F32(p.Grad)...))
		}
		got[c.name] = res
		var ins []torchSpec
		for i, x := range c.in {
			sp := specOf(x)
			sp.Int = c.ints != nil && c.ints[i] || c.kind == "parambroadcast"
			ins = append(ins, sp)
		}
		attrs := c.attrs
		if attrs == nil {
			attrs = map[string]any{}
		}
		reqCases = append(reqCases, map[string]any{"name": c.name, "kind": c.kind, "attrs": attrs,
			"inputs": ins, "params": params, "dout": specOf(dout)})
	}
	req, err := json.Marshal(map[string]any{"cases": reqCases})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(torchPython, "testdata/torch_layers_tf.py")
	cmd.Stdin = strings.NewReader(string(req))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("PyTorch: %v\n%s", err, stderr.String())
	}
	var want map[string]struct {
		Out    []float64   `json:"out"`
		Grads  [][]float64 `json:"grads"`
		PGrads [][]float64 `json:"pgrads"`
	}
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	const tol = 1e-5
	worst := 0.0
	check := func(name string, g []float32, w []float64) {
		if len(g) != len(w) {
			t.Errorf("%s: %d values, PyTorch %d", name, len(g), len(w))
			return
		}
		scale := 0.0
		for _, v := range w {
			scale = math.Max(scale, math.Abs(v))
		}
		for i, v := range g {
			d := math.Abs(float64(v) - w[i])
			if !(d <= tol*scale) {
				t.Errorf("%s[%d] = %v, PyTorch %v (difference %.3g of the largest magnitude %.3g)", name, i, v, w[i], d/scale, scale)
				return
			}
			if scale > 0 {
				worst = math.Max(worst, d/scale)
			}
		}
	}
	for _, c := range cases {
		g, w := got[c.name], want[c.name]
		check(c.name+" output", g.out, w.Out)
		for i, gi := range g.grads {
			switch {
			case c.kind == "embedding" || c.kind == "parambroadcast":
				if gi != nil {
					t.Errorf("%s: input %d has a gradient", c.name, i)
				}
			case i >= len(w.Grads) || w.Grads[i] == nil:
				t.Errorf("%s: PyTorch gave no gradient for input %d", c.name, i)
			default:
				check(fmt.Sprintf("%s input %d gradient", c.name, i), gi, w.Grads[i])
			}
		}
		for i, gi := range g.pgrads {
			check(fmt.Sprintf("%s parameter %d gradient", c.name, i), gi, w.PGrads[i])
		}
	}
	t.Logf("%d layers: largest difference %.3g of a tensor's largest magnitude", len(cases), worst)
}

// detCase is a layer with inputs for the determinism and allocation
// tests.
type detCase struct {
	name  string
	layer func() nn.Layer
	in    func() []*nn.Tensor
}

func transformerDetCases() []detCase {
	r := rand.New(rand.NewPCG(3, 4))
	causal := make([]bool, 32*32)
	for i := 0; i < 32; i++ {
		for j := i + 1; j < 32; j++ {
			causal[i*32+j] = true
		}
	}
	tok := nn.New(8, 32)
	for i := range nn.F32(tok) {
		nn.F32(tok)[i] = float32(r.IntN(50))
	}
	bias := nn.F32(normal(r, 0, 1, 96))
	return []detCase{
		{"layernorm", func() nn.Layer { return &nn.LayerNorm{Eps: 1e-5} }, func() []*nn.Tensor { return []*nn.Tensor{normal(r, 1, 2, 8, 32, 96)} }},
		{"layernorm-noaffine", func() nn.Layer { return &nn.LayerNorm{Eps: 1e-5, NoAffine: true} }, func() []*nn.Tensor { return []*nn.Tensor{normal(r, 1, 2, 8, 33, 95)} }},
		{"matmul", func() nn.Layer { return &nn.MatMul{TransB: true} }, func() []*nn.Tensor {
			return []*nn.Tensor{normal(r, 0, 1, 8, 4, 32, 24), normal(r, 0, 1, 8, 4, 32, 24)}
		}},
		{"matmul-few", func() nn.Layer { return &nn.MatMul{TransA: true} }, func() []*nn.Tensor {
			return []*nn.Tensor{normal(r, 0, 1, 3, 96, 80), normal(r, 0, 1, 3, 96, 70)}
		}},
		{"embedding", func() nn.Layer { return &nn.Embedding{Num: 50, Dim: 96} }, func() []*nn.Tensor { return []*nn.Tensor{tok} }},
		{"broadcast", func() nn.Layer { return &nn.Broadcast{Op: "mul"} }, func() []*nn.Tensor {
			return []*nn.Tensor{normal(r, 0, 1, 8, 32, 1, 96), normal(r, 0, 1, 8, 1, 32, 96)}
		}},
		{"broadcastop-bias", func() nn.Layer { return broadcastParam("add", []int{1, 96}, newP(96), nil) }, func() []*nn.Tensor {
			return []*nn.Tensor{normal(r, 0, 1, 8, 32, 96)}
		}},
		{"broadcastop-scale", func() nn.Layer { return broadcastParam("mul", []int{1, 96}, newP(96), nil) }, func() []*nn.Tensor {
			return []*nn.Tensor{normal(r, 0, 1, 8, 32, 96)}
		}},
		{"broadcastop-rows", func() nn.Layer { return broadcastConst("div", []int{32, 1}, bias[:32]) }, func() []*nn.Tensor {
			return []*nn.Tensor{normal(r, 0, 1, 8, 32, 96)}
		}},
		{"mask", func() nn.Layer { return &nn.Mask{Shape: []int{1, 32, 32}, Mask: causal, Fill: float32(math.Inf(-1))} }, func() []*nn.Tensor {
			return []*nn.Tensor{normal(r, 0, 1, 8, 4, 32, 32)}
		}},
		{"take", func() nn.Layer { return &nn.Take{Axis: 0, Index: []int{31, 0, 31, 5}} }, func() []*nn.Tensor {
			return []*nn.Tensor{normal(r, 0, 1, 8, 32, 96)}
		}},
		{"parambroadcast", func() nn.Layer { return &nn.ParamBroadcast{Shape: []int{1, 96}, P: newP(96)} }, func() []*nn.Tensor {
			return []*nn.Tensor{normal(r, 0, 1, 64, 3)}
		}},
	}
}

// The layers give the same bits at every thread count with the
// deterministic backend.
func TestTransformerLayersDeterministicAcrossThreads(t *testing.T) {
	for _, c := range transformerDetCases() {
		t.Run(c.name, func(t *testing.T) {
			l := c.layer()
			xs := c.in()
			shapes := make([][]int, len(xs))
			need := make([]bool, len(xs))
			for i, x := range xs {
				shapes[i] = x.Shape()[1:]
				need[i] = true
			}
			if _, err := l.Build(shapes); err != nil {
				t.Fatal(err)
			}
			randomParams(l, 3)
			out1, din1, dp1 := runPass(t, l, 1, xs, nil, need)
			for _, threads := range []int{2, 3, 8} {
				out, din, dp := runPass(t, l, threads, xs, nil, need)
				sameBits(t, fmt.Sprintf("output at %d threads", threads), out, out1)
				for i := range din {
					sameBits(t, fmt.Sprintf("input %d gradient at %d threads", i, threads), din[i], din1[i])
				}
				for i := range dp {
					sameBits(t, fmt.Sprintf("parameter %d gradient at %d threads", i, threads), dp[i], dp1[i])
				}
			}
		})
	}
}

// serialBackend hides the deterministic backend's type, so that MatMul
// takes its path for backends without a single-threaded twin.
type serialBackend struct{ nn.Backend }

// MatMul gives the deterministic backend's bits on a backend it knows
// nothing about (its products run one after another).
func TestMatMulUnknownBackend(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	a, b := normal(r, 0, 1, 4, 3, 20, 30), normal(r, 0, 1, 4, 3, 30, 10)
	run := func(be nn.Backend) [][]float32 {
		l := &nn.MatMul{}
		if _, err := l.Build([][]int{{3, 20, 30}, {3, 30, 10}}); err != nil {
			t.Fatal(err)
		}
		c := &nn.Ctx{Backend: be, Train: true}
		var s nn.Slot
		y := l.Forward(c, &s, []*nn.Tensor{a, b})
		out := [][]float32{append([]float32(nil), nn.F32(y)...)}
		for _, g := range l.Backward(c, &s, []*nn.Tensor{a, b}, y, ramp(y.Shape()...), []bool{true, true}) {
			out = append(out, append([]float32(nil), nn.F32(g)...))
		}
		return out
	}
	be2, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	want, got := run(gonum1(t)), run(serialBackend{be2})
	for i := range want {
		sameBits(t, fmt.Sprintf("tensor %d", i), got[i], want[i])
	}
}

// A steady-state forward and backward pass of LayerNorm and MatMul
// allocates nothing, at one thread and at two.
func TestTransformerLayersAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, c := range transformerDetCases()[:4] {
		for _, threads := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/threads=%d", c.name, threads), func(t *testing.T) {
				be, err := nn.NewBackend("ppnode-det", threads, true)
				if err != nil {
					t.Fatal(err)
				}
				l := c.layer()
				xs := c.in()
				shapes := make([][]int, len(xs))
				need := make([]bool, len(xs))
				for i, x := range xs {
					shapes[i] = x.Shape()[1:]
					need[i] = true
				}
				if _, err := l.Build(shapes); err != nil {
					t.Fatal(err)
				}
				ctx := &nn.Ctx{Backend: be, Train: true}
				var s nn.Slot
				var dout *nn.Tensor
				step := func() {
					y := l.Forward(ctx, &s, xs)
					if dout == nil {
						dout = ramp(y.Shape()...)
					}
					l.Backward(ctx, &s, xs, y, dout, need)
				}
				runtime.GC()
				step()
				if a := testing.AllocsPerRun(20, step); a != 0 {
					t.Errorf("%v allocations per pass", a)
				}
			})
		}
	}
}

// benchPass times a forward and backward pass of l on xs.
func benchPass(b *testing.B, l nn.Layer, xs []*nn.Tensor) {
	shapes := make([][]int, len(xs))
	need := make([]bool, len(xs))
	for i, x := range xs {
		shapes[i] = x.Shape()[1:]
		need[i] = true
	}
	if _, err := l.Build(shapes); err != nil {
		b.Fatal(err)
	}
	randomParams(l, 1)
	for _, name := range nn.Backends() {
		for _, threads := range []int{1, 2} {
			be, err := nn.NewBackend(name, threads, false)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(fmt.Sprintf("%s/threads=%d", name, threads), func(b *testing.B) {
				ctx := &nn.Ctx{Backend: be, Train: true}
				var s nn.Slot
				y := l.Forward(ctx, &s, xs)
				dout := ramp(y.Shape()...)
				l.Backward(ctx, &s, xs, y, dout, need)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					y := l.Forward(ctx, &s, xs)
					l.Backward(ctx, &s, xs, y, dout, need)
				}
			})
		}
	}
}

// GPT-sized passes (d = 256, 4 heads, context 128, 16 sequences):
// LayerNorm over [2048, 256], attention's q·kᵀ as 16 samples of
// [4, 128, 64]·[4, 64, 128].
func BenchmarkLayerNorm(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	benchPass(b, &nn.LayerNorm{Eps: 1e-5}, []*nn.Tensor{normal(r, 0.5, 2, 2048, 256)})
}

func BenchmarkMatMul(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	benchPass(b, &nn.MatMul{}, []*nn.Tensor{normal(r, 0, 1, 16, 4, 128, 64), normal(r, 0, 1, 16, 4, 64, 128)})
}
