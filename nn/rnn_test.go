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

// rnnKinds are the recurrent layers under test, by Kind.
var rnnKinds = []struct {
	kind  string
	gates int
	new   func(in, hidden int) nn.Layer
}{
	{"lstm", 4, func(in, h int) nn.Layer { return &nn.LSTM{In: in, Hidden: h} }},
	{"gru", 3, func(in, h int) nn.Layer { return &nn.GRU{In: in, Hidden: h} }},
	{"rnn", 1, func(in, h int) nn.Layer { return &nn.RNN{In: in, Hidden: h} }},
}

// rnnLayer returns a built recurrent layer for [steps, in] samples with
// its parameters drawn from seed, scaled by scale.
func rnnLayer(t testing.TB, kind string, in, hidden, steps int, seed uint64, scale float32) nn.Layer {
	t.Helper()
	for _, k := range rnnKinds {
		if k.kind != kind {
			continue
		}
		l := k.new(in, hidden)
		if _, err := l.Build([][]int{{steps, in}}); err != nil {
			t.Fatal(err)
		}
		for _, p := range l.Params() {
			p.Reset(seed)
			for i := range nn.F32(p.Value) {
				nn.F32(p.Value)[i] *= scale
			}
		}
		return l
	}
	t.Fatalf("no recurrent layer %q", kind)
	return nil
}

// rnnPass runs a forward and a backward pass from zero parameter gradients
// and returns copies of the output, the input gradient and the parameter
// gradients (in Params order).
func rnnPass(be nn.Backend, l nn.Layer, x, dout *nn.Tensor) [][]float32 {
	c := &nn.Ctx{Backend: be, Train: true}
	var s nn.Slot
	for _, p := range l.Params() {
		clear(nn.F32(p.Grad))
	}
	y := l.Forward(c, &s, []*nn.Tensor{x})
	out := [][]float32{append([]float32(nil), nn.F32(y)...)}
	g := l.Backward(c, &s, []*nn.Tensor{x}, y, dout, []bool{true})
	out = append(out, append([]float32(nil), nn.F32(g[0])...))
	for _, p := range l.Params() {
		out = append(out, append([]float32(nil), nn.F32(p.Grad)...))
	}
	return out
}

// The layers have PyTorch's parameters: names, shapes, order and U(±1/√H)
// initialisation; Build checks the input shape.
func TestLSTMGRUParams(t *testing.T) {
	const in, h, steps = 7, 9, 5
	for _, k := range rnnKinds {
		l := k.new(in, h)
		if l.Kind() != k.kind {
			t.Errorf("Kind %q, want %q", l.Kind(), k.kind)
		}
		out, err := l.Build([][]int{{steps, in}})
		if err != nil {
			t.Fatal(err)
		}
		if !nn.SameShape(out, []int{steps, h}) {
			t.Errorf("%s: output %v, want [%d %d]", k.kind, out, steps, h)
		}
		want := []struct {
			name  string
			shape []int
		}{{"weight_ih", []int{k.gates * h, in}}, {"weight_hh", []int{k.gates * h, h}}, {"bias_ih", []int{k.gates * h}}, {"bias_hh", []int{k.gates * h}}}
		ps := l.Params()
		if len(ps) != len(want) {
			t.Fatalf("%s: %d params, want %d", k.kind, len(ps), len(want))
		}
		bound := float32(1 / math.Sqrt(h))
		for i, p := range ps {
			if p.Name != want[i].name || !nn.SameShape(p.Value.Shape(), want[i].shape) || !p.Trainable() {
				t.Errorf("%s: param %d is %q %v, want %q %v, trainable", k.kind, i, p.Name, p.Value.Shape(), want[i].name, want[i].shape)
			}
			if p.Init != nn.InitUniform || p.FanIn != h {
				t.Errorf("%s: %s init %v fan-in %d, want InitUniform %d", k.kind, p.Name, p.Init, p.FanIn, h)
			}
			p.Reset(3)
			var m float32
			for _, v := range nn.F32(p.Value) {
				m = max(m, float32(math.Abs(float64(v))))
			}
			if m > bound || m < bound/2 {
				t.Errorf("%s: %s drawn up to %v, want U(±%v)", k.kind, p.Name, m, bound)
			}
		}
		for _, bad := range [][][]int{{{steps, in + 1}}, {{in}}, {{steps, in}, {steps, in}}, {{0, in}}, {{2, steps, in}}} {
			if _, err := k.new(in, h).Build(bad); err == nil {
				t.Errorf("%s: Build(%v) succeeded", k.kind, bad)
			}
		}
		if _, err := k.new(in, 0).Build([][]int{{steps, in}}); err == nil {
			t.Errorf("%s: hidden size 0 accepted", k.kind)
		}
	}
}

