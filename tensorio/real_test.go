package tensorio_test

// Real tensors: activations and gradients captured from training, for the
// codec benchmarks and the codec-choice test. They are checked in under
// testdata/real; regenerate them (about a minute on two cores) with
//
//	go test ./tensorio/ -run TestWriteRealSamples -write-real
//
// This external test package imports data and nn/zoo only to produce them;
// the tensorio package itself depends on nn alone.

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/data"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
	"github.com/ppnode/ppnode/tensorio"
)

var writeReal = flag.Bool("write-real", false, "regenerate testdata/real/*.safetensors by training mlp32 and resnet50 (slow)")

const realDir = "testdata/real"

// realModel says how one model is trained and where its pipeline is cut.
type realModel struct {
	file   string // under realDir
	model  string
	data   string
	width  float64
	batch  int                // training mini-batch
	micro  int                // micro-batches per mini-batch
	steps  int                // training steps before the capture
	opt    nn.OptimizerConfig // ppnode train's default, at a constant rate
	sample int                // samples of the captured micro-batch
	// cuts are the layers after which the model is cut into stages, and
	// keep the number of leading samples of each captured tensor saved
	// (at most 512 KiB each).
	cuts []string
	keep []int
}

var realModels = []realModel{
	{
		file: "mlp32.safetensors", model: "mlp32", data: "mnist", width: 512,
		batch: 128, micro: 4, steps: 20, sample: 256,
		opt: nn.OptimizerConfig{Name: "adam", LR: 3e-4},
		// After a ReLU (the usual cut), and after a Linear layer, before
		// its ReLU: there the activation is dense and the gradient
		// half zeros.
		cuts: []string{"relu8", "fc16", "relu24"},
		keep: []int{256, 256, 256},
	},
	{
		file: "resnet50.safetensors", model: "resnet50", data: "synthetic:32x32x3:10", width: 0.25,
		batch: 32, micro: 4, steps: 20, sample: 8,
		opt: nn.OptimizerConfig{Name: "adam", LR: 3e-4},
		// Block outputs (after the residual add and ReLU) of stages 1-3.
		cuts: []string{"layer1.2.relu3", "layer2.3.relu3", "layer3.5.relu3"},
		keep: []int{2, 4, 8},
	},
}

