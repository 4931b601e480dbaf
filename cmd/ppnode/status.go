package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/nodes"
)

// clusterStatus is what `ppnode status` shows: the node asked, and the jobs
// of every member that answered.
type clusterStatus struct {
	nodes.Status
	// Coordinators are the statuses of the other members, for their jobs
	// (those that could not be asked are in Unreachable).
	Others      []nodes.Status    `json:"others,omitempty"`
	Unreachable map[string]string `json:"unreachable,omitempty"`
}

func runStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status", "--via host:port [--json]")
	via := fs.String("via", "", "HTTP address of a node, host:port")
	asJSON := fs.Bool("json", false, "print one JSON object")
	creds := credsFlag(fs)
	tokenFile := tokenFlag(fs)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if err := useCreds(*creds, *tokenFile); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *via == "" {
		return usagef("--via host:port of a node is required")
	}
	if _, _, err := net.SplitHostPort(*via); err != nil {
		return usagef("--via %q: want host:port", *via)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var cs clusterStatus
	var err error
	if cs.Status, err = api(*via).Status(ctx); err != nil {
		return err
	}
	// Jobs live on the node that coordinates them: ask the other members.
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range cs.Members {
		if m.Name == cs.Name || m.HTTP == "" || !m.State.Usable() {
			continue
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			st, err := api(m.HTTP).Status(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if cs.Unreachable == nil {
					cs.Unreachable = map[string]string{}
				}
				cs.Unreachable[m.Name] = err.Error()
				return
			}
			cs.Others = append(cs.Others, st)
		})
	}
	wg.Wait()
	if *asJSON {
		b, err := json.Marshal(cs)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
		return nil
	}
	printStatus(stdout, &cs)
	return nil
}

