package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/nodes"
)

// Deadlines of the harness's waits.
const (
	// ReadyTimeout bounds a node's start: process start, profile, gossip
	// join, until its ready line.
	ReadyTimeout = 30 * time.Second
	// StopTimeout is how long a node may take to leave after SIGTERM
	// before it is killed (and the test fails).
	StopTimeout = 15 * time.Second
	// CommandTimeout bounds one `ppnode` client run unless the caller
	// gives a deadline.
	CommandTimeout = 2 * time.Minute
)

var build struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// BinaryEnv names a ppnode binary already built from this checkout with
// the tags below, which [Binary] then returns (make test sets it).
const BinaryEnv = "PPNODE_TEST_BINARY"

// Binary returns the path of a ppnode binary built from this checkout. It
// is built once per test binary, with the Makefile's tags: openblas (and
// CGO_LDFLAGS=-lopenblas) when libopenblas is installed, dnnl when
// oneDNN's library and header are; or it is $PPNODE_TEST_BINARY.
func Binary(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		if p := os.Getenv(BinaryEnv); p != "" {
			build.path, build.err = filepath.Abs(p)
			if build.err == nil {
				_, build.err = os.Stat(build.path)
			}
			return
		}
		build.dir, build.err = os.MkdirTemp("", "ppnode-integration-")
		if build.err != nil {
			return
		}
		build.path = filepath.Join(build.dir, "ppnode")
		args := []string{"build"}
		env := os.Environ()
		var tags []string
		if haveLib("libopenblas.so ") {
			tags = append(tags, "openblas")
			env = append(env, "CGO_LDFLAGS=-lopenblas")
		}
		if HaveOneDNN() {
			tags = append(tags, "dnnl")
		}
		if len(tags) > 0 {
			args = append(args, "-tags", strings.Join(tags, " "))
		}
		args = append(args, "-o", build.path, "github.com/ppnode/ppnode/cmd/ppnode")
		cmd := exec.Command(goTool(), args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.path
}

// RemoveBinary removes what [Binary] built; TestMain calls it.
func RemoveBinary() {
	if build.dir != "" {
		os.RemoveAll(build.dir)
	}
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// HaveOneDNN reports whether [Binary] builds with oneDNN: its library and
// header are installed (the Makefile's test).
func HaveOneDNN() bool {
	_, err := os.Stat("/usr/include/dnnl.h")
	return err == nil && haveLib("libdnnl.so ")
}

// haveLib reports whether ldconfig knows a library of that name.
func haveLib(name string) bool {
	for _, ldconfig := range []string{"ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"} {
		out, err := exec.Command(ldconfig, "-p").Output()
		if err == nil {
			return bytes.Contains(out, []byte(name))
		}
	}
	return false
}

// Ready is a node's ready line: the addresses it bound.
type Ready struct {
	Name   string `json:"name"`
	Gossip string `json:"gossip"`
	Actors string `json:"actors"`
	HTTP   string `json:"http"`
	Probe  string `json:"probe"`
}

// NodeOptions configure one node.
type NodeOptions struct {
	Name string
	// CPUQuota is the node's share of one CPU through a cgroup v1 quota
	// (0.5: half a CPU; 0: no cgroup). The test fails if it cannot be set;
	// call RequireCPUQuota first to skip instead.
	CPUQuota float64
	// Threads is passed as --threads when > 0.
	Threads int
	// Args are extra flags of `ppnode join`.
	Args []string
}

// Node is one `ppnode join` process.
type Node struct {
	Ready // valid once WaitReady returned nil

	opts   NodeOptions
	cmd    *exec.Cmd
	cgroup string // "" without a quota
	stdout *lineLog
	stderr *lineLog
	ready  chan Ready    // the parsed ready line, once
	exited chan struct{} // closed when the process has been waited for
	err    error         // the process's exit, valid after exited
	killed bool          // by Kill, on the test goroutine
	client *http.Client  // reaches the node's HTTP API

	mu     sync.Mutex // guards paused
	paused bool       // by Pause (SIGSTOP), until Resume
}

// Cluster is the set of nodes a test started. Its cleanup stops them and
// checks for leaks.
type Cluster struct {
	t   testing.TB
	bin string

	net *Network // nil: nodes run in this network namespace, on 127.0.0.1

	// LogDir, if set, also receives each node process's stderr, as
	// NAME-PID.log.
	LogDir string

	mu    sync.Mutex // guards nodes
	nodes []*Node
}

// NewCluster returns an empty cluster; nodes join with Join.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	c := &Cluster{t: t, bin: Binary(t)}
	// Cleanups run last-registered first: stop the nodes, then check.
	t.Cleanup(func() { c.checkLeaks() })
	t.Cleanup(func() { c.stopAll() })
	return c
}

// NewNetCluster returns an empty cluster whose nodes each run in a
// network namespace of their own (see [Network]); the test is skipped
// where namespaces cannot be made. The namespaces are removed after the
// nodes are stopped.
func NewNetCluster(t testing.TB) *Cluster {
	t.Helper()
	nw := NewNetwork(t) // its cleanup runs after the cluster's
	c := NewCluster(t)
	c.net = nw
	return c
}

// Network is the cluster's namespaces, or nil.
func (c *Cluster) Network() *Network { return c.net }

// StartCluster starts one node per option: the first alone, the others
// at once with the first as their seed. Nodes without a name are called
// a, b, c, ...
func StartCluster(t testing.TB, opts ...NodeOptions) *Cluster {
	t.Helper()
	c := NewCluster(t)
	c.StartAll(opts...)
	return c
}

// StartAll starts nodes as StartCluster does, in an empty cluster.
func (c *Cluster) StartAll(opts ...NodeOptions) {
	t := c.t
	t.Helper()
	for i := range opts {
		if opts[i].Name == "" {
			opts[i].Name = string(rune('a' + i))
		}
	}
	if len(opts) == 0 {
		return
	}
	c.Join(opts[0])
	var started []*Node
	for _, o := range opts[1:] {
		n, err := c.Start(o)
		if err != nil {
			t.Fatal(err)
		}
		started = append(started, n)
	}
	for _, n := range started {
		if err := n.WaitReady(ReadyTimeout); err != nil {
			t.Fatal(err)
		}
	}
}

// Join starts a node and waits for its ready line.
func (c *Cluster) Join(o NodeOptions) *Node {
	c.t.Helper()
	n, err := c.Start(o)
	if err == nil {
		err = n.WaitReady(ReadyTimeout)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

// Nodes returns the nodes started so far, stopped ones included.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Node(nil), c.nodes...)
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes() {
		if n.opts.Name == name {
			return n
		}
	}
	return nil
}

// seed returns the gossip address of the first running, ready node.
func (c *Cluster) seed() string {
	for _, n := range c.Nodes() {
		select {
		case <-n.exited:
			continue
		default:
		}
		if n.Gossip != "" {
			return n.Gossip
		}
	}
	return ""
}

// Start starts a node without waiting for it: `ppnode join` on
// 127.0.0.1 port 0 (in a cluster with a Network: on the node's address in
// its namespace), seeded by the first running node.
func (c *Cluster) Start(o NodeOptions) (*Node, error) {
	if o.Name == "" {
		o.Name = string(rune('a' + len(c.Nodes())))
	}
	host := "127.0.0.1"
	if c.net != nil {
		ip, err := c.net.AddNode(o.Name)
		if err != nil {
			return nil, err
		}
		host = ip
	}
	args := []string{"join", "--name", o.Name, "--bind", host + ":0", "--http", host + ":0"}
	if s := c.seed(); s != "" {
		args = append(args, "--seeds", s)
	}
	if o.Threads > 0 {
		args = append(args, "--threads", strconv.Itoa(o.Threads))
	}
	args = append(args, o.Args...)
	// Tests' files are in their temporary directories: the nodes read job
	// files from there, unless the test says otherwise.
	if !hasFlag(o.Args, "files") {
		args = append(args, "--files", os.TempDir())
	}
	// A data dir of its own (the default one is shared by every node of
	// that name), removed once the process has exited, unless the test
	// gives one.
	dataDir := ""
	if !hasFlag(o.Args, "data-dir") {
		d, err := os.MkdirTemp("", "ppnode-test-data-"+o.Name+"-")
		if err != nil {
			return nil, fmt.Errorf("node %s: data dir: %w", o.Name, err)
		}
		dataDir = d
		args = append(args, "--data-dir", d)
	}
	n := &Node{opts: o, ready: make(chan Ready, 1), exited: make(chan struct{}), client: client}
	if _, err := Creds(o.Name); err != nil {
		os.RemoveAll(dataDir)
		return nil, fmt.Errorf("node %s: %w", o.Name, err)
	}
	name, argv := c.bin, args
	if c.net != nil {
		var err error
		if name, argv, err = c.net.Command(o.Name, c.bin, args); err != nil {
			os.RemoveAll(dataDir)
			return nil, err
		}
		n.client = c.net.Client()
	}
	var err error
	if n.client, err = withTLS(n.client); err != nil {
		os.RemoveAll(dataDir)
		return nil, err
	}
	if o.CPUQuota > 0 {
		dir, err := MakeCgroup(fmt.Sprintf("ppnode-test-%d-%s", os.Getpid(), o.Name), o.CPUQuota)
		if err != nil {
			os.RemoveAll(dataDir)
			return nil, fmt.Errorf("node %s: CPU quota: %w", o.Name, err)
		}
		n.cgroup = dir
		name, argv = InCgroup(dir, name, argv)
	}
	n.stdout = newLineLog(200, func(line string) {
		rest, ok := strings.CutPrefix(line, "ready ")
		if !ok {
			return
		}
		var r Ready
		if err := json.Unmarshal([]byte(rest), &r); err != nil {
			return
		}
		select {
		case n.ready <- r:
		default:
		}
	})
	n.stderr = newLineLog(200, nil)
	n.cmd = exec.Command(name, argv...)
	n.cmd.Stdout, n.cmd.Stderr = n.stdout, n.stderr
	var logFile *os.File
	if c.LogDir != "" {
		// Named once the pid is known; the process writes to both.
		f, err := os.CreateTemp(c.LogDir, o.Name+"-*.log")
		if err != nil {
			RemoveCgroup(n.cgroup)
			os.RemoveAll(dataDir)
			return nil, fmt.Errorf("node %s: %w", o.Name, err)
		}
		logFile = f
		n.cmd.Stderr = io.MultiWriter(n.stderr, f)
	}
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	n.cmd.WaitDelay = 2 * time.Second
	if err := n.cmd.Start(); err != nil {
		RemoveCgroup(n.cgroup)
		os.RemoveAll(dataDir)
		if logFile != nil {
			logFile.Close()
			os.Remove(logFile.Name())
		}
		return nil, fmt.Errorf("node %s: %w", o.Name, err)
	}
	if logFile != nil {
		os.Rename(logFile.Name(), filepath.Join(c.LogDir, fmt.Sprintf("%s-%d.log", o.Name, n.cmd.Process.Pid)))
	}
	go func() {
		n.err = n.cmd.Wait()
		if logFile != nil {
			logFile.Close()
		}
		if dataDir != "" {
			os.RemoveAll(dataDir)
		}
		close(n.exited)
	}()
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	c.t.Logf("node %s: started pid %d: ppnode %s (quota %v%s)", o.Name, n.cmd.Process.Pid, strings.Join(args, " "), o.CPUQuota, map[bool]string{true: ", own network namespace"}[c.net != nil])
	return n, nil
}

// hasFlag reports whether args give the flag name (-name, --name,
// --name=value).
func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if f, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); strings.HasPrefix(a, "-") && f == name {
			return true
		}
	}
	return false
}

