package integration

import (
	"bufio"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
)

// The soak is a benchmark, not a timed test: it runs only when given a
// duration (README, "Soak").
var (
	soakFor   = flag.Duration("soak", 0, "run TestSoak this long (0: skip it)")
	soakNodes = flag.Int("soak-nodes", 8, "TestSoak's nodes")
	soakSeed  = flag.Uint64("soak-seed", 1, "TestSoak's seed (faults, their times, the jobs)")
	soakOut   = flag.String("soak-out", "", "TestSoak's directory for samples.csv and faults.log (default: a temporary one)")
	soakNetns = flag.Bool("soak-netns", true, "TestSoak's nodes each in a network namespace, and link cuts among its faults (skipped where namespaces cannot be made)")
)

// soakQuotas are the CPU quotas a quota fault chooses from.
var soakQuotas = []float64{0.25, 0.5, 1}

// TestSoak runs a cluster for -soak while deterministic jobs (GPipe,
// 1F1B, zero-bubble or interleaved) run back to back and faults come at
// random times: SIGKILL and restart, SIGSTOP and SIGCONT, a graceful leave
// and a join, a CPU quota change, and (with -soak-netns) a cut of the links
// between a node and another. One fault at a time; after it the next waits
// until every node sees every other alive. Every finished job's weights
// must equal those of the same spec trained in one process. Every 30 s it
// records each node's RSS, goroutines and open files, and at the end
// compares each node's medians of the first and last ten minutes; every
// node process's log is kept in the output directory's logs/.
func TestSoak(t *testing.T) {
	if *soakFor == 0 {
		t.Skip("a benchmark: set -soak DURATION")
	}
	RequireCPUQuota(t)
	out := *soakOut
	if out == "" {
		out = t.TempDir()
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	flog, err := os.Create(filepath.Join(out, "faults.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer flog.Close()
	var logMu sync.Mutex
	logf := func(format string, a ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		line := time.Now().UTC().Format("15:04:05 ") + fmt.Sprintf(format, a...)
		fmt.Fprintln(flog, line)
		t.Log(line)
	}
	r := rand.New(rand.NewPCG(*soakSeed, 7))
	opts := make([]NodeOptions, *soakNodes)
	for i := range opts {
		opts[i] = NodeOptions{Name: string(rune('a' + i)), Threads: 1, CPUQuota: 1, Args: []string{"--pprof", "--handshake-timeout", "2s"}}
	}
	var c *Cluster
	if *soakNetns {
		RequireNetns(t)
		c = NewNetCluster(t)
	} else {
		c = NewCluster(t)
	}
	c.LogDir = filepath.Join(out, "logs")
	if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
		t.Fatal(err)
	}
	c.StartAll(opts...)
	s := &soak{t: t, c: c, opts: opts, logf: logf, start: time.Now()}
	waitMembers(t, c.Node("a"), len(opts))

	end := time.Now().Add(*soakFor)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() { s.jobs(rand.New(rand.NewPCG(*soakSeed, 11)), stop) })
	wg.Go(func() { s.sample(out, stop) })
	for time.Now().Before(end) {
		wait := time.Duration(3000+r.IntN(9000)) * time.Millisecond
		select {
		case <-time.After(wait): // the time between faults is the soak's input
		case <-s.failed():
		}
		if s.fatal() != nil {
			break
		}
		s.fault(r)
	}
	close(stop)
	wg.Wait()
	s.report(out)
}

type soak struct {
	t     *testing.T
	c     *Cluster
	opts  []NodeOptions
	logf  func(string, ...any)
	start time.Time

	mu       sync.Mutex // guards the fields below
	faults   map[string]int
	jobsRun  int
	jobsDone int
	jobsFail []string
	mismatch []string
	err      error
	errc     chan struct{}
	busy     map[string]bool // nodes a fault holds down or is restarting
	unsent   int             // submissions to a node that went down under them
	samples  []soakSample
}

type soakSample struct {
	at                     time.Duration
	node                   string
	rssKB, goroutines, fds int
}

func (s *soak) failed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.errc == nil {
		s.errc = make(chan struct{})
	}
	return s.errc
}

func (s *soak) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
		if s.errc == nil {
			s.errc = make(chan struct{})
		}
		close(s.errc)
	}
}

