package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ppnode/ppnode/nodes"
)

// runCancel stops a job: the node that coordinates it stops it at its
// next step, and its record tells the nodes that hold it that it failed
// (they do not take it over). --via may be any member: the job is looked
// for on the others too.
func runCancel(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("cancel", "--via host:port JOB")
	via := fs.String("via", "", "HTTP address of a node of the cluster, host:port")
	creds := credsFlag(fs)
	tokenFile := tokenFlag(fs)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("want one job id, got %d arguments", fs.NArg())
	}
	id := fs.Arg(0)
	if !validJobID(id) {
		return usagef("job id %q: a job id is letters, digits, '-' and '_'", id)
	}
	if *via == "" {
		return usagef("--via host:port of a node is required")
	}
	if _, _, err := net.SplitHostPort(*via); err != nil {
		return usagef("--via %q: want host:port", *via)
	}
	if err := useCreds(*creds, *tokenFile); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, at, err := cancelJob(ctx, *via, id)
	if err != nil {
		return err
	}
	if st.State.Ended() {
		fmt.Fprintf(stdout, "job %s on %s had already ended: %s at step %d/%d\n", id, at, st.State, st.Step, st.Total)
		return nil
	}
	fmt.Fprintf(stdout, "job %s on %s cancelled at step %d/%d: it stops at the end of its current step\n", id, at, st.Step, st.Total)
	return nil
}

// cancelJob cancels job id through the node at via, or, if that node does
// not coordinate it, through the member that does. It returns the job's
// status as the cancel found it and the name of the node that
// coordinates it.
func cancelJob(ctx context.Context, via, id string) (nodes.JobStatus, string, error) {
	st, err := api(via).Cancel(ctx, id)
	if err == nil {
		return st, st.Coordinator, nil
	}
	if !nodes.IsNotFound(err) {
		return st, "", err
	}
	cs, serr := api(via).Status(ctx)
	if serr != nil {
		return st, "", err
	}
	for _, m := range cs.Members {
		if m.Name == cs.Name || m.HTTP == "" || !m.State.Usable() {
			continue
		}
		mctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := api(m.HTTP).Cancel(mctx, id)
		cancel()
		if err == nil {
			return st, st.Coordinator, nil
		}
	}
	return st, "", fmt.Errorf("no job %q: no node of the cluster (asked through %s) coordinates it; see ppnode status --via %s", id, cs.Name, via)
}

// validJobID reports whether id can be a job's id (the rule of the nodes'
// checkpoint store: it names a directory).
func validJobID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}
