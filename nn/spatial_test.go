package nn_test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/nntest"
	"github.com/ppnode/ppnode/tensorio"
)

// transposeConvs are transposed convolutions of the geometries decoders use
// and the corners of the layer's arithmetic.
var transposeConvs = []struct {
	name  string
	conv  func() *nn.ConvTranspose2D
	shape []int
}{
	{"3x3", func() *nn.ConvTranspose2D { return &nn.ConvTranspose2D{In: 3, Out: 4, KH: 3, KW: 3} }, []int{4, 5, 3}},
	{"3x3-stride2-pad1-outpad1", func() *nn.ConvTranspose2D {
		return &nn.ConvTranspose2D{In: 4, Out: 3, KH: 3, KW: 3, SH: 2, SW: 2, PadT: 1, PadL: 1, PadB: 1, PadR: 1, OutPadH: 1, OutPadW: 1}
	}, []int{4, 3, 4}},
	{"4x4-stride2-pad1", func() *nn.ConvTranspose2D {
		return &nn.ConvTranspose2D{In: 4, Out: 3, KH: 4, KW: 4, SH: 2, SW: 2, PadT: 1, PadL: 1, PadB: 1, PadR: 1}
	}, []int{4, 5, 4}},
	{"2x2-stride2", func() *nn.ConvTranspose2D { return &nn.ConvTranspose2D{In: 2, Out: 5, KH: 2, KW: 2, SH: 2, SW: 2} }, []int{3, 4, 2}},
	{"asym-pads-outpad", func() *nn.ConvTranspose2D {
		return &nn.ConvTranspose2D{In: 3, Out: 2, KH: 2, KW: 3, SH: 2, SW: 1, PadT: 0, PadL: 2, PadB: 1, PadR: 0, OutPadH: 1}
	}, []int{4, 5, 3}},
	{"dilation2", func() *nn.ConvTranspose2D {
		return &nn.ConvTranspose2D{In: 2, Out: 3, KH: 3, KW: 3, PadT: 1, PadL: 1, PadB: 1, PadR: 1, DH: 2, DW: 2}
	}, []int{4, 4, 2}},
	{"groups2-stride2", func() *nn.ConvTranspose2D {
		return &nn.ConvTranspose2D{In: 4, Out: 6, KH: 3, KW: 3, SH: 2, SW: 2, PadT: 1, PadL: 1, PadB: 1, PadR: 1, OutPadH: 1, OutPadW: 1, Groups: 2}
	}, []int{3, 4, 4}},
	{"depthwise-4x4-stride2", func() *nn.ConvTranspose2D {
		return &nn.ConvTranspose2D{In: 3, Out: 3, KH: 4, KW: 4, SH: 2, SW: 2, PadT: 1, PadL: 1, PadB: 1, PadR: 1, Groups: 3}
	}, []int{3, 3, 3}},
	{"1x1", func() *nn.ConvTranspose2D { return &nn.ConvTranspose2D{In: 5, Out: 3, KH: 1, KW: 1} }, []int{3, 4, 5}},
	{"1x1-stride2-outpad", func() *nn.ConvTranspose2D {
		return &nn.ConvTranspose2D{In: 3, Out: 2, KH: 1, KW: 1, SH: 2, SW: 2, OutPadH: 1, OutPadW: 1}
	}, []int{3, 3, 3}},
	{"outpad-beyond-stride", func() *nn.ConvTranspose2D {
		return &nn.ConvTranspose2D{In: 2, Out: 2, KH: 2, KW: 2, SH: 2, SW: 2, OutPadH: 3, OutPadW: 2}
	}, []int{2, 3, 2}},
	{"crop-beyond-kernel", func() *nn.ConvTranspose2D {
		return &nn.ConvTranspose2D{In: 2, Out: 3, KH: 3, KW: 2, SH: 2, SW: 3, PadT: 3, PadL: 0, PadB: 2, PadR: 3}
	}, []int{5, 4, 2}},
}

