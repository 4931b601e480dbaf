package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
)

// Scenarios (see the package doc, "Scenarios") are fault-injection tests
// written as scripts: one statement a line, words separated by blanks, a
// word or a key's value in double quotes when it holds blanks, # starts a
// comment. RunScenarios runs each file as a subtest named after it; an
// error names the file and line of the statement that failed.

// Default deadlines of the scenario statements (within=D overrides them).
const (
	scenarioStepWait  = 2 * time.Minute // at step, wait recovery, wait state
	scenarioJobWait   = 3 * time.Minute // expect: the job's end
	scenarioEventWait = 30 * time.Second
	// watchInterval is how often a scenario reads its job's status; it
	// bounds the resolution of the measured recovery times.
	watchInterval = 10 * time.Millisecond
)

// RunScenarios runs every scenario file matching pattern, each as a
// subtest named after the file (without .txt).
func RunScenarios(t *testing.T, pattern string) {
	files, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no scenario matches %s", pattern)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { RunScenario(t, f) })
	}
}

// RunScenario runs the scenario file path.
func RunScenario(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	stmts, err := parseScenario(path, string(b))
	if err != nil {
		t.Fatal(err)
	}
	s := &scenario{t: t, name: strings.TrimSuffix(filepath.Base(path), ".txt")}
	defer s.report() // a failed scenario's figures too
	for _, st := range stmts {
		t.Logf("%s:%d: %s", path, st.line, st.text)
		if err := s.exec(st, st.words); err != nil {
			t.Fatalf("%s:%d: %s: %v", path, st.line, st.text, err)
		}
	}
}

// stmt is one statement of a scenario file.
type stmt struct {
	line  int
	text  string
	words []string
}

func parseScenario(path, src string) ([]stmt, error) {
	var out []stmt
	for i, line := range strings.Split(src, "\n") {
		words, err := splitWords(line)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, i+1, err)
		}
		if len(words) > 0 {
			out = append(out, stmt{line: i + 1, text: strings.TrimSpace(line), words: words})
		}
	}
	return out, nil
}

