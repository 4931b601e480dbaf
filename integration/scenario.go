package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/ppnode/ppnode/job"
)

// Scenarios (see the package doc, "Scenarios") are fault-injection tests
// written as cockroachdb/datadriven scripts: a directive a step, its
// arguments key=value (values with blanks in parentheses), free text
// (a log line to wait for) below it, and "----" with an empty expected
// output: a directive that does not hold fails the test, naming the file
// and line.

// Default deadlines of the scenario directives (within=D overrides them).
const (
	scenarioStepWait  = 2 * time.Minute // at step, wait recovery, wait state
	scenarioJobWait   = 3 * time.Minute // expect: the job's end
	scenarioEventWait = 30 * time.Second
	// watchInterval is how often a scenario reads its job's status; it
	// bounds the resolution of the measured recovery times.
	watchInterval = 10 * time.Millisecond
)

// RunScenarios runs every scenario file in dir, each as a subtest named
// after the file.
func RunScenarios(t *testing.T, dir string) {
	datadriven.Walk(t, dir, func(t *testing.T, path string) {
		t.Parallel() // they mostly wait: for failure detection, timeouts, keepalives
		s := &scenario{t: t, name: strings.TrimSuffix(filepath.Base(path), ".txt")}
		defer s.report() // a failed scenario's figures too
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if err := s.exec(d); err != nil {
				d.Fatalf(t, "%v", err)
			}
			return ""
		})
	})
}

// scenario is the state of a running scenario.
type scenario struct {
	t       *testing.T
	name    string
	c       *Cluster
	threads int
	spec    job.Spec
	via     *Node     // the node the job was submitted to (its coordinator)
	w       *jobWatch // nil before train
	faults  []fault
}

// fault is a fault the scenario injected that a recovery should follow.
type fault struct {
	what string
	at   time.Time
	// ended is when a stop was continued (zero: not yet, or not a stop).
	ended time.Time
	// recovery is the index of the recovery expected to follow: the
	// number of recoveries listed when the fault was injected.
	recovery int
}

// args are a directive's arguments, by key.
type args map[string][]string

// parseArgs collects d's arguments; keys must be in allowed.
func parseArgs(d *datadriven.TestData, allowed ...string) (args, error) {
	a := args{}
	for _, ca := range d.CmdArgs {
		if !slices.Contains(allowed, ca.Key) {
			return nil, fmt.Errorf("%s: unknown argument %q (have %s)", d.Cmd, ca.Key, strings.Join(allowed, ", "))
		}
		if _, dup := a[ca.Key]; dup {
			return nil, fmt.Errorf("%s: %s given twice", d.Cmd, ca.Key)
		}
		a[ca.Key] = ca.Vals
	}
	return a, nil
}

// get is the single value of key (ok false if absent).
func (a args) get(key string) (string, bool, error) {
	vs, ok := a[key]
	switch {
	case !ok:
		return "", false, nil
	case len(vs) != 1:
		return "", false, fmt.Errorf("%s: want one value, got %q", key, vs)
	}
	return vs[0], true, nil
}

// num is the integer value of key (def if absent).
func (a args) num(key string, def int) (int, error) {
	v, ok, err := a.get(key)
	if err != nil || !ok {
		return def, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s=%s: want an integer", key, v)
	}
	return n, nil
}

// within is the value of within= (def if absent).
func (a args) within(def time.Duration) (time.Duration, error) {
	v, ok, err := a.get("within")
	if err != nil || !ok {
		return def, err
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("within=%s: want a positive duration", v)
	}
	return d, nil
}

// node is the one node a directive names (kill c).
func oneNode(d *datadriven.TestData) (string, error) {
	if len(d.CmdArgs) != 1 || len(d.CmdArgs[0].Vals) != 0 {
		return "", fmt.Errorf("usage: %s NODE", d.Cmd)
	}
	return d.CmdArgs[0].Key, nil
}

