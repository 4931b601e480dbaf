package onnx_test

import (
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx"
	"github.com/ppnode/ppnode/onnx/onnxpb"
	"github.com/ppnode/ppnode/tensorio"
)

// torchPython is Debian's interpreter with python3-torch; the python3 first
// on PATH may be another one.
const torchPython = "/usr/bin/python3"

// Micro-batches and optimizer of testdata/torch_onnx.py.
var (
	micro        = []int{5, 4, 3}
	lr, momentum = 0.05, 0.9
)

// torchMissing says once why PyTorch cannot run (importing it takes seconds).
var torchMissing = sync.OnceValue(func() error {
	return exec.Command(torchPython, "-c", "import torch, numpy").Run()
})

// exportTorch runs testdata/torch_onnx.py once for every model (importing
// torch takes seconds) and returns the directory that holds, for each
// model, MODEL/model.onnx and MODEL/ref.safetensors.
func exportTorch(t *testing.T, models []string) string {
	t.Helper()
	if err := torchMissing(); err != nil {
		t.Skipf("PyTorch is not available (%s -c 'import torch': %v); install Debian's python3-torch", torchPython, err)
	}
	dir := t.TempDir()
	args := append([]string{"testdata/torch_onnx.py", "--each", dir, "0"}, models...)
	if out, err := exec.Command(torchPython, args...).CombinedOutput(); err != nil {
		t.Fatalf("torch_onnx.py --each: %v\n%s", err, out)
	}
	return dir
}

