package nn_test

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/nntest"
	"github.com/ppnode/ppnode/tensorio"
)

// runLayer builds l on per-sample input shape in, fills its parameters and
// an input batch of n samples from r, and runs one forward and one backward
// pass with a random output gradient. It returns the input, the output, the
// output gradient, the input gradient and the parameters.
func runLayer(t testing.TB, be nn.Backend, l nn.Layer, in []int, n int, r *rand.Rand) (x, y, dy, dx *nn.Tensor, ps []*nn.Param) {
	t.Helper()
	out, err := l.Build([][]int{in})
	if err != nil {
		t.Fatal(err)
	}
	ps = l.Params()
	for _, p := range ps {
		for i := range nn.F32(p.Value) {
			nn.F32(p.Value)[i] = float32(r.NormFloat64())
		}
		clear(nn.F32(p.Grad))
	}
	x = nn.New(append([]int{n}, in...)...)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(r.NormFloat64())
	}
	c := &nn.Ctx{Backend: be, Train: true}
	var s nn.Slot
	y = l.Forward(c, &s, []*nn.Tensor{x})
	if want := append([]int{n}, out...); !nn.SameShape(y.Shape(), want) {
		t.Fatalf("output shape %v, Build said %v", y.Shape(), want)
	}
	y = nn.FromData(append([]float32(nil), nn.F32(y)...), y.Shape()...)
	dy = nn.New(y.Shape()...)
	for i := range nn.F32(dy) {
		nn.F32(dy)[i] = float32(r.NormFloat64())
	}
	g := l.Backward(c, &s, []*nn.Tensor{x}, y, dy, []bool{true})
	dx = nn.FromData(append([]float32(nil), nn.F32(g[0])...), g[0].Shape()...)
	return x, y, dy, dx, ps
}

// The common convolutions (the zoo's geometries, built by NewConv2D) give
// exactly the bits they gave before grouped, dilated and asymmetric
// convolutions were added: the hash was recorded with that code, on the
// deterministic backend with two threads.
func TestConv2DCommonPathBits(t *testing.T) {
	be, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	put := func(v []float32) {
		for _, f := range v {
			binary.Write(h, binary.LittleEndian, math.Float32bits(f))
		}
	}
	r := rand.New(rand.NewPCG(11, 12))
	for _, c := range []struct {
		in, out, k, stride, pad int
		bias                    bool
		shape                   []int
	}{
		{3, 8, 3, 1, 1, false, []int{9, 7, 3}},
		{8, 6, 3, 2, 1, false, []int{8, 9, 8}},
		{6, 10, 1, 1, 0, false, []int{5, 4, 6}},
		{6, 10, 1, 2, 0, false, []int{5, 6, 6}},
		{4, 5, 2, 1, 0, true, []int{5, 5, 4}},
		{3, 7, 7, 2, 3, true, []int{11, 10, 3}},
		{5, 4, 3, 1, 0, true, []int{3, 3, 5}},
		{16, 24, 3, 1, 1, false, []int{16, 16, 16}}, // large enough for threaded GEMMs
	} {
		l := nn.NewConv2D(c.in, c.out, c.k, c.stride, c.pad)
		l.Bias = c.bias
		_, y, _, dx, ps := runLayer(t, be, l, c.shape, 5, r)
		put(nn.F32(y))
		put(nn.F32(dx))
		for _, p := range ps {
			put(nn.F32(p.Grad))
		}
	}
	const want = "6f8a4a13b3e340215af56d4ea8b5a297e0f3ca09d88803a5d245a11a9a22dfd7"
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		t.Fatalf("common-path convolution bits changed: hash %s, want %s", got, want)
	}
}