func (s *scenario) exec(d *datadriven.TestData) error {
	switch d.Cmd {
	case "slow":
		if testing.Short() {
			s.t.Skip("slow scenario: skipped with -short")
		}
		return nil
	case "start":
		a, err := parseArgs(d, "n", "threads", "quota", "netns", "handshake")
		if err != nil {
			return err
		}
		return s.start(a)
	case "train":
		a, err := parseArgs(d, "model", "width", "data", "samples", "batch", "micro", "epochs", "steps", "partition",
			"schedule", "checkpoint_every", "optimizer", "lr", "seed", "max_nodes", "no_rebalance", "via", "id")
		if err != nil {
			return err
		}
		return s.train(a)
	case "at":
		a, err := parseArgs(d, "step")
		if err != nil {
			return err
		}
		n, err := a.num("step", 0)
		if err != nil || n < 1 {
			return fmt.Errorf("usage: at step=N (N >= 1): %v", err)
		}
		return s.atStep(n)
	case "kill", "stop", "cont", "leave":
		name, err := oneNode(d)
		if err != nil {
			return err
		}
		return s.signal(d.Cmd, name)
	case "cut", "restore":
		if len(d.CmdArgs) != 2 {
			return fmt.Errorf("usage: %s NODE NODE", d.Cmd)
		}
		return s.link(d.Cmd, d.CmdArgs[0].Key, d.CmdArgs[1].Key)
	case "wait":
		a, err := parseArgs(d, "recovery", "state", "alive", "log", "within")
		if err != nil {
			return err
		}
		return s.wait(a, strings.TrimSpace(d.Input))
	case "expect":
		a, err := parseArgs(d, "done", "failed", "recoveries", "replans", "min_replans", "max_replayed", "max_recovery_ms",
			"sha", "cause", "replan", "error", "within")
		if err != nil {
			return err
		}
		return s.expect(a)
	}
	return fmt.Errorf("unknown directive %q (have slow, start, train, at, kill, stop, cont, leave, cut, restore, wait, expect)", d.Cmd)
}

// start n=N [threads=T] [quota=(Q, Q, ...)] [netns] [handshake=D]: nodes
// a, b, c, ..., once the first sees them all alive; handshake is their
// --handshake-timeout (which also bounds their link dials).
func (s *scenario) start(a args) error {
	if s.c != nil {
		return errors.New("the cluster is already started")
	}
	n, err := a.num("n", 0)
	if err != nil || n < 1 || n > 26 {
		return fmt.Errorf("start n=N: want 1 to 26 nodes (%v)", err)
	}
	if s.threads, err = a.num("threads", 1); err != nil || s.threads < 1 {
		return fmt.Errorf("threads: want a positive number (%v)", err)
	}
	opts := make([]NodeOptions, n)
	for i := range opts {
		opts[i] = NodeOptions{Name: string(rune('a' + i)), Threads: s.threads}
	}
	if hs, ok := a["handshake"]; ok {
		if d, err := time.ParseDuration(hs[0]); len(hs) != 1 || err != nil || d <= 0 {
			return fmt.Errorf("handshake=%v: want one duration", hs)
		}
		for i := range opts {
			opts[i].Args = append(opts[i].Args, "--handshake-timeout", hs[0])
		}
	}
	if qs, ok := a["quota"]; ok {
		if len(qs) != n {
			return fmt.Errorf("quota=%v: want one quota per node (%d)", qs, n)
		}
		for i, q := range qs {
			f, err := strconv.ParseFloat(q, 64)
			if err != nil || f < 0 || f > 64 {
				return fmt.Errorf("quota %q: want CPUs, 0 for none", q)
			}
			opts[i].CPUQuota = f
		}
		RequireCPUQuota(s.t)
	}
	if _, ok := a["netns"]; ok {
		s.c = NewNetCluster(s.t)
	} else {
		s.c = NewCluster(s.t)
	}
	s.c.StartAll(opts...)
	first := s.c.Node("a")
	var last []string
	err = Poll(fmt.Sprintf("node a sees %d members", n), scenarioEventWait, 20*time.Millisecond, func() (bool, error) {
		st, err := first.Status()
		if err != nil {
			return false, err
		}
		last = Alive(st)
		return len(last) == n, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last: %v)", err, last)
	}
	return nil
}

func (s *scenario) node(name string) (*Node, error) {
	if s.c == nil {
		return nil, errors.New("no cluster: start one first")
	}
	n := s.c.Node(name)
	if n == nil {
		return nil, fmt.Errorf("no node %q", name)
	}
	return n, nil
}

