package integration

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/linkprobe"
	"golang.org/x/sys/unix"
)

// floodConns is the size of each flood: by default the attack's, 20,000
// (about 6 s of dials each here).
var floodConns = flag.Int("flood", 20000, "connections of each flood in TestFloodLeavesTheNodeServing")

// floodNodeFiles is the open-files limit the nodes get: a systemd service's
// default soft limit, well below the flood, so that a node that kept every
// connection would run out of descriptors as the attacked node did (its
// limit was this machine's 20,000).
const floodNodeFiles = 1024

// A flood of silent TCP connections (from 127.0.0.2, as an attacker on
// another machine) to a node's actor port, then to another node's
// link-probe port, then to the first one's gossip port, leaves the nodes
// serving: the flooded node's GET
// /v1/status, each on a new connection, answers within 1 s during the
// flood, a probe of the flooded probe port succeeds, and a small job
// submitted while the flood's connections are held open finishes. The node closes most of them as soon as it accepts them,
// and counts them in /metrics.
func TestFloodLeavesTheNodeServing(t *testing.T) {
	c := StartCluster(t, NodeOptions{Threads: 1}, NodeOptions{Threads: 1})
	a, b := c.Node("a"), c.Node("b")
	// The flood's client ends are this process's descriptors; raise its
	// open-files limit as far as allowed (after the nodes started, so that
	// they keep theirs). The flood holds its connections up to that limit,
	// and beyond it only those the node has not closed.
	room := raiseOpenFiles(t, uint64(*floodConns)+1024)
	for _, n := range []*Node{a, b} {
		lim := unix.Rlimit{Cur: floodNodeFiles, Max: floodNodeFiles}
		if err := unix.Prlimit(n.cmd.Process.Pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
			t.Fatalf("node %s: open-files limit: %v", n.opts.Name, err)
		}
	}
	for i, tc := range []struct {
		name   string
		node   *Node
		target string
		port   string        // the port label of the node's metrics
		hold   time.Duration // how long the node holds a silent connection it took
	}{
		{"actor port", a, a.Actors, "actor", 5 * time.Second},   // the handshake timeout
		{"probe port", b, b.Probe, "probe", 5 * time.Second},    // the same
		{"gossip port", a, a.Gossip, "gossip", 2 * time.Second}, // memberlist's TCP timeout
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.target == "" {
				t.Fatalf("node %s does not say its %s", tc.node.opts.Name, tc.name)
			}
			status := watchStatus(tc.node)
			f := startFlood(tc.target, *floodConns, room)
			<-f.dialled
			if tc.port == "probe" { // a probe from the cluster's address gets through
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				r, err := linkprobe.Measure(ctx, tc.target, linkprobe.Options{Duration: 20 * time.Millisecond})
				cancel()
				if err != nil {
					t.Fatalf("probe during the flood: %v", err)
				}
				t.Logf("probe during the flood: %.0f Mbit/s, RTT %v", r.BytesPerSec*8/1e6, r.RTT)
			}
			spec := failoverSpec()
			spec.Steps, spec.CheckpointEvery = 40, 0
			spec.ID = fmt.Sprintf("flood-%d", i)
			sub, err := a.Submit(spec)
			if err != nil {
				t.Fatalf("submit during the flood: %v", err)
			}
			st, err := a.WaitJob(sub.ID, 2*time.Minute, nil)
			if err != nil || st.State != job.StateDone {
				t.Fatalf("job during the flood: %v, state %q %s", err, st.State, st.Error)
			}
			worst, failed, polls := status.stop()
			closedByNode := f.stop()
			t.Logf("%d connections in %v (%d dials failed), %d of them closed by the node by the job's end; status: %d polls, worst %v, %d failed; job %s done at step %d",
				f.connected.Load(), f.took, f.failed.Load(), closedByNode, polls, worst.Round(time.Millisecond), failed, sub.ID, st.Step)
			if failed > 0 || worst > time.Second {
				t.Errorf("GET /v1/status during the flood: worst %v, %d of %d failed; want every answer within 1 s", worst, failed, polls)
			}
			// A source address gets 32 handshakes (the default PerIP) per
			// time a silent connection is held: the rest are refused.
			refused := refusedCount(t, tc.node, tc.port)
			if min := *floodConns - 32*(int(f.took/tc.hold)+2); refused < min || f.connected.Load() < int64(*floodConns) {
				t.Errorf("the node refused %d of the flood's %d connections (%d connected); want at least %d closed at once",
					refused, *floodConns, f.connected.Load(), min)
			}
			t.Logf("node %s refused %d connections; its open files peaked at %d (limit %d)", tc.node.opts.Name, refused, status.peakFiles, floodNodeFiles)
		})
	}
}

