// Command ppnode trains one model across machines of unequal speed:
//
//	ppnode join --name a --bind 10.0.0.1:7946           # a node (each machine)
//	ppnode train --via 10.0.0.1:8080 --model mlp32       # a job over the cluster
//	ppnode status --via 10.0.0.1:8080                    # members and jobs
//	ppnode replan --via 10.0.0.1:8080 JOB PARTITION      # move a running job
//	ppnode train --local --model mlp32 --data mnist      # in this process
//	ppnode demo                                          # three nodes on this machine
//	ppnode plan | ckpt | bench ...                       # plan, checkpoints, kernels
//
// Run 'ppnode <command> -h' for a command's flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

type command struct {
	name, summary string
	run           func(args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"train", "train a model (--local: in this process)", runTrain},
	{"demo", "start nodes on this machine and train mlp32 on MNIST across them", runDemo},
	{"init", "create a cluster's credentials: its CA, gossip key and a client certificate", runInit},
	{"cert", "issue a node's (or --client) certificate: cert NAME --host ADDR", runCert},
	{"join", "run a node: join the cluster and host stages and jobs", runJoin},
	{"status", "show the cluster's members and jobs: status --via host:port", runStatus},
	{"replan", "move a running job to another partition: replan --via host:port JOB PARTITION", runReplan},
	{"bench", "measure kernels: bench gemm", runBench},
	{"ckpt", "inspect a checkpoint or safetensors file, export a checkpoint", runCkpt},
	{"plan", "partition a model over nodes and simulate the pipeline", runPlan},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(args[1:], stdout, stderr)
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			if err != nil {
				fmt.Fprintf(stderr, "ppnode %s: %v\n", c.name, err)
				var u usageError
				if errors.As(err, &u) {
					return 2
				}
				return 1
			}
			return 0
		}
	}
	fmt.Fprintf(stderr, "ppnode: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: ppnode <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'ppnode <command> -h' for its flags.")
}

// usageError is a mistake in the command line (exit status 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }
