package nodes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// Errors of [Agent.Submit].
var (
	ErrClosed  = errors.New("nodes: node is shutting down")
	ErrJobID   = errors.New("nodes: job id in use")
	ErrBadID   = errors.New("nodes: bad job id")
	ErrNoJob   = errors.New("nodes: no such job")
	maxIDBytes = 64
)

func checkID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrBadID)
	}
	if len(id) > maxIDBytes {
		return fmt.Errorf("%w: longer than %d bytes", ErrBadID, maxIDBytes)
	}
	for _, r := range id {
		// The checkpoint store's rule: the id names a directory.
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("%w: %q (use letters, digits, '-' and '_')", ErrBadID, id)
		}
	}
	return nil
}

// jobs is the table of the jobs this node knows: those it coordinates
// (submitted here or taken over, see runner) and the records it holds of
// jobs coordinated elsewhere (see failover). Both are under one lock
// because they share the job ids: an id is reserved, fenced, or handed
// from a held record to a job coordinated here in one step. The table
// does no I/O; its lock is held around no other part's (only around the
// coordinators' Status and Meter, and cancelling a fenced job).
type jobs struct {
	self string
	log  *slog.Logger

	mu     sync.Mutex              // guards what follows and every coordinated's rec, superseded and movedTo
	closed bool                    // the node is stopping: no id is reserved any more
	seq    int                     // numbers the ids given to submissions without one
	coord  map[string]*coordinated // the jobs coordinated here, by id
	order  []string                // ids of coord in submission order
	// held are the records of jobs coordinated elsewhere that this node
	// holds.
	held map[string]*JobRecord

	// keepWeights and keepJobs bound the done jobs whose final weights
	// stay in memory and the ended jobs kept at all (keptWeights,
	// keptEndedJobs; set before the first job).
	keepWeights, keepJobs int

	// forget, if set (before the first job), is told of each run of a job
	// the table no longer knows at all, neither coordinated nor held,
	// outside the lock: the node drops that run's cuts. forgotten are
	// those not told yet.
	forget    func(id, run string)
	forgotten []jobRun

	// runs counts the reservations in coord and the jobs' Run goroutines;
	// added to under mu, after closed is checked, so that Wait is safe.
	runs sync.WaitGroup
}

// coordinated is a job this node coordinates; nil in jobs.coord while its
// id is reserved for a submission or a takeover being planned.
type coordinated struct {
	c      *actors.Coordinator
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned

	// rec is the job's record as last sent to its holders (guarded by
	// jobs.mu); takeover is how this node got the job (nil: submitted
	// here); superseded is set when a newer coordinator took it over
	// (guarded by jobs.mu).
	rec        JobRecord
	takeover   *Takeover
	superseded bool
	movedTo    string // the coordinator that superseded this node
	// dropped are former holders not yet told that they no longer hold
	// the job; warnedFew is set once a lack of holders was logged (both
	// used by the persisting goroutine and, after it, Run's).
	dropped   []string
	warnedFew bool
}

func newJobs(self string, log *slog.Logger) *jobs {
	return &jobs{self: self, log: log, coord: map[string]*coordinated{}, held: map[string]*JobRecord{},
		keepWeights: keptWeights, keepJobs: keptEndedJobs}
}

// reserve reserves id for a submission, an empty id for a new unique one,
// which it returns; the id must be neither coordinated nor held here. It
// counts the reservation in runs: release or start it.
func (t *jobs) reserve(id string) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", ErrClosed
	}
	if id == "" {
		t.seq++
		id = fmt.Sprintf("%s-%d-%s", t.self, t.seq, strconv.FormatInt(time.Now().UnixMilli()%(1<<30), 36))
	} else if err := checkID(id); err != nil {
		return "", err
	}
	_, coordinated := t.coord[id]
	if _, held := t.held[id]; coordinated || held {
		return "", fmt.Errorf("%w: %q", ErrJobID, id)
	}
	t.coord[id] = nil
	t.runs.Add(1)
	return id, nil
}

