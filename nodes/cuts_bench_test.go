package nodes

import (
	"fmt"
	"testing"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// The digest a coordinator computes of every cut it replicates, and a
// successor of the copy it resumes from: one pass of the encoder through
// SHA-256.
func BenchmarkCutDigest(b *testing.B) {
	for _, mb := range []int{4, 64} {
		b.Run(fmt.Sprintf("size=%dMB", mb), func(b *testing.B) {
			w := nn.New(mb << 18) // float32s
			for i := range nn.F32(w) {
				nn.F32(w)[i] = float32(i)
			}
			ck := &tensorio.Checkpoint{JobID: "bench", Step: 10, Params: []tensorio.Named{{Name: "w", T: w}},
				Meta: job.CutMeta{Generation: 1}.Encode()}
			b.SetBytes(int64(mb) << 20)
			b.ResetTimer()
			var sink string
			for b.Loop() {
				sum, err := cutDigest(ck, "run")
				if err != nil {
					b.Fatal(err)
				}
				sink = sum
			}
			_ = sink
		})
	}
}
