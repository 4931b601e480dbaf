package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ppnode/ppnode/data"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
	"github.com/ppnode/ppnode/trust"
)

// The demo: `ppnode demo` starts nodes as child processes of this binary
// on loopback, each under its own CPU quota where cgroup v1 allows it,
// trains mlp32 on MNIST across them with the automatic plan, and stops
// them. The integration package's harness does the same for tests.

const (
	demoCgroupRoot  = "/sys/fs/cgroup/cpu"
	demoReadyWithin = 90 * time.Second
	demoStopWithin  = 15 * time.Second
)

func runDemo(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "[--nodes N] [--epochs N | --steps N] [flags]")
	nodeCount := fs.Int("nodes", 3, "nodes to start (1-8)")
	epochs := fs.Int("epochs", 1, "epochs")
	steps := fs.Int("steps", 0, "train this many steps (0: all epochs); without --epochs, as many epochs as they need")
	batch := fs.Int("batch", 64, "mini-batch size")
	micro := fs.Int("micro-batches", 4, "micro-batches per mini-batch")
	dataSet := fs.String("data", "mnist", "data set")
	noQuota := fs.Bool("no-quota", false, "run the nodes without CPU quotas")
	cut := fs.Float64("cut-at", 0.4, "with quotas: cut the second node's CPU quota to 25% at this fraction of the job (0: never), to show the plan follow")
	minAcc := fs.Float64("min-accuracy", 0.95, "fail if the test accuracy is below this (0: no check; by default only\n"+
		"checked after an epoch or more)")
	var logs logFlags
	logs.register(fs)
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *nodeCount < 1 || *nodeCount > 8 {
		return usagef("--nodes %d: want 1 to 8", *nodeCount)
	}
	if _, err := logs.options(); err != nil {
		return err
	}
	set := setFlags(fs)
	spec := job.DefaultSpec()
	spec.ID = fmt.Sprintf("demo-%d", os.Getpid())
	spec.Model, spec.Data, spec.Epochs, spec.Steps = "mlp32", *dataSet, *epochs, *steps
	files := "" // the nodes' --files: a data file's directory
	if data.IsFile(spec.Data) {
		abs, err := filepath.Abs(spec.Data)
		if err != nil {
			return usageError{err}
		}
		spec.Data, files = abs, filepath.Dir(abs)
	}
	if set["steps"] && !set["epochs"] {
		spec.Epochs = 0 // as many as the steps need
	}
	spec.Batch, spec.MicroBatches = *batch, *micro
	if _, err := job.Check(spec); err != nil { // before any node starts
		return usageError{err}
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	logDir, err := os.MkdirTemp("", "ppnode-demo-")
	if err != nil {
		return err
	}
	// Each node's checkpoint store (coordinator failover needs one), in a
	// directory of this run, removed once the nodes are stopped.
	dataDir, err := os.MkdirTemp("", "ppnode-demo-data-")
	if err != nil {
		os.RemoveAll(logDir)
		return err
	}
	// The cluster's credentials, made for this run: the demo runs as a
	// real cluster does, with mutual TLS and an encrypted gossip.
	creds := filepath.Join(dataDir, "creds")
	if err := demoCreds(creds, *nodeCount); err != nil {
		os.RemoveAll(logDir)
		os.RemoveAll(dataDir)
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()

	// Quotas from one CPU down to 40% of one, or none.
	quotas := make([]float64, *nodeCount)
	for i := range quotas {
		quotas[i] = 1
		if *nodeCount > 1 {
			quotas[i] = 1 - 0.6*float64(i)/float64(*nodeCount-1)
		}
	}
	why := "--no-quota"
	if !*noQuota {
		why = demoProbeCgroup()
	}
	names := make([]string, *nodeCount)
	for i := range names {
		names[i] = string(rune('a' + i))
	}
	if why == "" {
		var parts []string
		for i, q := range quotas {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", names[i], 100*q))
		}
		fmt.Fprintf(stderr, "starting %d nodes on 127.0.0.1 with unequal CPU quotas (cgroup v1, share of one CPU): %s\n",
			*nodeCount, strings.Join(parts, ", "))
	} else {
		quotas = nil
		fmt.Fprintf(stderr, "starting %d nodes on 127.0.0.1, unthrottled: CPU quotas unavailable (%s)\n", *nodeCount, why)
	}
	fmt.Fprintf(stderr, "node logs: %s\n", logDir)

	var nodes []*demoNode
	keepLogs := true // the logs are removed after a run that went well
	defer func() {
		errs := demoStopAll(nodes)
		for _, err := range errs {
			fmt.Fprintf(stderr, "demo: %v\n", err)
		}
		os.RemoveAll(dataDir)
		if !keepLogs && len(errs) == 0 {
			os.RemoveAll(logDir)
		}
	}()
	for i, name := range names {
		if i == 1 {
			// The others start together, seeded by a.
			for _, n := range nodes {
				if err := n.waitReady(ctx); err != nil {
					return err
				}
			}
		}
		q := 0.0
		if quotas != nil {
			q = quotas[i]
		}
		seeds := ""
		if i > 0 {
			seeds = nodes[0].ready.Gossip
		}
		n, err := demoStart(exe, name, seeds, q, logDir, filepath.Join(dataDir, name), creds, files, logs)
		if err != nil {
			return err
		}
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		if err := n.waitReady(ctx); err != nil {
			return err
		}
	}
	via := nodes[0].ready.HTTP
	members, err := demoWaitMembers(ctx, via, *nodeCount)
	if err != nil {
		return err
	}
	for _, m := range members {
		fmt.Fprintf(stderr, "  node %s: gossip %s, %.1f GFLOP/s measured at start\n", m.Name, m.Gossip, m.Profile.GFLOPS)
	}
	fmt.Fprintf(stderr, "cluster ready after %.1f s\n", time.Since(start).Seconds())

	type outcome struct {
		res *job.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, _, err := followJob(via, spec, false, stdout, stderr)
		done <- outcome{res, err}
	}()
	if quotas != nil && *cut > 0 && len(nodes) > 1 {
		// Not the first node: it coordinates the job.
		go demoCutQuota(ctx, via, spec.ID, nodes[1], *cut, stderr)
	}
	var out outcome
	select {
	case <-ctx.Done():
		fmt.Fprintln(stderr, "\ninterrupted: stopping the nodes")
		keepLogs = false
		return errors.New("interrupted")
	case out = <-done:
	}
	if out.err != nil {
		return fmt.Errorf("%w (node logs in %s)", out.err, logDir)
	}
	fmt.Fprintf(stderr, "demo: %d nodes, final plan %s (%s), test accuracy %.4f, %.1f s in all\n",
		*nodeCount, out.res.Plan, out.res.Schedule, out.res.TestAccuracy, time.Since(start).Seconds())
	if err := demoCheckAccuracy(out.res, *minAcc, set["min-accuracy"], stderr); err != nil {
		return err
	}
	keepLogs = false
	return nil
}

// demoNode is one `ppnode join` child process.
type demoNode struct {
	name   string
	cmd    *exec.Cmd
	cgroup string
	log    *os.File
	readyc chan demoReady
	ready  demoReady
	exited chan struct{}
	err    error // the process's exit, valid after exited
}

// demoReady is a node's ready line.
type demoReady struct {
	Gossip string `json:"gossip"`
	HTTP   string `json:"http"`
}

// demoProbeCgroup returns why CPU quotas cannot be set here, or "".
func demoProbeCgroup() string {
	dir, err := demoMakeCgroup(fmt.Sprintf("ppnode-demo-%d-probe", os.Getpid()), 1)
	if err != nil {
		return fmt.Sprintf("no writable cgroup v1 cpu controller at %s: %v", demoCgroupRoot, err)
	}
	os.Remove(dir)
	return ""
}

// demoMakeCgroup makes a cgroup v1 CPU cgroup with a quota of quota CPUs.
func demoMakeCgroup(name string, quota float64) (string, error) {
	dir := filepath.Join(demoCgroupRoot, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte("100000"), 0)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(int(quota*100000))), 0)
	}
	if err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

