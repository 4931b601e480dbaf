package nodes

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/cluster"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// putCut sends ck to an agent as a replica (PUT /v1/checkpoints/{job}) and
// returns the status code and the error message, if any.
func putCut(t *testing.T, to *Agent, ck *tensorio.Checkpoint) (int, string) {
	t.Helper()
	var buf bytes.Buffer
	if err := tensorio.WriteCheckpoint(&buf, ck); err != nil {
		t.Fatal(err)
	}
	var e ErrorReply
	return call(t, "PUT", "http://"+to.HTTPAddr()+"/v1/checkpoints/"+ck.JobID, buf.Bytes(), &e), e.Error
}

// putRecordTo sends rec to an agent (PUT /v1/jobrecords/{id}) and returns
// the status code and the error message, if any.
func putRecordTo(t *testing.T, to *Agent, rec JobRecord) (int, string) {
	t.Helper()
	body, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var e ErrorReply
	return call(t, "PUT", "http://"+to.HTTPAddr()+"/v1/jobrecords/"+rec.ID, body, &e), e.Error
}

func storeSteps(t *testing.T, a *Agent, id string) []int64 {
	t.Helper()
	steps, err := a.Store().Steps(id)
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

// The cuts of an earlier run of a job id (a data dir outlives the node;
// ids may be reused) are neither resumed from nor allowed to crowd out the
// current run's: a holder removes them when it keeps the record of a new
// run, refuses replicas without a run or of another run in progress, and a
// successor skips copies of another run, in its store and on other
// holders.
func TestCutsOfAnotherRun(t *testing.T) {
	as := startCluster(t, 2)
	a, b := as[0], as[1]
	const id = "rerun"
	// Left in b's data dir by an earlier run, before this process started:
	// more, and of higher steps, than the store keeps.
	for _, step := range []int64{30, 40, 50} {
		if _, err := b.Store().Save(testCut(id, "old", step)); err != nil {
			t.Fatal(err)
		}
	}
	rec := goodRecord(t)
	rec.ID, rec.Coordinator, rec.Holders = id, "a", []string{"b"} // a is alive: no takeover
	respec(t, &rec, func(s *job.Spec) { s.ID, s.Replicas = id, 2 })
	listCuts(t, &rec, 10, 20)
	check := func(what string, from *Agent, rec JobRecord, wantStep int64, wantSource string) {
		t.Helper()
		ck, meta, src := from.failover.latestCut(rec)
		switch {
		case wantStep == 0 && ck != nil:
			t.Errorf("%s: cut at step %d from %s, want none", what, ck.Step, src)
		case wantStep > 0 && (ck == nil || ck.Step != wantStep || meta.Run != rec.Run):
			t.Errorf("%s: %v from %q, want step %d of run %s", what, ck, src, wantStep, rec.Run)
		case !strings.Contains(src, wantSource):
			t.Errorf("%s: source %q, want it to mention %q", what, src, wantSource)
		default:
			t.Logf("%s: %s", what, src)
		}
	}
	check("before the record", b, rec, 0, "no usable cut (skipped steps [30 40 50] on b (another run))")

	if code, msg := putRecordTo(t, b, rec); code != http.StatusNoContent {
		t.Fatalf("PUT of the record: %d %s", code, msg)
	}
	if got := storeSteps(t, b, id); len(got) != 0 {
		t.Fatalf("b keeps the earlier run's cuts %v after the record of a new run", got)
	}
	for _, step := range []int64{10, 20} {
		if code, msg := putCut(t, b, testCut(id, rec.Run, step)); code != http.StatusNoContent {
			t.Fatalf("PUT of the cut at step %d: %d %s", step, code, msg)
		}
	}
	for _, c := range []struct {
		name string
		run  string
		code int
		want string
	}{
		{"no run", "", http.StatusBadRequest, `cut metadata: run ""`},
		{"bad run", "a b", http.StatusBadRequest, `run "a b"`},
		{"another run in progress", "run-2", http.StatusConflict, "another run"},
	} {
		if code, msg := putCut(t, b, testCut(id, c.run, 30)); code != c.code || !strings.Contains(msg, c.want) {
			t.Errorf("PUT of a cut, %s: %d %q; want %d mentioning %q", c.name, code, msg, c.code, c.want)
		}
	}
	if got := storeSteps(t, b, id); !slices.Equal(got, []int64{10, 20}) {
		t.Fatalf("b's cuts %v, want the run's [10 20]", got)
	}

	// A higher copy of another run that got in anyway (a write racing
	// the claim) is skipped, in the successor's store and on another
	// holder: the record does not list it.
	if _, err := b.Store().Save(testCut(id, "old", 30)); err != nil {
		t.Fatal(err)
	}
	check("own store", b, rec, 20, "this node's store (skipped step 30 on b (not the record's))")
	check("other holder", a, rec, 20, "the replica on b (skipped step 30 on b (not the record's))")
	other := rec.clone()
	other.Run = "run-2"
	check("a holder of another run", a, other, 0, "steps [10 20 30] on b (another run)")

	// A new run of the id: refused while the first runs, accepted once it
	// ended; the first run's cuts go.
	if code, msg := putRecordTo(t, b, other); code != http.StatusConflict || !strings.Contains(msg, "another run") {
		t.Errorf("PUT of another run's record while the first runs: %d %q, want 409", code, msg)
	}
	done := rec.clone()
	done.Revision++
	done.State, done.Result = RecordDone, &job.Result{WeightsSHA256: "x"}
	if code, msg := putRecordTo(t, b, done); code != http.StatusNoContent {
		t.Fatalf("PUT of the end of the first run: %d %s", code, msg)
	}
	if code, msg := putRecordTo(t, b, other); code != http.StatusNoContent {
		t.Fatalf("PUT of the second run's record: %d %s", code, msg)
	}
	if got := storeSteps(t, b, id); len(got) != 0 {
		t.Errorf("b keeps the first run's cuts %v after the record of the second", got)
	}
	if r, err := b.Record(id); err != nil || r.Run != other.Run {
		t.Errorf("b's record: %+v, %v; want run %s", r, err, other.Run)
	}
}

// A job id submitted again over data dirs that hold the cuts of its
// earlier run, up to a higher step: the submission and the holder remove
// them, and when the coordinator dies the successor resumes from the new
// run's cut, never the earlier run's, and ends with the new run's
// fault-free weights; the new run's cuts are kept.
func TestTakeoverIgnoresAnEarlierRunsCuts(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	spec := takeoverSpec("rerun")
	want := localSHA(t, spec)

	// The earlier run: other weights (another seed), to step 150.
	first := spec
	first.Seed, first.Steps = 7, 150
	a := startIn(t, dirs[0], "a")
	b := startIn(t, dirs[1], "b", a.GossipAddr())
	awaitMembers(t, a, 5*time.Second, "b", func(ms []cluster.Member) bool { return len(ms) == 2 })
	if _, err := a.Submit(first); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if st, err := a.Wait(ctx, first.ID); err != nil || st.State != job.StateDone {
		t.Fatalf("the earlier run: %s %s %v", st.State, st.Error, err)
	}
	firstRec, _ := a.Record(first.ID)
	for _, ag := range []*Agent{a, b} {
		if err := ag.Close(); err != nil {
			t.Fatal(err)
		}
	}
	stale := map[string][]int64{}
	for i, name := range []string{"a", "b"} {
		st, err := tensorio.OpenStore(filepath.Join(dirs[i], "checkpoints"), CheckpointsKept)
		if err != nil {
			t.Fatal(err)
		}
		if stale[name], err = st.Steps(first.ID); err != nil || len(stale[name]) == 0 || slices.Min(stale[name]) < 100 {
			t.Fatalf("the earlier run left steps %v on %s (%v); want cuts above step 100", stale[name], name, err)
		}
	}
	t.Logf("the earlier run (%s) left cuts %v", firstRec.Run, stale)

	// The same id again, on nodes restarted over the same data dirs.
	a = startIn(t, dirs[0], "a")
	b = startIn(t, dirs[1], "b", a.GossipAddr())
	awaitMembers(t, a, 5*time.Second, "b", func(ms []cluster.Member) bool { return len(ms) == 2 })
	if _, err := a.Submit(spec); err != nil {
		t.Fatal(err)
	}
	rec, err := a.Record(spec.ID)
	if err != nil || rec.Run == "" || rec.Run == firstRec.Run {
		t.Fatalf("record of the new run %+v (%v); the earlier run's was %s", rec, err, firstRec.Run)
	}
	// The holder kept the record before Submit returned: both stores are
	// clear of the earlier run by now.
	for _, ag := range []*Agent{a, b} {
		if got := storeSteps(t, ag, spec.ID); len(got) > 0 && slices.Max(got) >= 100 {
			t.Fatalf("%s still holds cuts %v after the new submission", ag.Name(), got)
		}
	}
	var st JobStatus
	poll(t, "a durable cut", time.Minute, func() bool {
		st, _ = a.Job(spec.ID)
		return st.LatestCut >= 20 || st.State == job.StateDone || st.State == job.StateFailed
	})
	if st.State != job.StateTraining {
		t.Fatalf("job %s at step %d before the coordinator died: make it longer", st.State, st.Step)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("coordinator a closed at step %d (latest cut %d)", st.Step, st.LatestCut)
	poll(t, "the job on b", 30*time.Second, func() bool { _, err := b.Job(spec.ID); return err == nil })
	st, err = b.Wait(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != job.StateDone || st.Result == nil {
		t.Fatalf("job on b: %s %s", st.State, st.Error)
	}
	tk := st.Takeover
	if tk == nil || tk.Step < 20 || tk.Step >= 100 || !strings.HasPrefix(tk.Source, "this node's store") {
		t.Fatalf("takeover %+v; want one from b's own copy of a cut of the new run, at a step in [20, 100)", tk)
	}
	t.Logf("takeover: %+v", *tk)
	if st.Result.WeightsSHA256 != want {
		t.Errorf("weights after the takeover %s, the new run's without it %s", st.Result.WeightsSHA256, want)
	}
	// b, now the coordinator, keeps the new run's last cuts.
	steps := storeSteps(t, b, spec.ID)
	last := int64(spec.Steps)
	if want := []int64{last - 20, last - 10, last}; !slices.Equal(steps, want) || b.cuts.run(spec.ID) != rec.Run {
		t.Errorf("b's cuts %v of run %q; want %v of run %s", steps, b.cuts.run(spec.ID), want, rec.Run)
	}
	for _, s := range steps {
		ck, err := b.Store().Load(spec.ID, s)
		if err != nil {
			t.Errorf("b's cut at step %d: %v", s, err)
		} else if r := runOf(t, ck); r != "" && r != rec.Run {
			t.Errorf("b's cut at step %d is of run %q, want %s", s, r, rec.Run)
		}
	}
}