func printStatus(w io.Writer, cs *clusterStatus) {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "NODE\tSTATE\tGFLOPS\tTHREADS\tMEMORY\tGOSSIP\tACTORS\tHTTP\tVERSION\n")
	for _, m := range cs.Members {
		state := string(m.State)
		if m.Error != "" {
			state += " (" + m.Error + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%d\t%s\t%s\t%s\t%s\t%s\n", m.Name, state, m.Profile.GFLOPS, m.Profile.Threads,
			gib(m.Profile.Memory), m.Gossip, m.Actors, m.HTTP, m.Version)
	}
	tw.Flush()
	all := append([]nodes.Status{cs.Status}, cs.Others...)
	njobs := 0
	for _, st := range all {
		for _, j := range st.Jobs {
			njobs++
			loss := ""
			if j.LossName != "" && j.LossName != nn.LossCE {
				loss = " (" + j.LossName + ")"
			}
			fmt.Fprintf(w, "\njob %s on %s: %s %s, step %d/%d, loss %.4f%s, %.0f samples/s\n",
				j.ID, st.Name, j.Model, j.State, j.Step, j.Total, j.Loss, loss, j.SamplesPerSec)
			if j.Plan != "" {
				fmt.Fprintf(w, "  plan %s, %s, M=%d, predicted %.1f ms/step, bubble %.0f%%\n", j.Plan, j.Schedule, j.MicroBatches, j.PredictedMS, 100*j.PredictedBubble)
			}
			if len(j.Tied) > 0 {
				fmt.Fprintf(w, "  tied weights, their copies' gradients summed across stages each step: %s\n", strings.Join(j.Tied, "; "))
			}
			var rec []string
			for _, s := range j.Stages {
				if s.Recompute {
					rec = append(rec, fmt.Sprintf("s%d", s.ID))
				}
			}
			if len(rec) > 0 {
				fmt.Fprintf(w, "  stages %s recompute their activations at the backward pass\n", strings.Join(rec, ", "))
			}
			if j.Reason != "" {
				fmt.Fprintf(w, "  %s: %s\n", j.State, j.Reason)
			}
			if j.Error != "" {
				fmt.Fprintf(w, "  error: %s\n", j.Error)
			}
			if j.Result != nil {
				fmt.Fprintf(w, "  result: %stest loss %.4f%s%s, weights %s\n", accuracy(j.Result, ", "), j.Result.TestLoss, testNotes(j.Result, ", "), evaluated(j.Result), j.Result.WeightsSHA256)
			} else if n := len(j.Accuracy); n > 0 { // the newest evaluation while it trains
				fmt.Fprintf(w, "  %s\n", evaluation(!j.NoAccuracy, j.Accuracy[n-1]))
			}
			if j.Cuts > 0 {
				fmt.Fprintf(w, "  latest consistent cut: step %d (%d cuts, every %d steps; the last paused the pipeline %.0f ms, written and copied in %.0f ms",
					j.LatestCut, j.Cuts, j.CheckpointEvery, j.CheckpointMS, j.PersistMS)
				if j.CutCostMS > 0 {
					fmt.Fprintf(w, ", cost the steps %.0f ms", j.CutCostMS)
				}
				fmt.Fprintln(w, ")")
			}
			if j.Replicas > 0 {
				fmt.Fprintf(w, "  copies of the cuts and the job record: %d wanted; held by %s and %v\n", j.Replicas, st.Name, j.Holders)
			}
			if tk := j.Takeover; tk != nil {
				fmt.Fprintf(w, "  taken over from %s at %s: resumed from step %d (%s), generation %d, ready in %.0f ms\n",
					tk.From, tk.At.Format(time.TimeOnly), tk.Step, tk.Source, tk.Generation, tk.PrepareMS)
			}
			if j.MovedTo != "" {
				fmt.Fprintf(w, "  moved to %s (this node was declared dead and the job taken over)\n", j.MovedTo)
			}
			for _, r := range j.Recoveries {
				fmt.Fprintf(w, "  recovery at step %d: %s; detected after %.0f ms, restored in %.0f ms %s; plan %s\n",
					r.Step, r.Cause, r.DetectMS, r.RestoreMS, recoveredFrom(r), r.Plan)
			}
			for _, r := range j.Replans {
				measured := ""
				if r.MeasuredAfterMS > 0 {
					measured = fmt.Sprintf(" (measured %.1f -> %.1f ms)", r.MeasuredBeforeMS, r.MeasuredAfterMS)
				}
				fmt.Fprintf(w, "  re-plan at step %d: %s; predicted gain %.0f%%%s, move predicted %.0f ms, took %.0f ms, %s: %d of %d state bytes over the network; plan %s\n",
					r.Step, r.Reason, 100*r.Gain, measured, r.CostMS, r.MovedMS, r.Method, r.MovedBytes, r.StateBytes, r.Plan)
			}
			if len(j.Stages) == 0 {
				continue
			}
			tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintf(tw, "  STAGE\tREPLICA\tNODE\tLAYERS\tPARAMS\tMICRO\tFWD ms\tBWD ms\tUPDATE ms\tWAIT ms\t\n")
			for _, s := range j.Stages {
				fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t\n", s.Group, s.Replica, s.Node, s.Layers, s.Params,
					s.MicroBatches, s.ForwardMS, s.BackwardMS, s.UpdateMS, s.WaitMS)
			}
			tw.Flush()
			printLinks(w, j.Links)
		}
	}
	if njobs == 0 {
		fmt.Fprintln(w, "\nno jobs")
	}
	for _, st := range all {
		for _, r := range st.Records {
			fmt.Fprintf(w, "%s holds the record of job %s: %s, coordinator %s, holders %v, generation %d\n",
				st.Name, r.ID, r.State, r.Coordinator, r.Holders, r.Generation)
		}
	}
	for name, err := range cs.Unreachable {
		fmt.Fprintf(w, "(could not ask %s for its jobs: %s)\n", name, err)
	}
}

func gib(b uint64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
}

// printLinks prints a job's link table: rate and round trip as planned,
// then per kind of tensor the codec, its ratio and the bytes sent.
func printLinks(w io.Writer, links []job.LinkStatus) {
	if len(links) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "  LINK\tRATE\tRTT\tSOURCE\tSENT\tCODECS (ratio)\n")
	for _, l := range links {
		var codecs []string
		for _, k := range l.Kinds {
			codecs = append(codecs, fmt.Sprintf("%s %s (%.2f)", k.Kind, k.Codec, k.Ratio))
		}
		fmt.Fprintf(tw, "  %s->%s\t%.0f Mbit/s\t%.2f ms\t%s\t%s\t%s\n", l.From, l.To, l.MbitPerSec, l.RTTMS, l.Source,
			mb(l.WireBytes), strings.Join(codecs, ", "))
	}
	tw.Flush()
}

func mb(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }

// recoveredFrom says where a recovery took the job's state from.
func recoveredFrom(r job.Recovery) string {
	if r.From == job.FromSurvivors {
		return "from the stages that survived, no step replayed"
	}
	return fmt.Sprintf("from the cut, %d steps replayed", r.Replayed)
}