// BenchmarkConv2D times the common convolutions of resnet50 (width 0.25 on
// 32×32 inputs) forward, and forward plus backward.
func BenchmarkConv2D(b *testing.B) {
	be, err := nn.NewBackend("", 0, false)
	if err != nil {
		b.Fatal(err)
	}
	const n = 32
	for _, c := range []struct {
		name                    string
		in, out, k, stride, pad int
		shape                   []int
	}{
		{"3x3", 16, 16, 3, 1, 1, []int{32, 32, 16}},
		{"3x3-stride2", 32, 32, 3, 2, 1, []int{16, 16, 32}},
		{"1x1", 64, 16, 1, 1, 0, []int{16, 16, 64}},
		{"1x1-stride2", 64, 128, 1, 2, 0, []int{16, 16, 64}},
	} {
		l := nn.NewConv2D(c.in, c.out, c.k, c.stride, c.pad)
		r := rand.New(rand.NewPCG(1, 2))
		x, y, dy, _, _ := runLayer(b, be, l, c.shape, n, r)
		ctx := &nn.Ctx{Backend: be, Train: true}
		var s nn.Slot
		in := []*nn.Tensor{x}
		need := []bool{true}
		b.Run(fmt.Sprintf("%s/fwd", c.name), func(b *testing.B) {
			for b.Loop() {
				l.Forward(ctx, &s, in)
			}
		})
		b.Run(fmt.Sprintf("%s/fwdbwd", c.name), func(b *testing.B) {
			for b.Loop() {
				l.Forward(ctx, &s, in)
				l.Backward(ctx, &s, in, y, dy, need)
			}
		})
		// The layer's own loops (im2col, col2im) alone, on one thread:
		// the GEMMs do nothing.
		nop := &nn.Ctx{Backend: nopBackend{}, Train: true}
		b.Run(fmt.Sprintf("%s/nogemm-fwd", c.name), func(b *testing.B) {
			for b.Loop() {
				l.Forward(nop, &s, in)
			}
		})
		b.Run(fmt.Sprintf("%s/nogemm", c.name), func(b *testing.B) {
			for b.Loop() {
				l.Forward(nop, &s, in)
				l.Backward(nop, &s, in, y, dy, need)
			}
		})
	}
}

// nopBackend is a Backend whose GEMMs do nothing.
type nopBackend struct{}

func (nopBackend) Name() string        { return "nop" }
func (nopBackend) Deterministic() bool { return true }
func (nopBackend) Threads() int        { return 1 }
func (nopBackend) Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
}

// generalConvs are convolutions beyond NewConv2D's square ones: groups,
// depthwise, dilation, rectangular kernels, asymmetric pads and strides.
var generalConvs = []struct {
	name  string
	conv  func() *nn.Conv2D
	shape []int
}{
	{"groups2", func() *nn.Conv2D { return &nn.Conv2D{In: 4, Out: 6, K: 3, Pad: 1, Groups: 2} }, []int{5, 5, 4}},
	{"groups2-stride2", func() *nn.Conv2D { return &nn.Conv2D{In: 6, Out: 4, K: 3, Stride: 2, Pad: 1, Groups: 2} }, []int{6, 7, 6}},
	{"depthwise", func() *nn.Conv2D { return &nn.Conv2D{In: 3, Out: 3, K: 3, Pad: 1, Groups: 3} }, []int{5, 4, 3}},
	{"depthwise-x2-stride2", func() *nn.Conv2D { return &nn.Conv2D{In: 3, Out: 6, K: 3, Stride: 2, Pad: 1, Groups: 3} }, []int{6, 5, 3}},
	{"dilation2", func() *nn.Conv2D { return &nn.Conv2D{In: 2, Out: 3, K: 3, Pad: 2, DH: 2, DW: 2} }, []int{6, 7, 2}},
	{"dilation-2x1-nopad", func() *nn.Conv2D { return &nn.Conv2D{In: 2, Out: 3, K: 2, DH: 2} }, []int{6, 5, 2}},
	{"kernel3x1", func() *nn.Conv2D { return &nn.Conv2D{In: 2, Out: 3, KH: 3, KW: 1, PadT: 1, PadB: 1} }, []int{5, 4, 2}},
	{"kernel1x3-stride1x2", func() *nn.Conv2D { return &nn.Conv2D{In: 3, Out: 2, KH: 1, KW: 3, SW: 2, PadL: 1, PadR: 1} }, []int{4, 7, 3}},
	{"asym-pads-stride2x1", func() *nn.Conv2D {
		return &nn.Conv2D{In: 3, Out: 4, KH: 2, KW: 3, SH: 2, SW: 1, PadT: 0, PadL: 2, PadB: 1, PadR: 0}
	}, []int{6, 5, 3}},
	{"1x1-groups2", func() *nn.Conv2D { return &nn.Conv2D{In: 4, Out: 6, K: 1, Groups: 2} }, []int{3, 4, 4}},
	{"1x1-pad", func() *nn.Conv2D { return &nn.Conv2D{In: 3, Out: 2, K: 1, PadT: 1, PadR: 1} }, []int{3, 3, 3}},
	{"everything", func() *nn.Conv2D {
		return &nn.Conv2D{In: 4, Out: 6, KH: 3, KW: 2, SH: 1, SW: 2, PadT: 2, PadL: 1, PadB: 0, PadR: 2, DH: 2, DW: 1, Groups: 2}
	}, []int{7, 6, 4}},
}