// spatialPass builds l on x's per-sample shape, sets its parameters to
// normal draws from r, and runs one forward and one backward pass with a
// random output gradient. It returns copies of the output, the output
// gradient and the input gradient.
func spatialPass(t testing.TB, be nn.Backend, l nn.Layer, x *nn.Tensor, r *rand.Rand) (y, dy, dx *nn.Tensor) {
	t.Helper()
	out, err := l.Build([][]int{x.Shape()[1:]})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Params() {
		for i := range nn.F32(p.Value) {
			nn.F32(p.Value)[i] = float32(r.NormFloat64())
		}
		clear(nn.F32(p.Grad))
	}
	c := &nn.Ctx{Backend: be, Train: true}
	var s nn.Slot
	y = l.Forward(c, &s, []*nn.Tensor{x})
	if want := append([]int{x.Shape()[0]}, out...); !nn.SameShape(y.Shape(), want) {
		t.Fatalf("output shape %v, Build said %v", y.Shape(), want)
	}
	y = nn.FromData(slices.Clone(nn.F32(y)), y.Shape()...)
	dy = nn.New(y.Shape()...)
	for i := range nn.F32(dy) {
		nn.F32(dy)[i] = float32(r.NormFloat64())
	}
	g := l.Backward(c, &s, []*nn.Tensor{x}, y, dy, []bool{true})
	dx = nn.FromData(slices.Clone(nn.F32(g[0])), g[0].Shape()...)
	return y, dy, dx
}

// spatialRandn is a tensor of normal draws from r, scaled by k and shifted by b.
func spatialRandn(r *rand.Rand, k, b float64, shape ...int) *nn.Tensor {
	x := nn.New(shape...)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(k*r.NormFloat64() + b)
	}
	return x
}

func TestConvTranspose2DBuild(t *testing.T) {
	l := &nn.ConvTranspose2D{In: 4, Out: 6, KH: 3, KW: 2, SH: 2, PadT: 1, PadB: 1, OutPadH: 1, Groups: 2, Bias: true}
	out, err := l.Build([][]int{{5, 4, 4}})
	if err != nil {
		t.Fatal(err)
	}
	// Ho = 4·2 − 2 + 2 + 1 + 1 = 10, Wo = 3·1 + 1 + 1 = 5.
	if !slices.Equal(out, []int{10, 5, 6}) || l.SW != 1 || l.DH != 1 || l.DW != 1 || l.Kind() != "convtranspose2d" {
		t.Fatalf("output %v, fields %+v", out, *l)
	}
	if !slices.Equal(l.W.Value.Shape(), []int{4, 3, 2, 3}) || !slices.Equal(l.W.ExportedShape(), []int{4, 3, 3, 2}) ||
		l.W.FanIn != 3*3*2 || l.W.Init != nn.InitUniform || l.W.Name != "weight" ||
		l.B.Name != "bias" || !slices.Equal(l.B.Value.Shape(), []int{6}) || l.B.FanIn != 18 || l.B.Init != nn.InitUniform {
		t.Fatalf("weight %v (exported %v) fan-in %d init %v; bias %v fan-in %d", l.W.Value.Shape(), l.W.ExportedShape(), l.W.FanIn, l.W.Init, l.B.Value.Shape(), l.B.FanIn)
	}
	// Exported is PyTorch's [In, Out/Groups, KH, KW] of the stored
	// [In, KH, KW, Out/Groups], and FromExported inverts it.
	for i := range nn.F32(l.W.Value) {
		nn.F32(l.W.Value)[i] = float32(i)
	}
	e := nn.F32(l.W.Exported())
	for ci := 0; ci < 4; ci++ {
		for co := 0; co < 3; co++ {
			for ky := 0; ky < 3; ky++ {
				for kx := 0; kx < 2; kx++ {
					if got, want := e[((ci*3+co)*3+ky)*2+kx], float32(((ci*3+ky)*2+kx)*3+co); got != want {
						t.Fatalf("exported [%d %d %d %d] = %v, want %v", ci, co, ky, kx, got, want)
					}
				}
			}
		}
	}
	back, err := l.W.FromExported(e, l.W.ExportedShape())
	if err != nil || !slices.Equal(back, nn.F32(l.W.Value)) {
		t.Fatalf("FromExported(Exported()) differs (%v)", err)
	}
	for _, c := range []struct {
		l     *nn.ConvTranspose2D
		shape []int
	}{
		{&nn.ConvTranspose2D{In: 3, Out: 2, KH: 3, KW: 3}, []int{4, 4, 2}},            // channels
		{&nn.ConvTranspose2D{In: 4, Out: 6, KH: 3, KW: 3, Groups: 4}, []int{4, 4, 4}}, // groups
		{&nn.ConvTranspose2D{In: 2, Out: 2, KW: 3}, []int{4, 4, 2}},                   // no KH
		{&nn.ConvTranspose2D{In: 2, Out: 2, KH: 3, KW: 3, PadT: 2, PadB: 3}, []int{1, 4, 2}},
		{&nn.ConvTranspose2D{In: 2, Out: 2, KH: 3, KW: 3, OutPadW: -1}, []int{4, 4, 2}},
		{&nn.ConvTranspose2D{In: 2, Out: 2, KH: 3, KW: 3, SH: -1}, []int{4, 4, 2}},
	} {
		if _, err := c.l.Build([][]int{c.shape}); err == nil {
			t.Errorf("%+v on %v accepted", *c.l, c.shape)
		}
	}
}

