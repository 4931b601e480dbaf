package nodes

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/cluster"
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

// peer is another member that can hold copies of a job.
type peer struct{ name, http string }

// peers are the other members that can hold a job's copies: alive, not
// leaving, with an HTTP API and a checkpoint store; sorted by name.
func (a *Agent) peers() []peer {
	var out []peer
	for _, m := range a.node.Members() {
		if m.Name != a.cfg.Name && m.State == cluster.StateAlive && !m.Leaving && m.MetaErr == nil &&
			m.Meta.Tags[tagHTTP] != "" && m.Meta.Tags[tagStore] == "1" {
			out = append(out, peer{m.Name, m.Meta.Tags[tagHTTP]})
		}
	}
	slices.SortFunc(out, func(x, y peer) int { return strings.Compare(x.name, y.name) })
	return out
}

func peerNames(ps []peer) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.name
	}
	return out
}

// memberHTTP returns the HTTP addresses of the members this node believes
// alive, by name.
func (a *Agent) memberHTTP() map[string]string {
	out := map[string]string{}
	for _, m := range a.node.Members() {
		if m.State == cluster.StateAlive && m.MetaErr == nil && m.Meta.Tags[tagHTTP] != "" {
			out[m.Name] = m.Meta.Tags[tagHTTP]
		}
	}
	return out
}

// replicas is the actors.Replicator of this node's coordinators.
type replicas struct{ a *Agent }

func (r replicas) Replicate(ck *tensorio.Checkpoint) error { return r.a.replicate(ck) }

// replicate sends a cut of a job this node coordinates, stamped with the
// job's run (job.CutMeta.Run), to Spec.Replicas-1 other nodes (the current
// holders while they can take it, then the others by name), then
// the job's record with the holders that acknowledged the cut and the
// cut's plan generation. It fails unless as many holders acknowledged as
// the cluster has nodes to hold copies (with fewer such nodes than asked,
// every one of them).
func (a *Agent) replicate(ck *tensorio.Checkpoint) error {
	a.mu.Lock()
	j := a.jobs[ck.JobID]
	var rec JobRecord
	if j != nil {
		rec = j.rec.clone()
	}
	a.mu.Unlock()
	if j == nil {
		return fmt.Errorf("nodes: replicating a cut of job %q, which this node does not coordinate", ck.JobID)
	}
	want := rec.replicas() - 1
	peers := a.peers()
	byName := map[string]string{}
	for _, p := range peers {
		byName[p.name] = p.http
	}
	order := chooseHolders(rec.Holders, peerNames(peers), len(peers))
	meta, err := job.ParseCutMeta(ck.Meta)
	if err != nil {
		return fmt.Errorf("nodes: step %d of %s: %w", ck.Step, ck.JobID, err)
	}
	sck := stamped(ck, meta, rec.Run)
	if err := sck.Validate(); err != nil {
		return err
	}
	var holders []string
	var errs []error
	for _, name := range order {
		if len(holders) == want {
			break
		}
		// Encoded as it is sent: a cut is hundreds of MB.
		ctx, cancel := context.WithTimeout(a.ctx, fetchTimeout)
		err := a.client(byName[name]).PutCut(ctx, ck.JobID, func(w io.Writer) error { return tensorio.WriteCheckpoint(w, sck) })
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue // the next node by name takes its place
		}
		holders = append(holders, name)
	}
	if err := a.ctx.Err(); err != nil {
		// This node is shutting down: the PUTs failed for that, not for
		// the holders. A record without them would make them drop theirs
		// and no one would take the job over.
		return fmt.Errorf("nodes: step %d of %s not replicated: the node is shutting down", ck.Step, ck.JobID)
	}
	rec.Generation = max(rec.Generation, meta.Generation)
	rec.Holders = holders
	rec.Revision++
	failed := a.sendRecord(j, rec, recordTimeout)
	if len(holders) < min(want, len(order)) {
		return fmt.Errorf("nodes: step %d of %s has %d of %d replicas: %w", ck.Step, ck.JobID, len(holders), want, errors.Join(errs...))
	}
	if len(failed) > 0 {
		return fmt.Errorf("nodes: the record of %s did not reach %v", ck.JobID, failed)
	}
	if len(holders) < want && !j.warnedFew {
		j.warnedFew = true
		a.log.Warn("nodes: fewer nodes can hold copies than the job asks", "job", ck.JobID, "replicas", rec.replicas(), "holders", holders)
	}
	return nil
}

