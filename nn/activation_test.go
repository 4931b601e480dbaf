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

// gradCase is one gradient check of a layer made fresh for it.
type gradCase struct {
	name  string
	layer func() nn.Layer
	in    [][]int
	opt   nntest.Options
}

func runGradCases(t *testing.T, cases []gradCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nntest.GradCheck(t, c.layer(), c.in, c.opt)
		})
	}
}

// uniformIn draws inputs uniform in [lo, hi].
func uniformIn(lo, hi float64) func(r *rand.Rand) float32 {
	return func(r *rand.Rand) float32 { return float32(lo + (hi-lo)*r.Float64()) }
}

// awayIn draws inputs with magnitude in [lo, hi] and a random sign.
func awayIn(lo, hi float64) func(r *rand.Rand) float32 {
	return func(r *rand.Rand) float32 {
		v := lo + (hi-lo)*r.Float64()
		if r.IntN(2) == 0 {
			v = -v
		}
		return float32(v)
	}
}

func TestGradCheckActivations(t *testing.T) {
	shapes := [][]int{{7}, {2, 3, 4}}
	kinds := []struct {
		name  string
		layer func() nn.Layer
		opt   nntest.Options
	}{
		{"sigmoid", func() nn.Layer { return nn.Sigmoid{} }, nntest.Options{}},
		{"sigmoid-wide", func() nn.Layer { return nn.Sigmoid{} }, nntest.Options{Input: uniformIn(-6, 6)}},
		{"tanh", func() nn.Layer { return nn.Tanh{} }, nntest.Options{}},
		{"tanh-wide", func() nn.Layer { return nn.Tanh{} }, nntest.Options{Input: uniformIn(-3, 3)}},
		{"leakyrelu", func() nn.Layer { return nn.LeakyReLU{Alpha: 0.01} }, nntest.Options{}},
		{"leakyrelu-0.2", func() nn.Layer { return nn.LeakyReLU{Alpha: 0.2} }, nntest.Options{}},
		{"leakyrelu-negative", func() nn.Layer { return nn.LeakyReLU{Alpha: -0.5} }, nntest.Options{}},
		{"gelu", func() nn.Layer { return nn.GELU{} }, nntest.Options{}},
		{"gelu-wide", func() nn.Layer { return nn.GELU{} }, nntest.Options{Input: uniformIn(-5, 5)}},
		{"erf", func() nn.Layer { return nn.Erf{} }, nntest.Options{}},
		{"erf-wide", func() nn.Layer { return nn.Erf{} }, nntest.Options{Input: uniformIn(-3, 3)}},
		{"softmax", func() nn.Layer { return nn.Softmax{} }, nntest.Options{}},
		{"softmax-wide", func() nn.Layer { return nn.Softmax{} }, nntest.Options{Input: uniformIn(-4, 4)}},
		{"logsoftmax", func() nn.Layer { return nn.LogSoftmax{} }, nntest.Options{}},
		{"logsoftmax-wide", func() nn.Layer { return nn.LogSoftmax{} }, nntest.Options{Input: uniformIn(-4, 4)}},
	}
	var cases []gradCase
	for _, k := range kinds {
		for _, s := range shapes {
			cases = append(cases, gradCase{fmt.Sprintf("%s%v", k.name, s), k.layer, [][]int{s}, k.opt})
		}
	}
	cases = append(cases,
		gradCase{"softmax-width1", func() nn.Layer { return nn.Softmax{} }, [][]int{{4, 1}}, nntest.Options{}},
		gradCase{"logsoftmax-width1", func() nn.Layer { return nn.LogSoftmax{} }, [][]int{{4, 1}}, nntest.Options{}},
		gradCase{"softmax-rows", func() nn.Layer { return nn.Softmax{} }, [][]int{{3, 2, 9}}, nntest.Options{Batch: 4}},
		gradCase{"logsoftmax-rows", func() nn.Layer { return nn.LogSoftmax{} }, [][]int{{3, 2, 9}}, nntest.Options{Batch: 4}},
	)
	runGradCases(t, cases)
}