// WaitReady waits for the node's ready line and records its addresses.
func (n *Node) WaitReady(timeout time.Duration) error {
	if n.HTTP != "" {
		return nil
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-n.ready:
		n.Ready = r
		return nil
	case <-n.exited:
		return fmt.Errorf("node %s exited before it was ready (%v); stderr:\n%s", n.opts.Name, n.err, n.stderr.tail(30))
	case <-timer.C:
		return fmt.Errorf("node %s: no ready line within %v; stderr:\n%s", n.opts.Name, timeout, n.stderr.tail(30))
	}
}

// Stop sends SIGTERM and waits for the node to leave; after StopTimeout
// it kills it. It returns an error if the node had to be killed or
// exited with a failure. Stopping a stopped node returns its first
// result again. A paused node is resumed first.
func (c *Cluster) Stop(n *Node) error {
	defer RemoveCgroupAfter(n.cgroup, n.exited)
	select {
	case <-n.exited:
		return n.exitError()
	default:
	}
	if n.isPaused() {
		if err := c.Resume(n); err != nil {
			return err
		}
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(StopTimeout)
	defer timer.Stop()
	select {
	case <-n.exited:
		return n.exitError()
	case <-timer.C:
		n.cmd.Process.Kill()
		<-n.exited
		return fmt.Errorf("node %s did not exit within %v of SIGTERM; killed. stderr:\n%s", n.opts.Name, StopTimeout, n.stderr.tail(30))
	}
}

func (n *Node) exitError() error {
	if n.err != nil && !n.killed { // a node the test killed was meant to die
		return fmt.Errorf("node %s: %v; stderr:\n%s", n.opts.Name, n.err, n.stderr.tail(30))
	}
	return nil
}

// Pause stops the node with SIGSTOP (a hung machine): it neither computes
// nor answers, and its sockets stay open.
func (c *Cluster) Pause(n *Node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.paused {
		return fmt.Errorf("node %s is already paused", n.opts.Name)
	}
	if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("node %s: SIGSTOP: %w", n.opts.Name, err)
	}
	n.paused = true
	return nil
}