func TestLSTMGradCheck(t *testing.T) {
	nntest.GradCheck(t, &nn.LSTM{In: 3, Hidden: 4}, [][]int{{5, 3}}, nntest.Options{Batch: 2, Probes: 64})
}

func TestGRUGradCheck(t *testing.T) {
	nntest.GradCheck(t, &nn.GRU{In: 3, Hidden: 4}, [][]int{{5, 3}}, nntest.Options{Batch: 2, Probes: 64})
}

func TestRNNGradCheck(t *testing.T) {
	nntest.GradCheck(t, &nn.RNN{In: 3, Hidden: 4}, [][]int{{5, 3}}, nntest.Options{Batch: 2, Probes: 64})
	nntest.GradCheck(t, &nn.RNN{In: 3, Hidden: 4, ReLU: true}, [][]int{{5, 3}}, nntest.Options{Batch: 2, Probes: 64})
}

// rnnReference is the forward pass in float64, written out from the
// equations in PyTorch's documentation.
func rnnReference(kind string, l nn.Layer, x *nn.Tensor) []float64 {
	ps := l.Params()
	wih, whh, bih, bhh := nn.F32(ps[0].Value), nn.F32(ps[1].Value), nn.F32(ps[2].Value), nn.F32(ps[3].Value)
	sh := x.Shape()
	n, steps, in := sh[0], sh[1], sh[2]
	hid := len(bih) / map[string]int{"lstm": 4, "gru": 3, "rnn": 1}[kind]
	xd := nn.F32(x)
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	// dot is row q of W·v + b.
	dot := func(w, b []float32, cols, q int, v []float64) float64 {
		s := float64(b[q])
		for k := 0; k < cols; k++ {
			s += float64(w[q*cols+k]) * v[k]
		}
		return s
	}
	out := make([]float64, 0, n*steps*hid)
	for b := 0; b < n; b++ {
		h, c := make([]float64, hid), make([]float64, hid)
		for t := 0; t < steps; t++ {
			xv := make([]float64, in)
			for k := range xv {
				xv[k] = float64(xd[(b*steps+t)*in+k])
			}
			nh := make([]float64, hid)
			for j := 0; j < hid; j++ {
				gx := func(g int) float64 { return dot(wih, bih, in, g*hid+j, xv) }
				gh := func(g int) float64 { return dot(whh, bhh, hid, g*hid+j, h) }
				switch kind {
				case "rnn":
					nh[j] = math.Tanh(gx(0) + gh(0))
				case "lstm":
					i, f := sig(gx(0)+gh(0)), sig(gx(1)+gh(1))
					g, o := math.Tanh(gx(2)+gh(2)), sig(gx(3)+gh(3))
					c[j] = f*c[j] + i*g
					nh[j] = o * math.Tanh(c[j])
				default:
					r, z := sig(gx(0)+gh(0)), sig(gx(1)+gh(1))
					nv := math.Tanh(gx(2) + r*gh(2))
					nh[j] = (1-z)*nv + z*h[j]
				}
			}
			h = nh
			out = append(out, h...)
		}
	}
	return out
}

// rnnClose reports the first element of got farther than tol·max|want| from
// want, and returns the largest difference relative to max|want|.
func rnnClose(t *testing.T, what string, got []float32, want []float64, tol float64) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, want %d", what, len(got), len(want))
		return 0
	}
	scale := 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(v))
	}
	worst := 0.0
	for i, v := range got {
		d := math.Abs(float64(v) - want[i])
		if !(d <= tol*scale) {
			t.Errorf("%s[%d] = %v, want %v (difference %.3g of the largest magnitude %.3g)", what, i, v, want[i], d/scale, scale)
			return math.Inf(1)
		}
		if scale > 0 {
			worst = math.Max(worst, d/scale)
		}
	}
	return worst
}