// loadExport returns a model's ONNX file in dir and its reference tensors
// by name.
func loadExport(t *testing.T, dir string) (string, map[string]*nn.Tensor) {
	t.Helper()
	ts, _, err := tensorio.LoadSafetensors(filepath.Join(dir, "ref.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	ref := map[string]*nn.Tensor{}
	for _, n := range ts {
		ref[n.Name] = n.T
	}
	return filepath.Join(dir, "model.onnx"), ref
}

// steps serves the reference's mini-batches: "__x" [steps, batch, ...]
// (or "__x0", "__x1", ... for several inputs) and "__y" [steps, batch,
// labels...].
type steps struct {
	xs    []*nn.Tensor
	y     *nn.Tensor
	sizes []int
}

func newSteps(t *testing.T, ref map[string]*nn.Tensor) *steps {
	t.Helper()
	s := &steps{y: ref["__y"], sizes: micro}
	if x, ok := ref["__x"]; ok {
		s.xs = []*nn.Tensor{x}
	}
	for k := 0; ref["__x"+strconv.Itoa(k)] != nil; k++ {
		s.xs = append(s.xs, ref["__x"+strconv.Itoa(k)])
	}
	if m, ok := ref["__micro"]; ok {
		s.sizes = nil
		for _, v := range nn.F32(m) {
			s.sizes = append(s.sizes, int(v))
		}
	}
	if len(s.xs) == 0 || s.y == nil {
		t.Fatal("the reference has no __x or __y")
	}
	return s
}

func (s *steps) BatchSize() int     { return s.xs[0].Shape()[1] }
func (s *steps) MicroBatches() int  { return len(s.sizes) }
func (s *steps) StepsPerEpoch() int { return s.xs[0].Shape()[0] }
func (s *steps) labels() int        { return nn.Size(s.y.Shape()[2:]) }

// inputs describes the data for the model at path: integer ids where
// the model's input is an integer tensor.
func (s *steps) inputs(t *testing.T, path string) []onnx.Input {
	t.Helper()
	m, err := onnx.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var ins []onnx.Input
	for k, in := range m.GetGraph().GetInput() {
		if k >= len(s.xs) {
			break
		}
		ins = append(ins, onnx.Input{Name: in.GetName(), Shape: s.xs[k].Shape()[2:],
			Int: in.GetType().GetTensorType().GetElemType() != int32(onnxpb.TensorProto_FLOAT)})
	}
	return ins
}

func (s *steps) Fill(epoch, step, m int, b *nn.Batch) {
	lo := 0
	for _, n := range s.sizes[:m] {
		lo += n
	}
	n, bs := s.sizes[m], s.BatchSize()
	b.X = b.X[:0]
	for _, x := range s.xs {
		per := nn.Size(x.Shape()[2:])
		off := (step*bs + lo) * per
		b.X = append(b.X, nn.FromData(slices.Clone(nn.F32(x)[off:off+n*per]), append([]int{n}, x.Shape()[2:]...)...))
	}
	L := s.labels()
	b.Y = slices.Clone(nn.F32(s.y)[(step*bs+lo)*L : (step*bs+lo+n)*L])
}

// A model exported from PyTorch trains in ppnode as in PyTorch, on every
// backend (the deterministic one and the default, with oneDNN when built
// in): the first step's loss and gradients within 1e-4 of each tensor's
// largest magnitude, the weights and running statistics after 20 steps of
// SGD within 1e-3. PyTorch runs in float64 from the same float32 weights.
func TestTorchModels(t *testing.T) {
	if testing.Short() {
		t.Skip("PyTorch parity runs without -short")
	}
	det, err := nn.NewBackend("ppnode-det", 1, true)
	if err != nil {
		t.Fatal(err)
	}
	def, err := nn.NewBackend("", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	backends := []nn.Backend{det}
	if nn.Describe(def) != nn.Describe(det) {
		backends = append(backends, def)
	}
	models := []string{"mlp", "resnet", "towers", "convnet", "gpt", "padlm", "smooth", "tiedgpt", "clipgpt", "albert", "siamese", "seq2seq", "tutorial",
		"lasttoken", "eot", "t5bias", "attnvariants", "padmodes", "lstmcell", "grucell", "rnn", "rnnrelu", "llama", "dlrm",
		"twotower", "transformer", "padmask", "maskpos", "einsum", "textcnn", "vit", "lstm", "gru", "bilstm", "bigru",
		"mobilenet", "mobilenetv3", "swin", "autoencoder", "normact", "misc", "regress", "denoise", "ctr", "multilabel", "multilabelpw", "paddingidx", "segment", "segmentcw", "regressl1", "regresshuber"}
	if m := os.Getenv("PPNODE_TORCH_MODELS"); m != "" { // for example torch_onnx.py's tv_* sweep
		models = strings.Split(m, ",")
	}
	dir := exportTorch(t, models)
	for _, model := range models {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			path, ref := loadExport(t, filepath.Join(dir, model))
			for _, be := range backends {
				t.Run(nn.Describe(be), func(t *testing.T) { torchParity(t, model, path, ref, be) })
			}
		})
	}
}

func torchParity(t *testing.T, model, path string, ref map[string]*nn.Tensor, be nn.Backend) {
	data := newSteps(t, ref)
	lossName := nn.LossCE
	if l, ok := ref["__loss"]; ok {
		lossName = []string{nn.LossCE, nn.LossMSE, nn.LossBCE, nn.LossL1, nn.LossHuber}[int(nn.F32(l)[0])]
	}
	md, err := onnx.Read(path, onnx.Options{Inputs: data.inputs(t, path)})
	if err != nil {
		t.Fatal(err)
	}
	g := md.Graph
	g.Init(1)
	for k, v := range ref {
		if table, ok := strings.CutPrefix(k, "__padding/"); ok {
			if err := g.SetPadding(table, int(nn.F32(v)[0])); err != nil {
				t.Fatal(err)
			}
		}
	}
	opt, err := nn.NewOptimizer(nn.OptimizerConfig{Name: "sgd", LR: lr, Momentum: momentum})
	if err != nil {
		t.Fatal(err)
	}
	tr := nn.NewTrainer(g, opt, be, 1)
	if tr.Loss, err = nn.NewLoss(lossName, be.Threads()); err != nil {
		t.Fatal(err)
	}
	if c, ok := ref["__clip"]; ok {
		tr.ClipNorm = float64(nn.F32(c)[0])
	}
	if eps, ok := ref["__smoothing"]; ok && lossName == nn.LossCE {
		tr.Loss.(*nn.SoftmaxCE).Smoothing = nn.F32(eps)[0]
	}
	if w, ok := ref["__class_weight"]; ok {
		tr.Loss.(*nn.SoftmaxCE).Weights = nn.F32(w)
	}
	if pw, ok := ref["__pos_weight"]; ok {
		tr.Loss = nn.NewBCE(be.Threads(), nn.F32(pw))
	}
	loss := firstStep(tr, data)
	tol := 1e-4
	if v, ok := ref["__tol"]; ok {
		tol = float64(nn.F32(v)[0])
	}
	lossDev := check(t, 1e-4, "loss1", []float32{float32(loss)}, nn.F32(ref["loss1"]))
	grads, gradDev, valueDev := 0, 0.0, 0.0
	for _, p := range g.Params() {
		if !p.Trainable() {
			continue
		}
		grads++
		exported := (&nn.Param{Value: p.Grad, Layout: p.Layout}).Exported()
		gradDev = max(gradDev, check(t, tol, "grad1/"+p.Name, nn.F32(exported), f32(t, ref, "grad1/"+p.Name)))
	}
	if tr.ClipNorm > 0 {
		nn.ClipGrads(g.Params(), tr.ClipNorm)
	}
	opt.Step(g.Params())
	losses := []float64{loss}
	for s := 1; s < data.StepsPerEpoch(); s++ {
		losses = append(losses, tr.Step(data, 0, s, s).Loss)
	}
	if l, ok := ref["__losses"]; ok && t.Failed() {
		t.Logf("losses: ppnode %.6f\nPyTorch %.6f", losses, nn.F32(l))
	}
	for _, p := range g.Params() {
		valueDev = max(valueDev, check(t, 1e-3, "value20/"+p.Name, nn.F32(p.Exported()), f32(t, ref, "value20/"+p.Name)))
	}
	t.Logf("%s on %s: %d layers, %d parameters and buffers (%d trainable); largest deviation from PyTorch: loss %.1e, gradients %.1e, weights after %d steps %.1e",
		model, nn.Describe(be), len(g.Nodes), len(g.Params()), grads, lossDev, gradDev, data.StepsPerEpoch(), valueDev)
}

func f32(t *testing.T, ref map[string]*nn.Tensor, name string) []float32 {
	t.Helper()
	r, ok := ref[name]
	if !ok {
		t.Fatalf("PyTorch has no %s", name)
	}
	return nn.F32(r)
}

// firstStep runs the forward and backward passes of the first mini-batch
// and returns its mean loss, leaving the gradients in place.
func firstStep(tr *nn.Trainer, b nn.Batches) float64 {
	tr.Ctx.Train = true
	var total float64
	mbs := make([]nn.Batch, b.MicroBatches())
	var mass float64 // what the mean divides by (the labels not ignored, or their weights)
	for m := range mbs {
		mbs[m] = *nn.MicroBatch(b, 0, 0, m)
		mass += tr.Loss.Mass(mbs[m].Y)
	}
	dout := make([]*nn.Tensor, 1)
	for m, mb := range mbs {
		tr.Ctx.Micro = m
		out := tr.Stage.Forward(&tr.Ctx, 0, mb.X)
		loss, _, grad := tr.Loss.Forward(out[0], mb.Y, float32(1/mass))
		total += loss
		dout[0] = grad
		tr.Stage.Backward(&tr.Ctx, 0, dout)
	}
	for _, g := range nn.Ties(tr.Stage.Params()) {
		nn.SumTies(g, nil)
	}
	return total / mass
}

// check compares within tol of the reference tensor's largest magnitude, or
// of 1e-3 for a tensor that is zero in exact arithmetic (the gradient of a
// bias before a BatchNorm: PyTorch's float64 gives 1e-17, float32 1e-8),
// and returns the largest difference in that unit.
func check(t *testing.T, tol float64, name string, got, want []float32) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, PyTorch has %d", name, len(got), len(want))
		return math.Inf(1)
	}
	scale := 1e-3
	for _, v := range want {
		if !math.IsInf(float64(v), 0) { // a mask's -inf
			scale = math.Max(scale, math.Abs(float64(v)))
		}
	}
	worst, at := 0.0, 0
	for i := range got {
		if got[i] == want[i] {
			continue
		}
		if d := math.Abs(float64(got[i]) - float64(want[i])); d > worst || math.IsNaN(d) {
			worst, at = d, i
		}
	}
	if worst > tol*scale || math.IsNaN(worst) {
		t.Errorf("%s[%d]: ppnode %v, PyTorch %v (difference %.3g, %.3g of the largest magnitude)", name, at, got[at], want[at], worst, worst/scale)
	}
	return worst / scale
}