// release gives up the reservation of id.
func (t *jobs) release(id string) {
	t.mu.Lock()
	delete(t.coord, id)
	t.mu.Unlock()
	t.runs.Done()
}

// start makes j the job of the reserved id, unless the node is stopping:
// then it releases the reservation and returns ErrClosed. Once j's Run
// returned, call runEnded.
func (t *jobs) start(id string, j *coordinated) error {
	t.mu.Lock()
	if t.closed {
		delete(t.coord, id)
		t.mu.Unlock()
		t.runs.Done()
		return ErrClosed
	}
	t.coord[id] = j
	t.order = append(t.order, id)
	t.mu.Unlock()
	return nil
}

// runEnded counts a started job's Run as returned.
func (t *jobs) runEnded() { t.runs.Done() }

// A node keeps the final weights of its keptWeights newest done jobs in
// memory to serve them (older ones are in their last cuts: `ppnode ckpt
// export`), and the statuses of its keptEndedJobs newest ended jobs; it
// forgets older ones and their cuts, as it does the records it holds
// (maxFinishedRecords), and their ids may be used again.
const (
	keptWeights   = 8
	keptEndedJobs = 256
)

// retire applies keepWeights and keepJobs to the ended jobs coordinated
// here, once a job has ended.
func (t *jobs) retire() {
	t.mu.Lock()
	var ended []string
	for _, id := range slices.Backward(t.order) {
		if j := t.coord[id]; j != nil && isClosed(j.done) {
			ended = append(ended, id)
		}
	}
	var kept []*actors.Coordinator
	for _, id := range ended[:min(len(ended), t.keepJobs)] {
		if c := t.coord[id].c; c != nil {
			kept = append(kept, c)
		}
	}
	if len(ended) > t.keepJobs {
		gone := ended[t.keepJobs:]
		for _, id := range gone {
			if t.held[id] == nil {
				t.forgotten = append(t.forgotten, jobRun{id, t.coord[id].rec.Run})
			}
			delete(t.coord, id)
		}
		t.order = slices.DeleteFunc(t.order, func(id string) bool { return slices.Contains(gone, id) })
	}
	t.mu.Unlock()
	done := 0
	for _, c := range kept {
		if c.Status().State == job.StateDone {
			if done++; done > t.keepWeights {
				c.ReleaseWeights()
			}
		}
	}
	t.tellForgotten()
}

// close refuses every reservation from now on.
func (t *jobs) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}

// awaitRuns waits up to d for the reservations to be released and the
// jobs' runs to return; false if some did not.
func (t *jobs) awaitRuns(d time.Duration) bool {
	ended := make(chan struct{})
	go func() {
		t.runs.Wait()
		close(ended)
	}()
	grace := time.NewTimer(d)
	defer grace.Stop()
	select {
	case <-ended:
		return true
	case <-grace.C:
		return false
	}
}

// get returns the job id coordinated here, or nil.
func (t *jobs) get(id string) *coordinated {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.coord[id]
}

// running are the jobs this node coordinates whose coordinator exists.
func (t *jobs) running() []*coordinated {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*coordinated
	for _, j := range t.coord {
		if j != nil {
			out = append(out, j)
		}
	}
	return out
}

// JobStatus is a job as the node that coordinates it reports it: the
// coordinator's progress, and where the job's copies are.
type JobStatus struct {
	job.Status
	// Coordinator is this node; Holders are the nodes that keep the job's
	// record and a copy of its cuts.
	Coordinator string   `json:"coordinator"`
	Holders     []string `json:"holders"`
	Replicas    int      `json:"replicas"`
	// Takeover, if set, is how this node took the job over from a dead
	// coordinator.
	Takeover *Takeover `json:"takeover,omitempty"`
	// MovedTo, if set, is the node that took the job over from this one
	// (this node had been declared dead): follow the job there.
	MovedTo string `json:"moved_to,omitempty"`
}

