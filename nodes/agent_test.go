package nodes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/cluster"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/job/jobtest"
)

var logLevel = flag.String("nodes.log", "", "write the agents' logs to stderr at this slog level; default: none")

func testLogger(t *testing.T) *slog.Logger {
	if *logLevel == "" {
		return slog.New(slog.DiscardHandler)
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*logLevel)); err != nil {
		t.Fatalf("-nodes.log: %v", err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
}

// start starts an agent on 127.0.0.1 with free ports, closed when the test
// ends.
func start(t *testing.T, name string, seeds ...string) *Agent {
	t.Helper()
	return startIn(t, t.TempDir(), name, seeds...)
}

// startIn starts an agent as start does, with dataDir as its data dir.
func startIn(t *testing.T, dataDir, name string, seeds ...string) *Agent {
	t.Helper()
	a, err := Start(Config{Name: name, Bind: "127.0.0.1:0", Seeds: seeds, HTTP: "127.0.0.1:0", Threads: 1,
		ProfileFor: 20 * time.Millisecond, DataDir: dataDir, Logger: testLogger(t), ActorLogLevel: slog.LevelError})
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// startCluster starts n agents named a, b, c, ... joined through the first
// and waits until the first sees them all.
func startCluster(t *testing.T, n int) []*Agent {
	t.Helper()
	as := []*Agent{start(t, "a")}
	for i := 1; i < n; i++ {
		as = append(as, start(t, string(rune('a'+i)), as[0].GossipAddr()))
	}
	for _, a := range as {
		awaitMembers(t, a, 5*time.Second, "all members", func(ms []cluster.Member) bool { return len(ms) == n })
	}
	return as
}

// awaitMembers waits until a's member list satisfies ok, re-checking at
// every membership event, and fails the test after d.
func awaitMembers(t *testing.T, a *Agent, d time.Duration, what string, ok func([]cluster.Member) bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		changed := a.members.changed()
		ms := a.Members()
		if ok(ms) {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("%s: waiting %v for %s; members %v", a.Name(), d, what, names(ms))
		}
	}
}

func names(ms []cluster.Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

func smallSpec() job.Spec { return jobtest.SmallSpec() }

func localSHA(t *testing.T, spec job.Spec) string { return jobtest.LocalSHA(t, spec) }

// call sends a request to an agent's API and decodes the answer, if any,
// into out (if not nil); it returns the status code.
func call(t *testing.T, method, url string, body []byte, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d %q: %v", method, url, res.StatusCode, b, err)
		}
	}
	return res.StatusCode
}

// A job submitted over HTTP to one node trains across three and gives the
// weights of one process, bit for bit.
func TestJobOverHTTPIsBitIdentical(t *testing.T) {
	as := startCluster(t, 3)
	spec := smallSpec()
	spec.Partition, spec.Schedule = "uniform", "1f1b"
	want := localSHA(t, spec)

	body, _ := json.Marshal(spec)
	var sub SubmitReply
	api := "http://" + as[1].HTTPAddr()
	if code := call(t, "POST", api+"/v1/jobs", body, &sub); code != http.StatusCreated {
		t.Fatalf("POST /v1/jobs: %d %+v", code, sub)
	}
	if sub.ID == "" || sub.Plan == "" || len(sub.Status.Stages) != 3 {
		t.Fatalf("submit reply %+v", sub)
	}
	t.Logf("job %s: %s", sub.ID, sub.Plan)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := as[1].Wait(ctx, sub.ID); err != nil {
		t.Fatal(err)
	}
	var st job.Status
	if code := call(t, "GET", api+"/v1/jobs/"+sub.ID, nil, &st); code != http.StatusOK {
		t.Fatalf("GET job: %d", code)
	}
	if st.State != job.StateDone || st.Result == nil {
		t.Fatalf("job ended %q: %s", st.State, st.Error)
	}
	if st.Result.WeightsSHA256 != want {
		t.Fatalf("pipelined weights %s, single process %s", st.Result.WeightsSHA256, want)
	}
	if got := st.Result.Nodes; len(got) != 3 {
		t.Fatalf("result nodes %v, want 3", got)
	}
	// The coordinator's cuts are replicated to the first other node by name.
	ck, err := as[0].Store().Latest(sub.ID)
	if err != nil || ck.Step != int64(st.Total) {
		t.Fatalf("replica on node a: %v (err %v), want the cut at step %d", ck, err, st.Total)
	}
	if rec, err := as[1].Record(sub.ID); err != nil || rec.Run == "" || runOf(t, ck) != rec.Run {
		t.Errorf("replica on node a of run %q; the job's record %+v (%v)", runOf(t, ck), rec, err)
	}
	if code := call(t, "PUT", "http://"+as[0].HTTPAddr()+"/v1/checkpoints/"+sub.ID, []byte("not a checkpoint"), nil); code != http.StatusBadRequest {
		t.Errorf("PUT of a corrupt checkpoint: %d, want 400", code)
	}

	var status Status
	if code := call(t, "GET", api+"/v1/status", nil, &status); code != http.StatusOK {
		t.Fatalf("GET status: %d", code)
	}
	if status.Name != "b" || len(status.Members) != 3 || len(status.Jobs) != 1 || status.Jobs[0].ID != sub.ID {
		t.Fatalf("status %+v", status)
	}
	for _, m := range status.Members {
		if m.State != MemberAlive || m.Actors == "" || m.HTTP == "" || m.Profile.GFLOPS <= 0 || m.Profile.Threads != 1 {
			t.Errorf("member %+v", m)
		}
	}
	if code := call(t, "GET", api+"/v1/jobs/nope", nil, nil); code != http.StatusNotFound {
		t.Errorf("GET unknown job: %d, want 404", code)
	}
	// The same id again is refused.
	spec.ID = sub.ID
	body, _ = json.Marshal(spec)
	if code := call(t, "POST", api+"/v1/jobs", body, nil); code != http.StatusConflict {
		t.Errorf("POST with a used id: %d, want 409", code)
	}
}

