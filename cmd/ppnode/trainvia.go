package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
)

// clusterFlags are the options of a job submitted to a cluster.
type clusterFlags struct {
	via       string
	partition string
	schedule  string
	chunks    int
	recompute string
	maxNodes  int
	ckptEvery int
	replicas  int
	fixed     bool
	wire      string
	noProbe   bool
	creds     string
	tokenFile string
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.via, "via", "", "submit the job through the node whose HTTP address this is (host:port)")
	fs.StringVar(&c.partition, "partition", "auto", `partition: auto, uniform, params, balanced, graph, or a description such as "fc1-fc16@a; fc17-fc32@b"`)
	fs.StringVar(&c.schedule, "schedule", "auto", "pipeline schedule: auto (the fastest by simulation of gpipe, 1f1b or graph, and zb where it is 5% faster), gpipe, 1f1b, graph, zb (zero-bubble: backward passes split into input and weight gradients) or interleaved (1F1B with --chunks stages per node, Megatron-LM; never chosen by auto)")
	fs.IntVar(&c.chunks, "chunks", 0, "interleaved: stages (chunks) per node, 2 or more (0: 2, 3 or 4, whichever the planner simulates fastest); the micro-batches must be a multiple of the nodes")
	fs.StringVar(&c.recompute, "recompute", "none", "recompute activations at the backward pass instead of keeping them: none, auto (the stages whose node's memory requires it) or all")
	fs.IntVar(&c.maxNodes, "max-nodes", 0, "use at most this many nodes (0: as many as help)")
	fs.IntVar(&c.ckptEvery, "checkpoint-every", 0, "take a consistent cut every N steps (0: from its cost, ~2% of the time)")
	fs.IntVar(&c.replicas, "replicas", job.DefaultReplicas, fmt.Sprintf("copies of each consistent cut and of the job's record, the coordinator's own included (1 to %d); with 2 or more the job survives the loss of its coordinator's node", job.MaxReplicas))
	fs.BoolVar(&c.fixed, "no-rebalance", false, "keep the first plan (otherwise an automatic plan follows measured speeds, joins and leaves)")
	fs.StringVar(&c.wire, "wire", "", "activations and gradients between stages: lossless, each link choosing its codec (default); raw (uncompressed); or lossy bf16 or int8 (not with --deterministic)")
	fs.BoolVar(&c.noProbe, "no-probe", false, "plan every link as 1 Gbit/s instead of measuring the links")
	c.creds = defaultCreds()
	fs.StringVar(&c.creds, "creds", c.creds, "the cluster's credentials directory, for --via (ppnode init; env PPNODE_CREDS)")
	fs.StringVar(&c.tokenFile, "token-file", defaultTokenFile(), tokenUsage)
}

