//go:build unix

package balance

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/ppnode/ppnode/nn/zoo"
)

// cpuTime is the CPU time this process has used.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The planner with replicas plans resnet50 over 64 nodes of mixed speeds
// and links in under a second of CPU time on one goroutine (the median of
// three searches; CPU time, which other processes on a shared machine do
// not inflate; BenchmarkSearchReplicas measures the wall time), and its
// plan is no slower than the plan without replicas.
func TestSearchReplicas64Nodes(t *testing.T) {
	if testing.Short() {
		t.Skip("timing")
	}
	g := build(t, "resnet50", zoo.Options{Width: 0.25, Input: []int{32, 32, 3}})
	prof := Analytic(g, AnalyticOptions{})
	c := rackCluster(64)
	o := Options{Batch: 64, Replicas: true, Workers: 1}
	var cpu, wall []time.Duration
	var res *Result
	for range 3 {
		c0, w0 := cpuTime(t), time.Now()
		var err error
		if res, err = Search(g, prof, c, o); err != nil {
			t.Fatal(err)
		}
		cpu, wall = append(cpu, cpuTime(t)-c0), append(wall, time.Since(w0))
	}
	slices.Sort(cpu)
	o.Replicas = false
	plain, err := Search(g, prof, c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CPU %v, wall %v: %d executors, %.1f ms (without replicas %d, %.1f ms)", cpu, wall, len(res.Plan.Stages), res.Report.StepTime*1e3,
		len(plain.Plan.Stages), plain.Report.StepTime*1e3)
	if cpu[1] > time.Second {
		t.Errorf("planning 64 nodes takes %v of CPU", cpu[1])
	}
	if res.Report.StepTime > plain.Report.StepTime {
		t.Errorf("with replicas %.1f ms, without %.1f ms", res.Report.StepTime*1e3, plain.Report.StepTime*1e3)
	}
}
