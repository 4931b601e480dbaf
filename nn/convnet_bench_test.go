package nn_test

import (
	"fmt"
	"testing"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nn/zoo"
)

// BenchmarkConvNetStep times convolutional training steps as BENCHMARKS.md
// reports them: resnet50 and vgg16 at width 0.25 on 32×32×3 inputs, batch
// 32, SGD with momentum, in one and in four micro-batches, on the default
// backend with one and two threads. Profile it with -cpuprofile to see where a step goes.
func BenchmarkConvNetStep(b *testing.B) {
	o := zoo.Options{Width: 0.25, Input: []int{32, 32, 3}, Classes: 10}
	for _, model := range []string{"resnet50", "vgg16"} {
		for _, micro := range []int{1, 4} {
			for _, threads := range []int{1, 2} {
				be, err := nn.NewBackend("", threads, false)
				if err != nil {
					b.Fatal(err)
				}
				b.Run(fmt.Sprintf("%s/micro=%d/threads=%d", model, micro, threads), func(b *testing.B) {
					tr := newTrainer(b, model, o, be)
					data := reuse{randomBatches(o.Input, 32, micro, 10)}
					tr.Step(data, 0, 0, 0)
					b.ReportAllocs()
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						tr.Step(data, 0, 0, i+1)
					}
					b.ReportMetric(float64(32*b.N)/b.Elapsed().Seconds(), "samples/s")
				})
			}
		}
	}
}

// BenchmarkConvNetStepDeterministic is BenchmarkConvNetStep's resnet50 on
// the deterministic backend, on one and two threads, for what
// --deterministic costs; profile it with -cpuprofile.
func BenchmarkConvNetStepDeterministic(b *testing.B) {
	o := zoo.Options{Width: 0.25, Input: []int{32, 32, 3}, Classes: 10}
	for _, threads := range []int{1, 2} {
		be, err := nn.NewBackend("", threads, true)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("resnet50/micro=1/threads=%d", threads), func(b *testing.B) {
			tr := newTrainer(b, "resnet50", o, be)
			data := reuse{randomBatches(o.Input, 32, 1, 10)}
			tr.Step(data, 0, 0, 0)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tr.Step(data, 0, 0, i+1)
			}
		})
	}
}