// TestWriteRealSamples trains each model of realModels for a few steps,
// then runs one more micro-batch forward and backward through the model
// cut into stages at the cut points (nn.Graph.Stage), and saves what
// crosses each cut: the forward output ("act/<layer>") and the gradient
// the next stage's Backward returns for it ("grad/<layer>").
func TestWriteRealSamples(t *testing.T) {
	if !*writeReal {
		t.Skip("run with -write-real to regenerate testdata/real")
	}
	if err := os.MkdirAll(realDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, m := range realModels {
		start := time.Now()
		ts, meta := captureReal(t, m)
		path := filepath.Join(realDir, m.file)
		if err := tensorio.SaveSafetensors(path, ts, meta); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		for _, x := range ts {
			z := 0
			for _, v := range nn.F32(x.T) {
				if v == 0 {
					z++
				}
			}
			t.Logf("%s %s %v: %.1f%% zeros", m.file, x.Name, x.T.Shape(), 100*float64(z)/float64(len(nn.F32(x.T))))
		}
		t.Logf("wrote %s in %v", path, time.Since(start).Round(time.Millisecond))
	}
}

func captureReal(t *testing.T, m realModel) ([]tensorio.Named, map[string]string) {
	const seed = 1
	be, err := nn.NewBackend("", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	set, err := data.Load(m.data, data.Options{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	set.Standardize() // as ppnode train does by default
	g, err := zoo.Build(m.model, zoo.Options{Width: m.width, Input: set.Train.Shape, Classes: set.Classes})
	if err != nil {
		t.Fatal(err)
	}
	g.Init(seed)
	oc := m.opt
	oc.Threads = 2
	opt, err := nn.NewOptimizer(oc)
	if err != nil {
		t.Fatal(err)
	}
	loader, err := data.NewLoader(set.Train, seed, m.batch, m.micro)
	if err != nil {
		t.Fatal(err)
	}
	tr := nn.NewTrainer(g, opt, be, seed)
	var losses []string
	for s := range m.steps {
		r := tr.Step(loader, 0, s, s)
		losses = append(losses, strconv.FormatFloat(r.Loss, 'f', 3, 64))
	}
	t.Logf("%s: training loss per step %s", m.model, strings.Join(losses, " "))

	// Cut the graph after each cut layer; every stage but the first
	// reads exactly the previous cut.
	var stages []*nn.Stage
	var names []string
	for _, n := range g.Nodes {
		names = append(names, n.Name)
		if slices.Contains(m.cuts, n.Name) || n == g.Nodes[len(g.Nodes)-1] {
			st, err := g.Stage(names)
			if err != nil {
				t.Fatal(err)
			}
			stages = append(stages, st)
			names = nil
		}
	}
	for i, st := range stages[1:] {
		if !slices.Equal(st.Inputs, []string{m.cuts[i]}) || !slices.Equal(stages[i].Outputs, []string{m.cuts[i]}) {
			t.Fatalf("%s: stage %d reads %v, stage %d writes %v; want only %s between them",
				m.model, i+1, st.Inputs, i, stages[i].Outputs, m.cuts[i])
		}
	}

	extra, err := data.NewLoader(set.Train, seed+1, m.sample, 1)
	if err != nil {
		t.Fatal(err)
	}
	x, y := extra.Batch(0, 0, 0)
	ctx := nn.Ctx{Backend: be, Train: true, Seed: seed, Step: m.steps}
	acts := make([]*nn.Tensor, len(m.cuts))
	grads := make([]*nn.Tensor, len(m.cuts))
	in := []*nn.Tensor{x}
	for i, st := range stages {
		in = st.Forward(&ctx, 0, in)
		if i < len(m.cuts) {
			acts[i] = leading(in[0], m.keep[i])
		}
	}
	var loss nn.SoftmaxCE
	_, _, grad := loss.Forward(in[0], y, 1/float32(len(y)))
	dout := []*nn.Tensor{grad}
	for i := len(stages) - 1; i >= 1; i-- {
		dout = stages[i].Backward(&ctx, 0, dout)
		grads[i-1] = leading(dout[0], m.keep[i-1])
	}

	var ts []tensorio.Named
	meta := map[string]string{
		"model": m.model, "data": m.data, "width": strconv.FormatFloat(m.width, 'g', -1, 64),
		"steps": strconv.Itoa(m.steps), "batch": strconv.Itoa(m.batch), "micro_batches": strconv.Itoa(m.micro),
		"optimizer": fmt.Sprintf("%s lr=%g", m.opt.Name, m.opt.LR), "seed": strconv.Itoa(seed),
		"train_loss": strings.Join(losses, " "),
		"captured":   fmt.Sprintf("one more micro-batch of %d samples (train mode); each tensor keeps its leading samples", m.sample),
		"generator":  "go test ./tensorio/ -run TestWriteRealSamples -write-real",
	}
	for i, c := range m.cuts {
		ts = append(ts, tensorio.Named{Name: "act/" + c, T: acts[i]}, tensorio.Named{Name: "grad/" + c, T: grads[i]})
	}
	return ts, meta
}

// leading returns a copy of the first k samples (rows of the batch
// dimension) of x.
func leading(x *nn.Tensor, k int) *nn.Tensor {
	shape := append([]int{}, x.Shape()...)
	per := nn.Size(shape[1:])
	shape[0] = min(k, shape[0])
	return nn.FromData(append([]float32(nil), nn.F32(x)[:shape[0]*per]...), shape...)
}

// realSample is one recorded tensor.
type realSample struct {
	name string // file stem and tensor name: "mlp32/act/relu8"
	t    *nn.Tensor
}

// loadRealSamples reads every tensor of testdata/real, in file and name
// order.
func loadRealSamples(tb testing.TB) []realSample {
	tb.Helper()
	var out []realSample
	for _, m := range realModels {
		ts, _, err := tensorio.LoadSafetensors(filepath.Join(realDir, m.file))
		if err != nil {
			tb.Fatalf("%v (regenerate with -write-real)", err)
		}
		for _, x := range ts {
			out = append(out, realSample{name: strings.TrimSuffix(m.file, ".safetensors") + "/" + x.Name, t: x.T})
		}
	}
	return out
}
