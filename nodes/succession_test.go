package nodes

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ppnode/ppnode/cluster"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
	"github.com/ppnode/ppnode/trust"
)

// syncBuffer is a log sink the agents' goroutines may share.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startWithCreds starts an agent as startIn does, holding the node
// certificate name of the cluster in creds, logging to log too.
func startWithCreds(t *testing.T, creds, name string, log io.Writer, seeds ...string) *Agent {
	t.Helper()
	id, err := trust.Load(creds, name)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Start(Config{Name: name, Bind: "127.0.0.1:0", Seeds: seeds, HTTP: "127.0.0.1:0", Threads: 1,
		ProfileFor: 20 * time.Millisecond, DataDir: t.TempDir(), Identity: id, ActorLogLevel: slog.LevelError,
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(log, testLogWriter(t)), nil))})
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// testLogWriter is where testLogger's lines go (nowhere by default).
func testLogWriter(t *testing.T) io.Writer {
	if *logLevel == "" {
		return io.Discard
	}
	return logWriter{t}
}

// logWriter sends log lines to t.Log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// A node certificate of the cluster does not make a coordinator: a node
// that never joined cannot name itself the coordinator of a running job
// with a higher term, at a holder or at the coordinator, nor send cuts of
// it, nor cuts of a job without a record (neither can a member). A zeroed
// cut restamped 200 steps later that lands in the holder's store anyway is
// refused when the holder takes the job over, with a log line, and the job
// ends with the weights of the run without the attack.
func TestOnlyTheRightfulSuccessorCoordinates(t *testing.T) {
	creds := t.TempDir()
	if err := trust.Init(creds); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b", "rogue"} {
		if _, err := trust.Issue(creds, n, trust.RoleNode, []string{"127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
	}
	var logs syncBuffer
	a := startWithCreds(t, creds, "a", &logs)
	b := startWithCreds(t, creds, "b", &logs, a.GossipAddr())
	awaitMembers(t, a, 5*time.Second, "b", func(ms []cluster.Member) bool { return len(ms) == 2 })
	awaitMembers(t, b, 5*time.Second, "a", func(ms []cluster.Member) bool { return len(ms) == 2 })
	rogueID, err := trust.Load(creds, "rogue")
	if err != nil {
		t.Fatal(err)
	}
	rogue := func(at *Agent) *Client { return NewClientWith(at.HTTPAddr(), HTTPClient(rogueID)) }
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	spec := takeoverSpec("succession")
	want := localSHA(t, spec)
	if _, err := a.Submit(spec); err != nil {
		t.Fatal(err)
	}
	var st JobStatus
	poll(t, "a durable cut", time.Minute, func() bool {
		st, _ = a.Job(spec.ID)
		return st.LatestCut >= 20 || st.State == job.StateDone || st.State == job.StateFailed
	})
	if st.State != job.StateTraining {
		t.Fatalf("job %s at step %d before the attacks: make it longer", st.State, st.Step)
	}
	rec, err := rogue(b).Record(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}

	// A record naming the rogue coordinator in the next term.
	forged := rec.clone()
	forged.Coordinator, forged.Generation, forged.Revision = "rogue", nextTerm(rec.Generation), 1
	forged.Holders = []string{"b"}
	for _, at := range []*Agent{b, a} {
		err := rogue(at).PutRecord(ctx, forged)
		if err == nil || !strings.Contains(err.Error(), "403") {
			t.Errorf("%s: a record naming the rogue coordinator: %v, want 403", at.Name(), err)
		}
	}
	if r, err := b.Record(spec.ID); err != nil || r.Coordinator != "a" {
		t.Errorf("b's record after the forgery: %+v, %v; want coordinator a", r, err)
	}

	// A zeroed cut 200 steps past b's newest copy.
	steps := storeSteps(t, b, spec.ID)
	if len(steps) == 0 {
		t.Fatal("b holds no cut although one is durable")
	}
	planted, err := b.Store().Load(spec.ID, steps[len(steps)-1])
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range planted.Params {
		clear(p.T.Data().([]float32))
	}
	for _, o := range planted.Optim {
		clear(o.T.Data().([]float32))
	}
	planted.Step += 200
	writeCut := func(ck *tensorio.Checkpoint) func(io.Writer) error {
		return func(w io.Writer) error { return tensorio.WriteCheckpoint(w, ck) }
	}
	if err := rogue(b).PutCut(ctx, spec.ID, writeCut(planted)); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("the rogue's cut: %v, want 403", err)
	}
	// Cuts of a job without a record: from the rogue, and from a member.
	other := *planted
	other.JobID = "no-record"
	for name, c := range map[string]*Client{"rogue": rogue(b), "a": a.members.client(b.HTTPAddr())} {
		if err := c.PutCut(ctx, other.JobID, writeCut(&other)); err == nil || !strings.Contains(err.Error(), "403") {
			t.Errorf("a cut of a job without a record from %s: %v, want 403", name, err)
		}
	}
	if got := storeSteps(t, b, other.JobID); len(got) != 0 {
		t.Errorf("b keeps cuts %v of a job without a record", got)
	}
	if st, err := a.Job(spec.ID); err != nil || st.State != job.StateTraining {
		t.Fatalf("the job after the attacks: %+v, %v; want it training on a", st, err)
	}

	// The planted cut gets into b's store by another way; a dies.
	if _, err := b.Store().Save(planted); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	poll(t, "the job on b", 30*time.Second, func() bool { _, err := b.Job(spec.ID); return err == nil })
	st, err = b.Wait(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != job.StateDone || st.Result == nil {
		t.Fatalf("job on b: %s %s", st.State, st.Error)
	}
	tk := st.Takeover
	if tk == nil || tk.Step >= planted.Step || tk.Step < 20 || !strings.Contains(tk.Source, "not the record's") {
		t.Fatalf("takeover %+v; want one from a genuine cut, skipping the planted one at step %d", tk, planted.Step)
	}
	t.Logf("takeover: %+v", *tk)
	if !strings.Contains(logs.String(), "refusing a cut that the job's record does not vouch for") {
		t.Error("no log line says that the planted cut was refused")
	}
	if st.Result.WeightsSHA256 != want {
		t.Errorf("weights after the attacks %s, without them %s", st.Result.WeightsSHA256, want)
	}
}