func TestGradCheckConv2DGeneral(t *testing.T) {
	for _, c := range generalConvs {
		for _, bias := range []bool{false, true} {
			name := c.name
			if bias {
				name += "-bias"
			}
			t.Run(name, func(t *testing.T) {
				l := c.conv()
				l.Bias = bias
				nntest.GradCheck(t, l, [][]int{c.shape}, nntest.Options{})
			})
		}
	}
}

// naiveConv is the convolution written out, in float64: y, and for the
// output gradient dy the gradients of x, the weights and the bias. l has
// been built; x is [n, h, w, In], the result [n, ho, wo, Out].
func naiveConv(l *nn.Conv2D, x, wt, bias, dy []float32, n, h, w, ho, wo int) (y, dx, dw, db []float64) {
	cin, cout := l.In/l.Groups, l.Out/l.Groups
	y = make([]float64, n*ho*wo*l.Out)
	dx = make([]float64, len(x))
	dw = make([]float64, len(wt))
	db = make([]float64, l.Out)
	for b := 0; b < n; b++ {
		for oy := 0; oy < ho; oy++ {
			for ox := 0; ox < wo; ox++ {
				for o := 0; o < l.Out; o++ {
					yi := ((b*ho+oy)*wo+ox)*l.Out + o
					g := float64(dy[yi])
					s := 0.0
					if bias != nil {
						s = float64(bias[o])
						db[o] += g
					}
					for ky := 0; ky < l.KH; ky++ {
						for kx := 0; kx < l.KW; kx++ {
							for ci := 0; ci < cin; ci++ {
								iy := oy*l.SH - l.PadT + ky*l.DH
								ix := ox*l.SW - l.PadL + kx*l.DW
								if iy < 0 || iy >= h || ix < 0 || ix >= w {
									continue
								}
								xi := ((b*h+iy)*w+ix)*l.In + o/cout*cin + ci
								wi := ((o*l.KH+ky)*l.KW+kx)*cin + ci
								s += float64(x[xi]) * float64(wt[wi])
								dx[xi] += g * float64(wt[wi])
								dw[wi] += g * float64(x[xi])
							}
						}
					}
					y[yi] = s
				}
			}
		}
	}
	return y, dx, dw, db
}

// closeTo checks got against want within tol of want's largest magnitude.
func closeTo(t *testing.T, name string, tol float64, got []float32, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, want %d", name, len(got), len(want))
		return
	}
	scale := 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(v))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - want[i]); d > tol*scale || math.IsNaN(d) {
			t.Errorf("%s[%d] = %v, want %v (difference %.3g of the largest magnitude)", name, i, got[i], want[i], d/scale)
			return
		}
	}
}