func TestGradCheckConvTranspose2D(t *testing.T) {
	for _, c := range transposeConvs {
		for _, bias := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/bias=%v", c.name, bias), func(t *testing.T) {
				l := c.conv()
				l.Bias = bias
				nntest.GradCheck(t, l, [][]int{c.shape}, nntest.Options{})
			})
		}
	}
}

// naiveConvTranspose is the transposed convolution written out in float64:
// y, and for dy the gradients of x, the weights (stored layout) and bias.
func naiveConvTranspose(l *nn.ConvTranspose2D, x, wt, bias, dy []float32, n, h, w, ho, wo int) (y, dx, dw, db []float64) {
	gin, gout := l.In/l.Groups, l.Out/l.Groups
	y = make([]float64, n*ho*wo*l.Out)
	dx = make([]float64, len(x))
	dw = make([]float64, len(wt))
	db = make([]float64, l.Out)
	for b := 0; b < n; b++ {
		for iy := 0; iy < h; iy++ {
			for ix := 0; ix < w; ix++ {
				for ci := 0; ci < l.In; ci++ {
					xi := ((b*h+iy)*w+ix)*l.In + ci
					for ky := 0; ky < l.KH; ky++ {
						for kx := 0; kx < l.KW; kx++ {
							oy, ox := iy*l.SH-l.PadT+ky*l.DH, ix*l.SW-l.PadL+kx*l.DW
							if oy < 0 || oy >= ho || ox < 0 || ox >= wo {
								continue
							}
							for co := 0; co < gout; co++ {
								yi := ((b*ho+oy)*wo+ox)*l.Out + ci/gin*gout + co
								wi := ((ci*l.KH+ky)*l.KW+kx)*gout + co
								y[yi] += float64(x[xi]) * float64(wt[wi])
								dx[xi] += float64(dy[yi]) * float64(wt[wi])
								dw[wi] += float64(dy[yi]) * float64(x[xi])
							}
						}
					}
				}
			}
		}
	}
	if bias != nil {
		for i := range y {
			y[i] += float64(bias[i%l.Out])
			db[i%l.Out] += float64(dy[i])
		}
	}
	return y, dx, dw, db
}