// A job whose micro-batches are auto runs with the M its coordinator
// chose, and says which: in its status, its result and the record its
// holders keep (a successor resumes it with that M).
func TestAutoMicroBatches(t *testing.T) {
	as := startCluster(t, 2)
	spec := smallSpec()
	spec.Deterministic, spec.MicroBatches = false, 0
	c, err := as[0].Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	id := c.Spec().ID()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := as[0].Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	m := c.Spec().Spec().MicroBatches
	if m < 1 || spec.Batch%m != 0 || st.MicroBatches != m || st.Result == nil || st.Result.MicroBatches != m {
		t.Fatalf("chosen M %d; status M %d, result %+v", m, st.MicroBatches, st.Result)
	}
	if !strings.Contains(c.Describe(), fmt.Sprintf("M=%d:", m)) {
		t.Errorf("plan %q does not say M=%d", c.Describe(), m)
	}
	// M was chosen over the links as measured, both ways.
	if probed := slices.DeleteFunc(slices.Clone(st.Links), func(l job.LinkStatus) bool { return l.Source != "probe" }); len(probed) != 2 {
		t.Errorf("links measured: %+v, want a-b and b-a", st.Links)
	}
	rec, err := as[0].Record(id)
	if err != nil || rec.Spec.Spec().MicroBatches != m {
		t.Fatalf("record's micro-batches %d (%v), want %d", rec.Spec.Spec().MicroBatches, err, m)
	}
}

