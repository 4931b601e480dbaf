// Command ppnode trains one model across machines of unequal speed:
//
//	ppnode join --name a --bind 10.0.0.1:7946           # a node (each machine)
//	ppnode train --via 10.0.0.1:8080 --model mlp32       # a job over the cluster
//	ppnode status --via 10.0.0.1:8080                    # members and jobs
//	ppnode replan --via 10.0.0.1:8080 JOB PARTITION      # move a running job
//	ppnode cancel --via 10.0.0.1:8080 JOB                # stop a job
//	ppnode train --local --model mlp32 --data mnist      # in this process
//	ppnode demo                                          # three nodes on this machine
//	ppnode plan | ckpt | bench ...                       # plan, checkpoints, kernels
//	ppnode version                                       # this binary's version
//
// Run 'ppnode <command> --help' (or 'ppnode help <command>') for a
// command's flags. As Go's tools do, help goes to stdout with exit status
// 0, and a mistake in the command line is a short message on stderr with
// exit status 2.
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
	{"cancel", "stop a job: cancel --via host:port JOB", runCancel},
	{"bench", "measure kernels: bench gemm", runBench},
	{"ckpt", "inspect a checkpoint or safetensors file, export a checkpoint", runCkpt},
	{"plan", "partition a model over nodes and simulate the pipeline", runPlan},
	{"version", "print this binary's version, revision and Go version", runVersion},
}

func main() {
	tuneOpenMP()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args (without the program's name) and returns
// the exit status: 0, 1 for a failure, 2 for a mistake in the command
// line.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		if args[0] == "help" && len(args) > 1 {
			return run([]string{args[1], "--help"}, stdout, stderr) // ppnode help CMD
		}
		usage(stdout)
		return 0
	case "-version", "--version":
		args = append([]string{"version"}, args[1:]...)
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(args[1:], stdout, stderr)
		var u usageError
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, &u):
			fmt.Fprintf(stderr, "ppnode %s: %v\nrun 'ppnode %s --help' for usage\n", c.name, err, c.name)
			return 2
		}
		fmt.Fprintf(stderr, "ppnode %s: %v\n", c.name, err)
		return 1
	}
	fmt.Fprintf(stderr, "ppnode: unknown command %q\nrun 'ppnode --help' for the commands\n", args[0])
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: ppnode <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'ppnode <command> --help' for its flags.")
}

// newFlagSet returns the flag set of command name (such as "ckpt
// inspect"), whose help shows synopsis, what follows "ppnode name" on a
// command line, then the flags. Parse it with parseFlags.
func newFlagSet(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: ppnode %s %s\n\nflags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args with fs as Go's tools do: -h or --help prints the
// command's help (fs.Usage) on stdout and returns flag.ErrHelp (exit
// status 0); an unknown flag or a bad value is a usageError (exit status
// 2) saying only what is wrong, without the help.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	fs.SetOutput(io.Discard) // the flag package prints the help on errors too
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		return flag.ErrHelp
	}
	if err != nil {
		return usageError{err}
	}
	return nil
}

// setFlags returns the names of the flags of fs given on the command line.
func setFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// usageError is a mistake in the command line (exit status 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }
