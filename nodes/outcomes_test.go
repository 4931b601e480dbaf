package nodes

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
)

// A job too large for the members' memory is refused (400) with its need
// and theirs, before the coordinator builds its model.
func TestJobTooLargeIsRefused(t *testing.T) {
	if job.AvailableMemory() > 100<<30 {
		t.Skip("this machine could hold the job")
	}
	a := start(t, "a")
	s := job.DefaultSpec() // mlp32 on MNIST with Adam
	s.Width = 1 << 14
	body, _ := json.Marshal(s)
	var e ErrorReply
	code := call(t, "POST", "http://"+a.HTTPAddr()+"/v1/jobs", body, &e)
	if code != http.StatusBadRequest || !strings.Contains(e.Error, "bad job spec: job needs about 121.2 GiB (parameters 30.1 GiB") ||
		!strings.Contains(e.Error, "; the members have ") {
		t.Fatalf("%d %q; want 400 with the job's need and the members' memory", code, e.Error)
	}
	if js := a.Jobs(); len(js) != 0 {
		t.Fatalf("jobs after the refusal: %+v", js)
	}
}

// A job whose loss diverges ends diverged, with the step; its record says
// it failed, so the holder does not take it over when its coordinator's
// node goes.
func TestDivergedJobIsNotTakenOver(t *testing.T) {
	as := startCluster(t, 2)
	a, b := as[0], as[1]
	spec := takeoverSpec("diverged")
	spec.LR = 1e308
	if _, err := a.Submit(spec); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := a.Wait(ctx, spec.ID)
	if err != nil || st.State != job.StateDiverged || !strings.HasPrefix(st.Error, "diverged at step ") || st.Result != nil {
		t.Fatalf("status %+v, %v; want it diverged", st.Status, err)
	}
	r, err := b.Record(spec.ID)
	if err != nil || r.State != RecordFailed || r.Error != st.Error {
		t.Fatalf("record on b: %+v, %v; want it failed: %s", r, err, st.Error)
	}
	notTakenOver(t, a, b, spec.ID, "a diverged job")
}