// sendRecord makes rec the record of job j and sends it to rec's holders,
// to former holders (who then drop their copy), and to the job's former
// coordinators if they are alive again (which makes them stop theirs: see
// acceptRecord). It returns the holders that did not acknowledge it.
// Calls for one job must not overlap.
func (a *Agent) sendRecord(j *coordinated, rec JobRecord, timeout time.Duration) (failed []string) {
	a.mu.Lock()
	prev := j.rec.Holders
	if !j.superseded {
		j.rec = rec.clone()
	}
	a.mu.Unlock()
	targets := slices.Clone(rec.Holders)
	for _, h := range append(slices.Clone(prev), j.dropped...) {
		if !slices.Contains(rec.Holders, h) && !slices.Contains(targets, h) {
			targets = append(targets, h)
		}
	}
	j.dropped = nil
	for _, t := range rec.Takeovers {
		if t.From != a.cfg.Name && !slices.Contains(targets, t.From) {
			targets = append(targets, t.From)
		}
	}
	if _, err := json.Marshal(rec); err != nil { // a result that JSON cannot carry
		a.log.Error("nodes: encoding a job record", "job", rec.ID, "err", err)
		return rec.Holders
	}
	addrs := a.memberHTTP()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, name := range targets {
		holder := slices.Contains(rec.Holders, name)
		addr, ok := addrs[name]
		if !ok {
			if holder {
				failed = append(failed, name)
			} else if slices.Contains(prev, name) {
				j.dropped = append(j.dropped, name) // tell it when it is back
			}
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), timeout)
			defer cancel()
			err := a.client(addr).PutRecord(ctx, rec)
			if err != nil && holder {
				a.log.Warn("nodes: sending a job record", "job", rec.ID, "to", name, "err", err)
				mu.Lock()
				failed = append(failed, name)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// finish tells the holders how job j ended, unless this node is shutting
// down (the job did not end: a holder takes it over) or another node took
// the job over.
func (a *Agent) finish(j *coordinated, res *job.Result, runErr error) {
	a.mu.Lock()
	superseded := j.superseded
	rec := j.rec.clone()
	a.mu.Unlock()
	if superseded || a.ctx.Err() != nil {
		return
	}
	rec.Revision++
	if runErr != nil {
		rec.State, rec.Error = RecordFailed, runErr.Error()
		if len(rec.Error) > maxErrorBytes {
			rec.Error = rec.Error[:maxErrorBytes]
		}
	} else {
		r := *res
		finiteResult(&r)
		rec.State, rec.Result = RecordDone, &r
	}
	if failed := a.sendRecord(j, rec, recordTimeout); len(failed) > 0 {
		a.log.Warn("nodes: the end of a job is not known to all its holders", "job", rec.ID, "missing", failed)
	}
}

// Records returns the records this node holds for jobs coordinated
// elsewhere, by job id.
func (a *Agent) Records() []JobRecord {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]JobRecord, 0, len(a.records))
	for _, r := range a.records {
		out = append(out, r.clone())
	}
	slices.SortFunc(out, func(x, y JobRecord) int { return strings.Compare(x.ID, y.ID) })
	return out
}

// Record returns the record of a job: the one this node holds, or, for a
// job it coordinates, the one it last sent (of a job that ended here and
// was submitted again elsewhere: the later run's, if held).
func (a *Agent) Record(id string) (JobRecord, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	j, r := a.jobs[id], a.records[id]
	if j != nil && (r == nil || r.Run == j.rec.Run) {
		return j.rec.clone(), nil
	}
	if r != nil { // held: the only record, or that of a later run than the job that ended here
		return r.clone(), nil
	}
	return JobRecord{}, fmt.Errorf("%w: %q", ErrNoJob, id)
}

