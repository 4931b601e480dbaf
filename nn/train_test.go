package nn_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// randomBatches serves a fixed random mini-batch (for speed and allocation
// measurements).
func randomBatches(shape []int, batch, micro, classes int) *fixedBatches {
	r := rand.New(rand.NewPCG(1, 1))
	fb := &fixedBatches{x: make([]float32, batch*nn.Size(shape)), y: make([]float32, batch), shape: shape}
	for i := range fb.x {
		fb.x[i] = float32(r.NormFloat64())
	}
	for i := range fb.y {
		fb.y[i] = float32(r.IntN(classes))
	}
	for m := 0; m < micro; m++ {
		fb.sizes = append(fb.sizes, batch/micro+btoi(m < batch%micro))
	}
	return fb
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// reuse makes Micro copy into the caller's buffers, as data.Loader does.
type reuse struct{ *fixedBatches }

func (r reuse) Micro(epoch, step, m int, x *nn.Tensor, y []float32) (*nn.Tensor, []float32) {
	lo := 0
	for _, s := range r.sizes[:m] {
		lo += s
	}
	n, per := r.sizes[m], nn.Size(r.shape)
	if x == nil || nn.Rows(x) != n {
		x = nn.New(append([]int{n}, r.shape...)...)
		y = make([]float32, n)
	}
	copy(nn.F32(x), r.x[lo*per:(lo+n)*per])
	copy(y, r.y[lo:lo+n])
	return x, y
}

func (r reuse) Fill(epoch, step, m int, b *nn.Batch) {
	var x *nn.Tensor
	if len(b.X) == 1 {
		x = b.X[0]
	}
	x, b.Y = r.Micro(epoch, step, m, x, b.Y)
	b.X = append(b.X[:0], x)
}

func newTrainer(tb testing.TB, model string, o zoo.Options, be nn.Backend) *nn.Trainer {
	g, err := zoo.Build(model, o)
	if err != nil {
		tb.Fatal(err)
	}
	g.Init(1)
	opt, err := nn.NewOptimizer(nn.OptimizerConfig{Name: "sgd", LR: 0.01, Momentum: 0.9})
	if err != nil {
		tb.Fatal(err)
	}
	return nn.NewTrainer(g, opt, be, 1)
}

// Two deterministic runs give the same bits, and the bits do not depend on
// the thread count.
func TestDeterministicTraining(t *testing.T) {
	run := func(threads int) string {
		be, err := nn.NewBackend("", threads, true)
		if err != nil {
			t.Fatal(err)
		}
		tr := newTrainer(t, "vgg16", zoo.Options{Width: 0.125, Input: []int{16, 16, 3}, Classes: 10}, be)
		b := reuse{randomBatches([]int{16, 16, 3}, 24, 3, 10)}
		for s := 0; s < 3; s++ {
			tr.Step(b, 0, 0, s)
		}
		return nn.WeightsSHA256(tr.Graph.Params())
	}
	a, b, c := run(1), run(1), run(2)
	if a != b || a != c {
		t.Fatalf("deterministic runs differ: %s, %s, %s (2 threads)", a, b, c)
	}
}

// Steady-state steps allocate no tensors: the allocations left (closures
// handed to the worker pool) are the same in number and size at every batch
// size, while a tensor allocated per step would grow with the batch.
func TestSteadyStateAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	be, _ := nn.NewBackend("", 2, false)
	type cost struct{ allocs, bytes float64 }
	per := map[int]cost{}
	for _, batch := range []int{16, 64} {
		tr := newTrainer(t, "resnet50", zoo.Options{Width: 1.0 / 16, Input: []int{8, 8, 3}}, be)
		b := reuse{randomBatches([]int{8, 8, 3}, batch, 4, 10)}
		tr.Step(b, 0, 0, 0)
		tr.Step(b, 0, 0, 1)
		// The fewest of several windows: the counters are the process's,
		// and other goroutines (the runtime's, the pool's) allocate now and
		// then; a tensor allocated per step shows in every window.
		const runs, windows = 3, 4
		best := cost{math.Inf(1), math.Inf(1)}
		for w := 0; w < windows; w++ {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for i := 0; i < runs; i++ {
				tr.Step(b, 0, 0, 2+w*runs+i)
			}
			runtime.ReadMemStats(&after)
			best.allocs = min(best.allocs, float64(after.Mallocs-before.Mallocs)/runs)
			best.bytes = min(best.bytes, float64(after.TotalAlloc-before.TotalAlloc)/runs)
		}
		per[batch] = best
	}
	t.Logf("per step: %+v", per)
	// The smallest tensor of this model, the logits, grows by (64-16) x 10
	// x 4 = 1920 bytes from batch 16 to 64; allow less drift than that.
	if per[64].allocs > per[16].allocs+2 || per[64].bytes > per[16].bytes+1024 {
		t.Fatalf("allocations grow with the batch: %+v", per)
	}
}

func BenchmarkTrainStep(b *testing.B) {
	be, err := nn.NewBackend("", 0, false)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		model string
		o     zoo.Options
	}{
		{"mlp32", zoo.Options{Input: []int{28, 28, 1}}},
		{"resnet50", zoo.Options{Width: 0.25, Input: []int{32, 32, 3}}},
	} {
		for _, batch := range []int{32, 128} {
			b.Run(fmt.Sprintf("%s/batch=%d", bc.model, batch), func(b *testing.B) {
				tr := newTrainer(b, bc.model, bc.o, be)
				data := reuse{randomBatches(bc.o.Input, batch, 4, 10)}
				tr.Step(data, 0, 0, 0)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					tr.Step(data, 0, 0, i+1)
				}
				b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "samples/s")
			})
		}
	}
}