// statusLocked returns j's status; t.mu must be held.
func (t *jobs) statusLocked(j *coordinated) JobStatus {
	st := JobStatus{Status: j.c.Status(), Coordinator: t.self, Holders: slices.Clone(j.rec.Holders), Replicas: j.rec.replicas(),
		MovedTo: j.movedTo}
	if j.takeover != nil {
		tk := *j.takeover
		st.Takeover = &tk
	}
	return st
}

// status returns the status of job id coordinated here.
func (t *jobs) status(id string) (JobStatus, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.coord[id]
	if j == nil {
		return JobStatus{}, fmt.Errorf("%w: %q", ErrNoJob, id)
	}
	return t.statusLocked(j), nil
}

// statuses returns the status of the jobs coordinated here, oldest first.
func (t *jobs) statuses() []JobStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]JobStatus, 0, len(t.order))
	for _, id := range t.order {
		if j := t.coord[id]; j != nil {
			out = append(out, t.statusLocked(j))
		}
	}
	return out
}

// wait waits until job id coordinated here has ended or ctx is done, and
// returns its status.
func (t *jobs) wait(ctx context.Context, id string) (JobStatus, error) {
	j := t.get(id)
	if j == nil {
		return JobStatus{}, fmt.Errorf("%w: %q", ErrNoJob, id)
	}
	var err error
	select {
	case <-j.done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.statusLocked(j), err
}

// cancel asks job id coordinated here to stop.
func (t *jobs) cancel(id string) error {
	j := t.get(id)
	if j == nil {
		return fmt.Errorf("%w: %q", ErrNoJob, id)
	}
	j.cancel()
	return nil
}

// meters are the counters of the jobs coordinated here, by id.
func (t *jobs) meters() map[string]actors.JobMeter {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]actors.JobMeter{}
	for id, j := range t.coord {
		if j != nil {
			out[id] = j.c.Meter()
		}
	}
	return out
}

// weights returns the final weights and their metadata of job id,
// coordinated and done here.
func (t *jobs) weights(id string) ([]tensorio.Entry, map[string]string, error) {
	j := t.get(id)
	if j == nil || j.c == nil {
		return nil, nil, fmt.Errorf("%w: %q", ErrNoJob, id)
	}
	es, meta, err := j.c.Weights()
	if errors.Is(err, actors.ErrWeightsReleased) {
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errNoWeights, err)
	}
	return es, meta, nil
}

// recordOf returns job id coordinated here (nil: none) and a copy of its
// record.
func (t *jobs) recordOf(id string) (*coordinated, JobRecord) {
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.coord[id]
	if j == nil {
		return nil, JobRecord{}
	}
	return j, j.rec.clone()
}

// setRecord makes rec the record of job j, unless another coordinator
// took j over, and returns the holders of the record it had.
func (t *jobs) setRecord(j *coordinated, rec JobRecord) (prevHolders []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	prev := j.rec.Holders
	if !j.superseded {
		j.rec = rec.clone()
	}
	return prev
}

// lastRecord returns a copy of job j's record, and whether another
// coordinator took j over.
func (t *jobs) lastRecord(j *coordinated) (JobRecord, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return j.rec.clone(), j.superseded
}

// records returns the records held for jobs coordinated elsewhere, by job
// id.
func (t *jobs) records() []JobRecord {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]JobRecord, 0, len(t.held))
	for _, r := range t.held {
		out = append(out, r.clone())
	}
	slices.SortFunc(out, func(x, y JobRecord) int { return strings.Compare(x.ID, y.ID) })
	return out
}

