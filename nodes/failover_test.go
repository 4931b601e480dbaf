package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/jobtest"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// poll calls cond every 5 ms until it returns true, and fails the test
// after d.
func poll(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("%s: not within %v", what, d)
		case <-tick.C:
		}
	}
}

func goodRecord(t *testing.T) JobRecord {
	s := smallSpec()
	s.ID = "job-1"
	s.Replicas = 3
	return JobRecord{ID: "job-1", Run: "run-1", Spec: jobtest.Check(t, s), Coordinator: "a", Holders: []string{"b", "c"}, Generation: 1, Revision: 1, State: RecordRunning}
}

// respec changes the spec of r.
func respec(t *testing.T, r *JobRecord, mod func(*job.Spec)) {
	t.Helper()
	s := r.Spec.Spec()
	mod(&s)
	r.Spec = jobtest.Check(t, s)
}

// recordJSON is r as JSON, with spec s in it (which job.Check may refuse).
func recordJSON(t *testing.T, r JobRecord, s job.Spec) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	b, err := json.Marshal(r)
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	if err == nil {
		m["spec"], err = json.Marshal(s)
	}
	if err == nil {
		b, err = json.Marshal(m)
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A job record from the network is checked field by field as it is
// decoded, its spec as job.Check checks it; what is wrong is named.
func TestJobRecordValidation(t *testing.T) {
	cases := []struct {
		name string
		mod  func(r *JobRecord, s *job.Spec)
		want string // "" : valid
	}{
		{"valid", func(r *JobRecord, s *job.Spec) {}, ""},
		{"done with a result", func(r *JobRecord, s *job.Spec) { r.State, r.Result = RecordDone, &job.Result{WeightsSHA256: "x"} }, ""},
		{"no holders", func(r *JobRecord, s *job.Spec) { r.Holders = nil }, ""},
		{"bad id", func(r *JobRecord, s *job.Spec) { r.ID, s.ID = "../x", "../x" }, "bad job id"},
		{"empty id", func(r *JobRecord, s *job.Spec) { r.ID, s.ID = "", "" }, "bad job id"},
		{"no run", func(r *JobRecord, s *job.Spec) { r.Run = "" }, `run ""`},
		{"bad run", func(r *JobRecord, s *job.Spec) { r.Run = "r/../x" }, `run "r/../x"`},
		{"long run", func(r *JobRecord, s *job.Spec) { r.Run = strings.Repeat("r", 65) }, "1 to 64"},
		{"spec of another job", func(r *JobRecord, s *job.Spec) { s.ID = "job-2" }, `spec of job "job-2"`},
		{"bad spec", func(r *JobRecord, s *job.Spec) { s.Model = "gpt5" }, "unknown model"},
		{"too many replicas", func(r *JobRecord, s *job.Spec) { s.Replicas = 9 }, "replicas 9"},
		{"no coordinator", func(r *JobRecord, s *job.Spec) { r.Coordinator = "" }, "coordinator"},
		{"control character", func(r *JobRecord, s *job.Spec) { r.Holders[0] = "b\n" }, "holder"},
		{"long name", func(r *JobRecord, s *job.Spec) { r.Holders[0] = strings.Repeat("b", 300) }, "holder"},
		{"more holders than replicas", func(r *JobRecord, s *job.Spec) { s.Replicas = 2 }, "2 holders for 2 replicas"},
		{"coordinator holds", func(r *JobRecord, s *job.Spec) { r.Holders[1] = "a" }, "also a holder"},
		{"holder twice", func(r *JobRecord, s *job.Spec) { r.Holders[1] = "b" }, "twice"},
		{"generation 0", func(r *JobRecord, s *job.Spec) { r.Generation = 0 }, "generation 0"},
		{"unknown state", func(r *JobRecord, s *job.Spec) { r.State = "paused" }, `state "paused"`},
		{"done without result", func(r *JobRecord, s *job.Spec) { r.State = RecordDone }, "without a result"},
		{"running with result", func(r *JobRecord, s *job.Spec) { r.Result = &job.Result{} }, "with a result"},
		{"long error", func(r *JobRecord, s *job.Spec) { r.State, r.Error = RecordFailed, strings.Repeat("e", 5000) }, "error message"},
		{"bad takeover", func(r *JobRecord, s *job.Spec) { r.Takeovers = []Takeover{{From: "a", To: "", Step: 20}} }, "takeover to"},
		{"negative takeover step", func(r *JobRecord, s *job.Spec) { r.Takeovers = []Takeover{{From: "a", To: "b", Step: -1}} }, "step -1"},
	}
	for _, c := range cases {
		r := goodRecord(t)
		s := r.Spec.Spec()
		c.mod(&r, &s)
		var got JobRecord
		err := json.Unmarshal(recordJSON(t, r, s), &got)
		if err == nil {
			err = got.Validate()
		}
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !errors.Is(err, ErrRecord) && !errors.Is(err, job.ErrSpec) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v; want an ErrRecord or ErrSpec mentioning %q", c.name, err, c.want)
		}
	}
}