// Forward and backward against the loops above, within 1e-5 of each
// tensor's largest magnitude, on the deterministic backend and on the
// default one (OpenBLAS when built with it).
func TestConvTranspose2DNaiveReference(t *testing.T) {
	det, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	def, err := nn.NewBackend("", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(21, 22))
	for _, be := range []nn.Backend{det, def} {
		kind := "default-" + be.Name()
		if be == det {
			kind = "deterministic"
		}
		for _, c := range transposeConvs {
			for _, bias := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/bias=%v", kind, c.name, bias), func(t *testing.T) {
					l := c.conv()
					l.Bias = bias
					const n = 3
					x := spatialRandn(r, 1, 0, append([]int{n}, c.shape...)...)
					y, dy, dx := spatialPass(t, be, l, x, r)
					var b []float32
					if bias {
						b = nn.F32(l.B.Value)
					}
					sh := y.Shape()
					wy, wdx, wdw, wdb := naiveConvTranspose(l, nn.F32(x), nn.F32(l.W.Value), b, nn.F32(dy), n, c.shape[0], c.shape[1], sh[1], sh[2])
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
}

// resizes are the Resize cases of the gradient check and the PyTorch
// parity test: nearest and bilinear, by factors and to sizes, up and down.
var resizes = []struct {
	name  string
	l     nn.Resize
	shape []int
}{
	{"nearest-x2", nn.Resize{Mode: "nearest", ScaleH: 2, ScaleW: 2}, []int{3, 4, 2}},
	{"nearest-x3x2", nn.Resize{Mode: "nearest", ScaleH: 3, ScaleW: 2}, []int{2, 3, 3}},
	{"nearest-size-down-up", nn.Resize{Mode: "nearest", OutH: 3, OutW: 8}, []int{7, 5, 2}},
	{"linear-x2", nn.Resize{Mode: "linear", ScaleH: 2, ScaleW: 2}, []int{3, 4, 2}},
	{"linear-odd-size", nn.Resize{Mode: "linear", OutH: 7, OutW: 5}, []int{4, 3, 3}},
	{"linear-down", nn.Resize{Mode: "linear", OutH: 3, OutW: 2}, []int{7, 5, 2}},
	{"linear-align-x2", nn.Resize{Mode: "linear", ScaleH: 2, ScaleW: 2, AlignCorners: true}, []int{3, 4, 2}},
	{"linear-align-odd-size", nn.Resize{Mode: "linear", OutH: 7, OutW: 4, AlignCorners: true}, []int{4, 3, 3}},
	{"linear-size1", nn.Resize{Mode: "linear", OutH: 1, OutW: 3}, []int{4, 3, 2}},
}

func TestGradCheckResize(t *testing.T) {
	for _, c := range resizes {
		t.Run(c.name, func(t *testing.T) {
			l := c.l
			nntest.GradCheck(t, &l, [][]int{c.shape}, nntest.Options{})
		})
	}
}

// Values worked out by hand, and the errors Build reports.
func TestResizeValues(t *testing.T) {
	be, _ := nn.NewBackend("ppnode-det", 1, true)
	x := nn.FromData([]float32{1, 2, 3, 4}, 1, 2, 2, 1)
	for _, c := range []struct {
		l    nn.Resize
		want []float32
	}{
		{nn.Resize{Mode: "nearest", ScaleH: 2, ScaleW: 1}, []float32{1, 2, 1, 2, 3, 4, 3, 4}},
		// Half-pixel centres: outputs at −¼ (clamped to 0), ¼, ¾, 1¼.
		{nn.Resize{Mode: "linear", ScaleH: 1, ScaleW: 2}, []float32{1, 1.25, 1.75, 2, 3, 3.25, 3.75, 4}},
		{nn.Resize{Mode: "linear", OutH: 1, OutW: 3, AlignCorners: true}, []float32{1, 1.5, 2}},
	} {
		l := c.l
		if _, err := l.Build([][]int{{2, 2, 1}}); err != nil {
			t.Fatal(err)
		}
		var s nn.Slot
		if got := nn.F32(l.Forward(&nn.Ctx{Backend: be}, &s, []*nn.Tensor{x})); !slices.Equal(got, c.want) {
			t.Errorf("%+v: %v, want %v", c.l, got, c.want)
		}
	}
	for _, l := range []nn.Resize{
		{Mode: "cubic", ScaleH: 2, ScaleW: 2},
		{Mode: "nearest", ScaleH: 2, ScaleW: 2, AlignCorners: true},
		{Mode: "linear", ScaleH: 2},
		{Mode: "linear", OutH: -1, ScaleW: 2},
	} {
		if _, err := l.Build([][]int{{2, 2, 1}}); err == nil {
			t.Errorf("%+v accepted", l)
		}
	}
}

func TestGradCheckClip(t *testing.T) {
	// Inputs stay 0.05 from the bounds, so no finite step straddles one.
	away := func(r *rand.Rand) float32 {
		for {
			v := float32(8*r.Float64() - 4)
			if math.Abs(float64(v)) > 0.05 && math.Abs(float64(v-1)) > 0.05 && math.Abs(float64(v+0.5)) > 0.05 {
				return v
			}
		}
	}
	inf := float32(math.Inf(1))
	for _, l := range []nn.Clip{{0, 6}, {-0.5, 1}, {-inf, 1}, {0, inf}} {
		nntest.GradCheck(t, l, [][]int{{4, 3, 2}}, nntest.Options{Input: away})
	}
	// The backward pass is hardtanh's: no gradient on a bound.
	be, _ := nn.NewBackend("ppnode-det", 1, true)
	l := nn.Clip{Min: 0, Max: 6}
	x := nn.FromData([]float32{-1, 0, 3, 6, 7, float32(math.NaN())}, 1, 6)
	var s nn.Slot
	c := &nn.Ctx{Backend: be}
	y := l.Forward(c, &s, []*nn.Tensor{x})
	if got := nn.F32(y); !slices.Equal(got[:5], []float32{0, 0, 3, 6, 6}) || !math.IsNaN(float64(got[5])) {
		t.Errorf("ReLU6 of %v: %v", nn.F32(x), got)
	}
	dx := l.Backward(c, &s, []*nn.Tensor{x}, y, nn.FromData([]float32{1, 1, 1, 1, 1, 1}, 1, 6), []bool{true})[0]
	if got := nn.F32(dx); !slices.Equal(got, []float32{0, 0, 1, 0, 0, 1}) {
		t.Errorf("ReLU6 gradient at %v: %v", nn.F32(x), got)
	}
}

// unaryInputs draws inputs for each operation in its domain.
var unaryInputs = map[string]func(r *rand.Rand) float32{
	"sqrt":       func(r *rand.Rand) float32 { return float32(0.2 + 2*r.Float64()) },
	"log":        func(r *rand.Rand) float32 { return float32(0.2 + 2*r.Float64()) },
	"reciprocal": func(r *rand.Rand) float32 { return float32(0.3 + 2*r.Float64()) },
}

var unaryNames = []string{"sqrt", "exp", "log", "neg", "abs", "reciprocal", "sin", "cos", "softplus", "silu", "sign"}

// hardLayers are the piecewise activations: ONNX's default HardSigmoid,
// PyTorch's, HardSwish, and ELU, SELU and CELU.
var hardLayers = []nn.Layer{nn.HardSigmoid{Alpha: 0.2, Beta: 0.5}, nn.HardSigmoid{Alpha: 1.0 / 6, Beta: 0.5}, nn.HardSwish{},
	nn.ELU{Alpha: 1, Gamma: 1}, nn.ELU{Alpha: 0.5, Gamma: 1}, nn.ELU{Alpha: 1.6732632, Gamma: 1.050701}, nn.ELU{Alpha: 2, Gamma: 1, Celu: true}}

func TestGradCheckUnary(t *testing.T) {
	for _, op := range unaryNames {
		t.Run(op, func(t *testing.T) {
			o := nntest.Options{Input: unaryInputs[op]}
			if op == "softplus" || op == "silu" {
				// Into the tails.
				o.Input = func(r *rand.Rand) float32 { return float32(7*r.Float64() - 3.5) }
			}
			nntest.GradCheck(t, nn.Unary{Op: op}, [][]int{{5, 3}}, o)
		})
	}
	for _, l := range hardLayers {
		t.Run(fmt.Sprint(l), func(t *testing.T) {
			// Past the kinks (±2.5 for ONNX's HardSigmoid, ±3 for the
			// others) and into the flat parts.
			o := nntest.Options{Input: func(r *rand.Rand) float32 { return float32(9*r.Float64() - 4.5) }}
			nntest.GradCheck(t, l, [][]int{{5, 3}}, o)
		})
	}
	if _, err := (nn.HardSigmoid{Alpha: float32(math.NaN())}).Build([][]int{{3}}); err == nil {
		t.Error("NaN alpha accepted")
	}
	if _, err := (nn.Unary{Op: "tan"}).Build([][]int{{3}}); err == nil {
		t.Error("unknown operation accepted")
	}
	if k := (nn.Unary{Op: "silu"}).Kind(); k != "silu" {
		t.Errorf("kind %q", k)
	}
	// Softplus does not overflow.
	be, _ := nn.NewBackend("ppnode-det", 1, true)
	var s nn.Slot
	y := nn.Unary{Op: "softplus"}.Forward(&nn.Ctx{Backend: be}, &s, []*nn.Tensor{nn.FromData([]float32{-200, 0, 200}, 1, 3)})
	if got := nn.F32(y); got[0] != 0 || got[1] != float32(math.Ln2) || got[2] != 200 {
		t.Errorf("softplus(-200, 0, 200) = %v", got)
	}
}

// spatialCase is one layer of the PyTorch parity test with its input and
// its results here.
type spatialCase struct {
	name      string
	l         nn.Layer
	x         *nn.Tensor
	y, dy, dx *nn.Tensor
}

// torchSpatial runs testdata/torch_spatial.py on the named tensors and the
// specs, and returns what it writes.
func torchSpatial(t *testing.T, specs []map[string]any, in []tensorio.Named) map[string][]float32 {
	t.Helper()
	dir := t.TempDir()
	js, err := json.Marshal(specs)
	if err != nil {
		t.Fatal(err)
	}
	inPath, specPath, outPath := filepath.Join(dir, "in.safetensors"), filepath.Join(dir, "spec.json"), filepath.Join(dir, "out.safetensors")
	if err := os.WriteFile(specPath, js, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tensorio.SaveSafetensors(inPath, in, nil); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(torchPython, "testdata/torch_spatial.py", inPath, specPath, outPath).CombinedOutput(); err != nil {
		t.Fatalf("PyTorch: %v\n%s", err, out)
	}
	ts, _, err := tensorio.LoadSafetensors(outPath)
	if err != nil {
		t.Fatal(err)
	}
	res := map[string][]float32{}
	for _, n := range ts {
		res[n.Name] = nn.F32(n.T)
	}
	return res
}

// Forward outputs and the gradients of sum(y·dy) against PyTorch in
// float64 (NCHW there, weights in PyTorch's exported layout), within 1e-5
// of each tensor's largest magnitude: ConvTranspose2D (also against
// PyTorch's own padding where it can express the geometry), Resize, Clip
// and the unary operations.
func TestSpatialTorch(t *testing.T) {
	needTorch(t)
	be, err := nn.NewBackend("ppnode-det", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(23, 24))
	var cases []*spatialCase
	for i, c := range transposeConvs {
		l := c.conv()
		l.Bias = i%2 == 0
		cases = append(cases, &spatialCase{name: c.name, l: l, x: spatialRandn(r, 1, 0, append([]int{3}, c.shape...)...)})
	}
	for _, c := range resizes {
		l := c.l
		cases = append(cases, &spatialCase{name: c.name, l: &l, x: spatialRandn(r, 1, 0, append([]int{2}, c.shape...)...)})
	}
	inf := float32(math.Inf(1))
	for _, l := range []nn.Clip{{0, 6}, {-0.5, 1}, {-inf, 1}, {0, inf}} {
		x := spatialRandn(r, 4, 2, 2, 5, 4, 3)
		// Values on the bounds: hardtanh passes no gradient there.
		for i, v := range []float32{0, 6, -0.5, 1} {
			nn.F32(x)[7*i+1] = v
		}
		cases = append(cases, &spatialCase{name: fmt.Sprintf("clip[%v,%v]", l.Min, l.Max), l: l, x: x})
	}
	for _, op := range unaryNames {
		x := spatialRandn(r, 2, 0, 2, 4, 3, 5)
		if op == "softplus" || op == "silu" {
			x = spatialRandn(r, 8, 0, 2, 4, 3, 5)
		}
		if f := unaryInputs[op]; f != nil {
			for i := range nn.F32(x) {
				nn.F32(x)[i] = f(r)
			}
		}
		cases = append(cases, &spatialCase{name: op, l: nn.Unary{Op: op}, x: x})
	}
	for _, l := range hardLayers {
		x := spatialRandn(r, 4, 0, 2, 4, 3, 5)
		// Values on PyTorch's kinks.
		for i, v := range []float32{-3, 3} {
			nn.F32(x)[7*i+1] = v
		}
		cases = append(cases, &spatialCase{name: fmt.Sprint(l), l: l, x: x})
	}
	var (
		specs []map[string]any
		in    []tensorio.Named
	)
	for i, c := range cases {
		c.y, c.dy, c.dx = spatialPass(t, be, c.l, c.x, r)
		p := fmt.Sprintf("%d/", i)
		in = append(in, named(p+"x", c.x), named(p+"dy", c.dy))
		var spec map[string]any
		switch l := c.l.(type) {
		case *nn.ConvTranspose2D:
			spec = map[string]any{"kind": "convtranspose2d", "bias": l.Bias, "stride": []int{l.SH, l.SW},
				"pads": []int{l.PadT, l.PadL, l.PadB, l.PadR}, "outpad": []int{l.OutPadH, l.OutPadW},
				"dilation": []int{l.DH, l.DW}, "groups": l.Groups}
			in = append(in, named(p+"w", l.W.Exported()))
			if l.Bias {
				in = append(in, named(p+"b", l.B.Value))
			}
		case *nn.Resize:
			spec = map[string]any{"kind": "resize", "mode": l.Mode, "align_corners": l.AlignCorners,
				"size": []int{c.y.Shape()[1], c.y.Shape()[2]}}
			if l.OutH == 0 {
				spec["scale"] = []int{l.ScaleH, l.ScaleW}
			}
		case nn.Clip:
			bound := func(v float32) any {
				if math.IsInf(float64(v), 0) {
					return nil
				}
				return v
			}
			spec = map[string]any{"kind": "clip", "min": bound(l.Min), "max": bound(l.Max)}
		case nn.Unary:
			spec = map[string]any{"kind": "unary", "op": l.Op}
		case nn.HardSigmoid:
			spec = map[string]any{"kind": "hardsigmoid", "alpha": l.Alpha, "beta": l.Beta}
		case nn.HardSwish:
			spec = map[string]any{"kind": "hardswish"}
		case nn.ELU:
			spec = map[string]any{"kind": "elu", "alpha": l.Alpha, "gamma": l.Gamma, "celu": l.Celu}
		}
		specs = append(specs, spec)
	}
	want := torchSpatial(t, specs, in)
	f64 := func(v []float32) []float64 {
		out := make([]float64, len(v))
		for i, x := range v {
			out[i] = float64(x)
		}
		return out
	}
	check := func(name, key string, got []float32) {
		t.Helper()
		w, ok := want[key]
		if !ok {
			t.Errorf("%s: PyTorch wrote no %s", name, key)
			return
		}
		closeTo(t, name, 1e-5, got, f64(w))
	}
	for i, c := range cases {
		p := fmt.Sprintf("%d/", i)
		check(c.name+" y", p+"y", nn.F32(c.y))
		check(c.name+" dx", p+"dx", nn.F32(c.dx))
		if l, ok := c.l.(*nn.ConvTranspose2D); ok {
			// PyTorch's gradient in its layout, converted to ours.
			dw, err := l.W.FromExported(want[p+"dw"], l.W.ExportedShape())
			if err != nil {
				t.Fatal(err)
			}
			closeTo(t, c.name+" dW", 1e-5, nn.F32(l.W.Grad), f64(dw))
			if l.Bias {
				check(c.name+" dB", p+"db", nn.F32(l.B.Grad))
			}
			if y2, ok := want[p+"y2"]; ok {
				closeTo(t, c.name+" y (PyTorch's padding)", 1e-5, nn.F32(c.y), f64(y2))
			}
		}
	}
}

// Every layer here gives the same bits with one, two and three threads, on
// tensors large enough for the passes to split.
func TestSpatialThreadsSameBits(t *testing.T) {
	layers := func() []nn.Layer {
		var ls []nn.Layer
		for _, c := range transposeConvs {
			l := c.conv()
			l.Bias = true
			ls = append(ls, l)
		}
		ls = append(ls,
			&nn.ConvTranspose2D{In: 16, Out: 8, KH: 4, KW: 4, SH: 2, SW: 2, PadT: 1, PadL: 1, PadB: 1, PadR: 1, Bias: true},
			&nn.Resize{Mode: "nearest", ScaleH: 2, ScaleW: 2},
			&nn.Resize{Mode: "linear", ScaleH: 2, ScaleW: 2},
			&nn.Resize{Mode: "linear", OutH: 37, OutW: 29, AlignCorners: true},
			nn.Clip{Min: 0, Max: 6})
		for _, op := range unaryNames {
			ls = append(ls, nn.Unary{Op: op})
		}
		return append(ls, hardLayers...)
	}
	shape := func(l nn.Layer, i int) []int {
		if i < len(transposeConvs) {
			return append([]int{7}, transposeConvs[i].shape...)
		}
		if l, ok := l.(*nn.ConvTranspose2D); ok {
			return []int{4, 12, 12, l.In}
		}
		return []int{4, 24, 24, 32}
	}
	var ref [][]float32
	for _, threads := range []int{1, 2, 3} {
		be, err := nn.NewBackend("ppnode-det", threads, true)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(25, 26))
		var got [][]float32
		for i, l := range layers() {
			x := spatialRandn(r, 1, 0, shape(l, i)...)
			if u, ok := l.(nn.Unary); ok && (u.Op == "sqrt" || u.Op == "log") {
				for j, v := range nn.F32(x) {
					nn.F32(x)[j] = float32(math.Abs(float64(v))) + 0.1
				}
			}
			y, _, dx := spatialPass(t, be, l, x, r)
			got = append(got, nn.F32(y), nn.F32(dx))
			for _, p := range l.Params() {
				got = append(got, nn.F32(p.Grad))
			}
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