// record returns the record of a job: the one held, or, for a job
// coordinated here, the one last sent (of a job that ended here and was
// submitted again elsewhere: the later run's, if held).
func (t *jobs) record(id string) (JobRecord, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	j, r := t.coord[id], t.held[id]
	if j != nil && (r == nil || r.Run == j.rec.Run) {
		return j.rec.clone(), nil
	}
	if r != nil { // held: the only record, or that of a later run than the job that ended here
		return r.clone(), nil
	}
	return JobRecord{}, fmt.Errorf("%w: %q", ErrNoJob, id)
}

// heldRecord returns a copy of the record of job id held here; ok is
// false without one.
func (t *jobs) heldRecord(id string) (rec JobRecord, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.held[id]; r != nil {
		return r.clone(), true
	}
	return JobRecord{}, false
}

// hold keeps a valid job record sent by the job's coordinator, if this
// node is among its holders (kept), and drops the one held otherwise (see
// failover.accept). A newer record of a job coordinated here that names
// another coordinator fences the job: it is cancelled.
//
// members are the gossip members (see members.successors): a record is
// taken only from a member, and one that names a new coordinator of the
// run only from its rightful successor (see rightful).
func (t *jobs) hold(rec JobRecord, members map[string]bool) (kept bool, err error) {
	defer t.tellForgotten()
	t.mu.Lock()
	defer t.mu.Unlock()
	if j, ok := t.coord[rec.ID]; ok && (j == nil || j.rec.Run == rec.Run || !isClosed(j.done)) {
		switch {
		case j == nil:
			return false, fmt.Errorf("%w: job %q is being planned or taken over here", ErrStaleRecord, rec.ID)
		case j.rec.Run != rec.Run:
			return false, fmt.Errorf("%w: job %q: this node coordinates another run of it (%s), not run %s", ErrStaleRecord, rec.ID, j.rec.Run, rec.Run)
		case rec.Coordinator == t.self || !rec.supersedes(&j.rec):
			return false, fmt.Errorf("%w: job %q: this node coordinates it at generation %d revision %d, the record is of generation %d revision %d",
				ErrStaleRecord, rec.ID, j.rec.Generation, j.rec.Revision, rec.Generation, rec.Revision)
		}
		if err := rightful(&j.rec, &rec, t.self, members); err != nil {
			return false, err
		}
		if !j.superseded {
			t.log.Warn("nodes: another node took over a job of this node; stopping it", "job", rec.ID, "coordinator", rec.Coordinator)
			j.superseded = true
			j.cancel()
		}
		j.movedTo = rec.Coordinator
	}
	if old := t.held[rec.ID]; old != nil && old.Run != rec.Run {
		if old.State == RecordRunning {
			return false, fmt.Errorf("%w: job %q: this node holds another run of it (%s), still running, not run %s", ErrStaleRecord, rec.ID, old.Run, rec.Run)
		}
	} else if old != nil && !rec.supersedes(old) {
		return false, fmt.Errorf("%w: job %q: held generation %d revision %d, sent generation %d revision %d",
			ErrStaleRecord, rec.ID, old.Generation, old.Revision, rec.Generation, rec.Revision)
	}
	if old := t.held[rec.ID]; old == nil || old.Run != rec.Run {
		err = rightful(nil, &rec, t.self, members)
	} else {
		err = rightful(old, &rec, t.self, members)
	}
	if err != nil {
		return false, err
	}
	if !slices.Contains(rec.Holders, t.self) {
		if old := t.held[rec.ID]; old == nil || old.Run == rec.Run {
			delete(t.held, rec.ID)
			if _, ok := t.coord[rec.ID]; !ok {
				t.forgotten = append(t.forgotten, jobRun{rec.ID, rec.Run}) // its copies of the cuts too
			}
		}
		return false, nil
	}
	r := rec.clone()
	t.held[rec.ID] = &r
	t.pruneLocked()
	return true, nil
}