// The successor is the usable holder with the smallest name; holders stay
// while they can, and the rest are filled by name; a takeover's generation
// is above any its predecessor can have used.
func TestSuccessorAndHolders(t *testing.T) {
	r := goodRecord(t)
	r.Holders = []string{"d", "b", "c"}
	respec(t, &r, func(s *job.Spec) { s.Replicas = 4 })
	for _, c := range []struct {
		usable []string
		want   string
	}{
		{[]string{"a", "b", "c", "d"}, "b"},
		{[]string{"c", "d"}, "c"},
		{[]string{"d", "e"}, "d"},
		{[]string{"a", "e"}, ""},
		{nil, ""},
	} {
		if got := successor(&r, func(n string) bool { return slices.Contains(c.usable, n) }); got != c.want {
			t.Errorf("successor with %v usable: %q, want %q", c.usable, got, c.want)
		}
	}
	for _, c := range []struct {
		current, candidates []string
		n                   int
		want                []string
	}{
		{nil, []string{"b", "c", "d"}, 1, []string{"b"}},
		{nil, []string{"b", "c", "d"}, 2, []string{"b", "c"}},
		{[]string{"d"}, []string{"a", "b", "d"}, 2, []string{"d", "a"}}, // a joined: d stays
		{[]string{"c", "d"}, []string{"b", "d"}, 2, []string{"d", "b"}}, // c died: b replaces it
		{[]string{"c"}, nil, 1, []string{}},
		{[]string{"b", "c"}, []string{"b", "c"}, 0, []string{}},
	} {
		if got := chooseHolders(c.current, c.candidates, c.n); !slices.Equal(got, c.want) {
			t.Errorf("chooseHolders(%v, %v, %d) = %v, want %v", c.current, c.candidates, c.n, got, c.want)
		}
	}
	if g := nextTerm(1, 7); g != 1<<32 {
		t.Errorf("first takeover generation %d, want 2^32", g)
	}
	if g := nextTerm(1<<32+5, 3); g != 2<<32 {
		t.Errorf("second takeover generation %d, want 2^33", g)
	}
	old := JobRecord{Generation: 1<<32 + 3, Revision: 7}
	for _, c := range []struct {
		gen, rev uint64
		want     bool
	}{
		{1<<32 + 3, 7, true}, {1<<32 + 9, 8, true}, {1<<32 + 9, 6, false}, {2 << 32, 1, true}, {5, 100, false},
	} {
		if got := (&JobRecord{Generation: c.gen, Revision: c.rev}).supersedes(&old); got != c.want {
			t.Errorf("generation %d revision %d supersedes %d/%d: %v", c.gen, c.rev, old.Generation, old.Revision, got)
		}
	}
}