// raiseOpenFiles raises this process's open-files limit towards n (the
// hard limit caps it without privileges) and returns how many connections
// the flood may hold, leaving 1024 descriptors to the rest of the test.
func raiseOpenFiles(t *testing.T, n uint64) int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < n {
		want := lim
		want.Cur, want.Max = n, max(lim.Max, n)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			lim.Cur = lim.Max // not root: up to the hard limit
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
		} else {
			lim = want
		}
	}
	t.Logf("open-files limit of the test: %d", lim.Cur)
	return int(lim.Cur) - 1024
}

// flood holds silent connections to one address.
type flood struct {
	dialled           chan struct{} // closed when every dial has returned
	took              time.Duration // of the dials, valid after dialled
	connected, failed atomic.Int64
	mu                sync.Mutex // guards conns and closedByNode
	conns             []net.Conn
	closedByNode      int
}

// startFlood opens n connections to addr from 127.0.0.2, 8 dials at a
// time, and holds them without sending a byte. When it holds room, it
// closes those the node has closed.
func startFlood(addr string, n, room int) *flood {
	f := &flood{dialled: make(chan struct{})}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 2 * time.Second,
		// The port is chosen at connect, by the whole 4-tuple: a bind to
		// port 0 would search the ports in use, slower with every
		// connection held.
		Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1) })
		}}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				c, err := d.Dial("tcp", addr)
				if err != nil {
					f.failed.Add(1)
					continue
				}
				f.connected.Add(1)
				f.mu.Lock()
				if len(f.conns) >= room {
					f.conns = f.sweep()
				}
				f.conns = append(f.conns, c)
				f.mu.Unlock()
			}
		})
	}
	go func() {
		wg.Wait()
		f.took = time.Since(start)
		close(f.dialled)
	}()
	return f
}

// sweep closes the connections the node has closed and returns the others.
// The caller holds f.mu.
func (f *flood) sweep() []net.Conn {
	open := f.conns[:0]
	for _, c := range f.conns {
		if heldOpen(c) {
			open = append(open, c)
		} else {
			f.closedByNode++
			c.Close()
		}
	}
	clear(f.conns[len(open):])
	return open
}

// heldOpen reports whether the other end still holds c open: a peek finds
// nothing to read and no end of stream.
func heldOpen(c net.Conn) bool {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return false
	}
	open := false
	rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		open = n > 0 || errors.Is(err, unix.EAGAIN)
		return true
	})
	return open
}

// stop closes the flood's connections and returns how many of them the
// node had closed.
func (f *flood) stop() int {
	<-f.dialled
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.sweep() {
		c.Close()
	}
	return f.closedByNode
}

// statusWatch polls a node's GET /v1/status every 100 ms, each time on a
// new connection, and keeps the slowest answer and the most files the node
// had open.
type statusWatch struct {
	done      chan struct{}
	ended     chan struct{}
	worst     time.Duration
	fails     int
	polls     int
	peakFiles int // the node's open files, at most, at the polls
}

func watchStatus(n *Node) *statusWatch {
	w := &statusWatch{done: make(chan struct{}), ended: make(chan struct{})}
	tr := n.client.Transport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	go func() {
		defer close(w.ended)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
			t0 := time.Now()
			res, err := hc.Get("https://" + n.HTTP + "/v1/status")
			if err == nil {
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", res.StatusCode)
				}
			}
			w.polls++
			w.worst = max(w.worst, time.Since(t0))
			if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", n.cmd.Process.Pid)); err == nil {
				w.peakFiles = max(w.peakFiles, len(fds))
			}
			if err != nil {
				w.fails++
			}
		}
	}()
	return w
}

// stop ends the polling and returns the slowest answer, the failures and
// the polls.
func (w *statusWatch) stop() (time.Duration, int, int) {
	close(w.done)
	<-w.ended
	return w.worst, w.fails, w.polls
}

// refusedCount is the node's ppnode_conns_refused_total of port, over
// every limit.
func refusedCount(t *testing.T, n *Node, port string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+n.HTTP+"/metrics", nil)
	res, err := n.client.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer res.Body.Close()
	total := 0
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "ppnode_conns_refused_total{") || !strings.Contains(line, `port="`+port+`"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		total += int(v)
	}
	return total
}