// Resume continues a paused node with SIGCONT.
func (c *Cluster) Resume(n *Node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.paused {
		return fmt.Errorf("node %s is not paused", n.opts.Name)
	}
	if err := n.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("node %s: SIGCONT: %w", n.opts.Name, err)
	}
	n.paused = false
	return nil
}

func (n *Node) isPaused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paused
}

// Kill kills the node with SIGKILL (a crash) and waits for it.
func (c *Cluster) Kill(n *Node) {
	n.cmd.Process.Kill()
	<-n.exited
	n.killed = true
	n.mu.Lock()
	n.paused = false
	n.mu.Unlock()
	RemoveCgroup(n.cgroup)
}

// WaitLog waits for a line of the node's stderr that contains substr,
// among its last lines or to come, and returns it.
func (n *Node) WaitLog(substr string, timeout time.Duration) (string, error) {
	ch := n.stderr.watch(substr)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case line := <-ch:
		return line, nil
	case <-n.exited:
		select {
		case line := <-ch:
			return line, nil
		default:
		}
		return "", fmt.Errorf("node %s exited (%v) before it logged %q", n.opts.Name, n.err, substr)
	case <-timer.C:
		return "", fmt.Errorf("node %s did not log %q within %v", n.opts.Name, substr, timeout)
	}
}