// forward runs l (built for the per-sample shapes of xs) on xs and returns
// its output.
func forward(t *testing.T, l nn.Layer, xs ...*nn.Tensor) *nn.Tensor {
	t.Helper()
	shapes := make([][]int, len(xs))
	for i, x := range xs {
		shapes[i] = x.Shape()[1:]
	}
	if _, err := l.Build(shapes); err != nil {
		t.Fatal(err)
	}
	return l.Forward(&nn.Ctx{Backend: gonum1(t)}, &nn.Slot{}, xs)
}

func gonum1(t testing.TB) nn.Backend {
	be, err := nn.NewBackend("ppnode-det", 1, true)
	if err != nil {
		t.Fatal(err)
	}
	return be
}

// Softmax rows sum to one and exp(LogSoftmax) is Softmax; an exact shift of
// a row changes no bit of either; rows of huge values neither overflow nor
// lose the answer.
func TestSoftmaxRows(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n, rows, w = 3, 4, 11
	x, shifted, huge := nn.New(n, rows, w), nn.New(n, rows, w), nn.New(n, rows, w)
	for i := range nn.F32(x) {
		// Multiples of 2⁻¹⁰ in ±8: adding 64 is exact.
		v := float32(math.Round(4*r.NormFloat64()*1024)) / 1024
		v = max(-8, min(8, v))
		nn.F32(x)[i], nn.F32(shifted)[i], nn.F32(huge)[i] = v, v+64, v+1e4
	}
	sm := nn.F32(forward(t, nn.Softmax{}, x))
	lsm := nn.F32(forward(t, nn.LogSoftmax{}, x))
	for row := 0; row < n*rows; row++ {
		var sum float64
		for j := 0; j < w; j++ {
			k := row*w + j
			sum += float64(sm[k])
			if sm[k] < 0 || sm[k] > 1 {
				t.Fatalf("softmax[%d] = %v is not a probability", k, sm[k])
			}
			// Each rounds once: softmax to 2⁻²⁴ of itself, logsoftmax to
			// 2⁻²⁴ of |logsoftmax|, which exp turns into a relative error.
			tol := 0x1p-24 * (2 + math.Abs(float64(lsm[k]))) * float64(sm[k])
			if e := math.Exp(float64(lsm[k])); math.Abs(e-float64(sm[k])) > tol {
				t.Errorf("exp(logsoftmax[%d]) = %v, softmax %v", k, e, sm[k])
			}
		}
		if math.Abs(sum-1) > 1e-6 {
			t.Errorf("row %d of softmax sums to %v", row, sum)
		}
	}
	sameBits(t, "softmax of the shifted rows", nn.F32(forward(t, nn.Softmax{}, shifted)), sm)
	sameBits(t, "logsoftmax of the shifted rows", nn.F32(forward(t, nn.LogSoftmax{}, shifted)), lsm)
	// x + 1e4 rounds to steps of 2⁻¹⁰ (exact here too), but exp(1e4)
	// overflows float64: only the subtracted maximum keeps this finite.
	sameBits(t, "softmax of rows near 1e4", nn.F32(forward(t, nn.Softmax{}, huge)), sm)
	sameBits(t, "logsoftmax of rows near 1e4", nn.F32(forward(t, nn.LogSoftmax{}, huge)), lsm)
}

// torchRef computes the forward outputs of activations in PyTorch from the
// same float32 inputs, in float64 ("f64/") and in float32 ("f32/"), and
// GELU as 0.5·x·erfc(-x/√2) in float64 ("exact/gelu"), whose tail does not
// cancel as PyTorch's 0.5·x·(1+erf(x/√2)) does below x ≈ -6.
const torchRef = `
import json, math, sys
import numpy as np
import torch
import torch.nn.functional as F
req = json.load(sys.stdin)
x64 = torch.tensor(np.array(req["x"], dtype=np.float64).reshape(req["shape"]))
out = {"exact/gelu": (0.5 * x64 * torch.erfc(-x64 / math.sqrt(2))).reshape(-1).tolist()}
for dt, x in (("f64", x64), ("f32", x64.float())):
    ops = {
        "gelu": F.gelu(x),
        "erf": torch.erf(x),
        "sigmoid": torch.sigmoid(x),
        "tanh": torch.tanh(x),
        "leakyrelu0.01": F.leaky_relu(x, 0.01),
        "leakyrelu0.2": F.leaky_relu(x, 0.2),
        "softmax": F.softmax(x, dim=-1),
        "logsoftmax": F.log_softmax(x, dim=-1),
    }
    for k, v in ops.items():
        out[dt + "/" + k] = v.double().reshape(-1).tolist()
json.dump(out, sys.stdout)
`

