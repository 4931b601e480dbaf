package nn_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/ppnode/ppnode/nn"
)

// BenchmarkTeamIdleSpin measures the CPU the process spends in the 20 ms
// after a pass on the team thread, while nothing runs: OpenMP's idle
// threads spinning before they sleep. Compare GOMP_SPINCOUNT settings:
//
//	GOMP_SPINCOUNT=30000 go test -tags 'openblas dnnl' -run '^$' -bench TeamIdleSpin ./nn
func BenchmarkTeamIdleSpin(b *testing.B) {
	if !nn.OneDNN {
		b.Skip("no team thread without oneDNN")
	}
	fire := false
	st := convStage(b, &fire).Whole()
	ctx := &nn.Ctx{Backend: newFast(b, 2), Train: true}
	in := []*nn.Tensor{randomTensor(1, 32, 8, 8, 3)}
	st.Forward(ctx, 0, in)
	var idle time.Duration
	for b.Loop() {
		st.Forward(ctx, 0, in)
		c0 := processCPU()
		time.Sleep(20 * time.Millisecond)
		idle += processCPU() - c0
	}
	b.ReportMetric(float64(idle.Microseconds())/1e3/float64(b.N), "idle-cpu-ms/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