// stopAll restores the cut links, stops every node that still runs, the
// last started first, and reports failures. On a failed test it also logs each node's last stderr
// lines.
func (c *Cluster) stopAll() {
	if c.net != nil {
		if err := c.net.RestoreAll(); err != nil {
			c.t.Errorf("restoring the cut links: %v", err)
		}
	}
	nodes := c.Nodes()
	for i := len(nodes) - 1; i >= 0; i-- {
		if err := c.Stop(nodes[i]); err != nil {
			c.t.Error(err)
		}
	}
	if c.t.Failed() || os.Getenv("PPNODE_TEST_LOGS") != "" {
		for _, n := range nodes {
			c.t.Logf("node %s stderr (last lines):\n%s", n.opts.Name, n.stderr.tail(40))
		}
	}
}

// checkLeaks fails the test if a child process of the test binary is
// left, a node's port is still listened on, or a cgroup is left.
func (c *Cluster) checkLeaks() {
	// Only this cluster's: tests run in parallel (TestMain checks that no
	// process is left at the end).
	for _, n := range c.Nodes() {
		select {
		case <-n.exited:
		default:
			c.t.Errorf("leak: node %s (pid %d) still runs after the test", n.opts.Name, n.cmd.Process.Pid)
		}
	}
	for _, n := range c.Nodes() {
		if n.cgroup != "" {
			if _, err := os.Stat(n.cgroup); err == nil {
				c.t.Errorf("leak: cgroup %s left", n.cgroup)
			}
		}
	}
}