// The activations' forward outputs agree with PyTorch's float64 on the
// same float32 inputs (the exact answer) within 1e-6 of each value; GELU
// below x = -6, where PyTorch's float64 formula cancels, is held to the
// erfc form instead. PyTorch's float32 is matched within 1e-6 of each value
// plus its own cancellation, 2⁻²²·|x| (2⁻²² of the row's largest |x| for
// the softmaxes): its GELU computes 1+erf in float32 and loses up to 1e-3
// of the value for x in (-4, 0), where ppnode's is the correctly rounded
// one.
func TestActivationsMatchTorch(t *testing.T) {
	needTorch(t)
	r := rand.New(rand.NewPCG(5, 6))
	const n, w = 40, 9
	x := nn.New(n, w)
	xd := nn.F32(x)
	for i := range xd {
		xd[i] = float32(16*r.Float64() - 8)
	}
	// Edge values: zeros, tiny and large magnitudes, and rows that need the
	// maximum subtracted to keep exp in float32's range.
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-3, -1e-3, 1e-20, -1e-20, 5.75, -5.75, 0.5, -0.5, 3, -3, -7.5, -9}
	copy(xd, special)
	for j := 0; j < w; j++ {
		xd[2*w+j] = 90 - float32(j)
		xd[3*w+j] = -30 + 7.5*float32(j)
	}
	vals := make([]float64, len(xd))
	for i, v := range xd {
		vals[i] = float64(v)
	}
	req, _ := json.Marshal(map[string]any{"x": vals, "shape": []int{n, w}})
	cmd := exec.Command(torchPython, "-c", torchRef)
	cmd.Stdin = strings.NewReader(string(req))
	res, err := cmd.Output()
	if err != nil {
		t.Fatalf("PyTorch: %v", err)
	}
	var want map[string][]float64
	if err := json.Unmarshal(res, &want); err != nil {
		t.Fatal(err)
	}
	rowMax := make([]float64, len(xd))
	for i := range xd {
		for j := i / w * w; j < (i/w+1)*w; j++ {
			rowMax[i] = math.Max(rowMax[i], math.Abs(float64(xd[j])))
		}
	}
	layers := []struct {
		name string
		l    nn.Layer
	}{
		{"gelu", nn.GELU{}}, {"erf", nn.Erf{}}, {"sigmoid", nn.Sigmoid{}}, {"tanh", nn.Tanh{}},
		{"leakyrelu0.01", nn.LeakyReLU{Alpha: 0.01}}, {"leakyrelu0.2", nn.LeakyReLU{Alpha: 0.2}},
		{"softmax", nn.Softmax{}}, {"logsoftmax", nn.LogSoftmax{}},
	}
	for _, c := range layers {
		got := nn.F32(forward(t, c.l, x))
		for _, dt := range []string{"f64", "f32"} {
			ref := want[dt+"/"+c.name]
			if len(ref) != len(got) {
				t.Fatalf("%s: PyTorch %s gave %d values for %d", c.name, dt, len(ref), len(got))
			}
			worst, at, bad := 0.0, 0, false
			for i, g := range got {
				wv, allow := ref[i], 0.0
				switch {
				case dt == "f64" && c.name == "gelu" && xd[i] < -6:
					wv = want["exact/gelu"][i]
				case dt == "f32" && (c.name == "softmax" || c.name == "logsoftmax"):
					allow = 0x1p-22 * rowMax[i]
				case dt == "f32":
					allow = 0x1p-22 * math.Abs(float64(xd[i]))
				}
				wv = float64(float32(wv))
				d := math.Abs(float64(g) - wv)
				rel := d / math.Abs(wv)
				if wv != 0 && rel > worst || math.IsNaN(float64(g)) {
					worst, at = rel, i
				}
				if d > 1e-6*math.Abs(wv)+allow || math.IsNaN(float64(g)) {
					t.Errorf("%s vs PyTorch %s: at x[%d] = %v ppnode %v, PyTorch %v (relative difference %.3g)", c.name, dt, i, xd[i], g, wv, rel)
					bad = true
					break
				}
			}
			if !bad {
				t.Logf("%-13s vs PyTorch %s: largest relative difference %.3g (x = %v)", c.name, dt, worst, xd[at])
			}
		}
	}
}

