package nodes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
)

// abc are the gossip members of the job tables' tests.
var abc = map[string]bool{"a": true, "b": true, "c": true}

// A job id is either coordinated here or its record held here: a held id
// cannot be submitted, a reserved one cannot be held, and a closed table
// reserves nothing.
func TestJobTableSharesIDs(t *testing.T) {
	tab := newJobs("b", slog.New(slog.DiscardHandler))
	rec := goodRecord(t) // coordinated by a, held by b and c
	if kept, err := tab.hold(rec, abc); !kept || err != nil {
		t.Fatalf("hold: %v, %v", kept, err)
	}
	if _, err := tab.reserve(rec.ID); !errors.Is(err, ErrJobID) {
		t.Errorf("reserving a held id: %v, want ErrJobID", err)
	}
	other := goodRecord(t)
	other.ID = "job-2"
	respec(t, &other, func(s *job.Spec) { s.ID = other.ID })
	if _, err := tab.reserve(other.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.hold(other, abc); !errors.Is(err, ErrStaleRecord) {
		t.Errorf("holding a reserved id: %v, want ErrStaleRecord", err)
	}
	tab.release(other.ID)
	if kept, err := tab.hold(other, abc); !kept || err != nil {
		t.Errorf("holding a released id: %v, %v", kept, err)
	}
	x, err1 := tab.reserve("")
	y, err2 := tab.reserve("")
	if err1 != nil || err2 != nil || x == y || checkID(x) != nil {
		t.Errorf("generated ids %q, %q: %v, %v", x, y, err1, err2)
	}
	tab.release(x)
	tab.release(y)
	tab.close()
	if _, err := tab.reserve("job-3"); !errors.Is(err, ErrClosed) {
		t.Errorf("reserving after close: %v, want ErrClosed", err)
	}
	if due := tab.due(map[string]bool{"b": true}); len(due) != 0 {
		t.Errorf("a closed table takes %d jobs over", len(due))
	}
	if !tab.awaitRuns(time.Second) {
		t.Error("reservations still counted after their release")
	}
}

// A held job is taken over by its successor alone, once its coordinator
// is gone, and only once.
func TestJobTableDue(t *testing.T) {
	rec := goodRecord(t)
	b, c := newJobs("b", slog.New(slog.DiscardHandler)), newJobs("c", slog.New(slog.DiscardHandler))
	for _, tab := range []*jobs{b, c} {
		if _, err := tab.hold(rec, abc); err != nil {
			t.Fatal(err)
		}
	}
	if due := b.due(map[string]bool{"a": true, "b": true, "c": true}); len(due) != 0 {
		t.Errorf("taken over while the coordinator is a member: %v", due)
	}
	gone := map[string]bool{"b": true, "c": true}
	if due := c.due(gone); len(due) != 0 {
		t.Errorf("c takes over though b is the successor: %v", due)
	}
	if due := b.due(gone); len(due) != 1 || due[0].ID != rec.ID {
		t.Fatalf("b takes over %v, want %s", due, rec.ID)
	}
	if due := b.due(gone); len(due) != 0 {
		t.Errorf("taken over twice: %v", due)
	}
	if closing := b.abandon(rec.ID); closing || len(b.records()) != 0 {
		t.Errorf("abandoned takeover: closing %v, records %v", closing, b.records())
	}
	if due := c.due(map[string]bool{"b": false, "c": true}); len(due) != 1 {
		t.Errorf("c does not take over once b may not: %v", due)
	}
	c.abandon(rec.ID)
	if !b.awaitRuns(time.Second) || !c.awaitRuns(time.Second) {
		t.Error("takeover reservations still counted")
	}
}

// A newer record of a job coordinated here that names another coordinator
// stops the job here (fencing); an older one is refused.
func TestJobTableFencing(t *testing.T) {
	tab := newJobs("a", slog.New(slog.DiscardHandler))
	rec := goodRecord(t)
	if _, err := tab.reserve(rec.ID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	j := &coordinated{cancel: cancel, done: make(chan struct{}), rec: rec}
	if err := tab.start(rec.ID, j); err != nil {
		t.Fatal(err)
	}
	stale := rec.clone()
	stale.Coordinator, stale.Holders, stale.Revision = "b", []string{"c"}, 0
	if _, err := tab.hold(stale, abc); !errors.Is(err, ErrStaleRecord) || ctx.Err() != nil {
		t.Errorf("an older record: %v (job cancelled: %v), want ErrStaleRecord", err, ctx.Err())
	}
	newer := stale.clone()
	newer.Generation, newer.Revision = nextTerm(rec.Generation), 1
	if kept, err := tab.hold(newer, abc); kept || err != nil {
		t.Fatalf("a newer record: kept %v, %v", kept, err)
	}
	if _, superseded := tab.lastRecord(j); !superseded || ctx.Err() == nil || j.movedTo != "b" {
		t.Errorf("fenced job: superseded %v, cancelled %v, moved to %q", superseded, ctx.Err() != nil, j.movedTo)
	}
	tab.runEnded()
	if !tab.awaitRuns(time.Second) {
		t.Error("the job's run still counted")
	}
}

// A job the table forgets (beyond the ended jobs it keeps, coordinated or
// held, or no longer held by this node) is told to forget with its run,
// once, and only when the table neither coordinates nor holds it any more.
func TestJobTableForgets(t *testing.T) {
	tab := newJobs("b", slog.New(slog.DiscardHandler))
	var told [][2]string
	tab.forget = func(id, run string) { told = append(told, [2]string{id, run}) }
	tab.keepJobs = 1
	for i, id := range []string{"job-1", "job-2", "job-3"} {
		if _, err := tab.reserve(id); err != nil {
			t.Fatal(err)
		}
		rec := goodRecord(t)
		rec.ID, rec.Run, rec.Coordinator, rec.Holders = id, fmt.Sprintf("run-%d", i+1), "b", []string{"c"}
		j := &coordinated{cancel: func() {}, done: make(chan struct{}), rec: rec}
		if err := tab.start(id, j); err != nil {
			t.Fatal(err)
		}
		close(j.done)
		tab.runEnded()
	}
	tab.retire()
	if want := [][2]string{{"job-2", "run-2"}, {"job-1", "run-1"}}; !slices.Equal(told, want) {
		t.Errorf("coordinated jobs forgotten: %v, want %v", told, want)
	}

	told = nil
	for i := range maxFinishedRecords + 1 {
		rec := goodRecord(t)
		rec.ID, rec.Run, rec.State = fmt.Sprintf("held-%03d", i), fmt.Sprintf("run-h%d", i), RecordFailed
		if kept, err := tab.hold(rec, abc); !kept || err != nil {
			t.Fatalf("hold %s: %v, %v", rec.ID, kept, err)
		}
	}
	if want := [][2]string{{"held-000", "run-h0"}}; !slices.Equal(told, want) {
		t.Errorf("held records forgotten: %v, want %v", told, want)
	}
	if tab.held["held-000"] != nil || tab.held["held-001"] == nil {
		t.Error("the oldest ended record was not the one dropped")
	}

	// A record that no longer names this node a holder.
	told = nil
	rec := goodRecord(t)
	if kept, err := tab.hold(rec, abc); !kept || err != nil {
		t.Fatalf("hold: %v, %v", kept, err)
	}
	rec.Holders, rec.Revision = []string{"c"}, rec.Revision+1
	if kept, err := tab.hold(rec, abc); kept || err != nil {
		t.Fatalf("a record without this node: kept %v, %v", kept, err)
	}
	if want := [][2]string{{rec.ID, rec.Run}}; !slices.Equal(told, want) {
		t.Errorf("a job no longer held: forgotten %v, want %v", told, want)
	}
}
