package nodes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// Timeouts of the failover traffic between nodes.
const (
	// recordTimeout bounds sending a job record to one node.
	recordTimeout = 5 * time.Second
	// fetchTimeout bounds reading a cut from another node.
	fetchTimeout = 2 * time.Minute
	// maxFinishedRecords bounds the records of ended jobs a node keeps.
	maxFinishedRecords = 64
)

// failover is the holder's side of coordinator failover: it keeps the
// records of jobs coordinated elsewhere that their coordinators send (in
// the jobs table), and takes a job over when its coordinator dies. It has
// no lock of its own.
type failover struct {
	self    string
	log     *slog.Logger
	ctx     context.Context // the agent's: cancelled when it stops
	jobs    *jobs
	members *members
	cuts    *cuts
	runner  *runner // starts the jobs taken over
}

// accept keeps a job record sent by the job's coordinator (rec is
// valid). A record older than the one held is refused (ErrStaleRecord).
// A node that is not among the holders drops its copy. A newer record of a
// job this node coordinates names another coordinator: this node was
// declared dead and its job taken over, so it stops its own run (fencing).
// A record of another run of the id (a new submission) replaces one of a
// run that ended, here or as a held record, and is refused while the
// other run is in progress here; a holder that keeps it removes the cuts
// of other runs from its store (cuts.claim) before it acknowledges.
func (f *failover) accept(rec JobRecord) error {
	kept, err := f.jobs.hold(rec, f.members.successors())
	if err != nil || !kept {
		return err
	}
	if err := f.cuts.claim(rec.ID, rec.Run); err != nil {
		return err
	}
	if rec.State == RecordRunning {
		f.considerTakeovers() // its coordinator may be gone already
	}
	return nil
}

// ErrNotSuccessor refuses a job record from a node that may not coordinate
// the job: not a member, or not the rightful successor of the coordinator
// named by the record held.
var ErrNotSuccessor = errors.New("nodes: not the job's rightful coordinator")

// rightful checks a record rec that names its sender as the job's
// coordinator against old, this node's record of the same run (nil: none).
// The coordinator must be a gossip member (members, as
// members.successors gives them: present means alive). A record that
// names a coordinator other than old's must start a later term, while
// old's coordinator is no longer a member (unless it is this node, which
// is being fenced), and come from the rightful successor: the holder of
// old that successor picks among the members that may take jobs over,
// old's coordinator left out, as the holders do when they take over.
func rightful(old, rec *JobRecord, self string, members map[string]bool) error {
	if _, ok := members[rec.Coordinator]; !ok {
		return fmt.Errorf("%w: job %q: %q is not a member of the cluster", ErrNotSuccessor, rec.ID, rec.Coordinator)
	}
	if old == nil || old.Coordinator == rec.Coordinator {
		return nil
	}
	if term(rec.Generation) <= term(old.Generation) {
		return fmt.Errorf("%w: job %q: %q names itself coordinator in term %d; %q coordinates term %d",
			ErrNotSuccessor, rec.ID, rec.Coordinator, term(rec.Generation), old.Coordinator, term(old.Generation))
	}
	if _, alive := members[old.Coordinator]; alive && old.Coordinator != self {
		return fmt.Errorf("%w: job %q: %q names itself coordinator, but %q is still a member", ErrNotSuccessor, rec.ID, rec.Coordinator, old.Coordinator)
	}
	if s := successor(old, func(n string) bool { return n != old.Coordinator && members[n] }); s != rec.Coordinator {
		return fmt.Errorf("%w: job %q: %q names itself coordinator, but the successor of %q is %q", ErrNotSuccessor, rec.ID, rec.Coordinator, old.Coordinator, s)
	}
	return nil
}

// considerTakeovers starts a takeover of every running job whose record
// this node holds, whose coordinator is no longer a member, and whose
// successor is this node.
func (f *failover) considerTakeovers() {
	for _, rec := range f.jobs.due(f.members.successors()) {
		go f.takeOver(rec)
	}
}