// train model=M key=value...: submits a deterministic job (threads as
// the nodes') and follows it.
func (s *scenario) train(a args) error {
	if s.c == nil {
		return errors.New("no cluster: start one first")
	}
	if s.w != nil {
		return errors.New("a scenario trains one job")
	}
	spec := job.DefaultSpec()
	spec.ID = strings.ReplaceAll(s.name, "_", "-")
	spec.Epochs, spec.Deterministic, spec.Threads = 10, true, s.threads
	ints := map[string]*int{"samples": &spec.SyntheticSamples, "batch": &spec.Batch, "micro": &spec.MicroBatches,
		"epochs": &spec.Epochs, "steps": &spec.Steps, "checkpoint_every": &spec.CheckpointEvery, "max_nodes": &spec.MaxNodes}
	strs := map[string]*string{"model": &spec.Model, "data": &spec.Data, "partition": &spec.Partition, "schedule": &spec.Schedule,
		"optimizer": &spec.Optimizer, "id": &spec.ID}
	floats := map[string]*float64{"width": &spec.Width, "lr": &spec.LR}
	via := "a"
	if ps := a["partition"]; len(ps) > 1 { // a stage's replicas: "@a,b" read as a list
		a["partition"] = []string{strings.Join(ps, ",")}
	}
	for k := range a {
		v, _, err := a.get(k)
		switch {
		case err != nil:
		case ints[k] != nil:
			*ints[k], err = strconv.Atoi(v)
		case strs[k] != nil:
			*strs[k] = v
		case floats[k] != nil:
			*floats[k], err = strconv.ParseFloat(v, 64)
		case k == "seed":
			spec.Seed, err = strconv.ParseUint(v, 10, 64)
		case k == "no_rebalance":
			spec.NoRebalance, err = strconv.ParseBool(v)
		case k == "via":
			via = v
		}
		if err != nil {
			return fmt.Errorf("%s=%s: %v", k, v, err)
		}
	}
	var err error
	if s.via, err = s.node(via); err != nil {
		return err
	}
	s.spec = spec
	rep, err := s.via.Submit(spec)
	if err != nil {
		return err
	}
	s.t.Logf("job %s: plan %s", rep.ID, rep.Plan)
	s.w = watchJob(s.t, s.via, rep.ID)
	return nil
}

func (s *scenario) job() (*jobWatch, error) {
	if s.w == nil {
		return nil, errors.New("no job: train one first")
	}
	return s.w, nil
}

// atStep waits until the job has trained n steps and still trains.
func (s *scenario) atStep(n int) error {
	w, err := s.job()
	if err != nil {
		return err
	}
	return w.wait(fmt.Sprintf("step %d", n), scenarioStepWait, func(st job.Status) (bool, error) {
		switch {
		case st.State.Ended():
			return false, fmt.Errorf("the job is %s at step %d/%d, before step %d: make it longer", st.State, st.Step, st.Total, n)
		case st.State == job.StateTraining && st.Step >= n:
			return true, nil
		}
		return false, nil
	})
}

// signal: kill (SIGKILL), stop (SIGSTOP), cont (SIGCONT), leave (SIGTERM,
// until the node has left).
func (s *scenario) signal(verb, name string) error {
	n, err := s.node(name)
	if err != nil {
		return err
	}
	switch verb {
	case "kill":
		s.noteFault("kill " + name)
		s.c.Kill(n)
		return nil
	case "stop":
		s.noteFault("stop " + name)
		return s.c.Pause(n)
	case "cont":
		for i := len(s.faults) - 1; i >= 0; i-- {
			if f := &s.faults[i]; f.what == "stop "+name && f.ended.IsZero() {
				f.ended = time.Now()
				break
			}
		}
		return s.c.Resume(n)
	}
	if err := s.c.Stop(n); err != nil {
		return fmt.Errorf("node %s did not leave cleanly: %w", name, err)
	}
	return nil
}

func (s *scenario) noteFault(what string) {
	f := fault{what: what, at: time.Now()}
	if s.w != nil {
		f.recovery = len(s.w.status().Recoveries)
	}
	s.faults = append(s.faults, f)
}