// runPass runs one forward and one backward pass of layer l, built for
// the per-sample shapes of xs, with the given thread count, and returns
// copies of the output, the input gradients (nil where not needed) and the
// parameter gradients (which start at zero).
func runPass(t *testing.T, l nn.Layer, threads int, xs []*nn.Tensor, dout *nn.Tensor, need []bool) (out []float32, din, dparams [][]float32) {
	t.Helper()
	be, err := nn.NewBackend("ppnode-det", threads, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Params() {
		clear(nn.F32(p.Grad))
	}
	c := &nn.Ctx{Backend: be, Train: true}
	var s nn.Slot
	y := l.Forward(c, &s, xs)
	out = append([]float32(nil), nn.F32(y)...)
	if dout == nil {
		dout = ramp(y.Shape()...)
	}
	for _, g := range l.Backward(c, &s, xs, y, dout, need) {
		if g == nil {
			din = append(din, nil)
		} else {
			din = append(din, append([]float32(nil), nn.F32(g)...))
		}
	}
	for _, p := range l.Params() {
		dparams = append(dparams, append([]float32(nil), nn.F32(p.Grad)...))
	}
	return out, din, dparams
}

// ramp is a tensor of deterministic, irregular values in about ±1.
func ramp(shape ...int) *nn.Tensor {
	t := nn.New(shape...)
	for i := range nn.F32(t) {
		nn.F32(t)[i] = float32(math.Sin(float64(i)*0.7311+0.3)) * 0.9
	}
	return t
}

// randomParams sets a built layer's parameters to values near their
// initial ones.
func randomParams(l nn.Layer, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 9))
	for _, p := range l.Params() {
		for i := range nn.F32(p.Value) {
			nn.F32(p.Value)[i] = float32(1 + 0.3*r.NormFloat64())
		}
	}
}

