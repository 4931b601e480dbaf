package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// MaxBodyBytes bounds a request body.
const MaxBodyBytes = 1 << 20

// SubmitReply is the answer to POST /v1/jobs.
type SubmitReply struct {
	ID     string     `json:"id"`
	Plan   string     `json:"plan"`
	Status job.Status `json:"status"`
}

// ErrorReply is the body of every error answer.
type ErrorReply struct {
	Error string `json:"error"`
}

// api is the node's HTTP API (see the package documentation): a thin
// layer that decodes a request, calls the agent or one of its parts, and
// writes the answer. It owns its listener and server, and the slots of
// the checkpoint uploads.
type api struct {
	a       *Agent
	ln      net.Listener
	srv     *http.Server
	uploads chan struct{} // a slot per checkpoint upload in progress
}

func newAPI(a *Agent) *api { return &api{a: a, uploads: make(chan struct{}, MaxUploads)} }

// listen opens the API's listener at addr (host:port).
func (h *api) listen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("nodes: HTTP: %w", err)
	}
	h.ln = h.a.gates.http.Listen(ln)
	h.srv = h.newServer()
	return nil
}

// addr is the API's host:port.
func (h *api) addr() string { return h.ln.Addr().String() }

// serve answers requests until shutdown.
func (h *api) serve() {
	serve := h.srv.Serve
	if h.srv.TLSConfig != nil {
		serve = func(l net.Listener) error { return h.srv.ServeTLS(l, "", "") }
	}
	if err := serve(h.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		h.a.log.Error("nodes: HTTP server", "err", err)
	}
}

// shutdown stops the server, letting the requests in progress finish
// for up to 2 s.
func (h *api) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := h.srv.Shutdown(ctx); err != nil {
		return h.srv.Close()
	}
	return nil
}

// handler routes the API's requests.
func (h *api) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/jobs", h.guard(user, h.postJob))
	mux.HandleFunc("GET /v1/jobs", h.guard(readOnly, func(w http.ResponseWriter, r *http.Request) {
		js := h.a.Jobs()
		for i := range js {
			finite(&js[i].Status)
		}
		writeJSON(w, http.StatusOK, js)
	}))
	mux.HandleFunc("GET /v1/jobs/{id}", h.guard(readOnly, func(w http.ResponseWriter, r *http.Request) {
		st, err := h.a.Job(r.PathValue("id"))
		if err != nil {
			writeError(w, http.StatusNotFound, err)
			return
		}
		finite(&st.Status)
		writeJSON(w, http.StatusOK, st)
	}))
	mux.HandleFunc("DELETE /v1/jobs/{id}", h.guard(user, func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := h.a.Cancel(id); err != nil {
			writeError(w, http.StatusNotFound, err)
			return
		}
		st, _ := h.a.Job(id)
		finite(&st.Status)
		writeJSON(w, http.StatusAccepted, st)
	}))
	mux.HandleFunc("POST /v1/jobs/{id}/replan", h.guard(user, h.postReplan))
	mux.HandleFunc("GET /v1/jobs/{id}/weights", h.guard(user, h.getWeights))
	mux.HandleFunc("POST /v1/links/probe", h.guard(member, h.postLinkProbe))
	mux.HandleFunc("GET /v1/status", h.guard(readOnly, func(w http.ResponseWriter, r *http.Request) {
		st := h.a.Status()
		for i := range st.Jobs {
			finite(&st.Jobs[i].Status)
		}
		writeJSON(w, http.StatusOK, st)
	}))
	h.dashboard(mux) // GET /: the dashboard (dashboard.go)
	mux.HandleFunc("GET /metrics", h.guard(readOnly, h.getMetrics))
	mux.HandleFunc("PUT /v1/checkpoints/{job}", h.guard(member, h.putCheckpoint))
	mux.HandleFunc("GET /v1/checkpoints/{job}", h.guard(member, h.listCheckpoints))
	mux.HandleFunc("GET /v1/checkpoints/{job}/{step}", h.guard(member, h.getCheckpoint))
	mux.HandleFunc("PUT /v1/jobrecords/{id}", h.guard(member, h.putRecord))
	// A client reads records too: how a job ended when its coordinator
	// is gone (train --via follows it there).
	mux.HandleFunc("GET /v1/jobrecords", h.guard(user, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, h.a.Records())
	}))
	mux.HandleFunc("GET /v1/jobrecords/{id}", h.guard(user, func(w http.ResponseWriter, r *http.Request) {
		rec, err := h.a.Record(r.PathValue("id"))
		if err != nil {
			writeError(w, http.StatusNotFound, err)
			return
		}
		writeJSON(w, http.StatusOK, rec)
	}))
	// Go's profiler, for an operator looking into a slow node (join
	// --pprof).
	if h.a.cfg.Pprof {
		mux.HandleFunc("GET /debug/pprof/", h.guard(user, pprof.Index))
		mux.HandleFunc("GET /debug/pprof/profile", h.guard(user, pprof.Profile))
		mux.HandleFunc("GET /debug/pprof/trace", h.guard(user, pprof.Trace))
	}
	return mux
}