func (s *scenario) link(verb, x, y string) error {
	if s.c == nil || s.c.Network() == nil {
		return fmt.Errorf("%s link needs a cluster in network namespaces (start ... netns)", verb)
	}
	for _, name := range []string{x, y} {
		if _, err := s.node(name); err != nil {
			return err
		}
	}
	if verb == "cut" {
		s.noteFault("cut link " + x + " " + y)
		return s.c.Network().Cut(x, y)
	}
	return s.c.Network().Restore(x, y)
}

// wait recovery=N | state=S | alive=(NODE, MEMBER) | log=NODE with the
// text as input; each with an optional within=D.
func (s *scenario) wait(a args, text string) error {
	switch {
	case a["recovery"] != nil:
		d, err := a.within(scenarioStepWait)
		if err != nil {
			return err
		}
		n, err := a.num("recovery", 0)
		if err != nil || n < 1 {
			return fmt.Errorf("wait recovery=N: want a positive number (%v)", err)
		}
		jw, err := s.job()
		if err != nil {
			return err
		}
		return jw.wait(fmt.Sprintf("recovery %d and a step after it", n), d, func(st job.Status) (bool, error) {
			if len(st.Recoveries) >= n && jw.stepsAfter() >= n {
				return true, nil
			}
			if st.State.Ended() {
				return false, fmt.Errorf("the job is %s (%s) with %d recoveries", st.State, st.Error, len(st.Recoveries))
			}
			return false, nil
		})
	case a["state"] != nil:
		d, err := a.within(scenarioStepWait)
		if err != nil {
			return err
		}
		want, _, err := a.get("state")
		if err != nil {
			return err
		}
		jw, err := s.job()
		if err != nil {
			return err
		}
		return jw.wait("state "+want, d, func(st job.Status) (bool, error) {
			if string(st.State) == want {
				return true, nil
			}
			if st.State.Ended() {
				return false, fmt.Errorf("the job is %s (%s)", st.State, st.Error)
			}
			return false, nil
		})
	case a["alive"] != nil:
		d, err := a.within(scenarioEventWait)
		if err != nil {
			return err
		}
		if len(a["alive"]) != 2 {
			return errors.New("usage: wait alive=(NODE, MEMBER)")
		}
		node, member := a["alive"][0], a["alive"][1]
		n, err := s.node(node)
		if err != nil {
			return err
		}
		var last []string
		err = Poll(fmt.Sprintf("node %s sees %s alive", node, member), d, 20*time.Millisecond, func() (bool, error) {
			st, err := n.Status()
			if err != nil {
				return false, err
			}
			last = Alive(st)
			return slices.Contains(last, member), nil
		})
		if err != nil {
			return fmt.Errorf("%w (alive: %v)", err, last)
		}
		return nil
	case a["log"] != nil:
		d, err := a.within(scenarioEventWait)
		if err != nil {
			return err
		}
		name, _, err := a.get("log")
		if err != nil || text == "" {
			return fmt.Errorf("usage: wait log=NODE, the text below it (%v)", err)
		}
		n, err := s.node(name)
		if err != nil {
			return err
		}
		line, err := n.WaitLog(text, d)
		if err == nil {
			s.t.Logf("node %s: %s", name, line)
		}
		return err
	}
	return errors.New("usage: wait recovery=N | state=S | alive=(NODE, MEMBER) | log=NODE [within=D]")
}

// expect done|failed CHECK...: waits for the job's end (within=D) and
// checks it: recoveries=N replans=N min_replans=N (counts),
// max_replayed=N max_recovery_ms=N (every recovery's), sha=fault-free|HEX
// (fault-free: the weights of the job trained in this process),
// cause=(TEXT) replan=(TEXT) error=(TEXT) (every recovery's cause, every
// re-plan's reason, the error contain TEXT).
func (s *scenario) expect(a args) error {
	jw, err := s.job()
	if err != nil {
		return err
	}
	_, done := a["done"]
	_, failed := a["failed"]
	if done == failed {
		return errors.New("usage: expect done|failed CHECK...")
	}
	d, err := a.within(scenarioJobWait)
	if err != nil {
		return err
	}
	err = jw.wait("the job's end", d, func(st job.Status) (bool, error) { return st.State.Ended(), nil })
	if err != nil {
		return err
	}
	st := jw.status()
	s.t.Logf("job %s: %s at step %d/%d; plan %s; recoveries %+v; re-plans %+v", st.ID, st.State, st.Step, st.Total, st.Plan, st.Recoveries, st.Replans)
	if want := map[bool]job.State{true: job.StateDone, false: job.StateFailed}[done]; st.State != want {
		return fmt.Errorf("the job is %s (%s), want %s", st.State, st.Error, want)
	}
	var errs []error
	for key := range a {
		if key != "done" && key != "failed" && key != "within" {
			errs = append(errs, s.check(st, a, key))
		}
	}
	return errors.Join(errs...)
}

