package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
)

// runReplan asks the node that coordinates a job to move it to another
// partition at its next step boundary: the same plan change as a node
// leaving or drifting speeds, asked by a user.
func runReplan(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replan", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: ppnode replan --via host:port [--via-cut] JOB PARTITION\n\n"+
			"PARTITION is a partitioner (auto, uniform, params, balanced, graph) or a partition\n"+
			`such as "fc1-fc16@a; fc17-fc32@b". The state moves straight between the stages,`+"\n"+
			"or with --via-cut through a cut.\n\n")
		fs.PrintDefaults()
	}
	via := fs.String("via", "", "HTTP address of the node that coordinates the job, host:port")
	viaCut := fs.Bool("via-cut", false, "move the state through a cut instead of straight between the stages")
	creds := credsFlag(fs)
	tokenFile := tokenFlag(fs)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if err := useCreds(*creds, *tokenFile); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return usagef("want a job id and a partition, got %d arguments", fs.NArg())
	}
	if _, _, err := net.SplitHostPort(*via); err != nil {
		return usagef("--via %q: want host:port", *via)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := fs.Arg(0)
	st, err := api(*via).Replan(ctx, id, nodes.ReplanRequest{Partition: fs.Arg(1), ViaCut: *viaCut})
	if errors.Is(err, job.ErrSpec) {
		return usageError{err}
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "job %s at step %d/%d: re-plan to %q asked; it happens at the next step boundary (see ppnode status --via %s)\n",
		id, st.Step, st.Total, fs.Arg(1), *via)
	return nil
}