func trainVia(spec job.Spec, f *trainFlags, c *clusterFlags, stdout, stderr io.Writer) error {
	if c.via == "" {
		return usagef("give --local, or --via host:port of a node")
	}
	if _, _, err := net.SplitHostPort(c.via); err != nil {
		return usagef("--via %q: want host:port", c.via)
	}
	if err := useCreds(c.creds, c.tokenFile); err != nil {
		return err
	}
	if c.maxNodes < 0 || c.ckptEvery < 0 {
		return usagef("--max-nodes and --checkpoint-every want 0 or more")
	}
	if c.replicas < 1 || c.replicas > job.MaxReplicas {
		return usagef("--replicas %d: want 1 to %d", c.replicas, job.MaxReplicas)
	}
	spec.Partition, spec.Schedule, spec.Chunks, spec.MaxNodes = c.partition, c.schedule, c.chunks, c.maxNodes
	if c.recompute != "none" {
		spec.Recompute = c.recompute
	}
	spec.CheckpointEvery, spec.NoRebalance, spec.Replicas = c.ckptEvery, c.fixed, c.replicas
	spec.Wire, spec.NoProbe = c.wire, c.noProbe
	if err := spec.HashFiles(); err != nil {
		return usageError{err}
	}
	res, at, err := followJob(c.via, spec, f.json, stdout, stderr)
	if errors.Is(err, job.ErrSpec) {
		return usageError{err}
	}
	if err != nil || f.out == "" {
		return err
	}
	if at == "" {
		return fmt.Errorf("job %s ended while its coordinator was out of reach: its weights are in its last cut (ppnode ckpt export)", res.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := api(at).Weights(ctx, res.ID, f.out, res.WeightsSHA256); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "weights written to %s\n", f.out)
	return nil
}

// How followJob follows a job.
const (
	// pollEvery is how often followJob asks for the job's progress.
	pollEvery = 300 * time.Millisecond
	// lostAfter is how many failed polls in a row make followJob look for
	// the job on the other nodes (the coordinator's node may be dead).
	lostAfter = 3
	// searchFor bounds that search: failure detection, then the successor
	// reading the cut and planning.
	searchFor = 2 * time.Minute
	// refreshEvery is how many polls pass between refreshes of the member
	// list.
	refreshEvery = 10
)

// followJob submits spec through the node whose HTTP address is via, shows
// the plan on stderr and the job's progress while it trains, and prints
// the result with printResult (asJSON: the JSON of `train --local`, with
// plan, schedule and nodes). If the coordinator's node stops answering, it
// asks the other members for the job until the node that took it over
// answers, says so on stderr, and follows the job there. On SIGINT it
// stops following and returns an error saying the job keeps running in the
// cluster. A job that fails returns its error; a refused spec returns an
// error that wraps job.ErrSpec.
func followJob(via string, spec job.Spec, asJSON bool, stdout, stderr io.Writer) (*job.Result, string, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return followJobContext(ctx, via, spec, asJSON, stdout, stderr)
}

func followJobContext(ctx context.Context, via string, spec job.Spec, asJSON bool, stdout, stderr io.Writer) (*job.Result, string, error) {
	fmt.Fprintf(stderr, "submitting %s on %s through %s (planning over the cluster)\n", spec.Model, spec.Data, via)
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	sub, err := api(via).Submit(sctx, spec)
	cancel()
	if err != nil {
		return nil, "", err
	}
	fmt.Fprintf(stderr, "job %s: %s\n", sub.ID, sub.Plan)
	for _, s := range sub.Status.Stages {
		fmt.Fprintf(stderr, "  stage %d on %s: %s\n", s.ID, s.Node, s.Layers)
	}
	if note := stepsNote(spec, sub.Status.Total); note != "" {
		fmt.Fprintln(stderr, note)
	}
	f := &follower{id: sub.ID, cur: via, members: map[string]string{}}
	f.refresh(ctx, via)
	bar := newProgress(stderr, sub.Status.Total, spec.Batch, asJSON, time.Now())
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	failures, polls, seenRecoveries, seenReplans, seenMeasured, seenEvals := 0, 0, 0, 0, 0, 0
	for {
		select {
		case <-ctx.Done():
			bar.done()
			return nil, "", fmt.Errorf("interrupted: job %s keeps running in the cluster (see ppnode status --via %s; stop it with ppnode cancel --via %s %s)",
				sub.ID, f.cur, f.cur, sub.ID)
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := api(f.cur).Job(pctx, sub.ID)
		cancel()
		if err == nil && st.MovedTo != "" {
			err = fmt.Errorf("the job moved to %s", st.MovedTo) // this node was declared dead
		}
		if err != nil {
			if ctx.Err() != nil {
				continue // the select above reports the interruption
			}
			if failures++; failures < lostAfter && !nodes.IsNotFound(err) {
				continue
			}
			lost := f.name(f.cur)
			found, rec, serr := f.search(ctx)
			if serr != nil {
				if ctx.Err() != nil {
					continue
				}
				bar.done()
				return nil, "", fmt.Errorf("lost track of job %s after %s stopped answering (%v): %w", sub.ID, lost, err, serr)
			}
			if rec != nil { // the job ended while nobody was asked
				bar.done()
				if rec.State == nodes.RecordDone {
					return rec.Result, "", printResult(rec.Result, asJSON, stdout, stderr)
				}
				return nil, "", fmt.Errorf("job %s failed: %s", sub.ID, rec.Error)
			}
			st = found
			if name := f.name(f.cur); name != lost {
				msg := fmt.Sprintf("coordinator %s lost; job taken over by %s", lost, name)
				if tk := st.Takeover; tk != nil && tk.To == name {
					msg += fmt.Sprintf(" from step %d", tk.Step)
				}
				bar.note(msg)
			}
			seenRecoveries, seenReplans, seenMeasured, seenEvals = 0, 0, 0, 0 // the new coordinator's own
		}
		failures = 0
		if polls++; polls%refreshEvery == 0 {
			f.refresh(ctx, f.cur)
		}
		// Plan changes as they happen (stderr, like the plan itself).
		for ; seenRecoveries < len(st.Recoveries); seenRecoveries++ {
			r := st.Recoveries[seenRecoveries]
			bar.note(fmt.Sprintf("recovered at step %d (%s) %s, restored in %.0f ms; plan %s",
				r.Step, r.Cause, recoveredFrom(r), r.RestoreMS, r.Plan))
		}
		for ; seenReplans < len(st.Replans); seenReplans++ {
			r := st.Replans[seenReplans]
			bar.note(fmt.Sprintf("re-planned at step %d: %s; plan %s (moved %d bytes in %.0f ms)", r.Step, r.Reason, r.Plan, r.MovedBytes, r.MovedMS))
		}
		// And, once known, what they did to the step time. A re-plan
		// followed by another before it was measured never will be.
		for ; seenMeasured < len(st.Replans); seenMeasured++ {
			r := st.Replans[seenMeasured]
			if r.MeasuredAfterMS == 0 {
				if seenMeasured == len(st.Replans)-1 {
					break // may still be measured
				}
				continue
			}
			bar.note(fmt.Sprintf("re-plan at step %d: median step %.1f ms before, %.1f ms after (predicted %.1f -> %.1f ms)",
				r.Step, r.MeasuredBeforeMS, r.MeasuredAfterMS, r.BeforeMS, r.AfterMS))
		}
		if st.Step > 0 {
			bar.update(time.Now(), st.Step, st.Loss, st.SamplesPerSec)
		}
		for ; seenEvals < len(st.Accuracy); seenEvals++ { // the last one is the result's
			if e := st.Accuracy[seenEvals]; e.Step < st.Total {
				bar.note(evaluation(!st.NoAccuracy, e))
			}
		}
		if e := st.Evaluation; e != nil {
			bar.evaluating(time.Now(), e.Step, e.Done, e.Samples)
		}
		switch st.State {
		case job.StateDone:
			bar.done()
			if st.Result == nil {
				return nil, "", fmt.Errorf("job %s is done but reported no result", sub.ID)
			}
			return st.Result, f.cur, printResult(st.Result, asJSON, stdout, stderr)
		case job.StateFailed, job.StateDiverged:
			bar.done()
			return nil, "", fmt.Errorf("job %s failed: %s", sub.ID, st.Error)
		}
	}
}

// follower keeps what followJob knows about the cluster: the node that
// coordinates the job and the members' HTTP addresses.
type follower struct {
	id      string
	cur     string            // HTTP address of the node followed
	members map[string]string // member name -> HTTP address
}

// name is the member name of an HTTP address (the address if unknown).
func (f *follower) name(addr string) string {
	for n, a := range f.members {
		if a == addr {
			return n
		}
	}
	return addr
}

// refresh learns the members' HTTP addresses from the node at addr
// (GET /v1/status); members that are gone are kept, in case they are
// back. It reports whether the node answered.
func (f *follower) refresh(ctx context.Context, addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	st, err := api(addr).Status(ctx)
	if err != nil {
		return false
	}
	f.members[st.Name] = addr
	for _, m := range st.Members {
		if m.HTTP != "" {
			f.members[m.Name] = m.HTTP
		}
	}
	return true
}

// search asks every known member, in name order, for the job until one
// coordinates it (found, and f.cur is that node) or a holder's record says
// it has ended (rec), for at most searchFor.
func (f *follower) search(ctx context.Context) (found nodes.JobStatus, rec *nodes.JobRecord, err error) {
	ctx, cancel := context.WithTimeout(ctx, searchFor)
	defer cancel()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	refreshed := false
	for {
		names := slices.Sorted(maps.Keys(f.members))
		for _, n := range names {
			addr := f.members[n]
			cl := api(addr)
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := cl.Job(qctx, f.id)
			cancel()
			if err == nil && st.MovedTo == "" {
				f.cur = addr
				return st, nil, nil
			}
			qctx, cancel = context.WithTimeout(ctx, 2*time.Second)
			r, err := cl.Record(qctx, f.id)
			cancel()
			if err == nil && (r.State == nodes.RecordDone && r.Result != nil || r.State == nodes.RecordFailed) {
				return found, &r, nil
			}
			if !refreshed {
				refreshed = f.refresh(ctx, addr) // members that joined since
			}
		}
		select {
		case <-ctx.Done():
			return found, nil, fmt.Errorf("no node of %v coordinates the job after %v", names, searchFor)
		case <-tick.C:
		}
	}
}
