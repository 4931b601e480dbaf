package job

import (
	"bufio"
	"cmp"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/cgroup"
	"github.com/ppnode/ppnode/data"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/onnx"
)

// Footprint is the memory a job needs, estimated from its spec and its
// model's layer shapes alone, before anything is allocated. Tensors are
// float32; the Go values around them are not counted.
type Footprint struct {
	// Params are the parameters and buffers (BatchNorm's running
	// statistics); Grads a gradient per trainable parameter; Optimizer the
	// optimizer's state: one slot per trainable parameter for SGD with
	// momentum (none without), two for Adam.
	Params, Grads, Optimizer int64
	// Activations are those of all of a step's micro-batches in flight at
	// once (GPipe keeps them all, 1F1B fewer): per sample and layer, its
	// output and its inputs' gradients, a convolution's im2col columns, a
	// dropout's mask. With recomputation allowed, the least a plan can
	// keep: one micro-batch's, each stage recomputing.
	Activations int64
	// MicroBatches is the number of micro-batches in flight counted.
	MicroBatches int
	// Data is the data set (both splits), loaded by the process that
	// prepares the job; LocalActivations what `train --local` runs itself:
	// two micro-batches' (one in flight and its gradients) and an
	// evaluation chunk's forward pass.
	Data, LocalActivations int64
	// Evaluation is an evaluation chunk's activations (in LocalActivations).
	Evaluation int64
}

// Driver is what a pipelined job's coordinator holds on its own node: the
// data, the model and its optimizer state (cuts are gathered into them)
// and an evaluation chunk's activations.
func (f Footprint) Driver() int64 {
	return sat(float64(f.Params) + float64(f.Optimizer) + float64(f.Data) + float64(f.Evaluation))
}

// Total is what the pipelined job needs over all its nodes.
func (f Footprint) Total() int64 {
	return sat(float64(f.Params) + float64(f.Grads) + float64(f.Optimizer) + float64(f.Activations))
}

// Local is what the process that prepares the job allocates itself
// (`ppnode train --local`, or the coordinator, which builds the whole
// model, profiles it and gathers the cuts into it): the whole model with
// its gradients and optimizer state, the data and its own activations.
func (f Footprint) Local() int64 {
	return sat(float64(f.Params) + float64(f.Grads) + float64(f.Optimizer) + float64(f.Data) + float64(f.LocalActivations))
}

// evalChunk is the most samples Job.Evaluate runs at a time; evalMemory
// bounds what their activations may take.
const (
	evalChunk  = 256
	evalMemory = 256 << 20
)

// evalChunkOf is how many samples of perSample bytes of activations each
// Job.Evaluate runs at a time.
func evalChunkOf(perSample int64) int {
	if perSample <= 0 {
		return evalChunk
	}
	return int(max(1, min(evalChunk, evalMemory/perSample)))
}

// evalBytes is what a sample's forward pass holds at once when w's model
// evaluates it: every layer's output and a convolution's columns.
func (w *shapes) evalBytes() int64 { return 4 * (w.outs + w.cols) }

// Estimate computes the spec's footprint from shapes only: the data set's
// from its name, the model's layer by layer as nn/zoo builds it (see
// modelShapes), so that nothing in proportion to the model is allocated.
// It fails for an unknown data set or a model that does not take its
// input.
func (c Checked) Estimate() (Footprint, error) {
	s := c.s
	d, train, test, err := dataShape(s)
	if err != nil {
		return Footprint{}, err
	}
	var w *shapes
	if IsModelFile(s.Model) {
		w, err = onnxShapes(s, d)
	} else {
		if len(d.Inputs) != 1 {
			return Footprint{}, specErr("%s takes one input; the data has %d", s.Model, len(d.Inputs))
		}
		w, err = modelShapes(s.Model, s.Width, d.Inputs[0].Shape, d.Classes)
	}
	if err != nil {
		return Footprint{}, specErr("%v", err)
	}
	slots := 0.0
	switch {
	case nn.IsAdam(s.Optimizer):
		slots = 2
	case s.Momentum != 0:
		slots = 1
	}
	M := s.MicroBatches
	if M == 0 { // auto: the least memory it may choose
		M = MostMicroBatches(s.Batch)
	}
	micro := float64((s.Batch + M - 1) / M)
	flight := M
	if s.Recompute == "auto" || s.Recompute == "all" {
		flight = 1
	}
	perSample := float64(w.outs + w.back + w.cols)
	var sample float64
	for _, in := range d.Inputs {
		sample += float64(size64(in.Shape))
	}
	sample += float64(size64(d.Labels)) - 1
	eval := float64(min(evalChunkOf(w.evalBytes()), test)) * float64(w.evalBytes())
	return Footprint{
		Params: sat(4 * float64(w.params)), Grads: sat(4 * float64(w.trainable)), Optimizer: sat(4 * slots * float64(w.trainable)),
		Activations: sat(4 * float64(flight) * micro * perSample), MicroBatches: flight,
		Data:             sat(4 * float64(train+test) * (sample + 1)),
		LocalActivations: sat(4*2*micro*perSample + eval),
		Evaluation:       sat(eval),
	}, nil
}