// check checks st against the expectation key of a.
func (s *scenario) check(st job.Status, a args, key string) error {
	val, _, err := a.get(key)
	if err != nil {
		return err
	}
	num := func(got float64, cmp func(got, want float64) bool, what string) error {
		want, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return fmt.Errorf("%s=%s: want a number", key, val)
		}
		if !cmp(got, want) {
			return fmt.Errorf("%s: got %v%s", key+"="+val, got, what)
		}
		return nil
	}
	eq := func(g, w float64) bool { return g == w }
	atLeast := func(g, w float64) bool { return g >= w }
	atMost := func(g, w float64) bool { return g <= w }
	contains := func(texts []string) error {
		if len(texts) == 0 {
			return fmt.Errorf("%s: nothing to contain %q", key, val)
		}
		for _, t := range texts {
			if !strings.Contains(t, val) {
				return fmt.Errorf("%s: %q does not contain %q", key, t, val)
			}
		}
		return nil
	}
	switch key {
	case "recoveries":
		return num(float64(len(st.Recoveries)), eq, "")
	case "replans":
		return num(float64(len(st.Replans)), eq, "")
	case "min_replans":
		return num(float64(len(st.Replans)), atLeast, "")
	case "max_replayed":
		var errs []error
		for i, r := range st.Recoveries {
			errs = append(errs, num(float64(r.Replayed), atMost, fmt.Sprintf(" (recovery %d)", i+1)))
		}
		return errors.Join(errs...)
	case "max_recovery_ms":
		var errs []error
		for _, m := range s.measure() {
			if m.faultToStep > 0 {
				errs = append(errs, num(float64(m.faultToStep.Milliseconds()), atMost, fmt.Sprintf(" (%s)", m.fault.what)))
			}
		}
		return errors.Join(errs...)
	case "cause":
		var texts []string
		for _, r := range st.Recoveries {
			texts = append(texts, r.Cause)
		}
		return contains(texts)
	case "replan":
		var texts []string
		for _, r := range st.Replans {
			texts = append(texts, r.Reason)
		}
		return contains(texts)
	case "error":
		return contains([]string{st.Error})
	case "sha":
		if st.Result == nil {
			return errors.New("the job has no result")
		}
		want := val
		if val == "fault-free" {
			if want, err = FaultFreeSHA(s.spec); err != nil {
				return err
			}
		}
		if st.Result.WeightsSHA256 != want {
			return fmt.Errorf("weights_sha256 %s, want %s (%s)", st.Result.WeightsSHA256, want, val)
		}
		return nil
	}
	return fmt.Errorf("unknown check %q", key)
}

// measurement is what one fault cost: from the fault to the first step
// completed after the recovery that followed it (as this process saw it,
// within watchInterval), and the recovery as the coordinator reported it.
type measurement struct {
	fault       fault
	faultToStep time.Duration // 0: no recovery followed
	recovery    job.Recovery
}

func (s *scenario) measure() []measurement {
	if s.w == nil {
		return nil
	}
	st := s.w.status()
	after := s.w.stepTimes()
	var out []measurement
	for _, f := range s.faults {
		m := measurement{fault: f}
		if f.recovery < len(st.Recoveries) && f.recovery < len(after) {
			m.recovery = st.Recoveries[f.recovery]
			m.faultToStep = after[f.recovery].Sub(f.at)
		}
		out = append(out, m)
	}
	return out
}

// report logs each fault's recovery, one line each starting "measure:".
func (s *scenario) report() {
	for i, m := range s.measure() {
		if m.faultToStep == 0 {
			s.t.Logf("measure: scenario=%s fault=%d what=%q recovered=false", s.name, i+1, m.fault.what)
			continue
		}
		r := m.recovery
		held := ""
		if !m.fault.ended.IsZero() {
			held = fmt.Sprintf(" held_ms=%.0f", job.Millis(m.fault.ended.Sub(m.fault.at)))
		}
		s.t.Logf("measure: scenario=%s fault=%d what=%q recovery_ms=%.1f detect_ms=%.1f restore_ms=%.1f replayed=%d%s cause=%q",
			s.name, i+1, m.fault.what, job.Millis(m.faultToStep), r.DetectMS, r.RestoreMS, r.Replayed, held, r.Cause)
	}
}