// splitWords splits a line at blanks outside double quotes, dropping the
// quotes and a # comment.
func splitWords(line string) ([]string, error) {
	var (
		words  []string
		cur    strings.Builder
		inWord bool
		quoted bool
	)
	for _, r := range line {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case quoted:
			cur.WriteRune(r)
		case r == '#':
			if inWord {
				words = append(words, cur.String())
			}
			return words, nil
		case r == ' ' || r == '\t' || r == '\r':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, errors.New("unterminated quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
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

func (s *scenario) exec(st stmt, w []string) error {
	switch w[0] {
	case "slow":
		if len(w) != 1 {
			return errors.New("usage: slow")
		}
		if testing.Short() {
			s.t.Skip("slow scenario: skipped with -short")
		}
		return nil
	case "start":
		return s.start(w[1:])
	case "train":
		return s.train(st, w[1:])
	case "at":
		// at step N <action...>
		if len(w) < 4 || w[1] != "step" {
			return errors.New("usage: at step N ACTION...")
		}
		n, err := strconv.Atoi(w[2])
		if err != nil || n < 1 {
			return fmt.Errorf("step %q: want a positive number", w[2])
		}
		if err := s.atStep(n); err != nil {
			return err
		}
		return s.exec(st, w[3:])
	case "kill", "stop", "cont", "leave":
		if len(w) != 2 {
			return fmt.Errorf("usage: %s NODE", w[0])
		}
		return s.signal(w[0], w[1])
	case "cut", "restore":
		if len(w) != 4 || w[1] != "link" {
			return fmt.Errorf("usage: %s link NODE NODE", w[0])
		}
		return s.link(w[0], w[2], w[3])
	case "wait":
		return s.wait(w[1:])
	case "expect":
		return s.expect(w[1:])
	}
	return fmt.Errorf("unknown statement %q (have slow, start, train, at, kill, stop, cont, leave, cut, restore, wait, expect)", w[0])
}

// options splits key=value words; keys must be in allowed.
func options(words []string, allowed ...string) (map[string]string, error) {
	m := map[string]string{}
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || !slices.Contains(allowed, k) {
			return nil, fmt.Errorf("unknown option %q (have %s=)", w, strings.Join(allowed, "=, "))
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("option %s given twice", k)
		}
		m[k] = v
	}
	return m, nil
}

func within(m map[string]string, def time.Duration) (time.Duration, error) {
	v, ok := m["within"]
	if !ok {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("within=%s: want a positive duration", v)
	}
	return d, nil
}

// start N [threads=T] [quota=Q,Q,...] [netns]: nodes a, b, c, ..., once
// the first sees them all alive.
func (s *scenario) start(w []string) error {
	if s.c != nil {
		return errors.New("the cluster is already started")
	}
	if len(w) < 1 {
		return errors.New("usage: start N [threads=T] [quota=Q,Q,...] [netns]")
	}
	n, err := strconv.Atoi(w[0])
	if err != nil || n < 1 || n > 26 {
		return fmt.Errorf("%q nodes: want 1 to 26", w[0])
	}
	netns := false
	rest := slices.DeleteFunc(slices.Clone(w[1:]), func(x string) bool {
		if x == "netns" {
			netns = true
			return true
		}
		return false
	})
	o, err := options(rest, "threads", "quota")
	if err != nil {
		return err
	}
	s.threads = 1
	if v, ok := o["threads"]; ok {
		if s.threads, err = strconv.Atoi(v); err != nil || s.threads < 1 {
			return fmt.Errorf("threads=%s: want a positive number", v)
		}
	}
	opts := make([]NodeOptions, n)
	for i := range opts {
		opts[i] = NodeOptions{Name: string(rune('a' + i)), Threads: s.threads}
	}
	if v, ok := o["quota"]; ok {
		qs := strings.Split(v, ",")
		if len(qs) != n {
			return fmt.Errorf("quota=%s: want one quota per node (%d)", v, n)
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
	if netns {
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

// train MODEL key=value...: submits a deterministic job (threads as the
// nodes') and follows it.
func (s *scenario) train(st stmt, w []string) error {
	if s.c == nil {
		return errors.New("no cluster: start one first")
	}
	if s.w != nil {
		return errors.New("a scenario trains one job")
	}
	if len(w) < 1 {
		return errors.New("usage: train MODEL key=value...")
	}
	o, err := options(w[1:], "width", "data", "samples", "batch", "micro", "epochs", "steps", "partition",
		"schedule", "checkpoint_every", "optimizer", "lr", "seed", "max_nodes", "no_rebalance", "via", "id")
	if err != nil {
		return err
	}
	spec := job.DefaultSpec()
	spec.ID = strings.ReplaceAll(s.name, "_", "-")
	spec.Model, spec.Epochs, spec.Deterministic, spec.Threads = w[0], 10, true, s.threads
	ints := map[string]*int{"samples": &spec.SyntheticSamples, "batch": &spec.Batch, "micro": &spec.MicroBatches,
		"epochs": &spec.Epochs, "steps": &spec.Steps, "checkpoint_every": &spec.CheckpointEvery, "max_nodes": &spec.MaxNodes}
	strs := map[string]*string{"data": &spec.Data, "partition": &spec.Partition, "schedule": &spec.Schedule,
		"optimizer": &spec.Optimizer, "id": &spec.ID}
	floats := map[string]*float64{"width": &spec.Width, "lr": &spec.LR}
	via := "a"
	for k, v := range o {
		var err error
		switch {
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

// wait recovery N | wait state PREFIX | wait alive NODE MEMBER |
// wait log NODE TEXT, each with an optional within=D.
func (s *scenario) wait(w []string) error {
	if len(w) < 2 {
		return errors.New("usage: wait recovery N | wait state PREFIX | wait alive NODE MEMBER | wait log NODE TEXT [within=D]")
	}
	args, opts := w[1:], []string{}
	for len(args) > 0 && strings.HasPrefix(args[len(args)-1], "within=") {
		opts = append(opts, args[len(args)-1])
		args = args[:len(args)-1]
	}
	o, err := options(opts, "within")
	if err != nil {
		return err
	}
	switch w[0] {
	case "recovery":
		d, err := within(o, scenarioStepWait)
		if err != nil {
			return err
		}
		if len(args) != 1 {
			return errors.New("usage: wait recovery N")
		}
		n, err := strconv.Atoi(args[0])
		if err != nil || n < 1 {
			return fmt.Errorf("recovery %q: want a positive number", args[0])
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
	case "state":
		d, err := within(o, scenarioStepWait)
		if err != nil {
			return err
		}
		if len(args) != 1 {
			return errors.New("usage: wait state PREFIX")
		}
		jw, err := s.job()
		if err != nil {
			return err
		}
		return jw.wait("state "+args[0], d, func(st job.Status) (bool, error) {
			if string(st.State) == args[0] {
				return true, nil
			}
			if st.State.Ended() {
				return false, fmt.Errorf("the job is %s (%s)", st.State, st.Error)
			}
			return false, nil
		})
	case "alive":
		d, err := within(o, scenarioEventWait)
		if err != nil {
			return err
		}
		if len(args) != 2 {
			return errors.New("usage: wait alive NODE MEMBER")
		}
		n, err := s.node(args[0])
		if err != nil {
			return err
		}
		var last []string
		err = Poll(fmt.Sprintf("node %s sees %s alive", args[0], args[1]), d, 20*time.Millisecond, func() (bool, error) {
			st, err := n.Status()
			if err != nil {
				return false, err
			}
			last = Alive(st)
			return slices.Contains(last, args[1]), nil
		})
		if err != nil {
			return fmt.Errorf("%w (alive: %v)", err, last)
		}
		return nil
	case "log":
		d, err := within(o, scenarioEventWait)
		if err != nil {
			return err
		}
		if len(args) != 2 {
			return errors.New(`usage: wait log NODE "TEXT"`)
		}
		n, err := s.node(args[0])
		if err != nil {
			return err
		}
		line, err := n.WaitLog(args[1], d)
		if err == nil {
			s.t.Logf("node %s: %s", args[0], line)
		}
		return err
	}
	return fmt.Errorf("wait %s: have recovery, state, alive, log", w[0])
}

// expect done|failed [KEY OP VALUE]... [within=D]: waits for the job's end
// and checks it. Keys: recoveries, replans (counts); replayed, recovery_ms
// (every recovery's); sha (fault-free: the weights of the job trained in
// this process); cause, replan, error (~: contains). Ops: = < <= > >= ~.
func (s *scenario) expect(w []string) error {
	jw, err := s.job()
	if err != nil {
		return err
	}
	if len(w) < 1 || (w[0] != "done" && w[0] != "failed") {
		return errors.New("usage: expect done|failed [KEY OP VALUE]...")
	}
	d := scenarioJobWait
	var checks []string
	for _, c := range w[1:] {
		if v, ok := strings.CutPrefix(c, "within="); ok {
			if d, err = within(map[string]string{"within": v}, d); err != nil {
				return err
			}
			continue
		}
		checks = append(checks, c)
	}
	err = jw.wait("the job's end", d, func(st job.Status) (bool, error) {
		return st.State.Ended(), nil
	})
	if err != nil {
		return err
	}
	st := jw.status()
	s.t.Logf("job %s: %s at step %d/%d; plan %s; recoveries %+v; re-plans %+v", st.ID, st.State, st.Step, st.Total, st.Plan, st.Recoveries, st.Replans)
	if string(st.State) != w[0] {
		return fmt.Errorf("the job is %s (%s), want %s", st.State, st.Error, w[0])
	}
	var errs []error
	for _, c := range checks {
		if err := s.check(st, c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

var cmpOps = []string{"<=", ">=", "=", "<", ">", "~"}

func (s *scenario) check(st job.Status, c string) error {
	var key, op, val string
	for i := range c {
		for _, o := range cmpOps {
			if strings.HasPrefix(c[i:], o) {
				key, op, val = c[:i], o, c[i+len(o):]
				break
			}
		}
		if op != "" {
			break
		}
	}
	if key == "" {
		return fmt.Errorf("%q: want KEY OP VALUE (ops %s)", c, strings.Join(cmpOps, " "))
	}
	num := func(got float64, what string) error {
		want, err := strconv.ParseFloat(val, 64)
		if err != nil || op == "~" {
			return fmt.Errorf("%s: want %s OP NUMBER", c, key)
		}
		ok := map[string]bool{"=": got == want, "<": got < want, "<=": got <= want, ">": got > want, ">=": got >= want}[op]
		if !ok {
			return fmt.Errorf("%s is %v, want %s %s%s", key, got, op, val, what)
		}
		return nil
	}
	contains := func(texts []string) error {
		if op != "~" {
			return fmt.Errorf("%s: %s takes ~ (contains)", c, key)
		}
		if len(texts) == 0 {
			return fmt.Errorf("no %s to contain %q", key, val)
		}
		for _, t := range texts {
			if !strings.Contains(t, val) {
				return fmt.Errorf("%s %q does not contain %q", key, t, val)
			}
		}
		return nil
	}
	switch key {
	case "recoveries":
		return num(float64(len(st.Recoveries)), "")
	case "replans":
		return num(float64(len(st.Replans)), "")
	case "replayed":
		var errs []error
		for i, r := range st.Recoveries {
			errs = append(errs, num(float64(r.Replayed), fmt.Sprintf(" (recovery %d)", i+1)))
		}
		return errors.Join(errs...)
	case "recovery_ms":
		var errs []error
		for _, m := range s.measure() {
			if m.faultToStep > 0 {
				errs = append(errs, num(float64(m.faultToStep.Milliseconds()), fmt.Sprintf(" (%s)", m.fault.what)))
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
		if op != "=" {
			return fmt.Errorf("%s: sha takes =", c)
		}
		if st.Result == nil {
			return errors.New("the job has no result")
		}
		want := val
		if val == "fault-free" {
			var err error
			if want, err = FaultFreeSHA(s.spec); err != nil {
				return err
			}
		}
		if st.Result.WeightsSHA256 != want {
			return fmt.Errorf("weights_sha256 %s, want %s (%s)", st.Result.WeightsSHA256, want, val)
		}
		return nil
	}
	return fmt.Errorf("%q: unknown key %s (have recoveries, replans, replayed, recovery_ms, cause, replan, error, sha)", c, key)
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
			held = fmt.Sprintf(" held_ms=%.0f", float64(m.fault.ended.Sub(m.fault.at).Microseconds())/1e3)
		}
		s.t.Logf("measure: scenario=%s fault=%d what=%q recovery_ms=%.1f detect_ms=%.1f restore_ms=%.1f replayed=%d%s cause=%q",
			s.name, i+1, m.fault.what, float64(m.faultToStep.Microseconds())/1e3, r.DetectMS, r.RestoreMS, r.Replayed, held, r.Cause)
	}
}

// jobWatch follows a job's status every watchInterval until it ends or
// the test does.
type jobWatch struct {
	n  *Node
	id string

	mu       sync.Mutex // guards the fields below
	st       job.Status
	seen     bool
	err      error       // reading the status failed for too long
	after    []time.Time // by recovery: when a step completed after it was first seen
	changed  chan struct{}
	stopping bool
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
					if st.Step == st.Recoveries[k].Step && st.State != "done" {
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
	local, err := spec.Prepare()
	if err != nil {
		return "", err
	}
	res, err := local.TrainLocal(1, nil)
	if err != nil {
		return "", err
	}
	if faultFree.shas == nil {
		faultFree.shas = map[string]string{}
	}
	faultFree.shas[string(key)] = res.WeightsSHA256
	return res.WeightsSHA256, nil
}