// PUT /v1/jobrecords/{id} keeps a valid record, refuses bad ones with 400
// and a clear message, older ones with 409; a node no longer listed as a
// holder drops its copy.
func TestPutJobRecord(t *testing.T) {
	as := startCluster(t, 2)
	api := "http://" + as[1].HTTPAddr() + "/v1/jobrecords/"
	rec := goodRecord(t)
	rec.Coordinator, rec.Holders = "a", []string{"b"} // a is alive: no takeover
	body := func(mod func(r *JobRecord)) []byte {
		r := rec.clone()
		mod(&r)
		b, _ := json.Marshal(r)
		return b
	}
	for _, c := range []struct {
		name string
		path string
		body []byte
		code int
		want string
	}{
		{"not JSON", "job-1", []byte(`{"id":`), 400, "bad job record"},
		{"unknown field", "job-1", []byte(`{"id":"job-1","extra":1}`), 400, "unknown field"},
		{"two values", "job-1", append(body(func(*JobRecord) {}), []byte(` {}`)...), 400, "more than one"},
		{"path and id differ", "job-2", body(func(*JobRecord) {}), 400, `record of job "job-1" sent as job "job-2"`},
		{"invalid", "job-1", body(func(r *JobRecord) { r.State = "paused" }), 400, `state "paused"`},
		{"bad spec", "job-1", recordJSON(t, rec, job.Spec{ID: "job-1", Model: "gpt5"}), 400, "unknown model"},
		{"too large", "job-1", []byte(`{"error":"` + strings.Repeat("x", MaxBodyBytes) + `"}`), 413, "body over"},
	} {
		var e ErrorReply
		if code := call(t, "PUT", api+c.path, c.body, &e); code != c.code || !strings.Contains(e.Error, c.want) {
			t.Errorf("%s: %d %q; want %d mentioning %q", c.name, code, e.Error, c.code, c.want)
		}
	}
	if got := as[1].Records(); len(got) != 0 {
		t.Fatalf("records after refusals: %+v", got)
	}
	rec.Revision = 5
	if code := call(t, "PUT", api+"job-1", body(func(*JobRecord) {}), nil); code != http.StatusNoContent {
		t.Fatalf("PUT of a valid record: %d", code)
	}
	var got JobRecord
	if code := call(t, "GET", api+"job-1", nil, &got); code != http.StatusOK || got.Coordinator != "a" || got.Revision != 5 || got.replicas() != 3 {
		t.Fatalf("GET record: %d %+v", code, got)
	}
	var e ErrorReply
	if code := call(t, "PUT", api+"job-1", body(func(r *JobRecord) { r.Revision = 4 }), &e); code != http.StatusConflict || !strings.Contains(e.Error, "stale") {
		t.Errorf("PUT of an older revision: %d %q, want 409", code, e.Error)
	}
	if code := call(t, "PUT", api+"job-1", body(func(r *JobRecord) { r.Revision = 6; r.Holders = []string{"c"} }), nil); code != http.StatusNoContent {
		t.Errorf("PUT of a record that drops b: %d", code)
	}
	if code := call(t, "GET", api+"job-1", nil, nil); code != http.StatusNotFound {
		t.Errorf("GET of a dropped record: %d, want 404", code)
	}
	// A job id held as a record is in use.
	if code := call(t, "PUT", api+"job-1", body(func(r *JobRecord) { r.Revision = 7 }), nil); code != http.StatusNoContent {
		t.Fatalf("PUT again: %d", code)
	}
	spec := rec.Spec.Spec()
	if _, err := as[1].Submit(spec); !errors.Is(err, ErrJobID) {
		t.Errorf("Submit of a job whose record this node holds: %v, want ErrJobID", err)
	}
}

// testCut is a small whole-model checkpoint of job id at step, a replica
// of run run ("": a coordinator's own copy, without a run).
func testCut(id, run string, step int64) *tensorio.Checkpoint {
	w := nn.New(4)
	for i := range nn.F32(w) {
		nn.F32(w)[i] = float32(step) + float32(i)
	}
	return &tensorio.Checkpoint{JobID: id, Step: step, Params: []tensorio.Named{{Name: "w", T: w}},
		Meta: job.CutMeta{Generation: 3, Run: run}.Encode()}
}

// listCuts lists testCut's cuts of rec's run at steps in rec, as its
// coordinator's replication does.
func listCuts(t *testing.T, rec *JobRecord, steps ...int64) {
	t.Helper()
	for _, step := range steps {
		sum, err := cutDigest(testCut(rec.ID, rec.Run, step), rec.Run)
		if err != nil {
			t.Fatal(err)
		}
		rec.addCut(step, sum)
	}
}

// runOf is the run in ck's metadata.
func runOf(t *testing.T, ck *tensorio.Checkpoint) string {
	t.Helper()
	m, err := job.ParseCutMeta(ck.Meta)
	if err != nil {
		t.Fatal(err)
	}
	return m.Run
}

