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
	"math"
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

var (
	writeReal = flag.Bool("write-real", false, "regenerate testdata/real/*.safetensors by training mlp32 and resnet50 (slow)")
	bounds    = flag.String("bounds", "", `print the order-0 entropy bound of the ReLU activations of testdata/real ("recorded"), or of resnet50's trained on DATA for STEPS ("DATA:STEPS", e.g. "mnist:200"; slow)`)
)

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

// TestEntropyBounds prints, for ReLU activations, what a lossless codec
// coding each element on its own (order 0) can reach at best: a zero flag
// per element, and each byte of a non-zero value coded by the frequencies
// of its byte plane. It compares the bound with sparse and sparse+huff.
func TestEntropyBounds(t *testing.T) {
	var ts []tensorio.Named
	switch data, steps, ok := strings.Cut(*bounds, ":"); {
	case *bounds == "":
		t.Skip(`run with -bounds recorded or -bounds DATA:STEPS`)
	case *bounds == "recorded":
		for _, s := range loadRealSamples(t) {
			ts = append(ts, tensorio.Named{Name: s.name, T: s.t})
		}
	case ok:
		m := realModels[1]
		m.data = data
		var err error
		if m.steps, err = strconv.Atoi(steps); err != nil {
			t.Fatal(err)
		}
		named, meta := captureReal(t, m)
		t.Logf("resnet50 on %s, %d steps: loss %s", data, m.steps, meta["train_loss"])
		for _, x := range named {
			ts = append(ts, tensorio.Named{Name: "resnet50/" + x.Name, T: x.T})
		}
	default:
		t.Fatalf("-bounds %q: want recorded or DATA:STEPS", *bounds)
	}
	for _, x := range ts {
		if !strings.Contains(x.Name, "/act/") || strings.HasSuffix(x.Name, "fc16") {
			continue // ReLU outputs only
		}
		v := nn.F32(x.T)
		zeros, bits := order0Bits(v)
		line := fmt.Sprintf("%s: %.1f%% zeros, order-0 bound %.2fx", x.Name, 100*zeros, float64(32*len(v))/bits)
		for _, c := range []tensorio.Codec{tensorio.CodecSparse, tensorio.CodecSparseHuff} {
			frame, err := tensorio.AppendFrame(nil, x.T, c)
			if err != nil {
				t.Fatal(err)
			}
			ratio := float64(4*len(v)) / float64(len(frame))
			line += fmt.Sprintf(", %v %.2fx", c, ratio)
			if c == tensorio.CodecSparse && ratio > float64(32*len(v))/bits {
				// It spends a bit per element and 32 per non-zero value.
				t.Errorf("%s: sparse %.3fx beats the order-0 bound", x.Name, ratio)
			}
		}
		t.Log(line)
	}
}

// order0Bits returns the fraction of zeros of v and the bits an order-0
// code needs for v: the entropy of the zero flags plus, over the non-zero
// values, the entropy of each of their four byte planes.
func order0Bits(v []float32) (zeros, bits float64) {
	var planes [4][256]int
	nz := 0
	for _, f := range v {
		if f == 0 {
			continue
		}
		u := math.Float32bits(f)
		for i := range planes {
			planes[i][byte(u>>(8*i))]++
		}
		nz++
	}
	h := func(counts []int, n int) float64 {
		var e float64
		for _, c := range counts {
			if c > 0 {
				p := float64(c) / float64(n)
				e -= p * math.Log2(p)
			}
		}
		return e
	}
	zeros = float64(len(v)-nz) / float64(len(v))
	bits = float64(len(v)) * h([]int{len(v) - nz, nz}, len(v))
	for i := range planes {
		bits += float64(nz) * h(planes[i][:], nz)
	}
	return zeros, bits
}

func TestOrder0Bits(t *testing.T) {
	// Half zeros and one non-zero value: a bit per element for the flag,
	// nothing for the values.
	if z, bits := order0Bits([]float32{0, 1, 0, 1}); z != 0.5 || bits != 4 {
		t.Errorf("order0Bits(0, 1, 0, 1) = %v, %v; want 0.5, 4", z, bits)
	}
	// No zeros, and the low byte taking 4 values equally often: 2 bits
	// each, the other planes constant.
	v := []float32{math.Float32frombits(0x3f800000), math.Float32frombits(0x3f800001),
		math.Float32frombits(0x3f800002), math.Float32frombits(0x3f800003)}
	if z, bits := order0Bits(v); z != 0 || bits != 8 {
		t.Errorf("order0Bits(%v) = %v, %v; want 0, 8", v, z, bits)
	}
}