// acceptRecord keeps a job record sent by the job's coordinator (rec is
// valid). A record older than the one held is refused (ErrStaleRecord).
// A node that is not among the holders drops its copy. A newer record of a
// job this node coordinates names another coordinator: this node was
// declared dead and its job taken over, so it stops its own run (fencing).
// A record of another run of the id (a new submission) replaces one of a
// run that ended, here or as a held record, and is refused while the
// other run is in progress here; a holder that keeps it removes the cuts
// of other runs from its store (claimCuts) before it acknowledges.
func (a *Agent) acceptRecord(rec JobRecord) error {
	a.mu.Lock()
	if j, ok := a.jobs[rec.ID]; ok && (j == nil || j.rec.Run == rec.Run || !isClosed(j.done)) {
		switch {
		case j == nil:
			a.mu.Unlock()
			return fmt.Errorf("%w: job %q is being planned or taken over here", ErrStaleRecord, rec.ID)
		case j.rec.Run != rec.Run:
			a.mu.Unlock()
			return fmt.Errorf("%w: job %q: this node coordinates another run of it (%s), not run %s", ErrStaleRecord, rec.ID, j.rec.Run, rec.Run)
		case rec.Coordinator == a.cfg.Name || !rec.supersedes(&j.rec):
			a.mu.Unlock()
			return fmt.Errorf("%w: job %q: this node coordinates it at generation %d revision %d, the record is of generation %d revision %d",
				ErrStaleRecord, rec.ID, j.rec.Generation, j.rec.Revision, rec.Generation, rec.Revision)
		}
		if !j.superseded {
			a.log.Warn("nodes: another node took over a job of this node; stopping it", "job", rec.ID, "coordinator", rec.Coordinator)
			j.superseded = true
			j.cancel()
		}
		j.movedTo = rec.Coordinator
	}
	if old := a.records[rec.ID]; old != nil && old.Run != rec.Run {
		if old.State == RecordRunning {
			a.mu.Unlock()
			return fmt.Errorf("%w: job %q: this node holds another run of it (%s), still running, not run %s", ErrStaleRecord, rec.ID, old.Run, rec.Run)
		}
	} else if old != nil && !rec.supersedes(old) {
		a.mu.Unlock()
		return fmt.Errorf("%w: job %q: held generation %d revision %d, sent generation %d revision %d",
			ErrStaleRecord, rec.ID, old.Generation, old.Revision, rec.Generation, rec.Revision)
	}
	if !slices.Contains(rec.Holders, a.cfg.Name) {
		if old := a.records[rec.ID]; old == nil || old.Run == rec.Run {
			delete(a.records, rec.ID)
		}
		a.mu.Unlock()
		return nil
	}
	r := rec.clone()
	a.records[rec.ID] = &r
	a.pruneRecords()
	a.mu.Unlock()
	if err := a.claimCuts(rec.ID, rec.Run); err != nil {
		return err
	}
	if rec.State == RecordRunning {
		a.considerTakeovers() // its coordinator may be gone already
	}
	return nil
}

// pruneRecords drops the oldest records of ended jobs beyond
// maxFinishedRecords (by id: job ids carry no time). a.mu must be held.
func (a *Agent) pruneRecords() {
	var ended []string
	for id, r := range a.records {
		if r.State != RecordRunning {
			ended = append(ended, id)
		}
	}
	if len(ended) <= maxFinishedRecords {
		return
	}
	slices.Sort(ended)
	for _, id := range ended[:len(ended)-maxFinishedRecords] {
		delete(a.records, id)
	}
}

