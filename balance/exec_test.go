package balance

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// fixedData is one random mini-batch cut into equal micro-batches.
type fixedData struct {
	x     []float32
	y     []float32
	shape []int
	M, n  int
}

func newFixedData(shape []int, batch, M, classes int) *fixedData {
	r := rand.New(rand.NewPCG(3, 3))
	d := &fixedData{x: make([]float32, batch*nn.Size(shape)), y: make([]float32, batch), shape: shape, M: M, n: batch / M}
	for i := range d.x {
		d.x[i] = float32(r.NormFloat64())
	}
	for i := range d.y {
		d.y[i] = float32(r.IntN(classes))
	}
	return d
}

func (d *fixedData) BatchSize() int     { return d.n * d.M }
func (d *fixedData) MicroBatches() int  { return d.M }
func (d *fixedData) StepsPerEpoch() int { return 1 }
func (d *fixedData) Micro(epoch, step, m int, x *nn.Tensor, y []float32) (*nn.Tensor, []float32) {
	per := nn.Size(d.shape)
	x = nn.FromData(slices.Clone(d.x[m*d.n*per:(m+1)*d.n*per]), append([]int{d.n}, d.shape...)...)
	return x, slices.Clone(d.y[m*d.n : (m+1)*d.n])
}

func (d *fixedData) Fill(epoch, step, m int, b *nn.Batch) {
	var x *nn.Tensor
	if len(b.X) == 1 {
		x = b.X[0]
	}
	x, b.Y = d.Micro(epoch, step, m, x, b.Y)
	b.X = append(b.X[:0], x)
}

func clone(t *nn.Tensor) *nn.Tensor {
	if t == nil {
		return nil
	}
	return nn.FromData(slices.Clone(nn.F32(t)), t.Shape()...)
}

// trainOneProcess trains g (initialised with seed 1) for steps steps of
// SGD in one process, the reference of the plan tests, and returns its
// weights' hash.
func trainOneProcess(g *nn.Graph, data *fixedData, steps int) string {
	g.Init(1)
	be, _ := nn.NewBackend("ppnode-det", 1, true)
	opt, _ := nn.NewOptimizer(nn.OptimizerConfig{Name: "sgd", LR: 0.05, Momentum: 0.9})
	tr := nn.NewTrainer(g, opt, be, 1)
	for s := 0; s < steps; s++ {
		tr.Step(data, 0, 0, s)
	}
	return nn.WeightsSHA256(g.Params())
}

