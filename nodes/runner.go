package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// runner runs the jobs this node coordinates, the coordinator's side of
// failover: it plans a submitted job, launches it, replicates its cuts
// and its record to the holders (it is the coordinators'
// actors.Replicator), and tells them how the job ended. Its state is the
// jobs table's; it has no lock of its own.
type runner struct {
	self    string
	log     *slog.Logger
	ctx     context.Context // the agent's: cancelled when it stops, which ends the jobs
	jobs    *jobs
	members *members
	cuts    *cuts
	// files, if set, is the directory a job's files must be in
	// (Config.Files).
	files *job.Files
	// base is what every coordinator of this node shares (control and
	// data plane, store, speed, threads, links).
	base actors.CoordinatorConfig
}

// config configures a coordinator of this node; resume, gen and takeover
// are CoordinatorConfig's Resume, Generation and Takeover (a takeover's).
func (r *runner) config(resume *tensorio.Checkpoint, gen uint64, takeover bool) actors.CoordinatorConfig {
	c := r.base
	c.Nodes, c.Replicas = r.members.usable(), r
	c.Resume, c.Generation, c.Takeover = resume, gen, takeover
	return c
}

// confine refuses a spec naming a file outside the node's files
// directory, before anything reads it.
func (r *runner) confine(spec job.Spec) error {
	if r.files == nil {
		return nil
	}
	return r.files.Check(spec)
}

// submit is [Agent.Submit].
func (r *runner) submit(spec job.Spec) (*actors.Coordinator, error) {
	id, err := r.jobs.reserve(spec.ID)
	if err != nil {
		return nil, err
	}
	spec.ID = id
	// The spec is checked here, once, where it enters the cluster; then
	// the job against the members' memory, from shapes alone: the
	// coordinator then checks its own share against this node's memory
	// before it builds the model.
	err = r.confine(spec)
	var cs job.Checked
	if err == nil {
		cs, err = job.Check(spec)
	}
	if err == nil {
		err = cs.CheckMemory(r.members.usable())
	}
	var c *actors.Coordinator
	if err == nil {
		c, err = actors.NewCoordinator(cs.ReadingFrom(r.files), r.config(nil, 0, false))
	}
	run := newRun()
	if err == nil {
		// A new run: cuts of this id left in the store by an earlier run
		// must neither be taken for this run's nor outrank them.
		err = r.cuts.claim(spec.ID, run)
	}
	if err != nil {
		r.jobs.release(spec.ID)
		return nil, err
	}
	rec := JobRecord{ID: spec.ID, Run: run, Spec: c.Spec(), Coordinator: r.self, Generation: 1, Revision: 1, State: RecordRunning}
	rec.Holders = chooseHolders(nil, peerNames(r.members.peers()), rec.replicas()-1)
	if err := r.launch(c, rec, rec, nil); err != nil {
		return nil, err
	}
	return c, nil
}

// launch starts a planned job whose id is reserved in the jobs table: it
// sends the record rec to the holders (and to those of prev, the record
// they knew before, if they are no longer holders) and runs the job in
// the background. It releases the reservation if the node is closing.
func (r *runner) launch(c *actors.Coordinator, prev, rec JobRecord, takeover *Takeover) error {
	id := rec.ID
	ctx, cancel := context.WithCancel(r.ctx)
	j := &coordinated{c: c, cancel: cancel, done: make(chan struct{}), rec: prev.clone(), takeover: takeover}
	if err := r.jobs.start(id, j); err != nil {
		cancel()
		return err
	}
	c.Members(r.members.usable()) // the members may have changed while it was planned
	r.log.Info("nodes: job planned", "job", id, "plan", c.Describe(), "holders", rec.Holders)
	r.sendRecord(j, rec, recordTimeout)
	go func() {
		defer r.jobs.runEnded()
		defer r.jobs.retire() // after done is closed: this job counts as ended
		defer close(j.done)
		defer cancel()
		res, err := c.Run(ctx)
		if err != nil {
			r.log.Warn("nodes: job failed", "job", id, "err", err)
		} else {
			r.log.Info("nodes: job done", "job", id, "seconds", res.Seconds, "weights_sha256", res.WeightsSHA256)
		}
		r.finish(j, res, err)
	}()
	return nil
}

// replan is [Agent.Replan].
func (r *runner) replan(id string, req ReplanRequest) error {
	j := r.jobs.get(id)
	if j == nil {
		return fmt.Errorf("%w: %q", ErrNoJob, id)
	}
	var names []string
	for _, n := range r.members.usable() {
		names = append(names, n.Name)
	}
	return j.c.RequestReplan(req.Partition, req.ViaCut, names)
}

