package nn

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"sort"
)

// Batches supplies a mini-batch's micro-batches in the deterministic order
// (data.Loader implements it).
type Batches interface {
	BatchSize() int
	MicroBatches() int
	StepsPerEpoch() int
	// Micro fills x and y (reallocating them if needed) with micro-batch m of
	// mini-batch step of epoch, and returns them.
	Micro(epoch, step, m int, x *Tensor, y []int32) (*Tensor, []int32)
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

	loss SoftmaxCE
	xs   []*Tensor
	ys   [][]int32
	in   []*Tensor
	dout []*Tensor
}

// NewTrainer returns a trainer over the whole graph g.
func NewTrainer(g *Graph, opt Optimizer, be Backend, seed uint64) *Trainer {
	return &Trainer{Graph: g, Stage: g.Whole(), Opt: opt, Ctx: Ctx{Backend: be, Seed: seed}, in: make([]*Tensor, 1), dout: make([]*Tensor, 1)}
}

// StepResult is one step's loss (mean over the mini-batch) and training
// accuracy.
type StepResult struct {
	Loss    float64
	Correct int
	Samples int
}

// Step trains on mini-batch step of epoch; global numbers the step across
// epochs (it seeds dropout).
func (t *Trainer) Step(b Batches, epoch, step, global int) StepResult {
	M := b.MicroBatches()
	for len(t.xs) < M {
		t.xs = append(t.xs, nil)
		t.ys = append(t.ys, nil)
	}
	scale := float32(1 / float64(b.BatchSize()))
	var r StepResult
	t.Ctx.Train = true
	t.Ctx.Step = global
	for m := 0; m < M; m++ {
		t.xs[m], t.ys[m] = b.Micro(epoch, step, m, t.xs[m], t.ys[m])
		t.Ctx.Micro = m
		t.in[0] = t.xs[m]
		out := t.Stage.Forward(&t.Ctx, 0, t.in)
		loss, correct, grad := t.loss.Forward(out[0], t.ys[m], scale)
		r.Loss += loss
		r.Correct += correct
		r.Samples += len(t.ys[m])
		t.dout[0] = grad
		t.Stage.Backward(&t.Ctx, 0, t.dout)
	}
	r.Loss /= float64(r.Samples)
	t.Opt.Step(t.Stage.Params())
	return r
}

// Evaluate returns the accuracy of the model in evaluation mode over chunks
// produced by next (which returns nil when done).
func (t *Trainer) Evaluate(next func(x *Tensor, y []int32) (*Tensor, []int32)) float64 {
	ctx := t.Ctx
	ctx.Train = false
	var x *Tensor
	var y []int32
	correct, n := 0, 0
	for {
		x, y = next(x, y)
		if x == nil {
			break
		}
		t.in[0] = x
		out := t.Stage.Forward(&ctx, 1, t.in)
		correct += Argmax(out[0], y)
		n += len(y)
	}
	if n == 0 {
		return math.NaN()
	}
	return float64(correct) / float64(n)
}

// WeightsSHA256 hashes every parameter and buffer's little-endian float32
// bytes, in the exported layout, in name order: two runs with the same hash
// have the same weights, and an exported file hashes the same.
func WeightsSHA256(ps []*Param) string {
	names := make([]string, len(ps))
	ts := make([]*Tensor, len(ps))
	for i, p := range ps {
		names[i], ts[i] = p.Name, p.Exported()
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
