package nodes

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

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
// store's run of each job is kept in memory (cuts.runs); a successor resumes
// from this node's copies only if they are of its record's run, and from
// another holder's only if its CutList says so. The coordinator's own
// copies are written by actors.Coordinator without a run (the claim
// vouches for them); the replicas carry it (job.CutMeta.Run), and a
// stamped copy of another run is refused wherever it is found.

// cuts are the cuts in the local checkpoint store and the run each job's
// cuts are of.
type cuts struct {
	store *tensorio.Store // nil without a data dir
	log   *slog.Logger

	mu   sync.Mutex // guards runs
	runs map[string]string
}

func newCuts(store *tensorio.Store, log *slog.Logger) *cuts {
	return &cuts{store: store, log: log, runs: map[string]string{}}
}

// claim makes run the run of job id's cuts in the local store, removing
// the cuts of any other run of id first. Without a store it does nothing.
func (cs *cuts) claim(id, run string) error {
	if cs.store == nil {
		return nil
	}
	if err := checkID(id); err != nil {
		return err
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.runs[id] == run {
		return nil
	}
	steps, err := cs.store.Steps(id)
	if err != nil {
		return fmt.Errorf("nodes: listing the cuts of job %q: %w", id, err)
	}
	if err := os.RemoveAll(filepath.Join(cs.store.Dir(), id)); err != nil {
		return fmt.Errorf("nodes: removing the cuts of an earlier run of job %q: %w", id, err)
	}
	if len(steps) > 0 {
		old := cs.runs[id]
		if old == "" {
			old = "unknown (written before this node started)"
		}
		cs.log.Info("nodes: removed the cuts of an earlier run of the job", "job", id, "steps", steps, "run", old, "new_run", run)
	}
	cs.runs[id] = run
	return nil
}

// drop removes the cuts of run of job id, a job the node no longer knows
// (jobs.forget); the cuts of another run, or of a run it does not know,
// stay.
func (cs *cuts) drop(id, run string) {
	if cs.store == nil || checkID(id) != nil {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if run == "" || cs.runs[id] != run {
		return
	}
	delete(cs.runs, id)
	if err := os.RemoveAll(filepath.Join(cs.store.Dir(), id)); err != nil {
		cs.log.Warn("nodes: removing the cuts of a job this node no longer keeps", "job", id, "run", run, "err", err)
		return
	}
	cs.log.Info("nodes: removed the cuts of a job this node no longer keeps", "job", id, "run", run)
}

// run is the run of job id's cuts in the local store ("": unknown).
func (cs *cuts) run(id string) string {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.runs[id]
}

// keep saves ck, a cut of run fetched from elsewhere, in the local store
// (if there is one), claimed for run.
func (cs *cuts) keep(ck *tensorio.Checkpoint, run string) error {
	if cs.store == nil {
		return nil
	}
	if err := cs.claim(ck.JobID, run); err != nil {
		return err
	}
	_, err := cs.store.Save(ck)
	return err
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

// cutDigest is the SHA-256, in hex, of the canonical encoding of a cut of
// run run: the checkpoint file with its metadata stamped with the run, as
// the holders receive it. Every copy of a cut, the coordinator's own
// (without a run) or a replica, has the same digest.
func cutDigest(ck *tensorio.Checkpoint, run string) (string, error) {
	meta, err := job.ParseCutMeta(ck.Meta)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if err := tensorio.WriteCheckpoint(h, stamped(ck, meta, run)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
