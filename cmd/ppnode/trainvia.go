package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ppnode/ppnode/actors"
	"github.com/ppnode/ppnode/nodes"
)

// clusterFlags are the options of a job submitted to a cluster.
type clusterFlags struct {
	via       string
	partition string
	schedule  string
	maxNodes  int
	ckptEvery int
	fixed     bool
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.via, "via", "", "submit the job through the node whose HTTP address this is (host:port)")
	fs.StringVar(&c.partition, "partition", "auto", `partition: auto, uniform, params, balanced, graph, or a description such as "fc1-fc16@a; fc17-fc32@b"`)
	fs.StringVar(&c.schedule, "schedule", "auto", "pipeline schedule: auto, gpipe, 1f1b or graph")
	fs.IntVar(&c.maxNodes, "max-nodes", 0, "use at most this many nodes (0: as many as help)")
	fs.IntVar(&c.ckptEvery, "checkpoint-every", 0, "take a consistent cut every N steps (0: from its measured cost, ~2% of the time)")
	fs.BoolVar(&c.fixed, "no-rebalance", false, "keep the first plan (otherwise an automatic plan follows measured speeds, joins and leaves)")
}

func trainVia(spec actors.JobSpec, f *trainFlags, c *clusterFlags, stdout, stderr io.Writer) error {
	if c.via == "" {
		return usagef("give --local, or --via host:port of a node")
	}
	if _, _, err := net.SplitHostPort(c.via); err != nil {
		return usagef("--via %q: want host:port", c.via)
	}
	if f.out != "" {
		return usagef("--out works with --local only: the weights of a cluster job stay on its nodes")
	}
	if c.maxNodes < 0 || c.ckptEvery < 0 {
		return usagef("--max-nodes and --checkpoint-every want 0 or more")
	}
	spec.Partition, spec.Schedule, spec.MaxNodes = c.partition, c.schedule, c.maxNodes
	spec.CheckpointEvery, spec.NoRebalance = c.ckptEvery, c.fixed
	_, err := followJob(c.via, spec, f.json, stdout, stderr)
	var se specError
	if errors.As(err, &se) {
		return usageError{err}
	}
	return err
}

// pollEvery is how often followJob asks for the job's progress.
const pollEvery = 300 * time.Millisecond

// followJob submits spec through the node whose HTTP address is via, shows
// the plan on stderr and a progress bar while the job trains, and prints
// the result with printResult (asJSON: the JSON of `train --local`, with
// plan, schedule and nodes). On SIGINT it stops following and returns an
// error saying the job keeps running in the cluster. A job that fails
// returns its error; a refused spec returns an error that wraps
// actors.ErrSpec.
func followJob(via string, spec actors.JobSpec, asJSON bool, stdout, stderr io.Writer) (*actors.JobResult, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return followJobContext(ctx, via, spec, asJSON, stdout, stderr)
}

func followJobContext(ctx context.Context, via string, spec actors.JobSpec, asJSON bool, stdout, stderr io.Writer) (*actors.JobResult, error) {
	api := newAPI(via)
	body, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "submitting %s on %s through %s (planning over the cluster)\n", spec.Model, spec.Data, via)
	var sub nodes.SubmitReply
	if err := api.do(ctx, http.MethodPost, "/v1/jobs", body, &sub, 5*time.Minute); err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "job %s: %s\n", sub.ID, sub.Plan)
	for _, s := range sub.Status.Stages {
		fmt.Fprintf(stderr, "  stage %d on %s: %s\n", s.ID, s.Node, s.Layers)
	}
	bar := newProgress(stderr, max(sub.Status.Total, 1), asJSON)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	failures, seenRecoveries, seenReplans := 0, 0, 0
	for {
		select {
		case <-ctx.Done():
			bar.done()
			return nil, fmt.Errorf("interrupted: job %s keeps running in the cluster (see ppnode status --via %s; stop it with DELETE http://%s/v1/jobs/%s)",
				sub.ID, via, via, sub.ID)
		case <-tick.C:
		}
		var st actors.JobStatus
		if err := api.do(ctx, http.MethodGet, "/v1/jobs/"+sub.ID, nil, &st, 10*time.Second); err != nil {
			if ctx.Err() != nil {
				continue // the select above reports the interruption
			}
			var ae *apiError
			if failures++; failures >= 10 || (errors.As(err, &ae) && ae.code == http.StatusNotFound) {
				bar.done()
				return nil, fmt.Errorf("lost track of job %s: %w", sub.ID, err)
			}
			continue
		}
		failures = 0
		// Plan changes as they happen (stderr, like the plan itself).
		for ; seenRecoveries < len(st.Recoveries); seenRecoveries++ {
			r := st.Recoveries[seenRecoveries]
			bar.note(fmt.Sprintf("recovered at step %d (%s): %d steps replayed, restored in %.0f ms; plan %s",
				r.Step, r.Cause, r.Replayed, r.RestoreMS, r.Plan))
		}
		for ; seenReplans < len(st.Replans); seenReplans++ {
			r := st.Replans[seenReplans]
			bar.note(fmt.Sprintf("re-planned at step %d: %s; plan %s (moved in %.0f ms)", r.Step, r.Reason, r.Plan, r.MovedMS))
		}
		if st.Step > 0 {
			bar.update(st.Step, st.Loss, st.SamplesPerSec)
		}
		switch st.State {
		case "done":
			bar.done()
			if st.Result == nil {
				return nil, fmt.Errorf("job %s is done but reported no result", sub.ID)
			}
			return st.Result, printResult(st.Result, asJSON, stdout, stderr)
		case "failed":
			bar.done()
			return nil, fmt.Errorf("job %s failed: %s", sub.ID, st.Error)
		}
	}
}

// api is a client of one node's HTTP API.
type api struct {
	base string
	hc   *http.Client
}

func newAPI(addr string) *api {
	return &api{base: "http://" + addr, hc: &http.Client{}}
}

// apiError is an error answer of the API.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

// specError is a job spec the node refused (400): a usage error.
type specError struct{ *apiError }

func (specError) Unwrap() error { return actors.ErrSpec }

// do sends a request and decodes a 2xx answer into out; other answers
// become an *apiError (a specError for 400).
func (a *api) do(ctx context.Context, method, path string, body []byte, out any, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, r)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, a.base+path, err)
	}
	if res.StatusCode/100 != 2 {
		var e nodes.ErrorReply
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		ae := &apiError{code: res.StatusCode, msg: fmt.Sprintf("%s (HTTP %d)", msg, res.StatusCode)}
		if res.StatusCode == http.StatusBadRequest {
			return specError{ae}
		}
		return ae
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: bad answer: %w", method, a.base+path, err)
	}
	return nil
}
