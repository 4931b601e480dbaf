package nn_test

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// oldSGD and oldAdam are the optimizers' loops as they were before the
// fused, vectorised passes, one parameter at a time, with each product
// rounded explicitly (float32(x*y)): what amd64 (GOAMD64=v1, no fusion)
// compiled them to, and so the bits the optimizers gave, now on every
// architecture.
func oldSGD(w, g, b []float32, lr, mu, wd float32, first bool) {
	for i := range w {
		d := g[i]
		if wd != 0 {
			d += float32(wd * w[i])
		}
		if b != nil {
			if first {
				b[i] = d
			} else {
				b[i] = float32(mu*b[i]) + d
			}
			d = b[i]
		}
		w[i] -= float32(lr * d)
		g[i] = 0
	}
}

func oldAdam(w, g, m, v []float32, step int, lr, beta1, beta2, epsilon, weightDecay float64) {
	t := float64(step)
	bc1 := 1 - math.Pow(beta1, t)
	bc2 := 1 - math.Pow(beta2, t)
	stepSize := float32(lr / bc1)
	bc2s := float32(math.Sqrt(bc2))
	b1, b2 := float32(beta1), float32(beta2)
	eps, wd := float32(epsilon), float32(weightDecay)
	for i := range w {
		d := g[i]
		if wd != 0 {
			d += float32(wd * w[i])
		}
		m[i] = float32(m[i]*b1) + float32((1-b1)*d)
		v[i] = float32(v[i]*b2) + float32((1-b2)*d*d)
		denom := float32(math.Sqrt(float64(v[i])))/bc2s + eps
		w[i] -= float32(stepSize * (m[i] / denom))
		g[i] = 0
	}
}

// optimParams returns trainable parameters of awkward sizes: tails of every
// length modulo 8, and more elements in all than a thread's grain (1<<15),
// so that the threads' split falls inside parameters and inside vectors.
func optimParams(r *rand.Rand) []*nn.Param {
	var ps []*nn.Param
	for i, n := range []int{1, 3, 8, 17, 40005, 7, 70001, 64, 2, 31} {
		p := &nn.Param{Name: fmt.Sprintf("p%d", i), Value: nn.New(n), Grad: nn.New(n)}
		fillAwkward(r, nn.F32(p.Value))
		ps = append(ps, p)
	}
	// A buffer (no gradient) is skipped.
	return append(ps, &nn.Param{Name: "buffer", Value: nn.New(5)})
}

// fillAwkward draws normal values at varied scales, with exact zeros of both signs
// and subnormals mixed in.
func fillAwkward(r *rand.Rand, x []float32) {
	for i := range x {
		switch r.IntN(16) {
		case 0:
			x[i] = 0
		case 1:
			x[i] = float32(math.Copysign(0, -1))
		case 2:
			x[i] = float32(r.NormFloat64() * 1e-40)
		default:
			x[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(7)-4)))
		}
	}
}

func cloneParams(ps []*nn.Param) []*nn.Param {
	out := make([]*nn.Param, len(ps))
	for i, p := range ps {
		q := *p
		q.Value = nn.FromData(slices.Clone(nn.F32(p.Value)), p.Value.Shape()...)
		if p.Grad != nil {
			q.Grad = nn.FromData(slices.Clone(nn.F32(p.Grad)), p.Grad.Shape()...)
		}
		out[i] = &q
	}
	return out
}

// optimConfigs covers every path of the kernels: SGD with and without
// momentum and weight decay, Adam with and without weight decay.
var optimConfigs = []nn.OptimizerConfig{
	{Name: "sgd", LR: 0.05, Momentum: 0.9},
	{Name: "sgd", LR: 0.05, Momentum: 0.9, WeightDecay: 1e-4},
	{Name: "sgd", LR: 0.05},
	{Name: "sgd", LR: 0.05, WeightDecay: 1e-3},
	{Name: "adam", LR: 1e-3},
	{Name: "adam", LR: 1e-3, WeightDecay: 1e-2, Beta1: 0.8, Beta2: 0.99, Eps: 1e-6},
}

func optimName(c nn.OptimizerConfig) string {
	return fmt.Sprintf("%s/momentum=%g/wd=%g", c.Name, c.Momentum, c.WeightDecay)
}