// ChildProcesses lists the processes whose parent is this process, as
// "pid (comm)".
func ChildProcesses() []string {
	me := os.Getpid()
	ents, _ := os.ReadDir("/proc")
	var kids []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid == me {
			kids = append(kids, fmt.Sprintf("%d %s", pid, s[strings.IndexByte(s, '('):i+1]))
		}
	}
	return kids
}

// ProcessesOf lists the processes, anywhere, that run the executable bin.
func ProcessesOf(bin string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == bin {
			pids = append(pids, pid)
		}
	}
	return pids
}

// The cgroup v1 CPU controller.
const (
	CgroupCPU    = "/sys/fs/cgroup/cpu"
	cfsPeriodUS  = 100000
	cgroupProbeN = "ppnode-probe"
)

// MakeCgroup creates the cgroup v1 CPU cgroup name with a quota of quota
// CPUs (period 100 ms).
func MakeCgroup(name string, quota float64) (string, error) {
	dir := filepath.Join(CgroupCPU, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(cfsPeriodUS)), 0)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(int(quota*cfsPeriodUS))), 0)
	}
	if err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

// RemoveCgroup removes a cgroup made by MakeCgroup ("" is a no-op). Its
// processes must have exited.
func RemoveCgroup(dir string) error {
	if dir == "" {
		return nil
	}
	return os.Remove(dir)
}

// RemoveCgroupAfter removes dir once exited is closed.
func RemoveCgroupAfter(dir string, exited <-chan struct{}) {
	if dir == "" {
		return
	}
	<-exited
	RemoveCgroup(dir)
}

// InCgroup returns a command line that runs bin args inside the cgroup
// dir from its first instruction: a shell moves itself into the cgroup
// and execs bin, which keeps its pid.
func InCgroup(dir, bin string, args []string) (string, []string) {
	return "/bin/sh", append([]string{"-c", `echo $$ > "$1/cgroup.procs" && shift && exec "$@"`, "sh", dir, bin}, args...)
}

// RequireCPUQuota skips the test unless cgroup v1 CPU quotas can be set.
func RequireCPUQuota(t testing.TB) {
	t.Helper()
	dir, err := MakeCgroup(fmt.Sprintf("%s-%d", cgroupProbeN, os.Getpid()), 1)
	if err != nil {
		t.Skipf("skipping: CPU quotas need a writable cgroup v1 cpu controller at %s (root): %v", CgroupCPU, err)
	}
	RemoveCgroup(dir)
}

// lineLog is an io.Writer that keeps the last lines written to it and
// calls onLine with each complete line.
type lineLog struct {
	max    int
	onLine func(string)

	mu      sync.Mutex // guards partial, lines and watches
	partial []byte
	lines   []string
	watches []lineWatch
}

// lineWatch waits for a line containing substr.
type lineWatch struct {
	substr string
	ch     chan string // buffered: gets the first such line
}