// The forward passes agree with a float64 reference written from the
// equations (run where PyTorch is not installed, too).
func TestLSTMGRUForwardReference(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 5))
	for _, k := range rnnKinds {
		for _, scale := range []float32{1, 4} {
			l := rnnLayer(t, k.kind, 6, 7, 11, 9, scale)
			x := rnnNormal(r, 0, 1, 3, 11, 6)
			got := rnnPass(gonum1(t), l, x, nn.New(3, 11, 7))[0]
			w := rnnClose(t, fmt.Sprintf("%s scale %v output", k.kind, scale), got, rnnReference(k.kind, l, x), 1e-5)
			t.Logf("%s scale %v: largest difference %.2g", k.kind, scale, w)
		}
	}
}

// The outputs and all gradients agree with PyTorch's nn.LSTM and nn.GRU
// (batch_first, float64) on the same parameters and inputs within 1e-5 of
// each tensor's largest magnitude.
func TestLSTMGRUTorchParity(t *testing.T) {
	needTorch(t)
	type spec struct {
		Shape []int     `json:"shape"`
		Data  []float64 `json:"data"`
	}
	specOf := func(x *nn.Tensor) spec {
		d := make([]float64, len(nn.F32(x)))
		for i, v := range nn.F32(x) {
			d[i] = float64(v)
		}
		return spec{x.Shape(), d}
	}
	type reqCase struct {
		Name   string          `json:"name"`
		Kind   string          `json:"kind"`
		In     int             `json:"in"`
		Hidden int             `json:"hidden"`
		X      spec            `json:"x"`
		Params map[string]spec `json:"params"`
		Dout   spec            `json:"dout"`
	}
	sizes := []struct {
		n, steps, in, hidden int
		scale                float32
	}{{3, 7, 4, 5, 1}, {4, 24, 10, 16, 1}, {2, 9, 5, 6, 3}, {1, 1, 2, 3, 1}}
	r := rand.New(rand.NewPCG(6, 7))
	var cases []reqCase
	got := map[string][][]float32{}
	var layers []nn.Layer
	for _, k := range rnnKinds {
		for i, sz := range sizes {
			name := fmt.Sprintf("%s-%d", k.kind, i)
			l := rnnLayer(t, k.kind, sz.in, sz.hidden, sz.steps, uint64(10+i), sz.scale)
			x := rnnNormal(r, 0, 1, sz.n, sz.steps, sz.in)
			dout := rnnNormal(r, 0, 1, sz.n, sz.steps, sz.hidden)
			got[name] = rnnPass(gonum1(t), l, x, dout)
			c := reqCase{Name: name, Kind: k.kind, In: sz.in, Hidden: sz.hidden, X: specOf(x), Dout: specOf(dout), Params: map[string]spec{}}
			for _, p := range l.Params() {
				c.Params[p.Name] = specOf(p.Value)
			}
			cases = append(cases, c)
			layers = append(layers, l)
		}
	}
	req, err := json.Marshal(map[string]any{"cases": cases})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(torchPython, "testdata/torch_rnn.py")
	cmd.Stdin = strings.NewReader(string(req))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("PyTorch: %v\n%s", err, stderr.String())
	}
	var want map[string]struct {
		Out   []float64            `json:"out"`
		Dx    []float64            `json:"dx"`
		Grads map[string][]float64 `json:"grads"`
	}
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	const tol = 1e-5
	worst := 0.0
	for i, c := range cases {
		g, w := got[c.Name], want[c.Name]
		worst = math.Max(worst, rnnClose(t, c.Name+" output", g[0], w.Out, tol))
		worst = math.Max(worst, rnnClose(t, c.Name+" input gradient", g[1], w.Dx, tol))
		for j, p := range layers[i].Params() {
			if w.Grads[p.Name] == nil {
				t.Errorf("%s: PyTorch gave no gradient for %s", c.Name, p.Name)
				continue
			}
			worst = math.Max(worst, rnnClose(t, c.Name+" "+p.Name+" gradient", g[2+j], w.Grads[p.Name], tol))
		}
	}
	t.Logf("largest difference %.2g of a tensor's largest magnitude", worst)
}

// Parameter gradients add to what the Params' Grad hold.
func TestLSTMGRUGradsAccumulate(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 3))
	be := gonum1(t)
	for _, k := range rnnKinds {
		l := rnnLayer(t, k.kind, 5, 6, 8, 1, 1)
		x, dout := rnnNormal(r, 0, 1, 3, 8, 5), rnnNormal(r, 0, 1, 3, 8, 6)
		once := rnnPass(be, l, x, dout)
		c := &nn.Ctx{Backend: be, Train: true}
		var s nn.Slot
		for _, p := range l.Params() {
			clear(nn.F32(p.Grad))
		}
		for i := 0; i < 2; i++ {
			y := l.Forward(c, &s, []*nn.Tensor{x})
			l.Backward(c, &s, []*nn.Tensor{x}, y, dout, []bool{false})
		}
		for i, p := range l.Params() {
			want := make([]float64, len(once[2+i]))
			for j, v := range once[2+i] {
				want[j] = 2 * float64(v)
			}
			rnnClose(t, k.kind+" "+p.Name+" twice", nn.F32(p.Grad), want, 1e-6)
		}
	}
}

