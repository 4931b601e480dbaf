package actors

import (
	"context"
	"testing"

	"github.com/ppnode/ppnode/dataplane"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/jobtest"
)

// BenchmarkPipelineStep trains mlp32 (width 1024, batch 128, M=8) across
// two in-process nodes of one thread each over dataplane.TCP links, cut
// uniformly, under 1F1B, zero-bubble and interleaved, against the
// single-process trainer with one thread; b.N steps each.
func BenchmarkPipelineStep(b *testing.B) {
	spec := job.DefaultSpec()
	spec.Data, spec.SyntheticSamples = "synthetic:28x28x1:10", 4096
	spec.Width, spec.Batch, spec.MicroBatches, spec.Threads = 1024, 128, 8, 1
	b.Run("local", func(b *testing.B) {
		spec := spec
		spec.Steps = b.N
		j, err := jobtest.Check(b, spec).Prepare()
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		if _, err := j.TrainLocal(1, job.LocalHooks{}); err != nil {
			b.Fatal(err)
		}
	})
	for _, sched := range []string{"1f1b", "zb", "interleaved"} {
		b.Run("pipeline2/"+sched, func(b *testing.B) {
			tc := newSystemCluster(b, 2, &dataplane.TCP{})
			spec := spec
			spec.ID, spec.Steps, spec.Partition, spec.Schedule = "bench", b.N, "uniform", sched
			if sched == "interleaved" {
				spec.Chunks = 2
			}
			c, err := newCoordinator(spec, tc.config(2))
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			res, err := c.Run(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(res.PredictedStepMS, "predicted-ms/step")
			b.ReportMetric(res.MeasuredStepMS, "median-ms/step")
			b.Logf("plan %s %s M=%d stages %+v", res.Plan, res.Schedule, res.MicroBatches, c.Status().Stages)
		})
	}
}