// A bad job spec is refused with a clear message and starts nothing.
func TestBadSpecIsRefused(t *testing.T) {
	as := startCluster(t, 2)
	api := "http://" + as[0].HTTPAddr()
	spec := func(mod func(*job.Spec)) []byte {
		s := smallSpec()
		mod(&s)
		b, _ := json.Marshal(s)
		return b
	}
	cases := []struct {
		name string
		body []byte
		code int
		want string
	}{
		{"unknown model", spec(func(s *job.Spec) { s.Model = "gpt5" }), 400, "unknown model"},
		{"partition misses a layer", spec(func(s *job.Spec) { s.Partition = "fc1-fc8@a; fc10-fc32@b" }), 400, "fc9"},
		{"more stages than nodes", spec(func(s *job.Spec) { s.Partition = "fc1-fc8@a; fc9-fc20@b; fc21-fc32@c" }), 400, "c"},
		{"micro-batches", spec(func(s *job.Spec) { s.MicroBatches = 100 }), 400, "micro-batches"},
		{"deterministic, micro-batches auto", spec(func(s *job.Spec) { s.MicroBatches = 0 }), 400, "deterministic job needs its number of micro-batches"},
		{"bad id", spec(func(s *job.Spec) { s.ID = "../x" }), 400, "bad job id"},
		{"unknown field", []byte(`{"model":"mlp32","layers":3}`), 400, "unknown field"},
		{"not JSON", []byte(`{"model":`), 400, "bad job spec"},
		{"two values", []byte(`{} {}`), 400, "more than one"},
		{"too large", append(append([]byte(`{"model":"`), bytes.Repeat([]byte("x"), MaxBodyBytes)...), '"', '}'), 413, "body over"},
	}
	for _, c := range cases {
		var e ErrorReply
		code := call(t, "POST", api+"/v1/jobs", c.body, &e)
		if code != c.code || !strings.Contains(e.Error, c.want) {
			t.Errorf("%s: %d %q; want %d mentioning %q", c.name, code, e.Error, c.code, c.want)
		}
	}
	var jobs []job.Status
	if code := call(t, "GET", api+"/v1/jobs", nil, &jobs); code != http.StatusOK || len(jobs) != 0 {
		t.Fatalf("jobs after refusals: %d %+v", code, jobs)
	}
}

// A node that leaves while idle is gone from another node's members within
// 2 s, and its listeners are closed.
func TestLeavingNodeDisappears(t *testing.T) {
	as := startCluster(t, 3)
	c := as[2]
	addrs := []string{c.HTTPAddr(), c.ActorAddr()}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := c.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	awaitMembers(t, as[0], 2*time.Second-time.Since(t0), "c to leave", func(ms []cluster.Member) bool {
		return !slices.ContainsFunc(ms, func(m cluster.Member) bool { return m.Name == "c" })
	})
	t.Logf("c gone from a's members after %v", time.Since(t0))
	for _, addr := range addrs {
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			t.Errorf("%s still accepts connections after Leave", addr)
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close after Leave: %v", err)
	}
	if got := len(as[0].members.usable()); got != 2 {
		t.Errorf("a offers %d nodes to jobs, want 2", got)
	}
}