// demoCreds creates a cluster's credentials in dir for nodes a, b, ...
// and makes the CLI use them.
func demoCreds(dir string, n int) error {
	if err := trust.Init(dir); err != nil {
		return err
	}
	for i := range n {
		if _, err := trust.Issue(dir, string(rune('a'+i)), trust.RoleNode, nil); err != nil {
			return err
		}
	}
	return useCreds(dir, "")
}

// demoStart starts `exe join` for one node, with dataDir as its data dir
// and its log as logs say; with quota > 0 the process enters its cgroup
// before it execs (a shell moves itself in, then execs the node), so the
// node's start-up profile sees its quota.
func demoStart(exe, name, seeds string, quota float64, logDir, dataDir, creds, files string, logs logFlags) (*demoNode, error) {
	args := []string{"join", "--name", name, "--bind", "127.0.0.1:0", "--http", "127.0.0.1:0", "--threads", "1", "--data-dir", dataDir, "--creds", creds,
		"--log-level", logs.level, "--log-format", logs.format}
	if seeds != "" {
		args = append(args, "--seeds", seeds)
	}
	if files != "" {
		args = append(args, "--files", files)
	}
	n := &demoNode{name: name, readyc: make(chan demoReady, 1), exited: make(chan struct{})}
	bin, argv := exe, args
	if quota > 0 {
		dir, err := demoMakeCgroup(fmt.Sprintf("ppnode-demo-%d-%s", os.Getpid(), name), quota)
		if err != nil {
			return nil, fmt.Errorf("node %s: CPU quota: %w", name, err)
		}
		n.cgroup = dir
		bin, argv = "/bin/sh", append([]string{"-c", `echo $$ > "$1/cgroup.procs" && shift && exec "$@"`, "sh", dir, exe}, args...)
	}
	log, err := os.Create(filepath.Join(logDir, name+".log"))
	if err != nil {
		os.Remove(n.cgroup)
		return nil, err
	}
	n.log = log
	n.cmd = exec.Command(bin, argv...)
	n.cmd.Stderr = log
	stdout, err := n.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	n.cmd.SysProcAttr = childAttrs()
	if err := n.cmd.Start(); err != nil {
		log.Close()
		os.Remove(n.cgroup)
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(log, sc.Text())
			if rest, ok := strings.CutPrefix(sc.Text(), "ready "); ok {
				var r demoReady
				if json.Unmarshal([]byte(rest), &r) == nil {
					select {
					case n.readyc <- r:
					default:
					}
				}
			}
		}
		io.Copy(io.Discard, stdout)
		n.err = n.cmd.Wait()
		close(n.exited)
	}()
	return n, nil
}