func (s *soak) fatal() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// live returns the newest process of each node name that runs and is not
// paused.
func (s *soak) live() []*Node {
	byName := map[string]*Node{}
	for _, n := range s.c.Nodes() {
		byName[n.opts.Name] = n // the newest wins
	}
	var ns []*Node
	s.mu.Lock()
	busy := maps.Clone(s.busy)
	s.mu.Unlock()
	for _, o := range s.opts {
		n := byName[o.Name]
		if busy[o.Name] {
			continue
		}
		select {
		case <-n.exited:
			continue
		default:
		}
		if !n.isPaused() {
			ns = append(ns, n)
		}
	}
	return ns
}

// fault injects one fault on a random node and returns when the node is
// back and every node sees all of them alive.
func (s *soak) fault(r *rand.Rand) {
	live := s.live()
	n := live[r.IntN(len(live))]
	name := n.opts.Name
	kinds := []string{"kill", "stop", "leave", "quota"}
	if s.c.Network() != nil && len(live) > 1 {
		kinds = append(kinds, "cut")
	}
	kind := kinds[r.IntN(len(kinds))]
	hold := time.Duration(500+r.IntN(4500)) * time.Millisecond
	other := "" // a cut's other end
	if kind == "cut" {
		for other == "" || other == name {
			other = live[r.IntN(len(live))].opts.Name
		}
		s.logf("fault cut between %s and %s (%v)", name, other, hold)
	} else {
		s.logf("fault %s on %s (%v)", kind, name, hold)
	}
	s.setBusy(name, true)
	var err error
	switch kind {
	case "kill":
		s.c.Kill(n)
		time.Sleep(hold) // the machine stays down this long
		err = s.restart(name)
	case "stop":
		if err = s.c.Pause(n); err == nil {
			time.Sleep(hold)
			err = s.c.Resume(n)
		}
	case "leave":
		if err = s.c.Stop(n); err == nil {
			time.Sleep(hold)
			err = s.restart(name)
		}
	case "cut":
		if err = s.c.Network().Cut(name, other); err == nil {
			time.Sleep(hold)
			err = s.c.Network().Restore(name, other)
		}
	case "quota":
		q := soakQuotas[r.IntN(len(soakQuotas))]
		kind = fmt.Sprintf("quota %.2f", q)
		err = os.WriteFile(filepath.Join(n.cgroup, "cpu.cfs_quota_us"), []byte(strconv.Itoa(int(q*cfsPeriodUS))), 0)
	}
	s.setBusy(name, false)
	s.mu.Lock()
	if s.faults == nil {
		s.faults = map[string]int{}
	}
	s.faults[strings.Fields(kind)[0]]++
	s.mu.Unlock()
	if err != nil {
		s.fail(fmt.Errorf("fault %s on %s: %w", kind, name, err))
		return
	}
	// The next fault waits until the cluster is whole again.
	why := ""
	err = Poll("every node alive", 2*time.Minute, 200*time.Millisecond, func() (bool, error) {
		live := s.live()
		for _, m := range live {
			st, err := m.Status()
			switch {
			case err != nil:
				why = fmt.Sprintf("%s: %v", m.opts.Name, err)
				return false, nil
			case len(Alive(st)) != len(s.opts):
				why = fmt.Sprintf("%s sees %v alive", m.opts.Name, Alive(st))
				return false, nil
			}
		}
		why = fmt.Sprintf("%d nodes running", len(live))
		return len(live) == len(s.opts), nil
	})
	if err != nil {
		s.fail(fmt.Errorf("after %s on %s: %w (%s)", kind, name, err, why))
	}
}

func (s *soak) setBusy(name string, b bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy == nil {
		s.busy = map[string]bool{}
	}
	s.busy[name] = b
}

// restart starts node name again and waits until it is ready.
func (s *soak) restart(name string) error {
	for _, o := range s.opts {
		if o.Name == name {
			n, err := s.c.Start(o)
			if err != nil {
				return err
			}
			return n.WaitReady(time.Minute)
		}
	}
	return fmt.Errorf("no node %s", name)
}