// jobWatch follows a job's status every watchInterval until it ends or
// the test does.
type jobWatch struct {
	n  *Node
	id string

	mu      sync.Mutex // guards the fields below
	st      job.Status
	seen    bool
	err     error       // reading the status failed for too long
	after   []time.Time // by recovery: when a step completed after it was first seen
	changed chan struct{}
}

// watchErrorGrace is how long the status may fail to be read (a busy
// node) before the scenario fails.
const watchErrorGrace = 15 * time.Second

func watchJob(t testing.TB, n *Node, id string) *jobWatch {
	w := &jobWatch{n: n, id: id, changed: make(chan struct{})}
	done := make(chan struct{})
	stop := make(chan struct{})
	// Registered after the cluster's cleanups: runs before them.
	t.Cleanup(func() {
		close(stop)
		<-done
	})
	go func() {
		defer close(done)
		tick := time.NewTicker(watchInterval)
		defer tick.Stop()
		var failingSince time.Time
		var lastState job.State
		for {
			st, err := n.Job(id)
			now := time.Now()
			w.mu.Lock()
			switch {
			case err == nil:
				failingSince = time.Time{}
				w.st, w.seen = st, true
				if st.State != lastState {
					t.Logf("job %s: %s at step %d", id, st.State, st.Step)
					lastState = st.State
				}
				for k := len(w.after); k < len(st.Recoveries); k++ {
					if st.Step == st.Recoveries[k].Step && st.State != job.StateDone {
						break
					}
					w.after = append(w.after, now)
				}
			case failingSince.IsZero():
				failingSince = now
			case now.Sub(failingSince) > watchErrorGrace:
				w.err = fmt.Errorf("reading job %s on node %s: %w (for %v)", id, n.opts.Name, err, watchErrorGrace)
			}
			end := w.err != nil || st.State.Ended()
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
			if end {
				return
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

func (w *jobWatch) status() job.Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.st
}

func (w *jobWatch) stepTimes() []time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.after)
}

func (w *jobWatch) stepsAfter() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.after)
}

// wait waits until cond holds for the latest status, cond fails, or
// timeout passes.
func (w *jobWatch) wait(what string, timeout time.Duration, cond func(job.Status) (bool, error)) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		w.mu.Lock()
		st, seen, err, ch := w.st, w.seen, w.err, w.changed
		w.mu.Unlock()
		if err != nil {
			return err
		}
		if seen {
			ok, err := cond(st)
			if err != nil {
				return err
			}
			if ok {
				return nil
			}
			if st.State.Ended() {
				return fmt.Errorf("%s: the job ended (%s at step %d) without it", what, st.State, st.Step)
			}
		}
		select {
		case <-ch:
		case <-timer.C:
			return fmt.Errorf("%s: not within %v (job %s at step %d/%d)", what, timeout, st.State, st.Step, st.Total)
		}
	}
}

var faultFree struct {
	mu   sync.Mutex
	shas map[string]string // by the spec's JSON
}

// FaultFreeSHA is the weights_sha256 of spec trained in this process
// (`ppnode train --local`), remembered per spec for the test binary.
func FaultFreeSHA(spec job.Spec) (string, error) {
	spec.ID = ""
	key, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	faultFree.mu.Lock()
	defer faultFree.mu.Unlock()
	if sha, ok := faultFree.shas[string(key)]; ok {
		return sha, nil
	}
	cs, err := job.Check(spec)
	if err != nil {
		return "", err
	}
	local, err := cs.Prepare()
	if err != nil {
		return "", err
	}
	res, err := local.TrainLocal(1, job.LocalHooks{})
	if err != nil {
		return "", err
	}
	if faultFree.shas == nil {
		faultFree.shas = map[string]string{}
	}
	faultFree.shas[string(key)] = res.WeightsSHA256
	return res.WeightsSHA256, nil
}
