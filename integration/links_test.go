package integration

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
)

// Links with measured rates (issue 16): three nodes in network namespaces
// whose links the test shapes. These are measurements, run with
// PPNODE_LINKS=1 (bench/links.sh); BENCHMARKS.md has their figures.

func requireLinkBench(t *testing.T) {
	t.Helper()
	if os.Getenv("PPNODE_LINKS") == "" {
		t.Skip("a throughput measurement on shaped links: set PPNODE_LINKS=1")
	}
}

// startShaped starts n one-thread nodes in namespaces, each link at
// rate bits/s (0: unshaped), and waits until a sees them all.
func startShaped(t *testing.T, n int, rate uint64) *Cluster {
	t.Helper()
	c := NewNetCluster(t)
	opts := make([]NodeOptions, n)
	for i := range opts {
		opts[i] = NodeOptions{Threads: 1}
	}
	c.StartAll(opts...)
	waitMembers(t, c.Node("a"), n)
	setAllRates(t, c, rate)
	return c
}

func setAllRates(t *testing.T, c *Cluster, rate uint64) {
	t.Helper()
	nodes := c.Nodes()
	for i := range nodes {
		for j := i + 1; j < len(nodes); j++ {
			if err := c.Network().SetRate(nodes[i].Name, nodes[j].Name, rate); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// runJob submits spec to a and waits for its result.
func runJob(t *testing.T, c *Cluster, spec job.Spec) job.Status {
	t.Helper()
	rep, err := c.Node("a").Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	var st job.Status
	err = Poll("job "+rep.ID, 10*time.Minute, 50*time.Millisecond, func() (bool, error) {
		var err error
		st, err = c.Node("a").Job(rep.ID)
		return st.State.Ended(), err
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.State != job.StateDone {
		t.Fatalf("job %s: %s %s", rep.ID, st.State, st.Error)
	}
	return st
}

// linkSpec is acceptance 4's job: mlp32 width 512 on MNIST, batch 128,
// SGD.
func linkSpec(id string, steps int) job.Spec {
	spec := job.DefaultSpec()
	spec.ID = id
	spec.Model, spec.Width, spec.Data = "mlp32", 512, "mnist"
	spec.Batch, spec.MicroBatches, spec.Steps, spec.Epochs = 128, 4, steps, 10
	spec.Optimizer, spec.Threads = "sgd", 1
	spec.Partition, spec.CheckpointEvery = "auto", 1000
	return spec
}

// TestLinksRate: the same job on unshaped links and on 100 Mbit/s links,
// alternated.
func TestLinksRate(t *testing.T) {
	requireLinkBench(t)
	c := startShaped(t, 3, 0)
	for round := range 2 {
		for _, rate := range []uint64{0, 100e6} {
			setAllRates(t, c, rate)
			st := runJob(t, c, linkSpec(fmt.Sprintf("rate-%d-%d", round, rate/1e6), 150))
			r := st.Result
			t.Logf("links %4d Mbit/s: %.0f samples/s, step %.1f ms (predicted %.1f), plan %s", rate/1e6, r.SamplesPerSec, r.MeasuredStepMS, r.PredictedStepMS, r.Plan)
			logLinks(t, st)
		}
	}
}

// logLinks logs the job's link table.
func logLinks(t *testing.T, st job.Status) {
	t.Helper()
	for _, l := range st.Links {
		line := fmt.Sprintf("  %s->%s %7.1f Mbit/s (%s, traffic bound %.0f) rtt %.2f ms, %.1f MB", l.From, l.To, l.MbitPerSec, l.Source, l.TrafficMbitPerSec, l.RTTMS, float64(l.WireBytes)/1e6)
		for _, k := range l.Kinds {
			line += fmt.Sprintf("; %s %s %.2fx encode %.0f ms", k.Kind, k.Codec, k.Ratio, k.EncodeMS)
		}
		t.Log(line)
	}
}
