package nodes

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// The local store keeps the cuts of one run per job id. Job ids may be
// chosen by the user and reused, and a data dir outlives the node's
// process, so the store may hold cuts of an earlier run of the same id:
// resuming from them would silently train from another run's weights, and
// the store's keep-last-N could prune the current run's cuts in favour of
// the earlier run's higher steps. So before a cut of run R of job J is
// written here (this node coordinates R, or holds copies of it), the store
// is claimed for R: the cuts of J it holds for any other run (or for a run
// this process does not know, from before it started) are removed. The
// store's run of each job is kept in memory (cutRuns); a successor resumes
// from this node's copies only if they are of its record's run, and from
// another holder's only if its CutList says so. The coordinator's own
// copies are written by actors.Coordinator without a run (the claim
// vouches for them); the replicas carry it (job.CutMeta.Run), and a
// stamped copy of another run is refused wherever it is found.

// claimCuts makes run the run of job id's cuts in the local store,
// removing the cuts of any other run of id first. Without a store it does
// nothing.
func (a *Agent) claimCuts(id, run string) error {
	if a.store == nil {
		return nil
	}
	if err := checkID(id); err != nil {
		return err
	}
	a.cutMu.Lock()
	defer a.cutMu.Unlock()
	if a.cutRuns[id] == run {
		return nil
	}
	steps, err := a.store.Steps(id)
	if err != nil {
		return fmt.Errorf("nodes: listing the cuts of job %q: %w", id, err)
	}
	if err := os.RemoveAll(filepath.Join(a.store.Dir(), id)); err != nil {
		return fmt.Errorf("nodes: removing the cuts of an earlier run of job %q: %w", id, err)
	}
	if len(steps) > 0 {
		old := a.cutRuns[id]
		if old == "" {
			old = "unknown (written before this node started)"
		}
		a.log.Info("nodes: removed the cuts of an earlier run of the job", "job", id, "steps", steps, "run", old, "new_run", run)
	}
	a.cutRuns[id] = run
	return nil
}

// cutsRun is the run of job id's cuts in the local store ("": unknown).
func (a *Agent) cutsRun(id string) string {
	a.cutMu.Lock()
	defer a.cutMu.Unlock()
	return a.cutRuns[id]
}

// runInUse returns an ErrStaleRecord error if run of job id cannot be
// kept here because another run of that id is in progress on this node:
// one it coordinates, is planning or taking over, or holds the running
// record of.
func (a *Agent) runInUse(id, run string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if j, ok := a.jobs[id]; ok {
		if j == nil {
			return fmt.Errorf("%w: job %q is being planned or taken over here", ErrStaleRecord, id)
		}
		if j.rec.Run != run && !isClosed(j.done) {
			return fmt.Errorf("%w: job %q: this node coordinates another run of it (%s), not run %s", ErrStaleRecord, id, j.rec.Run, run)
		}
	}
	if r := a.records[id]; r != nil && r.Run != run && r.State == RecordRunning {
		return fmt.Errorf("%w: job %q: this node holds another run of it (%s), still running, not run %s", ErrStaleRecord, id, r.Run, run)
	}
	return nil
}

// stamped returns a shallow copy of ck whose metadata is meta (ck's)
// with run.
func stamped(ck *tensorio.Checkpoint, meta job.CutMeta, run string) *tensorio.Checkpoint {
	c := *ck
	meta.Run = run
	c.Meta = meta.Encode()
	return &c
}

// replicaRun is the run a replica's metadata names (required).
func replicaRun(ck *tensorio.Checkpoint) (string, error) {
	meta, err := job.ParseCutMeta(ck.Meta)
	if err != nil {
		return "", err
	}
	if err := checkRun(meta.Run); err != nil {
		return "", fmt.Errorf("cut metadata: %w", err)
	}
	return meta.Run, nil
}
