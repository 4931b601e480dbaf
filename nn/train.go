package nn

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"sort"
)

// Batch is one micro-batch: a tensor per graph input, batch first, and
// the targets, sample after sample: classes as float32 numbers (one a
// sample, or one a position of a sample: a language model's next tokens),
// or values of the output's shape.
type Batch struct {
	X []*Tensor
	Y []float32
}

// Batches supplies a mini-batch's micro-batches in the deterministic order
// (data.Loader implements it).
type Batches interface {
	BatchSize() int
	MicroBatches() int
	StepsPerEpoch() int
	// Fill fills b with micro-batch m of mini-batch step of epoch, reusing
	// its tensors where they fit.
	Fill(epoch, step, m int, b *Batch)
}

// Trainer is the single-process reference: each step runs forward and
// backward of micro-batches 0..M-1 in ascending order, summing their
// gradients, then applies the optimizer once. A pipelined run must compute
// exactly this.
type Trainer struct {
	Graph *Graph
	Stage *Stage
	Opt   Optimizer
	Ctx   Ctx
	// Loss scores the outputs (NewTrainer's: the softmax cross-entropy).
	Loss Loss
	// ClipNorm, if positive, bounds the gradients' norm over the model
	// before each step (PyTorch's clip_grad_norm_).
	ClipNorm float64

	bs     []Batch
	dout   []*Tensor
	params []*Param // Stage's
	ties   [][]*Param
	normed []*Param // the tensors clipping's norm runs over (Normed), once ClipNorm is used
}

// NewTrainer returns a trainer over the whole graph g.
func NewTrainer(g *Graph, opt Optimizer, be Backend, seed uint64) *Trainer {
	st := g.Whole()
	ps := st.Params()
	return &Trainer{Graph: g, Stage: st, Opt: opt, Ctx: Ctx{Backend: be, Seed: seed}, dout: make([]*Tensor, 1),
		Loss: &SoftmaxCE{Threads: be.Threads()}, params: ps, ties: Ties(ps)}
}

// StepResult is one step's loss (mean over the mini-batch's targets) and
// training accuracy.
type StepResult struct {
	Loss    float64
	Correct int
	// Samples counts the targets: samples, their positions or values
	// (not the ignored labels).
	Samples int
}

// Step trains on mini-batch step of epoch; global numbers the step across
// epochs (it seeds dropout).
func (t *Trainer) Step(b Batches, epoch, step, global int) StepResult {
	M := b.MicroBatches()
	for len(t.bs) < M {
		t.bs = append(t.bs, Batch{})
	}
	var r StepResult
	var mass float64
	for m := range M {
		b.Fill(epoch, step, m, &t.bs[m])
		r.Samples += t.Loss.Count(t.bs[m].Y)
		mass += t.Loss.Mass(t.bs[m].Y)
	}
	// The mean over the targets that count: 1/(batch × targets a sample)
	// when all do, unweighted; a step whose every label is ignored (or
	// weighs 0) learns nothing.
	var scale float32
	if mass > 0 {
		scale = float32(1 / mass)
	}
	t.Ctx.Train = true
	t.Ctx.Step = global
	for m := range M {
		bm := &t.bs[m]
		t.Ctx.Micro = m
		out := t.Stage.Forward(&t.Ctx, 0, bm.X)
		loss, correct, grad := t.Loss.Forward(out[0], bm.Y, scale)
		r.Loss += loss
		r.Correct += correct
		t.dout[0] = grad
		t.Stage.Backward(&t.Ctx, 0, t.dout)
	}
	if mass > 0 {
		r.Loss /= mass
	}
	for _, g := range t.ties {
		SumTies(g, nil)
	}
	if t.ClipNorm > 0 {
		if t.normed == nil {
			t.normed = Normed(t.params)
		}
		ClipNormed(t.normed, t.params, t.ClipNorm)
	}
	t.Opt.Step(t.params)
	return r
}

// Evaluate returns the accuracy and the mean loss of the model in
// evaluation mode over the targets of the batches next fills (it returns
// false when done). outputs, if set, sees each batch's output.
func (t *Trainer) Evaluate(next func(b *Batch) bool, outputs func(out *Tensor)) (accuracy, loss float64) {
	ctx := t.Ctx
	ctx.Train = false
	var b Batch
	correct, n, mass := 0, 0, 0.0
	for next(&b) {
		out := t.Stage.Forward(&ctx, 1, b.X)
		if outputs != nil {
			outputs(out[0])
		}
		l, c, _ := t.Loss.Forward(out[0], b.Y, 0)
		loss += l
		correct += c
		n += t.Loss.Count(b.Y)
		mass += t.Loss.Mass(b.Y)
	}
	if n == 0 {
		return math.NaN(), math.NaN()
	}
	return float64(correct) / float64(n), loss / mass
}

// WeightsSHA256 hashes every parameter and buffer's little-endian float32
// bytes, in the exported layout, in name order (a tied tensor once under
// each of its names): two runs with the same hash have the same weights,
// and an exported file hashes the same.
func WeightsSHA256(ps []*Param) string {
	var names []string
	var ts []*Tensor
	for _, p := range Unique(ps) {
		t := p.Exported()
		for _, n := range append([]string{p.Name}, p.Aliases...) {
			names, ts = append(names, n), append(ts, t)
		}
	}
	return TensorsSHA256(names, ts)
}

// TensorsSHA256 is the hex SHA-256 of the tensors' little-endian float32
// bytes, taken in name order (ties keep their given order). It is the one
// definition of ppnode's weights fingerprint; checkpoints and safetensors
// files are hashed with it too.
func TensorsSHA256(names []string, ts []*Tensor) string {
	order := make([]int, len(names))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return names[order[a]] < names[order[b]] })
	h := sha256.New()
	buf := make([]byte, 4<<12)
	for _, i := range order {
		data := F32(ts[i])
		for len(data) > 0 {
			k := min(len(data), len(buf)/4)
			for j, v := range data[:k] {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(v))
			}
			h.Write(buf[:4*k])
			data = data[k:]
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// MicroBatch returns micro-batch m of mini-batch step of epoch in new
// buffers.
func MicroBatch(b Batches, epoch, step, m int) *Batch {
	var mb Batch
	b.Fill(epoch, step, m, &mb)
	return &mb
}
