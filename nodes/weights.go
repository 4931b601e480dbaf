package nodes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"

	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/tensorio"
)

// Weights out of a distributed run: the coordinator holds a done
// job's final weights (gathered at its last cut) and serves them as
// safetensors, GET /v1/jobs/{id}/weights.

// errNoWeights is a job whose weights this node cannot give.
var errNoWeights = errors.New("nodes: no final weights")

func (h *api) getWeights(w http.ResponseWriter, r *http.Request) {
	es, meta, err := h.a.jobs.weights(r.PathValue("id"))
	switch {
	case errors.Is(err, ErrNoJob):
		writeError(w, http.StatusNotFound, err)
		return
	case errors.Is(err, actors.ErrWeightsReleased):
		writeError(w, http.StatusGone, fmt.Errorf("%w (a node keeps the weights of its %d newest done jobs; export them from the job's last cut in a data dir: ppnode ckpt export)", err, keptWeights))
		return
	case err != nil:
		writeError(w, http.StatusConflict, err)
		return
	}
	w, _ = h.streaming(w, r)
	w.Header().Set("Content-Type", "application/octet-stream")
	if err := tensorio.WriteSafetensorsEntries(w, es, meta); err != nil {
		h.a.log.Warn("nodes: sending weights", "job", r.PathValue("id"), "err", err)
	}
}

// Weights downloads the final weights of job id (GET
// /v1/jobs/{id}/weights) to path as safetensors, atomically, once their
// fingerprint is sha (the job's Result.WeightsSHA256).
func (c *Client) Weights(ctx context.Context, id, path, sha string) error {
	res, err := c.send(ctx, http.MethodGet, "/v1/jobs/"+id+"/weights", "", nil)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename: a no-op
	_, err = io.Copy(tmp, io.LimitReader(res.Body, MaxCheckpointBytes))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("weights of job %s: %w", id, err)
	}
	if err := verifyWeights(tmp.Name(), sha); err != nil {
		return fmt.Errorf("weights of job %s: %w", id, err)
	}
	return os.Rename(tmp.Name(), path)
}

// verifyWeights checks that the safetensors file at path holds weights
// whose fingerprint (of its float32 tensors) is sha.
func verifyWeights(path, sha string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	es, _, err := tensorio.ParseSafetensors(b)
	if err != nil {
		return err
	}
	got, err := tensorio.EntriesSHA256(es)
	if err != nil {
		return err
	}
	if got != sha {
		return fmt.Errorf("%w: received weights %.16s, the job's are %.16s", tensorio.ErrCorrupt, got, sha)
	}
	return nil
}