// jobs runs deterministic jobs back to back, each submitted to a live
// node, and checks every finished one's weights.
func (s *soak) jobs(r *rand.Rand, stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		spec := failoverSpec()
		spec.ID = fmt.Sprintf("soak-%d", i)
		spec.Steps, spec.Epochs = 60+20*r.IntN(8), 100
		spec.CheckpointEvery = 10 * (1 + r.IntN(3))
		spec.Schedule = []string{"1f1b", "gpipe", "zb", "interleaved"}[r.IntN(4)]
		spec.Partition = []string{"uniform", "auto"}[r.IntN(2)]
		if spec.Schedule == "interleaved" {
			// Its nodes must divide the micro-batches (4).
			spec.Chunks, spec.MaxNodes = 2, 2*(1+r.IntN(2))
		}
		want, err := FaultFreeSHA(spec)
		if err != nil {
			s.fail(fmt.Errorf("job %s in one process: %w", spec.ID, err))
			return
		}
		live := s.live()
		if len(live) == 0 {
			continue
		}
		via := live[r.IntN(len(live))]
		s.mu.Lock()
		s.jobsRun++
		s.mu.Unlock()
		sub, err := via.Submit(spec)
		if err != nil {
			// The node went down after it was chosen: a client tries
			// another.
			s.logf("job %s not submitted: %s: %v", spec.ID, via.opts.Name, err)
			s.mu.Lock()
			s.jobsRun--
			s.unsent++
			s.mu.Unlock()
			continue
		}
		st, err := s.await(sub.ID, stop)
		switch {
		case errors.Is(err, errSoakStopped):
			return
		case err != nil:
			s.jobFailed(spec.ID, err)
		case st.State != job.StateDone:
			s.jobFailed(spec.ID, fmt.Errorf("%s at step %d: %s", st.State, st.Step, st.Error))
		case st.Result == nil || st.Result.WeightsSHA256 != want:
			got := "none"
			if st.Result != nil {
				got = st.Result.WeightsSHA256
			}
			s.logf("job %s: weights %s, one process %s", spec.ID, got, want)
			s.mu.Lock()
			s.mismatch = append(s.mismatch, spec.ID)
			s.mu.Unlock()
		default:
			s.logf("job %s done at step %d (%s, %s), %d recoveries, weights equal one process's", spec.ID, st.Step, spec.Partition, spec.Schedule, len(st.Recoveries))
			s.mu.Lock()
			s.jobsDone++
			s.mu.Unlock()
		}
	}
}

var errSoakStopped = errors.New("soak over")

// await follows job id through whichever live node answers, until it ends.
func (s *soak) await(id string, stop <-chan struct{}) (job.Status, error) {
	deadline := time.Now().Add(10 * time.Minute)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		select {
		case <-stop:
			return job.Status{}, errSoakStopped
		case <-tick.C:
		}
		coordinated := false
		for _, n := range s.live() {
			st, err := n.Job(id)
			if err != nil {
				continue
			}
			if st.State.Ended() {
				return st, nil
			}
			coordinated = true
			break
		}
		if coordinated {
			continue
		}
		// No node coordinates it: a holder's record may say how it ended.
		for _, n := range s.live() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			rec, err := n.Client().Record(ctx, id)
			cancel()
			switch {
			case err != nil:
			case rec.State == nodes.RecordFailed:
				return job.Status{}, fmt.Errorf("its record on %s says it failed: %s", n.opts.Name, rec.Error)
			case rec.State == nodes.RecordDone && rec.Result != nil:
				return job.Status{State: job.StateDone, Step: rec.Result.Steps, Result: rec.Result}, nil
			}
		}
	}
	return job.Status{}, fmt.Errorf("job %s did not end within 10 min", id)
}

func (s *soak) jobFailed(id string, err error) {
	s.logf("job %s failed: %v", id, err)
	s.mu.Lock()
	s.jobsFail = append(s.jobsFail, id+": "+err.Error())
	s.mu.Unlock()
}