// takeOver makes this node the coordinator of the job of rec, whose
// coordinator died: it reads the newest complete, verified cut it can find
// (its own copies, then those of the other holders), plans the job over
// the live nodes with a generation of a new term, and runs it as if it
// had been submitted here. Without any cut the job restarts from step 0.
// The reservation of the job's id in the jobs table (see jobs.due) is the
// caller's, handed over.
func (f *failover) takeOver(rec JobRecord) {
	t0 := time.Now()
	if f.stillRuns(rec) {
		// Declared failed but alive (a node starved of CPU can miss
		// memberlist's probes): it rejoins by refuting, and a later
		// failure is considered again.
		f.log.Warn("nodes: a job's coordinator was declared failed but still runs the job; not taking it over", "job", rec.ID, "coordinator", rec.Coordinator)
		f.jobs.release(rec.ID)
		return
	}
	f.log.Warn("nodes: taking over a job whose coordinator is gone", "job", rec.ID, "coordinator", rec.Coordinator)
	ck, meta, source := f.latestCut(rec)
	var step int64
	if ck != nil {
		step = ck.Step
	}
	gen := nextTerm(max(rec.Generation, meta.Generation))
	tk := Takeover{From: rec.Coordinator, To: f.self, Step: step, Source: source, Generation: gen, At: t0}
	next := rec.clone()
	next.Coordinator, next.Generation, next.Revision = f.self, gen, 1
	next.Takeovers = append(next.Takeovers, tk)
	if n := len(next.Takeovers); n > maxTakeovers {
		next.Takeovers = next.Takeovers[n-maxTakeovers:]
	}
	// The run's cuts go on in this store (its copies are of the run
	// already, unless it had no record of it before).
	err := f.runner.confine(rec.Spec.Spec())
	if err == nil {
		err = f.cuts.claim(rec.ID, rec.Run)
	}
	var c *actors.Coordinator
	if err == nil {
		c, err = actors.NewCoordinator(rec.Spec.ReadingFrom(f.runner.files), f.runner.config(ck, gen, true))
	}
	if err != nil {
		f.giveUp(rec, next, err)
		return
	}
	tk.PrepareMS = job.Millis(time.Since(t0))
	next.Takeovers[len(next.Takeovers)-1] = tk
	isSelf := func(h string) bool { return h == f.self }
	next.Holders = chooseHolders(slices.DeleteFunc(slices.Clone(rec.Holders), isSelf), peerNames(f.members.peers()), rec.replicas()-1)
	f.jobs.unhold(rec.ID)
	// The record's former holders hear of the new coordinator through
	// sendRecord: launch's job starts with the old holders as j.rec.
	old := rec.clone()
	old.Holders = slices.DeleteFunc(old.Holders, isSelf)
	if err := f.runner.launch(c, old, next, &tk); err != nil {
		return
	}
	f.log.Warn("nodes: took a job over", "job", rec.ID, "from", rec.Coordinator, "step", step, "source", source,
		"generation", gen, "prepare_ms", tk.PrepareMS, "holders", next.Holders)
}

// giveUp ends a takeover of the job of rec that could not start it: the
// record next, which would have made this node its coordinator, goes to
// the holders as failed, with this node no longer among them (it keeps
// the record itself when no other holder is left). A node that is
// stopping gives up quietly: a holder still alive takes the job over.
func (f *failover) giveUp(rec, next JobRecord, err error) {
	if closing := f.jobs.abandon(rec.ID); closing {
		return
	}
	f.log.Error("nodes: taking over a job failed", "job", rec.ID, "err", err)
	next.Holders = slices.DeleteFunc(next.Holders, func(h string) bool { return h == f.self })
	next.State, next.Error = RecordFailed, fmt.Sprintf("taking the job over on %s: %v", f.self, err)
	if len(next.Error) > maxErrorBytes {
		next.Error = next.Error[:maxErrorBytes]
	}
	f.runner.sendRecord(&coordinated{rec: rec}, next, recordTimeout)
	if len(next.Holders) == 0 {
		f.jobs.keepEnded(next) // else no node would know how the job ended
	}
}