func (n *demoNode) waitReady(ctx context.Context) error {
	if n.ready.HTTP != "" {
		return nil
	}
	timer := time.NewTimer(demoReadyWithin)
	defer timer.Stop()
	select {
	case n.ready = <-n.readyc:
		return nil
	case <-n.exited:
		return fmt.Errorf("node %s exited before it was ready: %v (log: %s)", n.name, n.err, n.log.Name())
	case <-timer.C:
		return fmt.Errorf("node %s not ready within %v (log: %s)", n.name, demoReadyWithin, n.log.Name())
	case <-ctx.Done():
		return errors.New("interrupted")
	}
}

// demoStopAll sends every node SIGTERM, kills those that have not left
// after demoStopWithin, and removes their cgroups.
func demoStopAll(nodes []*demoNode) []error {
	for _, n := range nodes {
		n.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.Now().Add(demoStopWithin)
	var errs []error
	for _, n := range nodes {
		timer := time.NewTimer(time.Until(deadline))
		select {
		case <-n.exited:
		case <-timer.C:
			n.cmd.Process.Kill()
			<-n.exited
			errs = append(errs, fmt.Errorf("node %s did not leave within %v of SIGTERM; killed", n.name, demoStopWithin))
		}
		timer.Stop()
		if n.err != nil && !strings.Contains(n.err.Error(), "killed") {
			errs = append(errs, fmt.Errorf("node %s: %v (log: %s)", n.name, n.err, n.log.Name()))
		}
		n.log.Close()
		if n.cgroup != "" {
			if err := os.Remove(n.cgroup); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// demoWaitMembers waits until the node at via sees want alive members.
func demoWaitMembers(ctx context.Context, via string, want int) ([]nodes.MemberStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if st, err := api(via).Status(ctx); err == nil {
			var alive []nodes.MemberStatus
			for _, m := range st.Members {
				if m.State == nodes.MemberAlive {
					alive = append(alive, m)
				}
			}
			if len(alive) == want {
				return alive, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the nodes did not all see each other within 30 s: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// demoCheckAccuracy applies --min-accuracy (min; given: on the command
// line) to the demo's result. Its default is what mlp32 reaches on MNIST
// in an epoch: a shorter run (--steps) is not held to it, and a line on w
// says so; a --min-accuracy given applies whatever the run's length.
func demoCheckAccuracy(res *job.Result, min float64, given bool, w io.Writer) error {
	if min <= 0 {
		return nil
	}
	if res.Epochs < 1 && !given {
		fmt.Fprintf(w, "demo: %d steps are %.2f of an epoch: the accuracy check (%.2f, for an epoch or more) is skipped; give --min-accuracy to check anyway\n",
			res.Steps, res.Epochs, min)
		return nil
	}
	if res.TestAccuracy < min {
		return fmt.Errorf("test accuracy %.4f is below %.2f", res.TestAccuracy, min)
	}
	return nil
}

// demoCutQuota cuts n's CPU quota to a quarter of a CPU once the job has
// run the fraction at of its steps: another program taking the machine.
// The coordinator measures the slowdown and moves layers off n.
func demoCutQuota(ctx context.Context, via, id string, n *demoNode, at float64, w io.Writer) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		st, err := demoJob(ctx, via, id)
		if err != nil || st.Total == 0 {
			continue
		}
		if st.State.Ended() {
			return
		}
		if float64(st.Step) >= at*float64(st.Total) {
			err := os.WriteFile(filepath.Join(n.cgroup, "cpu.cfs_quota_us"), []byte("25000"), 0)
			if err != nil {
				fmt.Fprintf(w, "could not cut node %s's CPU quota: %v\n", n.name, err)
			} else {
				fmt.Fprintf(w, "step %d: node %s's CPU quota cut to 25%% (another program takes its machine); the plan follows\n", st.Step, n.name)
			}
			return
		}
	}
}

// demoJob asks the node at addr for a job's status.
func demoJob(ctx context.Context, addr, id string) (nodes.JobStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return api(addr).Job(ctx, id)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