// sample records every 30 s each live node's RSS, goroutines and open
// files in dir/samples.csv, and every five minutes its heap profile in
// dir/heap-NODE-PID-SECONDS.pb.gz, with its memory statistics in .txt
// (what an RSS that grows holds).
func (s *soak) sample(dir string, stop <-chan struct{}) {
	f, err := os.Create(filepath.Join(dir, "samples.csv"))
	if err != nil {
		s.fail(err)
		return
	}
	defer f.Close()
	w := csv.NewWriter(f)
	w.Write([]string{"seconds", "node", "pid", "rss_kb", "goroutines", "open_files"})
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		for _, n := range s.live() {
			pid := n.cmd.Process.Pid
			rss, err1 := procStatusKB(pid, "VmRSS")
			fds, err2 := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			g, err3 := goroutines(n)
			if err1 != nil || err2 != nil || err3 != nil {
				continue // exiting or stopped under us
			}
			at := time.Since(s.start)
			if int(at.Seconds())%300 < 30 {
				name := fmt.Sprintf("heap-%s-%d-%d", n.opts.Name, pid, int(at.Seconds()))
				for p, file := range map[string]string{"heap": name + ".pb.gz", "heap?debug=1": name + ".txt"} {
					if err := saveProfile(n, p, filepath.Join(dir, file)); err != nil {
						s.logf("heap profile of %s: %v", n.opts.Name, err)
					}
				}
			}
			w.Write([]string{strconv.Itoa(int(at.Seconds())), n.opts.Name, strconv.Itoa(pid), strconv.Itoa(rss), strconv.Itoa(g), strconv.Itoa(len(fds))})
			s.mu.Lock()
			s.samples = append(s.samples, soakSample{at, n.opts.Name, rss, g, len(fds)})
			s.mu.Unlock()
		}
		w.Flush()
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// saveProfile writes the node's named profile to path.
func saveProfile(n *Node, profile, path string) error {
	resp, err := n.client.Get("https://" + n.HTTP + "/debug/pprof/" + profile)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", profile, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func procStatusKB(pid int, field string) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// goroutines reads the node's goroutine count from its profiler.
func goroutines(n *Node) (int, error) {
	resp, err := n.client.Get("https://" + n.HTTP + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(io.LimitReader(resp.Body, 4096)).ReadString('\n')
	if err != nil {
		return 0, err
	}
	v, ok := strings.CutPrefix(strings.TrimSpace(line), "goroutine profile: total ")
	if !ok {
		return 0, fmt.Errorf("goroutine profile starts %q", line)
	}
	return strconv.Atoi(v)
}

// report logs the totals and, per node, the medians of the first and last
// ten minutes (of the first and last third for a shorter soak).
func (s *soak) report(out string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	total := time.Since(s.start)
	window := min(10*time.Minute, total/3)
	var kinds []string
	sum := 0
	for k, v := range s.faults {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, v))
		sum += v
	}
	slices.Sort(kinds)
	s.logf("soak of %v: %d faults (%s); jobs: %d submitted (%d more refused by a node going down), %d done with the weights of one process, %d failed, %d with other weights",
		total.Round(time.Second), sum, strings.Join(kinds, ", "), s.jobsRun, s.unsent, s.jobsDone, len(s.jobsFail), len(s.mismatch))
	for _, f := range s.jobsFail {
		s.logf("failed: %s", f)
	}
	s.logf("per node, median of the first %v -> of the last %v: RSS MB, goroutines, open files", window, window)
	for _, o := range s.opts {
		var first, last [3][]int
		for _, sm := range s.samples {
			if sm.node != o.Name {
				continue
			}
			v := [3]int{sm.rssKB / 1024, sm.goroutines, sm.fds}
			for k := range v {
				if sm.at <= window {
					first[k] = append(first[k], v[k])
				}
				if sm.at >= total-window {
					last[k] = append(last[k], v[k])
				}
			}
		}
		s.logf("  %s: RSS %d -> %d, goroutines %d -> %d, open files %d -> %d", o.Name,
			medianInt(first[0]), medianInt(last[0]), medianInt(first[1]), medianInt(last[1]), medianInt(first[2]), medianInt(last[2]))
	}
	s.logf("samples in %s", filepath.Join(out, "samples.csv"))
	if s.err != nil {
		s.t.Errorf("soak stopped: %v", s.err)
	}
	if len(s.mismatch) > 0 {
		s.t.Errorf("jobs with other weights than one process's: %v", s.mismatch)
	}
}

func medianInt(x []int) int {
	if len(x) == 0 {
		return -1
	}
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}