// corrupt flips bytes in the middle of a file.
func corrupt(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(b) / 3; i < len(b)/3+8; i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A successor reads the newest cut whose copy verifies: its own, else a
// replica on another holder, else an older cut; a damaged newest file is
// skipped (tensorio.Store.Latest does the same).
func TestLatestCutSkipsDamagedCopies(t *testing.T) {
	as := startCluster(t, 2)
	a, b := as[0], as[1]
	const id = "cuts"
	rec := goodRecord(t)
	rec.ID, rec.Coordinator, rec.Holders = id, "gone", []string{"a", "b"}
	respec(t, &rec, func(s *job.Spec) { s.ID = id })
	listCuts(t, &rec, 10, 20)
	for i, ag := range as {
		if err := ag.cuts.claim(id, rec.Run); err != nil {
			t.Fatal(err)
		}
		for _, step := range []int64{10, 20} {
			run := rec.Run
			if i == 0 {
				run = "" // a's are copies of its own, as the coordinator of the run
			}
			if _, err := ag.Store().Save(testCut(id, run, step)); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(what string, wantStep int64, wantSource string) {
		t.Helper()
		ck, _, src := a.failover.latestCut(rec)
		switch {
		case wantStep == 0 && ck != nil:
			t.Errorf("%s: cut at step %d from %s, want none", what, ck.Step, src)
		case wantStep > 0 && (ck == nil || ck.Step != wantStep):
			t.Errorf("%s: %v from %q, want step %d", what, ck, src, wantStep)
		case !strings.Contains(src, wantSource):
			t.Errorf("%s: source %q, want it to mention %q", what, src, wantSource)
		default:
			t.Logf("%s: %s", what, src)
		}
	}
	check("intact", 20, "this node's store")

	corrupt(t, a.Store().Path(id, 20))
	if ck, err := a.Store().Latest(id); err != nil || ck.Step != 10 {
		t.Errorf("store with a damaged newest file: %v, %v; want step 10", ck, err)
	}
	check("own newest damaged", 20, "the replica on b")
	if ck, err := a.Store().Load(id, 20); err != nil || ck.Step != 20 {
		t.Errorf("the fetched replica was not kept in place of the damaged copy: %v", err)
	}

	corrupt(t, a.Store().Path(id, 20))
	corrupt(t, b.Store().Path(id, 20))
	check("newest damaged everywhere", 10, "this node's store (skipped step 20 on a, step 20 on b)")

	for _, ag := range as {
		corrupt(t, ag.Store().Path(id, 10))
	}
	check("all damaged", 0, "no usable cut")

	rec.ID = "never-cut"
	respec(t, &rec, func(s *job.Spec) { s.ID = rec.ID })
	check("no cut", 0, "no cut yet")
}

// takeoverSpec is a job long enough to be killed in the middle: 300
// steps, 120 with -short (the race detector's run).
func takeoverSpec(id string) job.Spec {
	s := smallSpec()
	s.ID = id
	s.Epochs, s.Steps, s.CheckpointEvery = 100, 300, 10
	if testing.Short() {
		s.Steps = 120
	}
	s.Partition, s.Schedule = "uniform", "1f1b"
	return s
}

// When the coordinator's node dies, the holder of the job's record takes
// the job over under the same id from the newest cut, with a generation of
// a new term; the job ends with the weights of the run without the fault,
// and the other nodes' records name the new coordinator.
func TestTakeoverAfterCoordinatorDies(t *testing.T) {
	as := startCluster(t, 3)
	a, b, c := as[0], as[1], as[2]
	spec := takeoverSpec("takeover")
	spec.Replicas = 3
	want := localSHA(t, spec)
	if _, err := a.Submit(spec); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*Agent{b, c} {
		if r, err := h.Record(spec.ID); err != nil || r.Coordinator != "a" || !slices.Equal(r.Holders, []string{"b", "c"}) {
			t.Fatalf("record on %s after the submission: %+v, %v", h.Name(), r, err)
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
	killed := time.Now()
	if err := a.Close(); err != nil { // no leave: the others see a failure
		t.Fatal(err)
	}
	t.Logf("coordinator a closed at step %d (latest cut %d)", st.Step, st.LatestCut)
	poll(t, "the job on b", 30*time.Second, func() bool { _, err := b.Job(spec.ID); return err == nil })
	if _, err := c.Job(spec.ID); err == nil {
		t.Fatal("c took the job over too")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := b.Wait(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != job.StateDone || st.Result == nil {
		t.Fatalf("job on b: %s %s", st.State, st.Error)
	}
	tk := st.Takeover
	if tk == nil || tk.From != "a" || tk.To != "b" || tk.Step < 20 || tk.Step%10 != 0 || tk.Generation != 1<<32 {
		t.Fatalf("takeover %+v; want from a to b at a cut >= 20 with generation 2^32", tk)
	}
	t.Logf("taken over %v after the close: %+v", tk.At.Sub(killed), *tk)
	if st.Result.WeightsSHA256 != want {
		t.Errorf("weights after the takeover %s, without it %s", st.Result.WeightsSHA256, want)
	}
	if jobs := b.Jobs(); len(jobs) != 1 || jobs[0].ID != spec.ID || jobs[0].Coordinator != "b" {
		t.Errorf("b's jobs: %+v", jobs)
	}
	r, err := c.Record(spec.ID)
	if err != nil || r.Coordinator != "b" || r.State != RecordDone || r.Result.WeightsSHA256 != want ||
		len(r.Takeovers) != 1 || r.Generation < 1<<32 || !slices.Equal(r.Holders, []string{"c"}) {
		t.Errorf("record on c after the job: %+v, %v", r, err)
	}
}

// A coordinator that dies before the first cut: its successor restarts
// the job from step 0, and the weights are still the fault-free ones.
func TestTakeoverBeforeAnyCut(t *testing.T) {
	as := startCluster(t, 2)
	a, b := as[0], as[1]
	spec := takeoverSpec("early")
	spec.CheckpointEvery = 1000
	want := localSHA(t, spec)
	if _, err := a.Submit(spec); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	poll(t, "the job on b", 30*time.Second, func() bool { _, err := b.Job(spec.ID); return err == nil })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := b.Wait(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != job.StateDone || st.Result == nil {
		t.Fatalf("job on b: %s %s", st.State, st.Error)
	}
	if tk := st.Takeover; tk == nil || tk.Step != 0 || !strings.Contains(tk.Source, "restarted") {
		t.Fatalf("takeover %+v; want a restart from step 0", tk)
	}
	if st.Result.WeightsSHA256 != want {
		t.Errorf("weights after the restart %s, without it %s", st.Result.WeightsSHA256, want)
	}
}

// A job cancelled by its user is not taken over: its record says it
// failed.
func TestCancelledJobIsNotTakenOver(t *testing.T) {
	as := startCluster(t, 2)
	a, b := as[0], as[1]
	spec := takeoverSpec("cancelled")
	spec.Steps, spec.Epochs = 0, 1000
	if _, err := a.Submit(spec); err != nil {
		t.Fatal(err)
	}
	if err := a.Cancel(spec.ID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.Wait(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	r, err := b.Record(spec.ID)
	if err != nil || r.State != RecordFailed || !strings.Contains(r.Error, "canceled") {
		t.Fatalf("record on b: %+v, %v; want it failed", r, err)
	}
	notTakenOver(t, a, b, spec.ID, "a cancelled job")
}

// notTakenOver closes a, the coordinator of job id, and checks that b,
// its record's holder, does not take the job over.
func notTakenOver(t *testing.T, a, b *Agent, id, what string) {
	t.Helper()
	changed := b.members.changed() // closed after b handled a's failure
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("b did not see a fail within 30 s")
	}
	b.jobs.mu.Lock()
	_, taken := b.jobs.coord[id]
	b.jobs.mu.Unlock()
	if taken {
		t.Fatal("b took over " + what)
	}
}

// A job that cannot run without the dead node (its partition names it) is
// not taken over: the successor gives up with a clear log, keeps no job,
// and, as no other holder is left, keeps the record of the failure.
func TestTakeoverOfAnUnplannableJobGivesUp(t *testing.T) {
	as := startCluster(t, 2)
	a, b := as[0], as[1]
	spec := takeoverSpec("pinned")
	spec.Partition = "fc1-fc16@a; fc17-fc32@b"
	if _, err := a.Submit(spec); err != nil {
		t.Fatal(err)
	}
	poll(t, "a durable cut", time.Minute, func() bool { st, _ := a.Job(spec.ID); return st.LatestCut >= 10 })
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// b, its only holder, keeps the record of the failure: a client
	// looking for the job learns how it ended.
	var rec JobRecord
	poll(t, "b to give the job up", 30*time.Second, func() bool {
		r, err := b.Record(spec.ID)
		rec = r
		return err == nil && r.State == RecordFailed
	})
	if !strings.Contains(rec.Error, "taking the job over on b") {
		t.Errorf("record on b: %+v", rec)
	}
	if js := b.Jobs(); len(js) != 0 {
		t.Fatalf("b runs %+v", js)
	}
}
