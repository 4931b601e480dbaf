package nn_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
	"github.com/ppnode/ppnode/tensorio"
)

// torchPython is Debian's interpreter with python3-torch; the python3 first
// on PATH may be another one.
const torchPython = "/usr/bin/python3"

// torchMissing says once per process why PyTorch cannot run (importing it
// takes seconds).
var torchMissing = sync.OnceValue(func() error {
	return exec.Command(torchPython, "-c", "import torch, numpy").Run()
})

// needTorch skips a PyTorch parity test where PyTorch is missing, and under
// the race detector: the parity tests check numbers, which the runs without
// it check, and not concurrency.
func needTorch(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("PyTorch parity runs without the race detector")
	}
	if err := torchMissing(); err != nil {
		t.Skipf("PyTorch is not available (%s -c 'import torch' failed: %v); install Debian's python3-torch to run the parity test", torchPython, err)
	}
}

// spec describes a graph for testdata/torch_step.py.
type specNode struct {
	Name    string         `json:"name"`
	Kind    string         `json:"kind"`
	Inputs  []string       `json:"inputs"`
	Attrs   map[string]any `json:"attrs"`
	Params  []string       `json:"params,omitempty"`
	Buffers []string       `json:"buffers,omitempty"`
}

func describe(g *nn.Graph) []specNode {
	var out []specNode
	for _, n := range g.Nodes {
		s := specNode{Name: n.Name, Kind: n.Layer.Kind(), Inputs: n.Inputs, Attrs: map[string]any{}}
		switch l := n.Layer.(type) {
		case *nn.Conv2D:
			s.Attrs["stride"], s.Attrs["pad"] = l.Stride, l.Pad
		case *nn.MaxPool2D:
			s.Attrs["k"], s.Attrs["stride"], s.Attrs["pad"] = l.K, l.Stride, l.Pad
		case *nn.BatchNorm:
			s.Attrs["momentum"], s.Attrs["eps"] = l.Momentum, l.Eps
		case *nn.Slice:
			s.Attrs["from"], s.Attrs["to"] = l.From, l.To
		}
		for _, p := range n.Layer.Params() {
			if p.Trainable() || p.Frozen {
				s.Params = append(s.Params, p.Name)
			} else {
				s.Buffers = append(s.Buffers, p.Name)
			}
		}
		out = append(out, s)
	}
	return out
}

// fixedBatches serves one mini-batch, cut into micro-batches of given sizes.
type fixedBatches struct {
	x     []float32
	y     []float32
	shape []int
	sizes []int
}

func (f *fixedBatches) BatchSize() int     { return len(f.y) }
func (f *fixedBatches) MicroBatches() int  { return len(f.sizes) }
func (f *fixedBatches) StepsPerEpoch() int { return 1 }
func (f *fixedBatches) Micro(epoch, step, m int, x *nn.Tensor, y []float32) (*nn.Tensor, []float32) {
	lo := 0
	for _, s := range f.sizes[:m] {
		lo += s
	}
	n, per := f.sizes[m], nn.Size(f.shape)
	x = nn.FromData(append([]float32(nil), f.x[lo*per:(lo+n)*per]...), append([]int{n}, f.shape...)...)
	return x, append([]float32(nil), f.y[lo:lo+n]...)
}

func (f *fixedBatches) Fill(epoch, step, m int, b *nn.Batch) {
	var x *nn.Tensor
	if len(b.X) == 1 {
		x = b.X[0]
	}
	x, b.Y = f.Micro(epoch, step, m, x, b.Y)
	b.X = append(b.X[:0], x)
}