// stillRuns reports whether rec's coordinator answers, at its last known
// HTTP address, that it is running the job.
func (f *failover) stillRuns(rec JobRecord) bool {
	addr := f.members.lastHTTP(rec.Coordinator)
	if addr == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(f.ctx, stillRunsTimeout)
	defer cancel()
	st, err := f.members.client(addr).Job(ctx, rec.ID)
	return err == nil && st.MovedTo == "" && st.State != "" && !st.State.Ended()
}

// stillRunsTimeout bounds the question to a coordinator declared failed
// (a dead node refuses the connection at once; a stopped one is given this
// long).
const stillRunsTimeout = 2 * time.Second

// cutSource is a copy of a cut: in this node's store (http == "") or on
// another node.
type cutSource struct {
	node, http string
	step       int64
}

// latestCut returns the newest complete, verified cut of rec's run of its
// job that this node or another live holder keeps, and says where it was
// found. A copy that is damaged or cannot be read is skipped for the next
// newest (this node's copy first at equal steps), and so are the cuts of
// other runs of the job id: this node's if its store is not claimed for
// rec.Run, another holder's if its CutList names another run, and any
// copy whose run (job.CutMeta.Run) is not rec.Run. With it comes its
// metadata. With no usable copy it returns nil: the job restarts from
// step 0.
func (f *failover) latestCut(rec JobRecord) (*tensorio.Checkpoint, job.CutMeta, string) {
	srcs, skipped := f.cutSources(rec)
	for _, s := range srcs {
		ck, meta, err := f.readCut(rec, s)
		if errors.Is(err, errOtherRun) {
			f.log.Warn("nodes: skipping a cut of another run of the job", "job", rec.ID, "step", s.step, "node", s.node, "err", err)
			skipped = append(skipped, fmt.Sprintf("step %d on %s (another run)", s.step, s.node))
			continue
		}
		if errors.Is(err, errNotRecorded) {
			f.log.Error("nodes: refusing a cut that the job's record does not vouch for (planted or damaged?)", "job", rec.ID, "step", s.step, "node", s.node, "err", err)
			skipped = append(skipped, fmt.Sprintf("step %d on %s (not the record's)", s.step, s.node))
			continue
		}
		if err != nil {
			f.log.Warn("nodes: skipping a damaged or unreadable cut", "job", rec.ID, "step", s.step, "node", s.node, "err", err)
			skipped = append(skipped, fmt.Sprintf("step %d on %s", s.step, s.node))
			continue
		}
		where := "this node's store"
		if s.http != "" {
			where = "the replica on " + s.node
			if err := f.cuts.keep(ck, rec.Run); err != nil {
				f.log.Warn("nodes: keeping a fetched cut", "job", rec.ID, "step", s.step, "err", err)
			}
		}
		if len(skipped) > 0 {
			where += " (skipped " + strings.Join(skipped, ", ") + ")"
		}
		return ck, meta, where
	}
	if len(skipped) > 0 {
		return nil, job.CutMeta{}, "no usable cut (skipped " + strings.Join(skipped, ", ") + "): restarted"
	}
	return nil, job.CutMeta{}, "no cut yet: restarted"
}