// runPlan executes a plan's programs in one process, as the runtime would
// across nodes: every stage runs its instructions in order, a receive
// waits for its message, gradients of a tensor from several stages are
// summed in the order of the output's To list, and replicas sum their
// parameter gradients as OpRecvSum says. A replica runs on its own copy of
// the model (copyOf, initialised as g). It returns the weights' hash after
// steps training steps, and fails the test if the replicas of a stage end
// with different weights.
func runPlan(t *testing.T, g *nn.Graph, copyOf func() *nn.Graph, p *Plan, data *fixedData, steps int) string {
	t.Helper()
	be, _ := nn.NewBackend("ppnode-det", 1, true)
	S := len(p.Stages)
	stages := make([]*nn.Stage, S)
	opts := make([]nn.Optimizer, S)
	last := map[int]int{} // stage of the partition -> its last replica
	for s, sp := range p.Stages {
		last[sp.Group] = s
		gs := g
		if sp.Replica > 0 {
			gs = copyOf()
		}
		st, err := gs.Stage(sp.Layers)
		if err != nil {
			t.Fatal(err)
		}
		for k, in := range sp.Inputs {
			if st.Inputs[k] != in.Name {
				t.Fatalf("stage %d input %d: plan %q, nn %q", s, k, in.Name, st.Inputs[k])
			}
		}
		stages[s] = st
		opts[s], _ = nn.NewOptimizer(nn.OptimizerConfig{Name: "sgd", LR: 0.05, Momentum: 0.9})
	}
	type key struct {
		from, to int
		grad     bool
		m        int
	}
	for step := 0; step < steps; step++ {
		msgs := map[key]map[string]*nn.Tensor{}
		ins := make([][]map[string]*nn.Tensor, S)     // stage, micro -> input tensors
		grads := make([][]map[string][]*nn.Tensor, S) // stage, micro -> output -> grads by To position
		outs := make([][][]*nn.Tensor, S)
		ginOf := make([][][]*nn.Tensor, S)
		lossGrad := make([]*nn.Tensor, data.M)
		var ce nn.SoftmaxCE
		for s := range stages {
			ins[s] = make([]map[string]*nn.Tensor, data.M)
			grads[s] = make([]map[string][]*nn.Tensor, data.M)
			outs[s] = make([][]*nn.Tensor, data.M)
			ginOf[s] = make([][]*nn.Tensor, data.M)
			for m := range ins[s] {
				ins[s][m] = map[string]*nn.Tensor{}
				grads[s][m] = map[string][]*nn.Tensor{}
			}
		}
		sums := map[[2]int][]*nn.Tensor{}
		backwards := make([]int, S)
		pc := make([]int, S)
		for progress := true; progress; {
			progress = false
			for s, sp := range p.Stages {
				for pc[s] < len(sp.Program) {
					in := sp.Program[pc[s]]
					m := in.Micro
					ctx := &nn.Ctx{Backend: be, Train: true, Seed: 1, Step: step, Micro: m}
					switch in.Op {
					case OpRecvAct, OpRecvGrad:
						if in.Peer == Coordinator {
							x, _ := data.Micro(0, step, m, nil, nil)
							ins[s][m][g.InputNames[0]] = x
							break
						}
						msg, ok := msgs[key{in.Peer, s, in.Op == OpRecvGrad, m}]
						if !ok {
							goto blocked
						}
						for _, name := range in.Tensors {
							if in.Op == OpRecvAct {
								ins[s][m][name] = msg[name]
							} else {
								k := slices.IndexFunc(sp.Outputs, func(o StageOutput) bool { return o.Name == name })
								pos := slices.Index(sp.Outputs[k].To, p.Stages[in.Peer].Group)
								for len(grads[s][m][name]) <= pos {
									grads[s][m][name] = append(grads[s][m][name], nil)
								}
								grads[s][m][name][pos] = msg[name]
							}
						}
					case OpForward:
						x := make([]*nn.Tensor, len(sp.Inputs))
						for k, i := range sp.Inputs {
							x[k] = ins[s][m][i.Name]
						}
						outs[s][m] = nil
						for _, o := range stages[s].Forward(ctx, m, x) {
							outs[s][m] = append(outs[s][m], clone(o))
						}
					case OpLoss:
						k := slices.Index(stages[s].Outputs, g.Output)
						_, y := data.Micro(0, step, m, nil, nil)
						_, _, gr := ce.Forward(outs[s][m][k], y, float32(1/float64(data.BatchSize())))
						lossGrad[m] = clone(gr)
					case OpSendAct, OpSendGrad:
						msg := map[string]*nn.Tensor{}
						for _, name := range in.Tensors {
							if in.Op == OpSendAct {
								msg[name] = outs[s][m][slices.Index(stages[s].Outputs, name)]
							} else {
								k := slices.Index(stages[s].Inputs, name)
								gr := ginOf[s][m][k]
								if gr == nil {
									gr = nn.New(ins[s][m][name].Shape()...)
								}
								msg[name] = gr
							}
						}
						msgs[key{s, in.Peer, in.Op == OpSendGrad, m}] = msg
					case OpBackward:
						dout := make([]*nn.Tensor, len(sp.Outputs))
						for k, o := range sp.Outputs {
							if o.Name == g.Output && sp.Loss {
								dout[k] = lossGrad[m]
								continue
							}
							var acc *nn.Tensor
							for _, gr := range grads[s][m][o.Name] {
								if acc == nil {
									acc = clone(gr)
									continue
								}
								a, b := nn.F32(acc), nn.F32(gr)
								for i := range a {
									a[i] += b[i]
								}
							}
							dout[k] = acc
						}
						ginOf[s][m] = nil
						for _, d := range stages[s].Backward(ctx, m, dout) {
							ginOf[s][m] = append(ginOf[s][m], clone(d))
						}
					case OpSendSum:
						var msg []*nn.Tensor
						for _, pr := range stages[s].Params() {
							if pr.Trainable() {
								msg = append(msg, clone(pr.Grad))
							}
						}
						sums[[2]int{s, in.Peer}] = msg
					case OpRecvSum:
						msg, ok := sums[[2]int{in.Peer, s}]
						if !ok {
							goto blocked
						}
						k := 0
						for _, pr := range stages[s].Params() {
							if !pr.Trainable() {
								continue
							}
							own, sum := nn.F32(pr.Grad), nn.F32(msg[k])
							k++
							if backwards[s] == 0 || in.Peer == last[sp.Group] {
								copy(own, sum) // the prefix to start from, or the total
								continue
							}
							for i := range own {
								own[i] = sum[i] + own[i]
							}
						}
					case OpStep:
						opts[s].Step(stages[s].Params())
					}
					if in.Op == OpBackward {
						backwards[s]++
					}
					pc[s]++
					progress = true
				}
			blocked:
			}
		}
		for s := range pc {
			if pc[s] != len(p.Stages[s].Program) {
				t.Fatalf("step %d: stage %d stuck at %v", step, s, p.Stages[s].Program[pc[s]])
			}
		}
	}
	for s, sp := range p.Stages {
		if sp.Replica > 0 && nn.WeightsSHA256(stages[s].Params()) != nn.WeightsSHA256(stages[s-sp.Replica].Params()) {
			t.Fatalf("replica %d of stage %d ends with other weights than replica 0", sp.Replica, sp.Group)
		}
	}
	return nn.WeightsSHA256(g.Params())
}

