package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Network namespaces (see the package doc, "Network namespaces"): a test
// that cuts links runs each node in a namespace of its own, joined to a
// bridge in a hub namespace by a veth pair:
//
//	node a: netns ppnt-<pid>-<seq>-a, eth0 10.213.0.11/24 ─┐
//	node b: netns ppnt-<pid>-<seq>-b, eth0 10.213.0.12/24 ─┼─ br0 10.213.0.1/24
//	node c: netns ppnt-<pid>-<seq>-c, eth0 10.213.0.13/24 ─┘  netns ppnt-<pid>-<seq>-hub
//
// Nothing is added to the root namespace: the test process reaches the
// nodes' HTTP APIs with sockets it opens inside the hub namespace (see
// [Network.Client]), so that tests of several processes may run at once,
// each with the same addresses in namespaces of its own.
//
// A cut link drops every IP packet between two nodes, both ways, in the
// hub: on the egress of each node's hub-side veth (toward the node), an
// htb qdisc sends the packets from the other node's address to a class
// whose pfifo has limit 0 (the kernel here has neither netem nor the gact
// "drop" action). The drop is the bridge's, after the sender's kernel
// transmitted the packet: the sender sees silence, as on a cut cable. (A
// drop at the sender's own qdisc would not do: TCP takes it for local
// congestion and retransmits and probes forever without counting the
// failures, so neither keepalive nor the retransmission limit would ever
// break the connection.) TCP connections are not closed by a cut.
//
// A shaped link (SetRate) is the same qdisc with one htb class per shaped
// peer, at the link's rate, each way; its queue holds about 50 ms of
// traffic, as a switch port's would.

// Subnet is the /24 of the namespaced nodes: the hub's bridge is .1, node
// i (from 0) is .11+i.
const Subnet = "10.213.0"

// netnsPrefix starts the name of every namespace the harness makes;
// the creating process's pid follows, so that a later run can remove
// those of a process that died without cleaning up.
const netnsPrefix = "ppnt-"

var netnsSeq struct {
	mu sync.Mutex
	n  int
}

// Network is the namespaces of one test. Its methods are safe for
// concurrent use.
type Network struct {
	t      testing.TB
	prefix string // ppnt-<pid>-<seq>-
	hub    string // the hub namespace
	client *http.Client

	mu     sync.Mutex // guards nodes and spaces
	nodes  map[string]*netnsNode
	spaces []string // every namespace made, hub first
}

type netnsNode struct {
	ns, ip   string
	hub      string            // the hub namespace
	port     string            // the node's veth in the hub
	blocked  map[string]bool   // source IPs dropped on their way to this node
	rates    map[string]uint64 // bits/s of the packets from these source IPs
	filtered bool              // port has the harness's qdisc
	layout   string            // its blocked and shaped sources
}

var netnsProbe struct {
	once sync.Once
	err  error
}

// RequireNetns skips the test unless this process can make network
// namespaces with veth pairs, a bridge and htb/u32 traffic control: root,
// ip and tc installed, and a kernel that has them.
func RequireNetns(t testing.TB) {
	t.Helper()
	netnsProbe.once.Do(func() { netnsProbe.err = probeNetns() })
	if netnsProbe.err != nil {
		t.Skipf("skipping: the test needs network namespaces (root, iproute2's ip and tc, veth, bridge, htb and u32 in the kernel): %v", netnsProbe.err)
	}
}