// dataShape is what the spec's data set feeds a model and its split
// sizes, known from its name or its file's headers (as data.Load would load
// it); a file's classes are not known before its labels are read (0).
func dataShape(s Spec) (d Sample, train, test int, err error) {
	one := func(shape []int, classes int) Sample {
		return Sample{Inputs: []onnx.Input{{Name: "x", Shape: shape}}, Labels: []int{}, Classes: classes}
	}
	switch {
	case s.Data == "mnist" || s.Data == "fashion-mnist":
		return one([]int{28, 28, 1}, 10), 60000, 10000, nil
	case s.Data == "synthetic" || strings.HasPrefix(s.Data, "synthetic:"):
		shape, classes, err := data.ParseSynthetic(s.Data)
		train := s.SyntheticSamples
		if train == 0 {
			train = data.DefaultSyntheticTrain
		}
		return one(shape, classes), train, data.DefaultSyntheticTest, err
	case data.IsFile(s.Data):
		fs, err := data.Describe(s.Data, s.open)
		if err != nil {
			return Sample{}, 0, 0, err
		}
		d := Sample{Labels: fs.Labels}
		for _, a := range fs.Inputs {
			d.Inputs = append(d.Inputs, onnx.Input{Name: a.Name, Shape: a.Shape, Int: a.Int})
		}
		return d, fs.Train, fs.Test, nil
	}
	return Sample{}, 0, 0, fmt.Errorf("data set %q: shape unknown before loading", s.Data)
}

// DataSample is what the spec's data set feeds a model, known from its
// name or its file's headers, without loading it.
func (s Spec) DataSample() (Sample, error) {
	d, _, _, err := dataShape(s)
	return d, err
}

// onnxShapes counts an ONNX model's sizes: its parameters from the file's
// initializers, and, when they leave room for it in this process, its
// activations from the layers the import builds.
func onnxShapes(s Spec, d Sample) (*shapes, error) {
	m, err := s.loadONNX()
	if err != nil {
		return nil, err
	}
	w := &shapes{}
	w.params, w.trainable = onnx.ParamCount(m)
	if avail := AvailableMemory(); avail > 0 && 16*float64(w.params) > float64(avail)/2 {
		return w, nil // the parameters alone settle it; building them could not
	}
	md, err := onnx.Import(m, onnx.Options{Inputs: d.Inputs})
	if err != nil {
		return nil, err
	}
	w.graph(md.Graph)
	return w, nil
}

// CheckMemory refuses (ErrSpec) a job that needs more memory than the
// members it may use have together: all of them, or the MaxNodes with the
// most. It checks nothing if a member's memory is unknown (0), or if the
// spec cannot be estimated (Prepare then says why).
func (c Checked) CheckMemory(members []NodeInfo) error {
	f, err := c.Estimate()
	if err != nil {
		return nil
	}
	mem := make([]int64, 0, len(members))
	for _, n := range members {
		if n.Memory <= 0 {
			return nil
		}
		mem = append(mem, n.Memory)
	}
	slices.SortFunc(mem, func(a, b int64) int { return cmp.Compare(b, a) })
	if m := c.s.MaxNodes; m > 0 && len(mem) > m {
		mem = mem[:m]
	}
	var have float64
	for _, m := range mem {
		have += float64(m)
	}
	if need := f.Total(); len(mem) > 0 && float64(need) > have {
		hint := ""
		if c.s.Recompute == "" || c.s.Recompute == "none" {
			hint = "; --recompute auto would count one's"
		}
		return specErr("job needs about %s (parameters %s, gradients %s, optimizer state %s, activations %s of %d micro-batches in flight%s); the members have %s",
			gib(need), gib(f.Params), gib(f.Grads), gib(f.Optimizer), gib(f.Activations), f.MicroBatches, hint, gib(sat(have)))
	}
	return nil
}

// checkLocal refuses (ErrSpec) a job whose share of this process, f.Local,
// is over avail bytes (0: unknown, not checked).
func checkLocal(f Footprint, avail int64) error {
	if need := f.Local(); avail > 0 && need > avail {
		return specErr("preparing the job needs about %s in this process (parameters %s, gradients %s, optimizer state %s, data %s, activations %s); this machine has %s available",
			gib(need), gib(f.Params), gib(f.Grads), gib(f.Optimizer), gib(f.Data), gib(f.LocalActivations), gib(avail))
	}
	return nil
}

// checkDriver refuses (ErrSpec) a job whose coordinator's share of this
// process, Driver and a profile window, is over avail bytes (0: unknown).
func checkDriver(f Footprint, avail int64) error {
	profile := min(f.LocalActivations-f.Evaluation, balance.ProfileWindow)
	if need := f.Driver() + profile; avail > 0 && need > avail {
		return specErr("coordinating the job needs about %s in this process (parameters %s, optimizer state %s, data %s, activations %s); this node has %s available",
			gib(need), gib(f.Params), gib(f.Optimizer), gib(f.Data), gib(f.Evaluation+profile), gib(avail))
	}
	return nil
}

// AvailableMemory is the memory this machine has for a job: MemAvailable,
// bounded by this process's cgroup memory limit (0: unknown).
func AvailableMemory() int64 {
	var avail uint64
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if kb, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
				if v, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")), 10, 64); err == nil {
					avail = v << 10
				}
			}
		}
		f.Close()
	}
	if v, ok := cgroup.Memory(); ok && (avail == 0 || uint64(v) < avail) {
		avail = uint64(v)
	}
	return int64(min(avail, math.MaxInt64))
}

// gib formats bytes in GiB, as `ppnode status` shows the members' memory
// (MiB below one GiB).
func gib(b int64) string {
	if b < 1<<30 {
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}

// sat is x as an int64, saturated.
func sat(x float64) int64 {
	if x >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(x)
}