// Plans run as their programs say compute, bit for bit, what one process
// computes: stage DAGs, several consumers of one tensor in different
// stages, every schedule.
func TestPlansTrainBitIdentical(t *testing.T) {
	cases := []struct {
		model func() *nn.Graph
		input []int
		spec  string
		nodes []string
	}{
		{func() *nn.Graph { return fanModel(t) }, []int{4}, "fc0@a; fc2 + fc3@b; fc1@c; concat-out@d", []string{"a", "b", "c", "d"}},
		{func() *nn.Graph { return fanModel(t) }, []int{4}, "fc0 + fc1@a; fc3@b; fc2 + concat-out@c", []string{"a", "b", "c"}},
		{func() *nn.Graph { return build(t, "uno", zoo.Options{Width: 0.02, Input: []int{6, 6, 1}}) }, []int{6, 6, 1},
			"flatten + tower3.slice-tower3.fc3@a; tower2.slice-tower2.fc3@b; tower1.slice-tower1.fc3@c; concat-out@d", []string{"a", "b", "c", "d"}},
		{func() *nn.Graph { return build(t, "resnet50", zoo.Options{Width: 1.0 / 16, Input: []int{8, 8, 3}}) }, []int{8, 8, 3},
			"conv1-layer1.0.conv3@a; layer1.0.bn3 + layer1.0.add-layer3.0.downsample.0@b; layer1.0.downsample.0-layer1.0.downsample.1@c; layer3.0.downsample.1-fc@d", []string{"a", "b", "c", "d"}},
	}
	for k, c := range cases {
		data := newFixedData(c.input, 12, 3, 2)
		want := trainOneProcess(c.model(), data, 2)
		for _, sched := range []Schedule{GPipe, GraphSchedule} {
			t.Run(fmt.Sprintf("%d/%s", k, sched), func(t *testing.T) {
				g := c.model()
				g.Init(1)
				part, err := ParseSpec(g, c.spec, c.nodes)
				if err != nil {
					t.Fatal(err)
				}
				p, err := Build(g, part, c.nodes, sched, data.M, data.n)
				if err != nil {
					t.Fatal(err)
				}
				if got := runPlan(t, g, nil, p, data, 2); got != want {
					t.Fatalf("plan's weights %s, single process %s", got[:16], want[:16])
				}
			})
		}
	}
}

// Replicated stages whose gradients are summed in the chained order
// train, as their programs say, the weights of one process bit for bit;
// in the fast order, which adds in another order and so ends elsewhere,
// every replica of a stage ends with the same weights (runPlan checks).
// Chains and a DAG, equal and explicit shares, every schedule.
func TestReplicatedPlansTrainBitIdentical(t *testing.T) {
	mlp := func() *nn.Graph { return build(t, "mlp32", zoo.Options{Width: 8, Input: []int{4, 4, 1}}) }
	uno := func() *nn.Graph { return build(t, "uno", zoo.Options{Width: 0.02, Input: []int{6, 6, 1}}) }
	cases := []struct {
		model func() *nn.Graph
		input []int
		spec  string
	}{
		{mlp, []int{4, 4, 1}, "fc1-fc16@a,b; fc17-fc32@c"},
		{mlp, []int{4, 4, 1}, "fc1-fc10@a:1,b:3; fc11-fc20@c; fc21-fc32@d,e,f"},
		{uno, []int{6, 6, 1}, "flatten + tower3.slice-tower3.fc3@a,b; tower2.slice-tower2.fc3@c; tower1.slice-tower1.fc3@d:2,e:1,f:1; concat-out@g,h"},
	}
	nodes := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for k, c := range cases {
		data := newFixedData(c.input, 16, 4, 2)
		want := trainOneProcess(c.model(), data, 2)
		copyOf := func() *nn.Graph {
			g := c.model()
			g.Init(1)
			return g
		}
		for _, sched := range []Schedule{GPipe, GraphSchedule} {
			for _, chained := range []bool{true, false} {
				t.Run(fmt.Sprintf("%d/%s/chained=%v", k, sched, chained), func(t *testing.T) {
					g := copyOf()
					part, err := ParseSpec(g, c.spec, nodes)
					if err != nil {
						t.Fatal(err)
					}
					p, err := buildPlan(g, part, nodes, sched, data.M, data.n, chained)
					if err != nil {
						t.Fatal(err)
					}
					if err := p.Validate(g); err != nil {
						t.Fatal(err)
					}
					got := runPlan(t, g, copyOf, p, data, 2)
					if chained && got != want {
						t.Fatalf("plan's weights %s, single process %s", got[:16], want[:16])
					}
					if !chained && got == want {
						t.Fatalf("the fast order gives the weights of one process: the test cannot tell the orders apart")
					}
				})
			}
		}
	}
}