// One training step of small models, run here and in PyTorch from the same
// weights and inputs: loss, gradients and updated weights (after one and two
// steps, so that momentum and Adam's moments count) agree within 1e-4 of
// each tensor's largest magnitude. PyTorch runs in float64, the exact
// reference for ppnode's float32 (PPNODE_PARITY_FLOAT32=1 compares with
// PyTorch's float32 instead); PPNODE_PARITY_DIR keeps the exchanged files.
func TestTorchParity(t *testing.T) {
	needTorch(t)
	if testing.Short() {
		t.Skip("PyTorch parity runs without -short")
	}
	smallConv := func() (*nn.Graph, error) {
		b := nn.NewBuilder()
		x := b.Input("x", 8, 8, 3)
		x = b.Add("conv1", nn.NewConv2D(3, 6, 3, 1, 1), x)
		x = b.Add("bn1", nn.NewBatchNorm(), x)
		x = b.Add("relu1", nn.ReLU{}, x)
		x = b.Add("pool1", &nn.MaxPool2D{K: 2, Stride: 2}, x)
		y := b.Add("block.conv1", nn.NewConv2D(6, 6, 3, 1, 1), x)
		y = b.Add("block.bn1", nn.NewBatchNorm(), y)
		y = b.Add("block.relu1", nn.ReLU{}, y)
		y = b.Add("block.conv2", nn.NewConv2D(6, 6, 1, 1, 0), y)
		y = b.Add("block.add", nn.Add{}, y, x)
		y = b.Add("block.relu2", nn.ReLU{}, y)
		y = b.Add("down", nn.NewConv2D(6, 8, 3, 2, 1), y)
		y = b.Add("flatten", nn.Flatten{}, y)
		y = b.Add("fc", nn.NewLinear(2*2*8, 5), y)
		return b.Build(y)
	}
	cases := []struct {
		name  string
		build func() (*nn.Graph, error)
		shape []int
		opt   nn.OptimizerConfig
		tol   float64
		draw  uint64   // seeds the weights' noise and the batch; 0 means 4
		frz   []string // Graph.Freeze's prefixes
	}{
		{"mlp", func() (*nn.Graph, error) {
			return zoo.Build("mlp32", zoo.Options{Width: 16, Input: []int{12}, Classes: 5})
		}, []int{12},
			nn.OptimizerConfig{Name: "sgd", LR: 0.05, Momentum: 0.9, WeightDecay: 1e-4}, 0, 0, nil},
		{"conv", smallConv, []int{8, 8, 3}, nn.OptimizerConfig{Name: "sgd", LR: 0.05, Momentum: 0.9, WeightDecay: 1e-4}, 0, 0, nil},
		{"conv-adam", smallConv, []int{8, 8, 3}, nn.OptimizerConfig{Name: "adam", LR: 1e-3, WeightDecay: 1e-4}, 0, 0, nil},
		// A decay large enough that shrinking the weights shows.
		{"conv-adamw", smallConv, []int{8, 8, 3}, nn.OptimizerConfig{Name: "adamw", LR: 1e-2, WeightDecay: 0.5}, 0, 0, nil},
		// Parameter groups: biases and BatchNorm's scales not decayed.
		{"conv-adamw-groups", smallConv, []int{8, 8, 3}, nn.OptimizerConfig{Name: "adamw", LR: 1e-2, WeightDecay: 0.5, NoDecay1D: true}, 0, 0, nil},
		{"conv-sgd-groups", smallConv, []int{8, 8, 3}, nn.OptimizerConfig{Name: "sgd", LR: 0.05, Momentum: 0.9, WeightDecay: 0.5, NoDecay1D: true}, 0, 0, nil},
		// The first convolution and its BatchNorm frozen (requires_grad=False),
		// and the block's second convolution: no update, no decay.
		{"conv-frozen", smallConv, []int{8, 8, 3}, nn.OptimizerConfig{Name: "adamw", LR: 1e-2, WeightDecay: 0.5}, 0, 0, []string{"conv1.", "bn1.", "block.conv2."}},
		{"resnet50", func() (*nn.Graph, error) {
			return zoo.Build("resnet50", zoo.Options{Width: 1.0 / 16, Input: []int{16, 16, 3}, Classes: 5})
			// 53 layers of float32: PyTorch's own float32 gradients differ
			// from its float64 ones by 1.4e-4 of the tensor's largest
			// magnitude on this instance, so one step is compared, at 3e-4.
			// Through 30 layers the float32 activations drift from the
			// float64 ones by about 5e-6 of their largest magnitude, and
			// with ~10^5 ReLU inputs per pass a few lie that close to the
			// kink: one that lands on the other side than in float64 moves
			// every gradient below it by a percent. Whether one does depends
			// on the summation order (it does on draw 4 with oneDNN's
			// kernels, and on draw 9 with the pure-Go ones), so the draw is
			// one on which no backend's does.
		}, []int{16, 16, 3}, nn.OptimizerConfig{Name: "sgd", LR: 0.001, Momentum: 0.9}, 3e-4, 5, nil},
		{"uno", func() (*nn.Graph, error) {
			return zoo.Build("uno", zoo.Options{Width: 0.02, Input: []int{30}, Classes: 5})
		}, []int{30},
			nn.OptimizerConfig{Name: "adam", LR: 1e-3}, 0, 0, nil},
	}
	// Every backend: the deterministic one (the layers' own loops) and the
	// default one (OpenBLAS, and oneDNN's layers when built with them).
	def, err := nn.NewBackend("", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	det, err := nn.NewBackend("ppnode-det", 1, true)
	if err != nil {
		t.Fatal(err)
	}
	backends := []struct {
		name string
		be   nn.Backend
	}{{"deterministic", det}, {"default", def}}
	for i := range cases {
		if cases[i].tol == 0 {
			cases[i].tol = 1e-4
		}
		if cases[i].draw == 0 {
			cases[i].draw = 4
		}
	}
	// The references of every case from one interpreter (importing torch
	// takes seconds); every backend starts from the same weights and batch.
	root := t.TempDir()
	if d := os.Getenv("PPNODE_PARITY_DIR"); d != "" {
		root = filepath.Join(d, t.Name())
	}
	var args []string
	build := func(c int) *nn.Graph {
		g, err := cases[c].build()
		if err == nil && cases[c].frz != nil {
			err = g.Freeze(cases[c].frz)
		}
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	for i, c := range cases {
		g := build(i)
		fb := parityStart(g, c.shape, c.draw)
		dir := filepath.Join(root, c.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeParityInputs(t, dir, g, fb, c.opt)
		args = append(args, filepath.Join(dir, "in.safetensors"), filepath.Join(dir, "spec.json"), filepath.Join(dir, "out.safetensors"))
	}
	cmd := exec.Command(torchPython, append([]string{"testdata/torch_step.py"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("torch_step.py: %v\n%s", err, out)
	}
	for i, c := range cases {
		ref, _, err := tensorio.LoadSafetensors(filepath.Join(root, c.name, "out.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][]float32{}
		for _, n := range ref {
			want[n.Name] = nn.F32(n.T)
		}
		for _, b := range backends {
			t.Run(c.name+"/"+b.name, func(t *testing.T) {
				g := build(i)
				parity(t, g, parityStart(g, c.shape, c.draw), c.opt, c.tol, want, b.be)
			})
		}
	}
}

// parityStart initialises g's weights (with noise drawn from draw) and
// returns the mini-batch of a parity case: the same on every call.
func parityStart(g *nn.Graph, shape []int, draw uint64) *fixedBatches {
	r := rand.New(rand.NewPCG(3, draw))
	g.Init(5)
	for _, p := range g.Params() {
		if p.Trainable() {
			for i := range nn.F32(p.Value) {
				nn.F32(p.Value)[i] += float32(0.05 * r.NormFloat64())
			}
		}
	}
	sizes := []int{5, 4, 5} // uneven micro-batches
	B := 14
	fb := &fixedBatches{x: make([]float32, B*nn.Size(shape)), y: make([]float32, B), shape: shape, sizes: sizes}
	for i := range fb.x {
		fb.x[i] = float32(r.NormFloat64())
	}
	for i := range fb.y {
		fb.y[i] = float32(r.IntN(5))
	}
	return fb
}

// writeParityInputs writes what testdata/torch_step.py reads in dir: the
// weights and the batch (in.safetensors), the graph, micro-batches and
// optimizer (spec.json).
func writeParityInputs(t *testing.T, dir string, g *nn.Graph, fb *fixedBatches, oc nn.OptimizerConfig) {
	t.Helper()
	var in []tensorio.Named
	var frozen []string
	for _, p := range g.Params() {
		in = append(in, tensorio.Named{Name: p.Name, T: nn.FromData(append([]float32(nil), nn.F32(p.Value)...), p.Value.Shape()...)})
		if p.Frozen {
			frozen = append(frozen, p.Name)
		}
	}
	B := len(fb.y)
	ys := make([]float32, B)
	for i, y := range fb.y {
		ys[i] = float32(y)
	}
	in = append(in, tensorio.Named{Name: "__x", T: nn.FromData(fb.x, append([]int{B}, fb.shape...)...)}, tensorio.Named{Name: "__y", T: nn.FromData(ys, B)})
	if err := tensorio.SaveSafetensors(filepath.Join(dir, "in.safetensors"), in, nil); err != nil {
		t.Fatal(err)
	}
	spec := map[string]any{
		"nodes": describe(g), "input": g.InputNames[0], "output": g.Output, "micro_sizes": fb.sizes,
		"optimizer": map[string]any{"name": oc.Name, "lr": oc.LR, "momentum": oc.Momentum, "weight_decay": oc.WeightDecay, "no_decay_1d": oc.NoDecay1D},
		"float64":   os.Getenv("PPNODE_PARITY_FLOAT32") == "",
		"frozen":    frozen,
	}
	js, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "spec.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
}

// parity trains g, started by parityStart, on be and compares with
// PyTorch's results want.
func parity(t *testing.T, g *nn.Graph, fb *fixedBatches, oc nn.OptimizerConfig, tol float64, want map[string][]float32, be nn.Backend) {
	opt, err := nn.NewOptimizer(oc)
	if err != nil {
		t.Fatal(err)
	}
	tr := nn.NewTrainer(g, opt, be, 1)
	// Step 1, by hand so that the gradients can be read before the update.
	stepLoss := stepNoUpdate(tr, fb)
	check(t, tol, "loss1", []float32{float32(stepLoss)}, want["loss1"])
	for _, p := range g.Params() {
		if p.Trainable() {
			check(t, tol, "grad1/"+p.Name, nn.F32(p.Grad), want["grad1/"+p.Name])
		}
	}
	opt.Step(g.Params())
	for _, p := range g.Params() {
		check(t, tol, "value1/"+p.Name, nn.F32(p.Value), want["value1/"+p.Name])
	}
	if tol > 1e-4 {
		// A model that needed a looser tolerance is too ill-conditioned in
		// float32 for its second step to be compared meaningfully.
		return
	}
	tr.Step(fb, 0, 0, 1)
	for _, p := range g.Params() {
		check(t, tol, "value2/"+p.Name, nn.F32(p.Value), want["value2/"+p.Name])
	}
}

// stepNoUpdate runs the forward and backward passes of one mini-batch and
// returns its mean loss, leaving the gradients in place.
func stepNoUpdate(tr *nn.Trainer, b nn.Batches) float64 {
	var ce nn.SoftmaxCE
	tr.Ctx.Train = true
	var total float64
	in, dout := make([]*nn.Tensor, 1), make([]*nn.Tensor, 1)
	for m := 0; m < b.MicroBatches(); m++ {
		mb := nn.MicroBatch(b, 0, 0, m)
		x, y := mb.X[0], mb.Y
		in[0] = x
		out := tr.Stage.Forward(&tr.Ctx, 0, in)
		loss, _, grad := ce.Forward(out[0], y, float32(1/float64(b.BatchSize())))
		total += loss
		dout[0] = grad
		tr.Stage.Backward(&tr.Ctx, 0, dout)
	}
	return total / float64(b.BatchSize())
}

// check compares within tol of the reference tensor's largest magnitude.
func check(t *testing.T, tol float64, name string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, PyTorch has %d", name, len(got), len(want))
		return
	}
	scale := 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	worst, at := 0.0, 0
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); d > worst || math.IsNaN(d) {
			worst, at = d, i
		}
	}
	if worst > tol*scale || math.IsNaN(worst) {
		t.Errorf("%s[%d]: ppnode %v, PyTorch %v (difference %.3g, %.3g of the largest magnitude)", name, at, got[at], want[at], worst, worst/scale)
	}
}