// rnnDetSizes make both the GEMMs and the steps' passes split at two
// threads: (batch, steps, in, hidden).
var rnnDetSizes = [][4]int{{16, 12, 24, 40}, {8, 6, 5, 96}, {5, 3, 7, 33}}

// The outputs and gradients have the same bits at 1, 2 and 3 threads.
func TestLSTMGRUDeterministicThreads(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 1))
	for _, k := range rnnKinds {
		for _, sz := range rnnDetSizes {
			n, steps, in, h := sz[0], sz[1], sz[2], sz[3]
			l := rnnLayer(t, k.kind, in, h, steps, 5, 2)
			x, dout := rnnNormal(r, 0, 1, n, steps, in), rnnNormal(r, 0, 1, n, steps, h)
			var want [][]float32
			for _, threads := range []int{1, 2, 3} {
				be, err := nn.NewBackend("ppnode-det", threads, true)
				if err != nil {
					t.Fatal(err)
				}
				got := rnnPass(be, l, x, dout)
				if want == nil {
					want = got
					continue
				}
				for i := range got {
					sameBits(t, fmt.Sprintf("%s %v threads=%d tensor %d", k.kind, sz, threads, i), got[i], want[i])
				}
			}
		}
	}
}

// A steady-state forward and backward pass allocates nothing, at one
// thread and at two.
func TestLSTMGRUAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := rand.New(rand.NewPCG(1, 1))
	for _, k := range rnnKinds {
		for _, threads := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/threads=%d", k.kind, threads), func(t *testing.T) {
				be, err := nn.NewBackend("ppnode-det", threads, true)
				if err != nil {
					t.Fatal(err)
				}
				sz := rnnDetSizes[0]
				l := rnnLayer(t, k.kind, sz[2], sz[3], sz[1], 1, 1)
				xs := []*nn.Tensor{rnnNormal(r, 0, 1, sz[0], sz[1], sz[2])}
				dout := rnnNormal(r, 0, 1, sz[0], sz[1], sz[3])
				need := []bool{true}
				c := &nn.Ctx{Backend: be, Train: true}
				var s nn.Slot
				step := func() {
					y := l.Forward(c, &s, xs)
					l.Backward(c, &s, xs, y, dout, need)
				}
				runtime.GC()
				step()
				if a := testing.AllocsPerRun(10, step); a != 0 {
					t.Errorf("%v allocations per pass", a)
				}
			})
		}
	}
}

// A forward and backward pass of 32 sequences of 64 steps, 64 features in,
// hidden size 128, on the deterministic backend.
func BenchmarkLSTM(b *testing.B) { benchRNN(b, "lstm") }
func BenchmarkGRU(b *testing.B)  { benchRNN(b, "gru") }

func benchRNN(b *testing.B, kind string) {
	const n, steps, in, h = 32, 64, 64, 128
	r := rand.New(rand.NewPCG(1, 2))
	l := rnnLayer(b, kind, in, h, steps, 1, 1)
	xs := []*nn.Tensor{rnnNormal(r, 0, 1, n, steps, in)}
	dout := rnnNormal(r, 0, 1, n, steps, h)
	need := []bool{true}
	for _, threads := range []int{1, 2} {
		be, err := nn.NewBackend("ppnode-det", threads, true)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			c := &nn.Ctx{Backend: be, Train: true}
			var s nn.Slot
			y := l.Forward(c, &s, xs)
			l.Backward(c, &s, xs, y, dout, need)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				y := l.Forward(c, &s, xs)
				l.Backward(c, &s, xs, y, dout, need)
			}
		})
	}
}

// rnnNormal is a tensor of normal values scaled by sd and shifted by mean.
func rnnNormal(r *rand.Rand, mean, sd float64, shape ...int) *nn.Tensor {
	x := nn.New(shape...)
	for i := range nn.F32(x) {
		nn.F32(x)[i] = float32(mean + sd*r.NormFloat64())
	}
	return x
}