func probeNetns() error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return err
		}
	}
	ns := fmt.Sprintf("%s%d-probe", netnsPrefix, os.Getpid())
	if err := ipCmd("netns", "add", ns); err != nil {
		return err
	}
	defer ipCmd("netns", "del", ns)
	steps := [][]string{
		{"ip", "-n", ns, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"},
		{"ip", "-n", ns, "link", "set", "p0", "up"},
		{"ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "p0", "root", "handle", "1:", "htb", "default", "1"},
		{"ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "p1", "root", "handle", "2:", "pfifo", "limit", "0"},
		{"ip", "netns", "exec", ns, "tc", "filter", "add", "dev", "p0", "parent", "1:", "protocol", "ip", "prio", "1",
			"u32", "match", "ip", "dst", Subnet + ".1/32", "flowid", "1:2"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return err
		}
	}
	return nil
}

// NewNetwork makes the hub namespace of a test and removes every namespace
// of the network when the test ends (after the nodes' cleanup if the
// cluster is made afterwards: cleanups run last-registered first), failing
// the test if a process is still in one. It first removes namespaces left
// by test processes that no longer run. The test is skipped where
// namespaces cannot be made (see RequireNetns).
func NewNetwork(t testing.TB) *Network {
	t.Helper()
	RequireNetns(t)
	RemoveStaleNetns()
	netnsSeq.mu.Lock()
	netnsSeq.n++
	seq := netnsSeq.n
	netnsSeq.mu.Unlock()
	nw := &Network{t: t, prefix: fmt.Sprintf("%s%d-%d-", netnsPrefix, os.Getpid(), seq), nodes: map[string]*netnsNode{}}
	nw.hub = nw.prefix + "hub"
	t.Cleanup(nw.close)
	if err := nw.addNamespace(nw.hub); err != nil {
		t.Fatal(err)
	}
	for _, s := range [][]string{
		{"ip", "-n", nw.hub, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", nw.hub, "addr", "add", Subnet + ".1/24", "dev", "br0"},
		{"ip", "-n", nw.hub, "link", "set", "br0", "up"},
	} {
		if err := run(s...); err != nil {
			t.Fatal(err)
		}
	}
	nsPath := filepath.Join("/run/netns", nw.hub)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialInNetns(ctx, nsPath, network, addr)
		},
		MaxIdleConnsPerHost: 4,
	}
	nw.client = &http.Client{Timeout: 10 * time.Second, Transport: tr}
	return nw
}

// Client is an HTTP client whose connections are made in the hub
// namespace: it reaches every node of the network.
func (nw *Network) Client() *http.Client { return nw.client }

func (nw *Network) addNamespace(ns string) error {
	if err := ipCmd("netns", "add", ns); err != nil {
		return err
	}
	nw.mu.Lock()
	nw.spaces = append(nw.spaces, ns)
	nw.mu.Unlock()
	return ipCmd("-n", ns, "link", "set", "lo", "up")
}

// AddNode makes the namespace of node name, with a veth to the hub, and
// returns the node's address; a node started again (a machine that
// restarts) keeps its namespace and address.
func (nw *Network) AddNode(name string) (string, error) {
	nw.mu.Lock()
	if n, ok := nw.nodes[name]; ok {
		nw.mu.Unlock()
		return n.ip, nil
	}
	i := len(nw.nodes)
	if i >= 200 {
		nw.mu.Unlock()
		return "", errors.New("more than 200 nodes in one network")
	}
	n := &netnsNode{ns: nw.prefix + name, ip: fmt.Sprintf("%s.%d", Subnet, 11+i), blocked: map[string]bool{}, rates: map[string]uint64{},
		hub: nw.hub, port: fmt.Sprintf("h%d", i)} // interface names in the hub: short and unique there
	nw.nodes[name] = n
	nw.mu.Unlock()
	if err := nw.addNamespace(n.ns); err != nil {
		return "", err
	}
	for _, s := range [][]string{
		{"ip", "link", "add", n.port, "netns", nw.hub, "type", "veth", "peer", "name", "eth0", "netns", n.ns},
		{"ip", "-n", nw.hub, "link", "set", n.port, "master", "br0", "up"},
		{"ip", "-n", n.ns, "addr", "add", n.ip + "/24", "dev", "eth0"},
		{"ip", "-n", n.ns, "link", "set", "eth0", "up"},
	} {
		if err := run(s...); err != nil {
			return "", fmt.Errorf("node %s: %w", name, err)
		}
	}
	return n.ip, nil
}

// Command returns the command line that runs bin args in node name's
// namespace; exec keeps the pid.
func (nw *Network) Command(name, bin string, args []string) (string, []string, error) {
	nw.mu.Lock()
	n, ok := nw.nodes[name]
	nw.mu.Unlock()
	if !ok {
		return "", nil, fmt.Errorf("node %s has no namespace", name)
	}
	return "ip", append([]string{"netns", "exec", n.ns, bin}, args...), nil
}

// Cut drops every packet between nodes x and y, both ways, until Restore.
func (nw *Network) Cut(x, y string) error { return nw.setLink(x, y, true) }

// Restore undoes Cut.
func (nw *Network) Restore(x, y string) error { return nw.setLink(x, y, false) }

func (nw *Network) setLink(x, y string, cut bool) error {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nx, ny, err := nw.pair(x, y)
	if err != nil {
		return err
	}
	if nx.blocked[ny.ip] == cut {
		if cut {
			return fmt.Errorf("the link %s-%s is already cut", x, y)
		}
		return fmt.Errorf("the link %s-%s is not cut", x, y)
	}
	for _, p := range [][2]*netnsNode{{nx, ny}, {ny, nx}} {
		if cut {
			p[0].blocked[p[1].ip] = true
		} else {
			delete(p[0].blocked, p[1].ip)
		}
		if err := p[0].applyFilter(); err != nil {
			return err
		}
	}
	return nil
}

// SetRate limits the link between nodes x and y to bitsPerSec each way
// (0: unlimited again), at once, while traffic flows; a cut link stays cut
// until Restore, then runs at its rate.
func (nw *Network) SetRate(x, y string, bitsPerSec uint64) error {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nx, ny, err := nw.pair(x, y)
	if err != nil {
		return err
	}
	if bitsPerSec != 0 && bitsPerSec < 8000 {
		return fmt.Errorf("rate %d bit/s of link %s-%s: want at least 8000", bitsPerSec, x, y)
	}
	for _, p := range [][2]*netnsNode{{nx, ny}, {ny, nx}} {
		if bitsPerSec == 0 {
			delete(p[0].rates, p[1].ip)
		} else {
			p[0].rates[p[1].ip] = bitsPerSec
		}
		if err := p[0].applyFilter(); err != nil {
			return err
		}
	}
	return nil
}

// pair returns the nodes of the link x-y.
func (nw *Network) pair(x, y string) (*netnsNode, *netnsNode, error) {
	nx, ny := nw.nodes[x], nw.nodes[y]
	switch {
	case nx == nil:
		return nil, nil, fmt.Errorf("node %s is not in the network", x)
	case ny == nil:
		return nil, nil, fmt.Errorf("node %s is not in the network", y)
	case x == y:
		return nil, nil, fmt.Errorf("a link needs two nodes, got %s twice", x)
	}
	return nx, ny, nil
}

// RestoreAll restores every cut link and lifts every rate limit (the
// cluster's cleanup does, so that the nodes can leave as usual).
func (nw *Network) RestoreAll() error {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	var errs []error
	for _, n := range nw.nodes {
		if len(n.blocked) > 0 || len(n.rates) > 0 {
			clear(n.blocked)
			clear(n.rates)
			errs = append(errs, n.applyFilter())
		}
	}
	return errors.Join(errs...)
}

// applyFilter replaces the qdisc of the node's port in the hub with one
// that drops the packets from its blocked peers and shapes those from its
// rate-limited ones (none of either: the default qdisc again), in one tc
// run (a change takes effect at once).
func (n *netnsNode) applyFilter() error {
	blocked := slices.Sorted(maps.Keys(n.blocked))
	var shaped []string
	for _, ip := range slices.Sorted(maps.Keys(n.rates)) {
		if !n.blocked[ip] {
			shaped = append(shaped, ip)
		}
	}
	layout := fmt.Sprint(blocked, shaped)
	want := len(blocked)+len(shaped) > 0
	// Only rates changed: change the classes in place, so that the
	// packets queued in them are not dropped.
	verb := "change"
	var batch strings.Builder
	if !n.filtered || layout != n.layout {
		verb = "add"
		if n.filtered {
			fmt.Fprintf(&batch, "qdisc del dev %s root\n", n.port)
		}
		if want {
			fmt.Fprintf(&batch, "qdisc add dev %[1]s root handle 1: htb default 1\n"+
				"class add dev %[1]s parent 1: classid 1:1 htb rate 10gbit quantum 60000\n"+
				"class add dev %[1]s parent 1: classid 1:2 htb rate 10gbit quantum 60000\n"+
				"qdisc add dev %[1]s parent 1:2 handle 2: pfifo limit 0\n", n.port)
			for _, ip := range blocked {
				fmt.Fprintf(&batch, "filter add dev %s parent 1: protocol ip prio 1 u32 match ip src %s/32 flowid 1:2\n", n.port, ip)
			}
		}
	}
	for i, ip := range shaped {
		bps := n.rates[ip]
		class := 16 + i
		// About 50 ms of queue, and a burst of 2 ms (at least a few
		// packets) so that the timer's granularity does not cap the rate.
		queue := max(bps/8/20, 3*1514)
		burst := max(bps/8/500, 4*1514)
		fmt.Fprintf(&batch, "class %[1]s dev %[2]s parent 1: classid 1:%[3]d htb rate %[4]dbit ceil %[4]dbit burst %[5]d cburst %[5]d quantum 1514\n"+
			"qdisc %[1]s dev %[2]s parent 1:%[3]d handle %[3]d: bfifo limit %[6]d\n",
			verb, n.port, class, bps, burst, queue)
		if verb == "add" {
			fmt.Fprintf(&batch, "filter add dev %s parent 1: protocol ip prio 2 u32 match ip src %s/32 flowid 1:%d\n", n.port, ip, class)
		}
	}
	if batch.Len() == 0 {
		return nil
	}
	if err := runInput(batch.String(), "ip", "netns", "exec", n.hub, "tc", "-batch", "-"); err != nil {
		return err
	}
	n.filtered, n.layout = want, layout
	return nil
}

// close removes the network's namespaces. A process still in one (a
// node that was not stopped) is a leak: it is reported and killed.
func (nw *Network) close() {
	if nw.client != nil {
		nw.client.CloseIdleConnections()
	}
	nw.mu.Lock()
	spaces := slices.Clone(nw.spaces)
	nw.mu.Unlock()
	for _, ns := range spaces {
		if pids := processesInNetns(ns); len(pids) > 0 {
			nw.t.Errorf("leak: processes %v are still in network namespace %s", pids, ns)
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	// Node namespaces first: deleting one removes its veth pair.
	for i := len(spaces) - 1; i >= 0; i-- {
		if err := ipCmd("netns", "del", spaces[i]); err != nil {
			nw.t.Errorf("removing network namespace %s: %v", spaces[i], err)
		}
	}
	if left := netnsNamed(nw.prefix); len(left) > 0 {
		nw.t.Errorf("leak: network namespaces left: %v", left)
	}
}

// processesInNetns lists the processes in the named namespace.
func processesInNetns(ns string) []int {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/run/netns", ns), &st); err != nil {
		return nil
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "net")); err == nil && l == want {
			pids = append(pids, pid)
		}
	}
	return pids
}

