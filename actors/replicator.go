package actors

import (
	"bytes"
	"sync"

	"github.com/ppnode/ppnode/tensorio"
)

// Replicator keeps copies of a job's cuts beyond this node, so that they
// outlive it: nodes send each to the job's record holders; tests keep
// them in memory (InmemReplicas).
//
// The contract: a coordinator calls Replicate on its background goroutine,
// after the cut is written to its Store, one call at a time (the next cut
// waits for it), and the cut counts as persisted once Replicate returns
// nil. Replicate may block as long as the copies take. ck's tensors are
// the coordinator's model: Replicate reads them and must neither change
// them nor keep them after it returns. Coordinators of different jobs call
// it concurrently.
type Replicator interface {
	Replicate(ck *tensorio.Checkpoint) error
}

// InmemReplicas is the in-memory twin of a node's Replicator, for tests:
// it keeps every cut it is given, encoded as a checkpoint file is (so a
// cut that could not be written fails here too). The zero value is ready
// to use; it is safe for concurrent use.
type InmemReplicas struct {
	mu   sync.Mutex // guards cuts
	cuts map[string][][]byte
}

var _ Replicator = (*InmemReplicas)(nil)

// Replicate keeps a copy of ck.
func (r *InmemReplicas) Replicate(ck *tensorio.Checkpoint) error {
	var b bytes.Buffer
	if err := tensorio.WriteCheckpoint(&b, ck); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cuts == nil {
		r.cuts = map[string][][]byte{}
	}
	r.cuts[ck.JobID] = append(r.cuts[ck.JobID], b.Bytes())
	return nil
}

// Latest returns a copy of the last cut of job id kept, nil if none.
func (r *InmemReplicas) Latest(id string) (*tensorio.Checkpoint, error) {
	r.mu.Lock()
	cuts := r.cuts[id]
	r.mu.Unlock()
	if len(cuts) == 0 {
		return nil, nil
	}
	return tensorio.ReadCheckpoint(cuts[len(cuts)-1])
}