func newLineLog(max int, onLine func(string)) *lineLog {
	return &lineLog{max: max, onLine: onLine}
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.partial = append(l.partial, p...)
	var done []string
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		done = append(done, line)
		l.lines = append(l.lines, line)
		if len(l.lines) > l.max {
			l.lines = l.lines[len(l.lines)-l.max:]
		}
		l.watches = slices.DeleteFunc(l.watches, func(w lineWatch) bool {
			if strings.Contains(line, w.substr) {
				w.ch <- line
				return true
			}
			return false
		})
	}
	l.mu.Unlock()
	if l.onLine != nil {
		for _, line := range done {
			l.onLine(line)
		}
	}
	return len(p), nil
}

// watch returns a channel that gets the first of the kept lines, or of
// the lines to come, that contains substr.
func (l *lineLog) watch(substr string) <-chan string {
	ch := make(chan string, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, substr) {
			ch <- line
			return ch
		}
	}
	l.watches = append(l.watches, lineWatch{substr, ch})
	return ch
}

func (l *lineLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := l.lines
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(append(lines, string(l.partial)), "\n")
}

// Poll calls cond every interval until it returns true (nil), an error
// (that error) or timeout passes (an error naming what).
func Poll(what string, timeout, interval time.Duration, cond func() (bool, error)) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-deadline.C:
			return fmt.Errorf("%s: not within %v", what, timeout)
		case <-tick.C:
		}
	}
}

var client = &http.Client{Timeout: 10 * time.Second}

// Client is a client of the node's HTTP API (made in the hub's namespace
// when the nodes have namespaces of their own).
func (n *Node) Client() *nodes.Client { return nodes.NewClientWith(n.HTTP, n.client) }

// Status returns the node's GET /v1/status.
func (n *Node) Status() (nodes.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return n.Client().Status(ctx)
}

// Alive returns the names of the members st sees as alive (or alive and
// leaving).
func Alive(st nodes.Status) []string {
	var names []string
	for _, m := range st.Members {
		if m.State.Usable() {
			names = append(names, m.Name)
		}
	}
	return names
}

// Submit submits a job to the node.
func (n *Node) Submit(spec job.Spec) (nodes.SubmitReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return n.Client().Submit(ctx, spec)
}

// Job returns GET /v1/jobs/{id}.
func (n *Node) Job(id string) (job.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := n.Client().Job(ctx, id)
	return st.Status, err
}

// WaitJob polls the job until until returns true, or the job ends (done
// or failed), or timeout passes.
func (n *Node) WaitJob(id string, timeout time.Duration, until func(job.Status) bool) (job.Status, error) {
	var st job.Status
	err := Poll("job "+id, timeout, 50*time.Millisecond, func() (bool, error) {
		var err error
		st, err = n.Job(id)
		if err != nil {
			return false, err
		}
		return st.State.Ended() || (until != nil && until(st)), nil
	})
	return st, err
}

// Run runs `ppnode args...` to its end, for at most timeout (0:
// CommandTimeout), and returns its stdout, or an error with its stderr.
func Run(t testing.TB, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	if timeout <= 0 {
		timeout = CommandTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, Binary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: killed after %v", err, timeout)
		}
		return stdout.String(), fmt.Errorf("ppnode %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Train runs `ppnode train --json args...` (for at most timeout, 0:
// CommandTimeout) and decodes its last line.
func Train(t testing.TB, timeout time.Duration, args ...string) (job.Result, error) {
	t.Helper()
	out, err := Run(t, timeout, append([]string{"train", "--json"}, args...)...)
	if err != nil {
		return job.Result{}, err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r job.Result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return r, fmt.Errorf("ppnode train: last line is not a result: %q", lines[len(lines)-1])
	}
	if r.WeightsSHA256 == "" {
		return r, errors.New("ppnode train: result without weights_sha256")
	}
	return r, nil
}