// cutSources lists the copies of the cuts of rec's run that this node
// and the other live holders keep, newest first, this node's first at
// equal steps; skipped says which were left out, and why.
func (f *failover) cutSources(rec JobRecord) (srcs []cutSource, skipped []string) {
	if store := f.cuts.store; store != nil {
		steps, err := store.Steps(rec.ID)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("own store: %v", err))
		}
		if len(steps) > 0 && f.cuts.run(rec.ID) != rec.Run {
			f.log.Warn("nodes: skipping the cuts of another run of the job", "job", rec.ID, "run", rec.Run, "steps", steps, "node", f.self)
			skipped = append(skipped, fmt.Sprintf("steps %v on %s (another run)", steps, f.self))
			steps = nil
		}
		for _, st := range steps {
			srcs = append(srcs, cutSource{node: f.self, step: st})
		}
	}
	addrs := f.members.httpAddrs()
	for _, h := range rec.Holders {
		addr, ok := addrs[h]
		if h == f.self || !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(f.ctx, recordTimeout)
		list, err := f.members.client(addr).Cuts(ctx, rec.ID)
		cancel()
		if err != nil {
			f.log.Warn("nodes: asking a holder for its cuts", "job", rec.ID, "holder", h, "err", err)
			continue
		}
		if len(list.Steps) > 0 && list.Run != rec.Run {
			f.log.Warn("nodes: skipping the cuts of another run of the job", "job", rec.ID, "run", rec.Run, "steps", list.Steps, "node", h, "their_run", list.Run)
			skipped = append(skipped, fmt.Sprintf("steps %v on %s (another run)", list.Steps, h))
			continue
		}
		for _, st := range list.Steps {
			srcs = append(srcs, cutSource{node: h, http: addr, step: st})
		}
	}
	slices.SortStableFunc(srcs, func(x, y cutSource) int {
		if c := cmp.Compare(y.step, x.step); c != 0 {
			return c
		}
		return cmp.Compare(x.http, y.http) // own copy ("") first
	})
	return srcs, skipped
}

// Errors of readCut: a copy stamped with another run; a copy whose step
// the job's record does not list, or whose digest is not the one listed.
var (
	errOtherRun    = errors.New("a cut of another run")
	errNotRecorded = errors.New("a cut the job's record does not list")
)

// readCut reads and verifies one copy of a cut of rec's run of its job,
// and its metadata: its step and digest must be among rec.Cuts. A copy
// without a run is taken as the run's: its source vouched for it
// (latestCut), and the digest covers the run.
func (f *failover) readCut(rec JobRecord, s cutSource) (*tensorio.Checkpoint, job.CutMeta, error) {
	id, run := rec.ID, rec.Run
	want, listed := rec.digestOf(s.step)
	if !listed {
		return nil, job.CutMeta{}, fmt.Errorf("%w: no cut at step %d among the record's %v", errNotRecorded, s.step, rec.cutSteps())
	}
	var ck *tensorio.Checkpoint
	if s.http == "" {
		var err error
		if ck, err = f.cuts.store.Load(id, s.step); err != nil {
			return nil, job.CutMeta{}, err
		}
	} else {
		ctx, cancel := context.WithTimeout(f.ctx, fetchTimeout)
		defer cancel()
		b, err := f.members.client(s.http).Cut(ctx, id, s.step, MaxCheckpointBytes)
		if err != nil {
			return nil, job.CutMeta{}, err
		}
		if ck, err = tensorio.ReadCheckpoint(b); err != nil {
			return nil, job.CutMeta{}, err
		}
	}
	if ck.JobID != id || ck.Step != s.step {
		return nil, job.CutMeta{}, fmt.Errorf("%w: holds job %q step %d", tensorio.ErrCorrupt, ck.JobID, ck.Step)
	}
	meta, err := job.ParseCutMeta(ck.Meta)
	if err != nil {
		return nil, job.CutMeta{}, fmt.Errorf("%w: %w", tensorio.ErrCorrupt, err)
	}
	if meta.Run != "" && meta.Run != run {
		return nil, job.CutMeta{}, fmt.Errorf("%w: run %q, the job's is %q", errOtherRun, meta.Run, run)
	}
	if sum, err := cutDigest(ck, run); err != nil || sum != want {
		return nil, job.CutMeta{}, fmt.Errorf("%w: the copy at step %d does not match the record's digest", errNotRecorded, s.step)
	}
	return ck, meta, nil
}

// CutList is the answer to GET /v1/checkpoints/{job}: the steps of the
// job's whole-model cuts this node keeps (not verified), oldest first,
// and the run they are of ("": not known to this node's process, the
// cuts of a run from before it started).
type CutList struct {
	Job   string  `json:"job"`
	Run   string  `json:"run,omitempty"`
	Steps []int64 `json:"steps"`
}