// Forward and backward against the convolution written out as seven loops,
// within 1e-5 of each tensor's largest magnitude.
func TestConv2DNaiveReference(t *testing.T) {
	be, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	type tc struct {
		name  string
		conv  func() *nn.Conv2D
		shape []int
	}
	cases := []tc{
		{"3x3", func() *nn.Conv2D { return nn.NewConv2D(3, 5, 3, 1, 1) }, []int{6, 5, 3}},
		{"3x3-stride2", func() *nn.Conv2D { return nn.NewConv2D(4, 3, 3, 2, 1) }, []int{7, 6, 4}},
		{"1x1", func() *nn.Conv2D { return nn.NewConv2D(5, 4, 1, 1, 0) }, []int{3, 4, 5}},
		{"7x7-stride2", func() *nn.Conv2D { return nn.NewConv2D(3, 4, 7, 2, 3) }, []int{9, 8, 3}},
		{"wide", func() *nn.Conv2D {
			return &nn.Conv2D{In: 32, Out: 48, K: 3, Pad: 1, Groups: 4, DH: 2, PadT: 2, PadB: 2, PadL: 1, PadR: 1}
		}, []int{12, 10, 32}},
		{"depthwise-wide", func() *nn.Conv2D { return &nn.Conv2D{In: 24, Out: 24, K: 3, Stride: 2, Pad: 1, Groups: 24} }, []int{11, 12, 24}},
	}
	for _, c := range generalConvs {
		cases = append(cases, tc(c))
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range cases {
		for _, bias := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/bias=%v", c.name, bias), func(t *testing.T) {
				l := c.conv()
				l.Bias = bias
				const n = 3
				x, y, dy, dx, _ := runLayer(t, be, l, c.shape, n, r)
				var b []float32
				if bias {
					b = nn.F32(l.B.Value)
				}
				sh := y.Shape()
				wy, wdx, wdw, wdb := naiveConv(l, nn.F32(x), nn.F32(l.W.Value), b, nn.F32(dy), n, c.shape[0], c.shape[1], sh[1], sh[2])
				closeTo(t, "y", 1e-5, nn.F32(y), wy)
				closeTo(t, "dx", 1e-5, nn.F32(dx), wdx)
				closeTo(t, "dW", 1e-5, nn.F32(l.W.Grad), wdw)
				if bias {
					closeTo(t, "dB", 1e-5, nn.F32(l.B.Grad), wdb)
				}
			})
		}
	}
}

// Build fills in the defaults, keeps NewConv2D's shapes, and rejects what
// cannot be computed.
func TestConv2DDefaults(t *testing.T) {
	l := nn.NewConv2D(4, 6, 3, 2, 1)
	out, err := l.Build([][]int{{8, 7, 4}})
	if err != nil {
		t.Fatal(err)
	}
	got := []int{l.KH, l.KW, l.SH, l.SW, l.PadT, l.PadL, l.PadB, l.PadR, l.DH, l.DW, l.Groups}
	if want := []int{3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1}; !nn.SameShape(got, want) || !nn.SameShape(out, []int{4, 4, 6}) {
		t.Fatalf("NewConv2D(4, 6, 3, 2, 1) on 8x7x4: fields %v, output %v", got, out)
	}
	if !nn.SameShape(l.W.Value.Shape(), []int{6, 3, 3, 4}) || l.W.FanIn != 36 || l.W.Name != "weight" {
		t.Fatalf("weight %v fan-in %d name %q", l.W.Value.Shape(), l.W.FanIn, l.W.Name)
	}
	l = &nn.Conv2D{In: 6, Out: 4, KH: 3, KW: 1, PadT: 2, DH: 2, Groups: 2, Bias: true}
	out, err = l.Build([][]int{{5, 4, 6}})
	if err != nil {
		t.Fatal(err)
	}
	got = []int{l.KH, l.KW, l.SH, l.SW, l.PadT, l.PadL, l.PadB, l.PadR, l.DH, l.DW, l.Groups}
	if want := []int{3, 1, 1, 1, 2, 0, 0, 0, 2, 1, 2}; !nn.SameShape(got, want) || !nn.SameShape(out, []int{3, 4, 4}) {
		t.Fatalf("fields %v, output %v", got, out)
	}
	if !nn.SameShape(l.W.Value.Shape(), []int{4, 3, 1, 3}) || l.W.FanIn != 9 || l.B.Name != "bias" {
		t.Fatalf("weight %v fan-in %d", l.W.Value.Shape(), l.W.FanIn)
	}
	for _, c := range []struct {
		l     *nn.Conv2D
		shape []int
	}{
		{&nn.Conv2D{In: 4, Out: 6, K: 3, Groups: 3}, []int{5, 5, 4}},
		{&nn.Conv2D{In: 4, Out: 6, K: 3, Groups: 4}, []int{5, 5, 4}},
		{&nn.Conv2D{In: 4, Out: 4, K: 3, Groups: -1}, []int{5, 5, 4}},
		{&nn.Conv2D{In: 2, Out: 2, K: 3, DH: 3}, []int{6, 5, 2}},
		{&nn.Conv2D{In: 2, Out: 2, K: 3, Stride: 2}, []int{2, 5, 2}},
		{&nn.Conv2D{In: 2, Out: 2, KH: 3}, []int{5, 5, 2}},
		{&nn.Conv2D{In: 2, Out: 2, K: 3, PadL: -1}, []int{5, 5, 2}},
		{&nn.Conv2D{In: 2, Out: 2, K: 3, SW: -1}, []int{5, 5, 2}},
		{&nn.Conv2D{In: 2, Out: 2, K: 3, DW: -2}, []int{5, 5, 2}},
	} {
		if _, err := c.l.Build([][]int{c.shape}); err == nil {
			t.Errorf("%+v on %v accepted", *c.l, c.shape)
		}
	}
}