// newLayers returns fresh copies of every layer this change adds, with the
// per-sample input shapes to try them on, for the determinism and
// allocation tests.
func newLayers() []gradCase {
	big := []int{12, 96} // 1152 per sample: several chunks at 64 samples
	return []gradCase{
		{"sigmoid", func() nn.Layer { return nn.Sigmoid{} }, [][]int{big}, nntest.Options{}},
		{"tanh", func() nn.Layer { return nn.Tanh{} }, [][]int{big}, nntest.Options{}},
		{"leakyrelu", func() nn.Layer { return nn.LeakyReLU{Alpha: 0.1} }, [][]int{big}, nntest.Options{}},
		{"gelu", func() nn.Layer { return nn.GELU{} }, [][]int{big}, nntest.Options{}},
		{"erf", func() nn.Layer { return nn.Erf{} }, [][]int{big}, nntest.Options{}},
		{"softmax", func() nn.Layer { return nn.Softmax{} }, [][]int{big}, nntest.Options{}},
		{"logsoftmax", func() nn.Layer { return nn.LogSoftmax{} }, [][]int{big}, nntest.Options{}},
		{"sub", func() nn.Layer { return nn.Binary{Op: "sub"} }, [][]int{big, big}, nntest.Options{}},
		{"mul", func() nn.Layer { return nn.Binary{Op: "mul"} }, [][]int{big, big}, nntest.Options{}},
		{"div", func() nn.Layer { return nn.Binary{Op: "div"} }, [][]int{big, big}, nntest.Options{}},
		{"scalar-rdiv", func() nn.Layer { return nn.Scalar{Op: "rdiv", C: 3} }, [][]int{big}, nntest.Options{}},
		{"scalar-pow", func() nn.Layer { return nn.Scalar{Op: "pow", C: 3} }, [][]int{big}, nntest.Options{}},
		{"permute", func() nn.Layer { return &nn.Permute{Perm: []int{2, 0, 1}} }, [][]int{{6, 8, 24}}, nntest.Options{}},
		{"permute-identity", func() nn.Layer { return &nn.Permute{Perm: []int{0, 2, 1}} }, [][]int{{6, 1, 24}}, nntest.Options{}},
		{"reshape", func() nn.Layer { return &nn.Reshape{Shape: []int{8, 3, 48}} }, [][]int{big}, nntest.Options{}},
		{"linear-transposed", func() nn.Layer { return &nn.Linear{In: 96, Out: 40, Transposed: true} }, [][]int{{96}}, nntest.Options{}},
		{"linear-nobias", func() nn.Layer { return &nn.Linear{In: 96, Out: 40, NoBias: true} }, [][]int{{96}}, nntest.Options{}},
	}
}

// The new layers give the same bits at every thread count: their parallel
// loops split only independent work.
func TestNewLayersDeterministicAcrossThreads(t *testing.T) {
	const batch = 64
	for _, c := range newLayers() {
		t.Run(c.name, func(t *testing.T) {
			l := c.layer()
			if _, err := l.Build(c.in); err != nil {
				t.Fatal(err)
			}
			randomParams(l, 3)
			xs := make([]*nn.Tensor, len(c.in))
			need := make([]bool, len(c.in))
			for i, s := range c.in {
				xs[i] = ramp(append([]int{batch}, s...)...)
				for j := range nn.F32(xs[i]) {
					nn.F32(xs[i])[j] += float32(2*i) + 0.01 // keep divisors away from 0
				}
				need[i] = true
			}
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

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: [%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// A steady-state pass of a new layer allocates no tensors: a few bytes for
// the parallel loops' closures, the same at every batch size.
func TestNewLayersSteadyStateAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	be := gonum1(t)
	c := &nn.Ctx{Backend: be, Train: true}
	for _, lc := range newLayers() {
		t.Run(lc.name, func(t *testing.T) {
			l := lc.layer()
			if _, err := l.Build(lc.in); err != nil {
				t.Fatal(err)
			}
			randomParams(l, 3)
			bytes := map[int]float64{}
			for _, batch := range []int{4, 64} {
				xs := make([]*nn.Tensor, len(lc.in))
				need := make([]bool, len(lc.in))
				for i, s := range lc.in {
					xs[i] = ramp(append([]int{batch}, s...)...)
					need[i] = true
				}
				var s nn.Slot
				var dout *nn.Tensor
				step := func() {
					y := l.Forward(c, &s, xs)
					if dout == nil {
						dout = ramp(y.Shape()...)
					}
					l.Backward(c, &s, xs, y, dout, need)
				}
				// Collect before the warm-up pass: a collection empties the
				// GEMM backend's pool of packing scratch.
				runtime.GC()
				step()
				var before, after runtime.MemStats
				const runs = 20
				runtime.ReadMemStats(&before)
				for i := 0; i < runs; i++ {
					step()
				}
				runtime.ReadMemStats(&after)
				bytes[batch] = float64(after.TotalAlloc-before.TotalAlloc) / runs
			}
			t.Logf("%.0f bytes a pass at batch 4, %.0f at batch 64", bytes[4], bytes[64])
			if bytes[64] > 512 || bytes[64] > bytes[4]+64 {
				t.Errorf("a pass allocates %.0f bytes at batch 4 and %.0f at batch 64", bytes[4], bytes[64])
			}
		})
	}
}
