package integration

import (
	"testing"
	"time"

	"github.com/ppnode/ppnode/actors"
)

// A stage node killed mid-job (SIGKILL): the coordinator re-plans over the
// live nodes, restores the latest cut and replays; the weights equal those
// of the run without the fault, and no more than K steps are replayed.
func TestKillStageNode(t *testing.T) {
	c := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
	waitMembers(t, c.Node("a"), 3)
	const K = 20
	spec := actors.DefaultSpec()
	spec.ID = "kill-stage"
	spec.Model, spec.Width, spec.Data, spec.SyntheticSamples = "mlp32", 64, "synthetic:8x8x1:4", 1024
	spec.Batch, spec.MicroBatches, spec.Epochs, spec.Steps = 32, 4, 10, 200
	spec.Deterministic, spec.Threads = true, 1
	spec.Partition, spec.Schedule, spec.CheckpointEvery = "uniform", "1f1b", K
	rep, err := c.Node("a").Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Code != 201 {
		t.Fatalf("POST /v1/jobs: %d %s", rep.Code, rep.Error)
	}
	st, err := c.Node("a").WaitJob(rep.ID, time.Minute, func(s actors.JobStatus) bool { return s.Step >= 50 })
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "training" {
		t.Fatalf("job %s at step %d/%d before the kill: make it longer", st.State, st.Step, st.Total)
	}
	c.Kill(c.Node("c"))
	killedAt := st.Step
	st, err = c.Node("a").WaitJob(rep.ID, 2*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "done" || st.Result == nil {
		t.Fatalf("job %s: %s %s", rep.ID, st.State, st.Error)
	}
	if len(st.Recoveries) != 1 {
		t.Fatalf("recoveries %+v, want one", st.Recoveries)
	}
	r := st.Recoveries[0]
	t.Logf("killed near step %d; recovery %+v", killedAt, r)
	if r.Replayed > K {
		t.Errorf("%d steps replayed, more than K = %d", r.Replayed, K)
	}
	if want := localSHA(t, spec); st.Result.WeightsSHA256 != want {
		t.Errorf("weights %s after the kill, %s without it", st.Result.WeightsSHA256, want)
	}
}

// localSHA is the weights fingerprint of spec trained in this process.
func localSHA(t *testing.T, spec actors.JobSpec) string {
	t.Helper()
	local, err := spec.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	res, err := local.TrainLocal(1, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.WeightsSHA256
}

// A stage node that leaves gracefully mid-job (SIGTERM): its layers move to
// the other nodes at a step boundary, through a cut at that step, with no
// rollback; the node exits once its stage is gone; the weights are those
// of the run without the leave.
func TestGracefulLeaveMigrates(t *testing.T) {
	c := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
	waitMembers(t, c.Node("a"), 3)
	spec := actors.DefaultSpec()
	spec.ID = "leave-stage"
	spec.Model, spec.Width, spec.Data, spec.SyntheticSamples = "mlp32", 64, "synthetic:8x8x1:4", 1024
	spec.Batch, spec.MicroBatches, spec.Epochs, spec.Steps = 32, 4, 10, 250
	spec.Deterministic, spec.Threads = true, 1
	spec.Partition, spec.Schedule, spec.CheckpointEvery = "uniform", "1f1b", 20
	rep, err := c.Node("a").Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Code != 201 {
		t.Fatalf("POST /v1/jobs: %d %s", rep.Code, rep.Error)
	}
	st, err := c.Node("a").WaitJob(rep.ID, time.Minute, func(s actors.JobStatus) bool { return s.Step >= 40 })
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "training" {
		t.Fatalf("job %s at step %d/%d before the leave: make it longer", st.State, st.Step, st.Total)
	}
	if err := c.Stop(c.Node("c")); err != nil {
		t.Fatalf("node c did not leave cleanly: %v", err)
	}
	st, err = c.Node("a").WaitJob(rep.ID, 2*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "done" || st.Result == nil {
		t.Fatalf("job %s: %s %s", rep.ID, st.State, st.Error)
	}
	t.Logf("re-plans %+v; recoveries %+v", st.Replans, st.Recoveries)
	if len(st.Recoveries) != 0 {
		t.Errorf("a graceful leave rolled back: %+v", st.Recoveries)
	}
	if len(st.Replans) == 0 || st.Replans[0].Reason != "node c is leaving" {
		t.Errorf("re-plans %+v, want one for node c leaving", st.Replans)
	}
	if want := localSHA(t, spec); st.Result.WeightsSHA256 != want {
		t.Errorf("weights %s after the leave, %s without it", st.Result.WeightsSHA256, want)
	}
}