// DELETE cancels a running job, and Close ends the jobs the node
// coordinates before it returns.
func TestCancelAndCloseEndJobs(t *testing.T) {
	as := startCluster(t, 2)
	api := "http://" + as[0].HTTPAddr()
	spec := smallSpec()
	spec.Steps, spec.Epochs = 0, 1000 // 4000 steps: far longer than the test
	spec.Partition = "uniform"
	body, _ := json.Marshal(spec)
	var sub SubmitReply
	if code := call(t, "POST", api+"/v1/jobs", body, &sub); code != http.StatusCreated {
		t.Fatalf("POST: %d", code)
	}
	if code := call(t, "DELETE", api+"/v1/jobs/"+sub.ID, nil, nil); code != http.StatusAccepted {
		t.Fatalf("DELETE: %d", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := as[0].Wait(ctx, sub.ID)
	if err != nil || st.State != job.StateFailed || !strings.Contains(st.Error, "canceled") {
		t.Fatalf("cancelled job: %v, state %q, error %q", err, st.State, st.Error)
	}
	if code := call(t, "DELETE", api+"/v1/jobs/nope", nil, nil); code != http.StatusNotFound {
		t.Errorf("DELETE unknown job: %d, want 404", code)
	}

	if code := call(t, "POST", api+"/v1/jobs", body, &sub); code != http.StatusCreated {
		t.Fatalf("POST: %d", code)
	}
	if err := as[0].Close(); err != nil {
		t.Fatal(err)
	}
	st, err = as[0].Wait(context.Background(), sub.ID) // ended: returns at once
	if err != nil || st.State != job.StateFailed {
		t.Fatalf("job after Close: %v, state %q", err, st.State)
	}
	if _, err := as[0].Submit(spec); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close: %v, want ErrClosed", err)
	}
}

// Agents that ran a job and closed leave no goroutines behind (beyond a
// few of protoactor's package-level helpers).
func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	for round := range 2 {
		a := start(t, "a")
		b := start(t, "b", a.GossipAddr())
		spec := smallSpec()
		spec.Partition = "uniform"
		c, err := b.Submit(spec)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		st, err := b.Wait(ctx, c.Status().ID)
		cancel()
		if err != nil || st.State != job.StateDone {
			t.Fatalf("round %d: job %v, state %q: %s", round, err, st.State, st.Error)
		}
		if code := call(t, "GET", "http://"+a.HTTPAddr()+"/v1/status", nil, nil); code != http.StatusOK {
			t.Fatalf("status: %d", code)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	// memberlist's and gRPC's last goroutines end shortly after their
	// Shutdown returns; allow them a moment.
	const slack = 3
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for runtime.NumGoroutine() > before+slack {
		if time.Now().After(deadline) {
			var buf bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf.String())
		}
		<-tick.C
	}
	t.Logf("goroutines: %d before, %d after", before, runtime.NumGoroutine())
}

// Two nodes cannot share a data dir: the second start fails with a clear
// error while the first runs; once it stopped, the dir can be used again.
func TestDataDirIsLocked(t *testing.T) {
	dir := t.TempDir()
	a := startIn(t, dir, "a")
	_, err := Start(Config{Name: "a2", Bind: "127.0.0.1:0", HTTP: "127.0.0.1:0", Threads: 1, ProfileFor: time.Millisecond,
		DataDir: dir, Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), "in use by another node") {
		t.Fatalf("second node on the same data dir: %v, want it refused", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	startIn(t, dir, "a")
}

// A job cancelled while its stage nodes close ends at once: stopping
// stages of a node that is gone does not wait out the stop's timeout.
func TestCancelWhileStageNodesClose(t *testing.T) {
	as := startCluster(t, 3)
	spec := smallSpec()
	spec.ID, spec.Partition = "orphaned", "uniform"
	spec.Steps, spec.Epochs = 0, 2000
	co, err := as[0].Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	awaitJob(t, co, time.Minute, "3 steps", func(s job.Status) bool { return s.State == job.StateTraining && s.Step >= 3 })
	if err := as[0].Cancel(spec.ID); err != nil {
		t.Fatal(err)
	}
	as[2].Close()
	as[1].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the stop's timeout is 10 s
	defer cancel()
	if _, err := as[0].Wait(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
}

// A node keeps the final weights of its newest done jobs in memory and
// answers 410 Gone, pointing to the job's last cut, for older ones; older
// still, it forgets the job (404) and removes its cuts.
func TestOldJobsAreReleased(t *testing.T) {
	as := startCluster(t, 1)
	as[0].jobs.keepWeights, as[0].jobs.keepJobs = 2, 4
	api := "http://" + as[0].HTTPAddr()
	var ids []string
	for i := range 5 {
		spec := smallSpec()
		spec.ID = fmt.Sprintf("w%d", i)
		body, _ := json.Marshal(spec)
		if code := call(t, "POST", api+"/v1/jobs", body, nil); code != http.StatusCreated {
			t.Fatalf("POST job %d: %d", i, code)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		st, err := as[0].Wait(ctx, spec.ID)
		cancel()
		if err != nil || st.State != job.StateDone {
			t.Fatalf("job %s: %v %+v", spec.ID, err, st)
		}
		ids = append(ids, spec.ID)
	}
	// The runner retires jobs after their end is published: wait for it.
	weights := func(id string) int { return call(t, "GET", api+"/v1/jobs/"+id+"/weights", nil, nil) }
	cutsOf := func(id string) string { return filepath.Join(as[0].cfg.DataDir, "checkpoints", id) }
	poll(t, "the oldest job and its cuts forgotten", 10*time.Second, func() bool {
		_, err := os.Stat(cutsOf(ids[0]))
		return weights(ids[0]) == http.StatusNotFound && os.IsNotExist(err)
	})
	for i, want := range []int{http.StatusNotFound, http.StatusGone, http.StatusGone, http.StatusOK, http.StatusOK} {
		if code := weights(ids[i]); code != want {
			t.Errorf("weights of job %s (%d of %d, oldest first): %d, want %d", ids[i], i+1, len(ids), code, want)
		}
	}
	if js := as[0].Jobs(); len(js) != 4 || js[0].ID != ids[1] {
		t.Errorf("jobs kept: %d, oldest %+v; want the 4 newest", len(js), js[0].ID)
	}
	if _, err := os.Stat(cutsOf(ids[1])); err != nil {
		t.Errorf("cuts of job %s, whose weights were released: %v", ids[1], err)
	}
}