// MaxCheckpointBytes bounds a replicated checkpoint.
const MaxCheckpointBytes = 8 << 30

// putCheckpoint keeps a replica of another node's consistent cut: the body
// is a tensorio checkpoint file of job {job} with its run (job.CutMeta),
// verified before it is stored; the cuts of other runs of the job are
// removed from the store first (cuts.claim). 409 if another run of the job
// is in progress here.
func (h *api) putCheckpoint(w http.ResponseWriter, r *http.Request) {
	store := h.a.cuts.store
	if store == nil {
		writeError(w, http.StatusServiceUnavailable, errors.New("nodes: this node keeps no checkpoints (no --data-dir)"))
		return
	}
	job := r.PathValue("job")
	if err := checkID(job); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	rec, err := h.cutOf(job, peerName(r))
	if err != nil {
		h.a.log.Warn("nodes: refused a cut", "job", job, "from", peerName(r), "err", err)
		writeError(w, http.StatusForbidden, err)
		return
	}
	select {
	case h.uploads <- struct{}{}:
		defer func() { <-h.uploads }()
	case <-r.Context().Done():
		return
	case <-time.After(h.a.cfg.HTTPTimeout):
		writeError(w, http.StatusServiceUnavailable, fmt.Errorf("nodes: %d checkpoint uploads in progress here; try again", MaxUploads))
		return
	}
	w, r = h.streaming(w, r)
	// The file streams to disk and is verified there: a cut is hundreds
	// of MB, and this node is usually running a stage.
	code := http.StatusInternalServerError
	_, err = store.SaveFrom(http.MaxBytesReader(w, r.Body, MaxCheckpointBytes), func(ck *tensorio.Checkpoint) error {
		code = http.StatusBadRequest
		if ck.JobID != job {
			return fmt.Errorf("nodes: checkpoint of job %q sent as job %q", ck.JobID, job)
		}
		run, err := replicaRun(ck)
		if err != nil {
			return fmt.Errorf("nodes: checkpoint of job %q at step %d: %w", ck.JobID, ck.Step, err)
		}
		code = http.StatusConflict
		if run != rec.Run {
			return fmt.Errorf("%w: job %q: a cut of run %s; the record held here is of another run (%s)", ErrStaleRecord, job, run, rec.Run)
		}
		if err := h.a.jobs.runInUse(ck.JobID, run); err != nil {
			return err
		}
		code = http.StatusInternalServerError
		return h.a.cuts.claim(ck.JobID, run)
	})
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		code = http.StatusRequestEntityTooLarge
	case errors.Is(err, tensorio.ErrCorrupt):
		code = http.StatusBadRequest
	}
	if err != nil {
		writeError(w, code, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// listCheckpoints answers which cuts of job {job} this node keeps.
func (h *api) listCheckpoints(w http.ResponseWriter, r *http.Request) {
	job := r.PathValue("job")
	if err := checkID(job); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	store := h.a.cuts.store
	if store == nil {
		writeError(w, http.StatusNotFound, errors.New("nodes: this node keeps no checkpoints (no --data-dir)"))
		return
	}
	steps, err := store.Steps(job)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, CutList{Job: job, Run: h.a.cuts.run(job), Steps: append([]int64{}, steps...)})
}

// getCheckpoint sends the checkpoint file of job {job} at step {step} as
// it is on disk (the receiver verifies it).
func (h *api) getCheckpoint(w http.ResponseWriter, r *http.Request) {
	job := r.PathValue("job")
	if err := checkID(job); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	step, err := strconv.ParseInt(r.PathValue("step"), 10, 64)
	if err != nil || step < 0 {
		writeError(w, http.StatusBadRequest, fmt.Errorf("nodes: step %q: want a non-negative integer", r.PathValue("step")))
		return
	}
	store := h.a.cuts.store
	if store == nil {
		writeError(w, http.StatusNotFound, errors.New("nodes: this node keeps no checkpoints (no --data-dir)"))
		return
	}
	f, err := os.Open(store.Path(job, step))
	if err != nil {
		writeError(w, http.StatusNotFound, fmt.Errorf("nodes: no checkpoint of job %q at step %d here", job, step))
		return
	}
	defer f.Close()
	w, _ = h.streaming(w, r)
	w.Header().Set("Content-Type", "application/octet-stream")
	if fi, err := f.Stat(); err == nil {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	}
	io.Copy(w, f)
}

// putRecord keeps the record of a job coordinated elsewhere (see
// failover.accept): 204; 400 for a bad record, 409 for one older than the
// record held, 413 for a body over MaxBodyBytes.
func (h *api) putRecord(w http.ResponseWriter, r *http.Request) {
	var rec JobRecord
	if !decodeJSON(w, r, &rec, ErrRecord) {
		return
	}
	if id := r.PathValue("id"); rec.ID != id {
		writeError(w, http.StatusBadRequest, fmt.Errorf("%w: record of job %q sent as job %q", ErrRecord, rec.ID, id))
		return
	}
	if err := rec.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if p := peerName(r); h.a.cfg.Identity != nil && p != rec.Coordinator {
		writeError(w, http.StatusForbidden, fmt.Errorf("nodes: a record of job %q naming coordinator %q sent by %q: only a job's coordinator sends its record", rec.ID, rec.Coordinator, p))
		return
	}
	if err := h.a.failover.accept(rec); err != nil {
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, ErrStaleRecord):
			code = http.StatusConflict
		case errors.Is(err, ErrNotSuccessor):
			code = http.StatusForbidden
			h.a.log.Warn("nodes: refused a job record", "job", rec.ID, "from", peerName(r), "err", err)
		}
		writeError(w, code, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// postReplan asks a job to move to another partition: 202 with its status;
// 400 for a partition that does not fit; 404 for a job this node does not
// coordinate.
func (h *api) postReplan(w http.ResponseWriter, r *http.Request) {
	var req ReplanRequest
	if !decodeJSON(w, r, &req, job.ErrSpec) {
		return
	}
	id := r.PathValue("id")
	switch err := h.a.Replan(id, req); {
	case errors.Is(err, ErrNoJob):
		writeError(w, http.StatusNotFound, err)
	case err != nil:
		writeError(w, http.StatusBadRequest, err)
	default:
		st, _ := h.a.Job(id)
		finite(&st.Status)
		writeJSON(w, http.StatusAccepted, st)
	}
}

// decodeJSON reads the request's body, one JSON value of at most
// MaxBodyBytes without unknown fields, into v. Otherwise it answers 400
// (413 for a body too large) with an error wrapping kind, and returns
// false.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, kind error) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("%w: body over %d bytes", kind, MaxBodyBytes))
		return false
	case err != nil:
		writeError(w, http.StatusBadRequest, fmt.Errorf("%w: %v", kind, err))
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, fmt.Errorf("%w: more than one JSON value in the body", kind))
		return false
	}
	return true
}