// Replicate makes the runner the actors.Replicator of this node's
// coordinators: it sends a cut of a job this node coordinates, stamped
// with the job's run (job.CutMeta.Run), to Spec.Replicas-1 other nodes
// (the current holders while they can take it, then the others by name),
// then the job's record with the holders that acknowledged the cut and the
// cut's plan generation. It fails unless as many holders acknowledged as
// the cluster has nodes to hold copies (with fewer such nodes than asked,
// every one of them).
func (r *runner) Replicate(ck *tensorio.Checkpoint) error {
	j, rec := r.jobs.recordOf(ck.JobID)
	if j == nil {
		return fmt.Errorf("nodes: replicating a cut of job %q, which this node does not coordinate", ck.JobID)
	}
	want := rec.replicas() - 1
	peers := r.members.peers()
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
	sum, err := cutDigest(ck, rec.Run)
	if err != nil {
		return fmt.Errorf("nodes: step %d of %s: %w", ck.Step, ck.JobID, err)
	}
	var holders []string
	var errs []error
	for _, name := range order {
		if len(holders) == want {
			break
		}
		if !slices.Contains(rec.Holders, name) {
			// A node takes cuts only of a job whose record it holds: it
			// gets one naming it before its first cut.
			if err := r.enlist(rec, holders, name, byName[name]); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
		}
		// Encoded as it is sent: a cut is hundreds of MB.
		ctx, cancel := context.WithTimeout(r.ctx, fetchTimeout)
		err := r.members.client(byName[name]).PutCut(ctx, ck.JobID, func(w io.Writer) error { return tensorio.WriteCheckpoint(w, sck) })
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue // the next node by name takes its place
		}
		holders = append(holders, name)
	}
	if err := r.ctx.Err(); err != nil {
		// This node is shutting down: the PUTs failed for that, not for
		// the holders. A record without them would make them drop theirs
		// and no one would take the job over.
		return fmt.Errorf("nodes: step %d of %s not replicated: the node is shutting down", ck.Step, ck.JobID)
	}
	rec.Generation = max(rec.Generation, meta.Generation)
	rec.Holders = holders
	rec.Revision++
	rec.addCut(ck.Step, sum)
	failed := r.sendRecord(j, rec, recordTimeout)
	if len(holders) < min(want, len(order)) {
		return fmt.Errorf("nodes: step %d of %s has %d of %d replicas: %w", ck.Step, ck.JobID, len(holders), want, errors.Join(errs...))
	}
	if len(failed) > 0 {
		return fmt.Errorf("nodes: the record of %s did not reach %v", ck.JobID, failed)
	}
	if len(holders) < want && !j.warnedFew {
		j.warnedFew = true
		r.log.Warn("nodes: fewer nodes can hold copies than the job asks", "job", ck.JobID, "replicas", rec.replicas(), "holders", holders)
	}
	return nil
}

// enlist sends the node name, at addr, which is not among the holders of
// rec, a record of the next revision that names it as a holder besides
// those that took the cut being replicated: a node takes cuts only of a
// job whose record it holds. The record with the cut follows.
func (r *runner) enlist(rec JobRecord, took []string, name, addr string) error {
	next := rec.clone()
	next.Holders = append(slices.Clone(took), name)
	next.Revision++
	ctx, cancel := context.WithTimeout(r.ctx, recordTimeout)
	defer cancel()
	return r.members.client(addr).PutRecord(ctx, next)
}

// sendRecord makes rec the record of job j and sends it to rec's holders,
// to former holders (who then drop their copy), and to the job's former
// coordinators if they are alive again (which makes them stop theirs: see
// jobs.hold). It returns the holders that did not acknowledge it.
// Calls for one job must not overlap.
func (r *runner) sendRecord(j *coordinated, rec JobRecord, timeout time.Duration) (failed []string) {
	prev := r.jobs.setRecord(j, rec)
	targets := slices.Clone(rec.Holders)
	for _, h := range append(slices.Clone(prev), j.dropped...) {
		if !slices.Contains(rec.Holders, h) && !slices.Contains(targets, h) {
			targets = append(targets, h)
		}
	}
	j.dropped = nil
	for _, t := range rec.Takeovers {
		if t.From != r.self && !slices.Contains(targets, t.From) {
			targets = append(targets, t.From)
		}
	}
	if _, err := json.Marshal(rec); err != nil { // a result that JSON cannot carry
		r.log.Error("nodes: encoding a job record", "job", rec.ID, "err", err)
		return rec.Holders
	}
	addrs := r.members.httpAddrs()
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
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), timeout)
			defer cancel()
			err := r.members.client(addr).PutRecord(ctx, rec)
			if err != nil && holder {
				r.log.Warn("nodes: sending a job record", "job", rec.ID, "to", name, "err", err)
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
func (r *runner) finish(j *coordinated, res *job.Result, runErr error) {
	rec, superseded := r.jobs.lastRecord(j)
	if superseded || r.ctx.Err() != nil {
		return
	}
	rec.Revision++
	if runErr != nil {
		rec.State, rec.Error = RecordFailed, runErr.Error()
		if len(rec.Error) > maxErrorBytes {
			rec.Error = rec.Error[:maxErrorBytes]
		}
	} else {
		res := *res
		finiteResult(&res)
		rec.State, rec.Result = RecordDone, &res
	}
	if failed := r.sendRecord(j, rec, recordTimeout); len(failed) > 0 {
		r.log.Warn("nodes: the end of a job is not known to all its holders", "job", rec.ID, "missing", failed)
	}
}