// The fused passes give the old loops' bits, for every thread count:
// values, optimizer state and zeroed gradients, over several steps with
// the learning rate changing between them.
func TestOptimizerMatchesOldLoops(t *testing.T) {
	for _, oc := range optimConfigs {
		for _, threads := range []int{1, 2, 3} {
			if testing.Short() && threads != 3 { // the race pass: the threaded loops only
				continue
			}
			t.Run(fmt.Sprintf("%s/threads=%d", optimName(oc), threads), func(t *testing.T) {
				r := rand.New(rand.NewPCG(7, uint64(threads)))
				ps := optimParams(r)
				ref := cloneParams(ps)
				oc.Threads = threads
				opt, err := nn.NewOptimizer(oc)
				if err != nil {
					t.Fatal(err)
				}
				beta1, beta2, eps := cmp.Or(oc.Beta1, 0.9), cmp.Or(oc.Beta2, 0.999), cmp.Or(oc.Eps, 1e-8)
				state := map[string][2][]float32{}
				for step := 1; step <= 4; step++ {
					lr := oc.LR * float64(step) / 3
					opt.SetLR(lr)
					for i, p := range ps {
						if p.Grad != nil {
							fillAwkward(r, nn.F32(p.Grad))
							copy(nn.F32(ref[i].Grad), nn.F32(p.Grad))
						}
					}
					opt.Step(ps)
					for _, p := range ref {
						if p.Grad == nil {
							continue
						}
						w, g := nn.F32(p.Value), nn.F32(p.Grad)
						s, ok := state[p.Name]
						if !ok {
							s = [2][]float32{make([]float32, len(w)), make([]float32, len(w))}
							state[p.Name] = s
						}
						if oc.Name == "adam" {
							oldAdam(w, g, s[0], s[1], step, lr, beta1, beta2, eps, oc.WeightDecay)
						} else {
							var b []float32
							if oc.Momentum != 0 {
								b = s[0]
							}
							oldSGD(w, g, b, float32(lr), float32(oc.Momentum), float32(oc.WeightDecay), step == 1)
						}
					}
					for i, p := range ps {
						sameBits(t, fmt.Sprintf("step %d: %s value", step, p.Name), nn.F32(p.Value), nn.F32(ref[i].Value))
						if p.Grad == nil {
							continue
						}
						sameBits(t, fmt.Sprintf("step %d: %s gradient", step, p.Name), nn.F32(p.Grad), make([]float32, p.Grad.Size()))
						st := opt.State(p)
						switch {
						case oc.Name == "adam":
							sameBits(t, fmt.Sprintf("step %d: %s exp_avg", step, p.Name), nn.F32(st["exp_avg"]), state[p.Name][0])
							sameBits(t, fmt.Sprintf("step %d: %s exp_avg_sq", step, p.Name), nn.F32(st["exp_avg_sq"]), state[p.Name][1])
						case oc.Momentum != 0:
							sameBits(t, fmt.Sprintf("step %d: %s momentum_buffer", step, p.Name), nn.F32(st["momentum_buffer"]), state[p.Name][0])
						}
					}
				}
				if opt.Steps() != 4 {
					t.Fatalf("Steps() = %d after 4 steps", opt.Steps())
				}
			})
		}
	}
}

// A step allocates nothing once the optimizer's state exists.
func TestOptimizerStepAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	for _, oc := range optimConfigs {
		for _, threads := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/threads=%d", optimName(oc), threads), func(t *testing.T) {
				ps := optimParams(rand.New(rand.NewPCG(1, 2)))
				oc.Threads = threads
				opt, err := nn.NewOptimizer(oc)
				if err != nil {
					t.Fatal(err)
				}
				opt.Step(ps)
				if a := testing.AllocsPerRun(20, func() { opt.Step(ps) }); a != 0 {
					t.Fatalf("a step allocates %v times", a)
				}
			})
		}
	}
}

// BenchmarkOptimizerStep times one update of mlp32's parameters (width 512,
// 8.3 M) alone; bytes are those the pass reads and writes.
func BenchmarkOptimizerStep(b *testing.B) {
	g, err := zoo.Build("mlp32", zoo.Options{Input: []int{28, 28, 1}})
	if err != nil {
		b.Fatal(err)
	}
	g.Init(1)
	ps := g.Params()
	n := g.ParamCount()
	for _, oc := range []nn.OptimizerConfig{
		{Name: "sgd", LR: 0.01, Momentum: 0.9},
		{Name: "adam", LR: 3e-4},
	} {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("opt=%s/threads=%d", oc.Name, threads), func(b *testing.B) {
				oc.Threads = threads
				opt, err := nn.NewOptimizer(oc)
				if err != nil {
					b.Fatal(err)
				}
				opt.Step(ps)
				arrays := 3 // value, gradient, momentum: read and written
				if oc.Name == "adam" {
					arrays = 4
				}
				b.SetBytes(int64(2 * arrays * 4 * n))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					opt.Step(ps)
				}
			})
		}
	}
}

// BenchmarkMLP32Step times a training step of mlp32 width 512, batch 128 in
// one micro-batch (BENCHMARKS.md's configuration), with each optimizer
// (profile it with -cpuprofile).
func BenchmarkMLP32Step(b *testing.B) {
	be, err := nn.NewBackend("", 0, false)
	if err != nil {
		b.Fatal(err)
	}
	for _, oc := range []nn.OptimizerConfig{
		{Name: "sgd", LR: 0.01, Momentum: 0.9},
		{Name: "adam", LR: 3e-4},
	} {
		b.Run(fmt.Sprintf("opt=%s", oc.Name), func(b *testing.B) {
			g, err := zoo.Build("mlp32", zoo.Options{Input: []int{28, 28, 1}})
			if err != nil {
				b.Fatal(err)
			}
			g.Init(1)
			oc.Threads = be.Threads()
			opt, err := nn.NewOptimizer(oc)
			if err != nil {
				b.Fatal(err)
			}
			tr := nn.NewTrainer(g, opt, be, 1)
			data := reuse{randomBatches([]int{28, 28, 1}, 128, 1, 10)}
			tr.Step(data, 0, 0, 0)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tr.Step(data, 0, 0, i+1)
			}
			b.ReportMetric(float64(128*b.N)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}