// considerTakeovers starts a takeover of every running job whose record
// this node holds, whose coordinator is no longer a member, and whose
// successor is this node.
func (a *Agent) considerTakeovers() {
	members := map[string]bool{} // name -> usable as a successor
	for _, m := range a.node.Members() {
		members[m.Name] = m.State == cluster.StateAlive && !m.Leaving && m.MetaErr == nil
	}
	usable := func(name string) bool { return members[name] }
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	for id, r := range a.records {
		if _, present := members[r.Coordinator]; present || r.State != RecordRunning {
			continue
		}
		if s := successor(r, usable); s != a.cfg.Name {
			a.log.Info("nodes: a job's coordinator is gone; another holder takes it over", "job", id, "coordinator", r.Coordinator, "successor", s)
			continue
		}
		if j, ok := a.jobs[id]; ok && (j == nil || !isClosed(j.done) || !j.superseded && j.rec.Run == r.Run) {
			continue // taken over already, or still running here (an earlier run that ended here does not count)
		}
		a.jobs[id] = nil // reserved until the takeover starts the job or gives up
		a.order = slices.DeleteFunc(a.order, func(o string) bool { return o == id })
		a.runs.Add(1)
		go a.takeOver(r.clone())
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// takeOver makes this node the coordinator of the job of rec, whose
// coordinator died: it reads the newest complete, verified cut it can find
// (its own copies, then those of the other holders), plans the job over
// the live nodes with a generation of a new term, and runs it as if it
// had been submitted here. Without any cut the job restarts from step 0.
// The reservation of the job's id in a.jobs and one count of a.runs are
// the caller's, handed over.
func (a *Agent) takeOver(rec JobRecord) {
	t0 := time.Now()
	if a.stillRuns(rec) {
		// Declared failed but alive (a node starved of CPU can miss
		// memberlist's probes): it rejoins by refuting, and a later
		// failure is considered again.
		a.log.Warn("nodes: a job's coordinator was declared failed but still runs the job; not taking it over", "job", rec.ID, "coordinator", rec.Coordinator)
		a.mu.Lock()
		delete(a.jobs, rec.ID)
		a.mu.Unlock()
		a.runs.Done()
		return
	}
	a.log.Warn("nodes: taking over a job whose coordinator is gone", "job", rec.ID, "coordinator", rec.Coordinator)
	ck, meta, source := a.latestCut(rec)
	var step int64
	if ck != nil {
		step = ck.Step
	}
	gen := nextTerm(max(rec.Generation, meta.Generation))
	tk := Takeover{From: rec.Coordinator, To: a.cfg.Name, Step: step, Source: source, Generation: gen, At: t0}
	next := rec.clone()
	next.Coordinator, next.Generation, next.Revision = a.cfg.Name, gen, 1
	next.Takeovers = append(next.Takeovers, tk)
	if n := len(next.Takeovers); n > maxTakeovers {
		next.Takeovers = next.Takeovers[n-maxTakeovers:]
	}
	// The run's cuts go on in this store (its copies are of the run
	// already, unless it had no record of it before).
	err := a.claimCuts(rec.ID, rec.Run)
	var c *actors.Coordinator
	if err == nil {
		c, err = actors.NewCoordinator(rec.Spec, a.coordinatorConfig(ck, gen, true))
	}
	if err != nil {
		a.mu.Lock()
		delete(a.jobs, rec.ID)
		closed := a.closed
		if !closed {
			delete(a.records, rec.ID) // not a holder any more: no second attempt
		}
		a.mu.Unlock()
		a.runs.Done()
		if closed {
			return // a holder still alive takes it over
		}
		a.log.Error("nodes: taking over a job failed", "job", rec.ID, "err", err)
		next.Holders = slices.DeleteFunc(next.Holders, func(h string) bool { return h == a.cfg.Name })
		next.State, next.Error = RecordFailed, fmt.Sprintf("taking the job over on %s: %v", a.cfg.Name, err)
		if len(next.Error) > maxErrorBytes {
			next.Error = next.Error[:maxErrorBytes]
		}
		a.sendRecord(&coordinated{rec: rec}, next, recordTimeout)
		return
	}
	tk.PrepareMS = job.Millis(time.Since(t0))
	next.Takeovers[len(next.Takeovers)-1] = tk
	next.Holders = chooseHolders(slices.DeleteFunc(slices.Clone(rec.Holders), func(h string) bool { return h == a.cfg.Name }),
		peerNames(a.peers()), rec.replicas()-1)
	a.mu.Lock()
	delete(a.records, rec.ID)
	a.mu.Unlock()
	// The record's former holders hear of the new coordinator through
	// sendRecord: launch's job starts with the old holders as j.rec.
	old := rec.clone()
	old.Holders = slices.DeleteFunc(old.Holders, func(h string) bool { return h == a.cfg.Name })
	if err := a.launch(c, old, next, &tk); err != nil {
		return
	}
	a.log.Warn("nodes: took a job over", "job", rec.ID, "from", rec.Coordinator, "step", step, "source", source,
		"generation", gen, "prepare_ms", tk.PrepareMS, "holders", next.Holders)
}

// stillRuns reports whether rec's coordinator answers, at its last known
// HTTP address, that it is running the job.
func (a *Agent) stillRuns(rec JobRecord) bool {
	a.mu.Lock()
	addr := a.httpOf[rec.Coordinator]
	a.mu.Unlock()
	if addr == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(a.ctx, stillRunsTimeout)
	defer cancel()
	st, err := a.client(addr).Job(ctx, rec.ID)
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
func (a *Agent) latestCut(rec JobRecord) (*tensorio.Checkpoint, job.CutMeta, string) {
	var srcs []cutSource
	var skipped []string
	if a.store != nil {
		steps, err := a.store.Steps(rec.ID)
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("own store: %v", err))
		}
		if len(steps) > 0 && a.cutsRun(rec.ID) != rec.Run {
			a.log.Warn("nodes: skipping the cuts of another run of the job", "job", rec.ID, "run", rec.Run, "steps", steps, "node", a.cfg.Name)
			skipped = append(skipped, fmt.Sprintf("steps %v on %s (another run)", steps, a.cfg.Name))
			steps = nil
		}
		for _, st := range steps {
			srcs = append(srcs, cutSource{node: a.cfg.Name, step: st})
		}
	}
	addrs := a.memberHTTP()
	for _, h := range rec.Holders {
		addr, ok := addrs[h]
		if h == a.cfg.Name || !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(a.ctx, recordTimeout)
		list, err := a.client(addr).Cuts(ctx, rec.ID)
		cancel()
		if err != nil {
			a.log.Warn("nodes: asking a holder for its cuts", "job", rec.ID, "holder", h, "err", err)
			continue
		}
		if len(list.Steps) > 0 && list.Run != rec.Run {
			a.log.Warn("nodes: skipping the cuts of another run of the job", "job", rec.ID, "run", rec.Run, "steps", list.Steps, "node", h, "their_run", list.Run)
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
	for _, s := range srcs {
		ck, meta, err := a.readCut(rec.ID, rec.Run, s)
		if errors.Is(err, errOtherRun) {
			a.log.Warn("nodes: skipping a cut of another run of the job", "job", rec.ID, "step", s.step, "node", s.node, "err", err)
			skipped = append(skipped, fmt.Sprintf("step %d on %s (another run)", s.step, s.node))
			continue
		}
		if err != nil {
			a.log.Warn("nodes: skipping a damaged or unreadable cut", "job", rec.ID, "step", s.step, "node", s.node, "err", err)
			skipped = append(skipped, fmt.Sprintf("step %d on %s", s.step, s.node))
			continue
		}
		where := "this node's store"
		if s.http != "" {
			where = "the replica on " + s.node
			if a.store != nil {
				err := a.claimCuts(rec.ID, rec.Run)
				if err == nil {
					_, err = a.store.Save(ck)
				}
				if err != nil {
					a.log.Warn("nodes: keeping a fetched cut", "job", rec.ID, "step", s.step, "err", err)
				}
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

// errOtherRun is readCut's error for a copy stamped with another run.
var errOtherRun = errors.New("a cut of another run")

// readCut reads and verifies one copy of a cut of run run of job id, and
// its metadata. A copy without a run is taken as the run's: its source
// vouched for it (latestCut).
func (a *Agent) readCut(id, run string, s cutSource) (*tensorio.Checkpoint, job.CutMeta, error) {
	var ck *tensorio.Checkpoint
	if s.http == "" {
		var err error
		if ck, err = a.store.Load(id, s.step); err != nil {
			return nil, job.CutMeta{}, err
		}
	} else {
		ctx, cancel := context.WithTimeout(a.ctx, fetchTimeout)
		defer cancel()
		b, err := a.client(s.http).Cut(ctx, id, s.step, MaxCheckpointBytes)
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