func (h *api) postJob(w http.ResponseWriter, r *http.Request) {
	spec := job.DefaultSpec()
	if !decodeJSON(w, r, &spec, job.ErrSpec) {
		return
	}
	c, err := h.a.Submit(spec)
	switch {
	case err == nil:
		st := c.Status()
		finite(&st)
		writeJSON(w, http.StatusCreated, SubmitReply{ID: st.ID, Plan: c.Describe(), Status: st})
	case errors.Is(err, job.ErrSpec), errors.Is(err, ErrBadID):
		writeError(w, http.StatusBadRequest, err)
	case errors.Is(err, ErrJobID):
		writeError(w, http.StatusConflict, err)
	case errors.Is(err, ErrClosed):
		writeError(w, http.StatusServiceUnavailable, err)
	default:
		writeError(w, http.StatusInternalServerError, err)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, code int, err error) {
	b, _ := json.Marshal(ErrorReply{Error: err.Error()})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// finite replaces the floats of st that JSON cannot carry (a diverged
// job's NaN or infinite loss) by 0, so that its status can still be sent.
func finite(st *job.Status) {
	fix := func(v *float64) {
		if math.IsNaN(*v) || math.IsInf(*v, 0) {
			*v = 0
		}
	}
	fix(&st.Loss)
	fix(&st.SamplesPerSec)
	fix(&st.PredictedMS)
	for i := range st.Stages {
		s := &st.Stages[i]
		for _, f := range []*float64{&s.ForwardMS, &s.BackwardMS, &s.UpdateMS, &s.WaitMS} {
			fix(f)
		}
	}
	for i := range st.Accuracy {
		fix(&st.Accuracy[i].Accuracy)
	}
	if st.Result != nil {
		r := *st.Result
		finiteResult(&r)
		st.Result = &r
	}
}

// finiteResult replaces the floats of r that JSON cannot carry by 0.
func finiteResult(r *job.Result) {
	for _, f := range []*float64{&r.TrainLoss, &r.TrainAccuracy, &r.TestAccuracy, &r.SamplesPerSec,
		&r.Seconds, &r.Epochs, &r.PredictedStepMS, &r.MeasuredStepMS} {
		if math.IsNaN(*f) || math.IsInf(*f, 0) {
			*f = 0
		}
	}
}