// The general paths give the same bits whatever the thread count.
func TestConv2DGeneralThreadsSameBits(t *testing.T) {
	var ref [][]float32
	for _, threads := range []int{1, 2, 3} {
		be, err := nn.NewBackend("ppnode-det", threads, true)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(7, 8))
		var got [][]float32
		for _, c := range generalConvs {
			l := c.conv()
			l.Bias = true
			_, y, _, dx, ps := runLayer(t, be, l, c.shape, 7, r)
			got = append(got, nn.F32(y), nn.F32(dx), nn.F32(ps[0].Grad), nn.F32(ps[1].Grad))
		}
		if ref == nil {
			ref = got
			continue
		}
		for i := range got {
			for j := range got[i] {
				if math.Float32bits(got[i][j]) != math.Float32bits(ref[i][j]) {
					t.Fatalf("%d threads: tensor %d element %d is %v, %v with one thread", threads, i, j, got[i][j], ref[i][j])
				}
			}
		}
	}
}

// torchRun runs script with Debian's PyTorch on the named tensors (written
// to a safetensors file) and spec (JSON), and returns the tensors it writes.
// The script gets the input file, the JSON and the output file as argv[1:4]
// and can import read_safetensors and write_safetensors from torch_step.
func torchRun(t *testing.T, script string, spec any, in []tensorio.Named) map[string][]float32 {
	t.Helper()
	dir := t.TempDir()
	if err := tensorio.SaveSafetensors(filepath.Join(dir, "in.safetensors"), in, nil); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	script = "import sys\nsys.path.insert(0, 'testdata')\nfrom torch_step import read_safetensors, write_safetensors\n" + strings.TrimSpace(script) + "\n"
	cmd := exec.Command(torchPython, "-c", script, filepath.Join(dir, "in.safetensors"), string(js), filepath.Join(dir, "out.safetensors"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("PyTorch: %v\n%s", err, out)
	}
	ts, _, err := tensorio.LoadSafetensors(filepath.Join(dir, "out.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	res := map[string][]float32{}
	for _, n := range ts {
		res[n.Name] = nn.F32(n.T)
	}
	return res
}

func named(name string, v *nn.Tensor) tensorio.Named {
	return tensorio.Named{Name: name, T: nn.FromData(append([]float32(nil), nn.F32(v)...), v.Shape()...)}
}

// torchConv computes, in float64, torch.nn.functional.conv2d (NCHW, OIHW)
// on the same tensors, asymmetric pads through F.pad, and its gradients
// for dy, all converted back to NHWC and OHWI.
const torchConv = `
import json
import numpy as np
import torch
import torch.nn.functional as F

t = read_safetensors(sys.argv[1])
out = {}
for i, c in enumerate(json.loads(sys.argv[2])):
    p = "%d/" % i
    x = torch.tensor(t[p + "x"].transpose(0, 3, 1, 2), dtype=torch.float64, requires_grad=True)
    w = torch.tensor(t[p + "w"].transpose(0, 3, 1, 2), dtype=torch.float64, requires_grad=True)
    b = torch.tensor(t[p + "b"], dtype=torch.float64, requires_grad=True) if c["bias"] else None
    pt, pl, pb, pr = c["pads"]
    xp = F.pad(x, (pl, pr, pt, pb))
    y = F.conv2d(xp, w, b, stride=tuple(c["stride"]), padding=0, dilation=tuple(c["dilation"]), groups=c["groups"])
    y.backward(torch.tensor(t[p + "dy"].transpose(0, 3, 1, 2), dtype=torch.float64))
    out[p + "y"] = y.detach().numpy().transpose(0, 2, 3, 1)
    out[p + "dx"] = x.grad.numpy().transpose(0, 2, 3, 1)
    out[p + "dw"] = w.grad.numpy().transpose(0, 2, 3, 1)
    if c["bias"]:
        out[p + "db"] = b.grad.numpy()
    if c["symmetric"]:
        # PyTorch's own padding where it can express the pads.
        y2 = F.conv2d(x, w, b, stride=tuple(c["stride"]), padding=(pt, pl), dilation=tuple(c["dilation"]), groups=c["groups"])
        out[p + "y2"] = y2.detach().numpy().transpose(0, 2, 3, 1)
write_safetensors(sys.argv[3], out)
`

// Forward and gradients against PyTorch's conv2d with groups, dilation,
// strides and padding, within 1e-5 of each tensor's largest magnitude.
func TestConv2DTorch(t *testing.T) {
	needTorch(t)
	be, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	type got struct{ y, dx, dw, db []float32 }
	var (
		specs []map[string]any
		in    []tensorio.Named
		res   []got
		names []string
	)
	r := rand.New(rand.NewPCG(9, 10))
	for i, c := range generalConvs {
		l := c.conv()
		l.Bias = i%2 == 0
		x, y, dy, dx, _ := runLayer(t, be, l, c.shape, 3, r)
		p := fmt.Sprintf("%d/", i)
		in = append(in, named(p+"x", x), named(p+"w", l.W.Value), named(p+"dy", dy))
		g := got{y: nn.F32(y), dx: nn.F32(dx), dw: nn.F32(l.W.Grad)}
		if l.Bias {
			in = append(in, named(p+"b", l.B.Value))
			g.db = nn.F32(l.B.Grad)
		}
		res = append(res, g)
		names = append(names, c.name)
		specs = append(specs, map[string]any{
			"bias": l.Bias, "pads": []int{l.PadT, l.PadL, l.PadB, l.PadR}, "stride": []int{l.SH, l.SW},
			"dilation": []int{l.DH, l.DW}, "groups": l.Groups, "symmetric": l.PadT == l.PadB && l.PadL == l.PadR,
		})
	}
	want := torchRun(t, torchConv, specs, in)
	f64 := func(v []float32) []float64 {
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	}
	for i, g := range res {
		p := fmt.Sprintf("%d/", i)
		closeTo(t, names[i]+" y", 1e-5, g.y, f64(want[p+"y"]))
		closeTo(t, names[i]+" dx", 1e-5, g.dx, f64(want[p+"dx"]))
		closeTo(t, names[i]+" dW", 1e-5, g.dw, f64(want[p+"dw"]))
		if g.db != nil {
			closeTo(t, names[i]+" dB", 1e-5, g.db, f64(want[p+"db"]))
		}
		if y2, ok := want[p+"y2"]; ok {
			closeTo(t, names[i]+" y (PyTorch's padding)", 1e-5, g.y, f64(y2))
		}
	}
}