// netnsNamed lists the namespaces whose name starts with prefix.
func netnsNamed(prefix string) []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// RemoveStaleNetns removes the namespaces that test processes no longer
// running left behind (a test binary killed by its timeout runs no
// cleanup; its nodes died with it, by their parent-death signal). A
// namespace is freed once no process is left in it.
func RemoveStaleNetns() {
	for _, ns := range netnsNamed(netnsPrefix) {
		pidS, _, _ := strings.Cut(strings.TrimPrefix(ns, netnsPrefix), "-")
		pid, err := strconv.Atoi(pidS)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // its test still runs
		}
		ipCmd("netns", "del", ns)
	}
}

// dialInNetns dials addr from inside the namespace at nsPath.
func dialInNetns(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	var c net.Conn
	var dialErr error
	err := inNetns(nsPath, func() {
		var d net.Dialer
		c, dialErr = d.DialContext(ctx, network, addr)
	})
	if err != nil {
		if c != nil {
			c.Close()
		}
		return nil, err
	}
	return c, dialErr
}

// inNetns runs f with the goroutine's thread in the namespace at nsPath:
// the sockets f makes belong to that namespace for good.
func inNetns(nsPath string, f func()) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := setns(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering %s: %w", nsPath, err)
	}
	f()
	if err := setns(orig); err != nil {
		// The thread stays locked, in the wrong namespace: the runtime
		// ends it with this goroutine.
		return fmt.Errorf("leaving %s: %w", nsPath, err)
	}
	runtime.UnlockOSThread()
	return nil
}

// nodeNetns returns the path of node name's namespace.
func (nw *Network) nodeNetns(name string) (string, error) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	n, ok := nw.nodes[name]
	if !ok {
		return "", fmt.Errorf("node %s has no namespace", name)
	}
	return filepath.Join("/run/netns", n.ns), nil
}

func setns(f *os.File) error {
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

func ipCmd(args ...string) error { return run(append([]string{"ip"}, args...)...) }

// run runs a command to its end (at most 30 s) and returns an error with
// its output if it fails.
func run(argv ...string) error { return runInput("", argv...) }

// runInput is run with input on the command's stdin.
func runInput(input string, argv ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin = strings.NewReader(input)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if input != "" {
			argv = append(argv, "<<", input)
		}
		return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