// pruneLocked drops the oldest records of ended jobs beyond
// maxFinishedRecords (by id: job ids carry no time); t.mu must be held.
func (t *jobs) pruneLocked() {
	var ended []string
	for id, r := range t.held {
		if r.State != RecordRunning {
			ended = append(ended, id)
		}
	}
	if len(ended) <= maxFinishedRecords {
		return
	}
	slices.Sort(ended)
	for _, id := range ended[:len(ended)-maxFinishedRecords] {
		if _, ok := t.coord[id]; !ok {
			t.forgotten = append(t.forgotten, jobRun{id, t.held[id].Run})
		}
		delete(t.held, id)
	}
}

// jobRun is a run of a job.
type jobRun struct{ id, run string }

// tellForgotten tells forget of the runs forgotten since it last did; t.mu
// must not be held.
func (t *jobs) tellForgotten() {
	t.mu.Lock()
	gone := t.forgotten
	t.forgotten = nil
	t.mu.Unlock()
	if t.forget != nil {
		for _, g := range gone {
			t.forget(g.id, g.run)
		}
	}
}

// runInUse returns an ErrStaleRecord error if run of job id cannot be
// kept here because another run of that id is in progress on this node:
// one it coordinates, is planning or taking over, or holds the running
// record of.
func (t *jobs) runInUse(id, run string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if j, ok := t.coord[id]; ok {
		if j == nil {
			return fmt.Errorf("%w: job %q is being planned or taken over here", ErrStaleRecord, id)
		}
		if j.rec.Run != run && !isClosed(j.done) {
			return fmt.Errorf("%w: job %q: this node coordinates another run of it (%s), not run %s", ErrStaleRecord, id, j.rec.Run, run)
		}
	}
	if r := t.held[id]; r != nil && r.Run != run && r.State == RecordRunning {
		return fmt.Errorf("%w: job %q: this node holds another run of it (%s), still running, not run %s", ErrStaleRecord, id, r.Run, run)
	}
	return nil
}

// due reserves and returns the held records of the running jobs this
// node is to take over: their coordinator is not a member, and this node
// is the successor among the members usable says may take jobs over (see
// successor). Each reservation is counted in runs: takeOver starts or
// abandons it.
func (t *jobs) due(usable map[string]bool) []JobRecord {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	var out []JobRecord
	for id, r := range t.held {
		if _, present := usable[r.Coordinator]; present || r.State != RecordRunning {
			continue
		}
		if s := successor(r, func(name string) bool { return usable[name] }); s != t.self {
			t.log.Info("nodes: a job's coordinator is gone; another holder takes it over", "job", id, "coordinator", r.Coordinator, "successor", s)
			continue
		}
		if j, ok := t.coord[id]; ok && (j == nil || !isClosed(j.done) || !j.superseded && j.rec.Run == r.Run) {
			continue // taken over already, or still running here (an earlier run that ended here does not count)
		}
		t.coord[id] = nil // reserved until the takeover starts the job or gives up
		t.order = slices.DeleteFunc(t.order, func(o string) bool { return o == id })
		t.runs.Add(1)
		out = append(out, r.clone())
	}
	return out
}

// unhold drops the held record of job id (its takeover is starting it
// here).
func (t *jobs) unhold(id string) {
	t.mu.Lock()
	delete(t.held, id)
	t.mu.Unlock()
}

// abandon gives up the reservation of a takeover of job id that failed,
// and the record held, unless the node is stopping (closing: a holder
// still alive takes the job over).
func (t *jobs) abandon(id string) (closing bool) {
	t.mu.Lock()
	delete(t.coord, id)
	closing = t.closed
	if !closing {
		delete(t.held, id) // not a holder any more: no second attempt
	}
	t.mu.Unlock()
	t.runs.Done()
	return closing
}

// keepEnded keeps rec, the record of a job that ended here without
// another holder to tell (a takeover that gave up), so that a client
// looking for the job finds how it ended.
func (t *jobs) keepEnded(rec JobRecord) {
	defer t.tellForgotten()
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.held[rec.ID]; !ok && !t.closed {
		r := rec.clone()
		t.held[rec.ID] = &r
		t.pruneLocked()
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
