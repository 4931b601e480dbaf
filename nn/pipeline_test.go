package nn_test

import (
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// pipelineStep runs one mini-batch through the stages as a GPipe schedule
// would: every micro-batch forward through all stages (each in its own
// slot), then every backward in ascending micro-batch order, stages in
// reverse; tensors cross stages by name. With recompute every stage keeps
// only its inputs: all micro-batches share slot 0, and each backward pass
// first runs its micro-batch's forward pass again. With split each
// backward pass is BackwardInput, and its BackwardWeight runs after the
// next micro-batch's BackwardInput, as a zero-bubble schedule defers it.
func pipelineStep(g *nn.Graph, stages []*nn.Stage, opt nn.Optimizer, be nn.Backend, b nn.Batches, global int, recompute, split bool) {
	M := b.MicroBatches()
	ctx := &nn.Ctx{Backend: be, Train: true, Seed: 1, Step: global}
	vals := make([]map[string]*nn.Tensor, M)
	labels := make([][]float32, M)
	var losses []nn.SoftmaxCE = make([]nn.SoftmaxCE, M)
	scale := float32(1 / float64(b.BatchSize()))
	slot := func(m int) int {
		if recompute {
			return 0
		}
		return m
	}
	stageIn := func(s *nn.Stage, m int) []*nn.Tensor {
		in := make([]*nn.Tensor, len(s.Inputs))
		for i, name := range s.Inputs {
			in[i] = vals[m][name]
		}
		return in
	}
	for m := 0; m < M; m++ {
		mb := nn.MicroBatch(b, 0, 0, m)
		x, y := mb.X[0], mb.Y
		vals[m] = map[string]*nn.Tensor{g.InputNames[0]: x}
		labels[m] = y
		ctx.Micro = m
		for _, s := range stages {
			// Copy outputs: a stage's output buffers belong to its slot,
			// as received tensors would belong to the receiver.
			for i, t := range s.Forward(ctx, slot(m), stageIn(s, m)) {
				vals[m][s.Outputs[i]] = nn.FromData(append([]float32(nil), nn.F32(t)...), t.Shape()...)
			}
		}
	}
	for m := 0; m < M; m++ {
		ctx.Micro = m
		_, _, grad := losses[m].Forward(vals[m][g.Output], labels[m], scale)
		grads := map[string]*nn.Tensor{g.Output: grad}
		for k := len(stages) - 1; k >= 0; k-- {
			s := stages[k]
			dout := make([]*nn.Tensor, len(s.Outputs))
			for i, name := range s.Outputs {
				dout[i] = grads[name]
			}
			if recompute {
				ctx.Recompute = true
				s.Forward(ctx, 0, stageIn(s, m))
				ctx.Recompute = false
			}
			backward := s.Backward
			if split {
				backward = s.BackwardInput
			}
			for i, d := range backward(ctx, slot(m), dout) {
				if d == nil {
					continue
				}
				name := s.Inputs[i]
				if acc, ok := grads[name]; ok {
					sum := append([]float32(nil), nn.F32(acc)...)
					for j, v := range nn.F32(d) {
						sum[j] += v
					}
					grads[name] = nn.FromData(sum, d.Shape()...)
				} else {
					grads[name] = nn.FromData(append([]float32(nil), nn.F32(d)...), d.Shape()...)
				}
			}
		}
		if split && m > 0 {
			for _, s := range stages {
				s.BackwardWeight(ctx, m-1)
			}
		}
	}
	if split {
		for _, s := range stages {
			s.BackwardWeight(ctx, M-1)
		}
	}
	var ps []*nn.Param
	for _, s := range stages {
		ps = append(ps, s.Params()...)
	}
	opt.Step(ps)
}

// A model cut into stages and run as a pipeline computes exactly, bit for
// bit, what the single-process trainer computes: the promise ppnode's
// runtime builds on. So does one whose stages recompute their activations
// at the backward pass (dropout masks and BatchNorm statistics included),
// and one whose backward passes split into input and weight gradients.
func TestPipelineMatchesTrainerBitForBit(t *testing.T) {
	cases := []struct {
		model string
		o     zoo.Options
		cuts  [][]int // node index boundaries of each plan
	}{
		{"mlp32", zoo.Options{Width: 16, Input: []int{6, 6, 1}}, nil},
		{"resnet50", zoo.Options{Width: 1.0 / 16, Input: []int{8, 8, 3}}, nil},
		{"uno", zoo.Options{Width: 0.02, Input: []int{6, 6, 1}}, nil},
		{"vgg16", zoo.Options{Width: 1.0 / 16, Input: []int{8, 8, 3}}, nil},
	}
	be, _ := nn.NewBackend("", 2, true)
	for _, c := range cases {
		t.Run(c.model, func(t *testing.T) {
			data := reuse{randomBatches(c.o.Input, 12, 3, 10)}
			ref := newTrainer(t, c.model, c.o, be)
			for s := 0; s < 2; s++ {
				ref.Step(data, 0, 0, s)
			}
			want := nn.WeightsSHA256(ref.Graph.Params())
			n := len(ref.Graph.Nodes)
			for _, run := range []struct {
				parts            int
				recompute, split bool
			}{{1, false, false}, {2, false, false}, {3, false, false}, {5, false, false}, {1, true, false}, {3, true, false}, {1, false, true}, {3, false, true}} {
				parts := run.parts
				g, err := zoo.Build(c.model, c.o)
				if err != nil {
					t.Fatal(err)
				}
				g.Init(1)
				var stages []*nn.Stage
				for p := 0; p < parts; p++ {
					var names []string
					for _, node := range g.Nodes[p*n/parts : (p+1)*n/parts] {
						names = append(names, node.Name)
					}
					s, err := g.Stage(names)
					if err != nil {
						t.Fatal(err)
					}
					stages = append(stages, s)
				}
				opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Name: "sgd", LR: 0.01, Momentum: 0.9})
				for s := 0; s < 2; s++ {
					pipelineStep(g, stages, opt, be, data, s, run.recompute, run.split)
				}
				if run.split && !stages[0].Splits(&nn.Ctx{Backend: be}) {
					t.Errorf("%d stages: the first stage does not split its backward pass", parts)
				}
				if got := nn.WeightsSHA256(g.Params()); got != want {
					t.Errorf("%d stages (recompute %v, split %v): weights %s, single process %s", parts, run.recompute, run.split, got[:16], want[:16])
				}
			}
		})
	}
}
