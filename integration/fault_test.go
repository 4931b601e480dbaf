package integration

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/linkprobe"
	"github.com/ppnode/ppnode/portrange"
)

// The fault-injection scenarios of testdata/scenarios (see the package
// doc, "Scenarios"): stage nodes killed, hung and cut off mid-job, and a
// graceful leave; each job ends with the weights of the run without the
// fault. Run one with -run 'TestScenarios/NAME'.
func TestScenarios(t *testing.T) {
	t.Parallel()
	RunScenarios(t, "testdata/scenarios")
}

// Directives that fail before touching a cluster say why.
func TestScenarioDirectives(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{"fly away", `unknown directive "fly"`},
		{"kill c", "no cluster"},
		{"kill", "usage: kill NODE"},
		{"at step=x", "usage: at step=N"},
		{"at 5", `unknown argument "5"`},
		{"cut b", "usage: cut NODE NODE"},
		{"start n=0", "want 1 to 26"},
		{"start n=3 speed=2", `unknown argument "speed"`},
		{"wait recovery=1", "no job"},
		{"wait nothing=1", `unknown argument "nothing"`},
		{"expect done", "no job"},
		{"expect done recoveries=1 recoveries=2", "given twice"},
	} {
		cmd, args, err := datadriven.ParseLine(c.line)
		if err != nil {
			t.Fatal(err)
		}
		s := &scenario{t: t, name: "parse"}
		if err := s.exec(&datadriven.TestData{Cmd: cmd, CmdArgs: args}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.line, err, c.want)
		}
	}
}

// localSHA is the weights fingerprint of spec trained in this process.
func localSHA(t *testing.T, spec job.Spec) string {
	t.Helper()
	sha, err := FaultFreeSHA(spec)
	if err != nil {
		t.Fatal(err)
	}
	return sha
}

// A cut link drops the packets between its two nodes only, both ways, and
// Restore brings them back; the namespaces are gone after the test.
func TestNetworkCut(t *testing.T) { // not parallel: its 300 ms reach checks need a quiet machine
	var prefix string
	t.Run("cut", func(t *testing.T) {
		nw := NewNetwork(t)
		prefix = nw.prefix
		names := []string{"a", "b", "c"}
		addrs := map[string]string{}
		for _, n := range names {
			ip, err := nw.AddNode(n)
			if err != nil {
				t.Fatal(err)
			}
			path, err := nw.nodeNetns(n)
			if err != nil {
				t.Fatal(err)
			}
			var ln net.Listener
			var lerr error
			if err := inNetns(path, func() { ln, lerr = net.Listen("tcp", ip+":0") }); err != nil || lerr != nil {
				t.Fatalf("listening in %s's namespace: %v %v", n, err, lerr)
			}
			defer ln.Close() // connections wait in the backlog: no accept needed
			addrs[n] = ln.Addr().String()
		}
		// connects reports whether from reaches to's listener within 300 ms.
		connects := func(from, to string) bool {
			path, err := nw.nodeNetns(from)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			c, err := dialInNetns(ctx, path, "tcp", addrs[to])
			if err != nil {
				return false
			}
			c.Close()
			return true
		}
		reach := func(when string, want map[[2]string]bool) {
			for _, x := range names {
				for _, y := range names {
					if x == y {
						continue
					}
					w, ok := want[[2]string{x, y}]
					if !ok {
						w = true
					}
					if got := connects(x, y); got != w {
						t.Errorf("%s: %s reaches %s: %v, want %v", when, x, y, got, w)
					}
				}
			}
		}
		reach("before the cut", nil)
		if err := nw.Cut("b", "c"); err != nil {
			t.Fatal(err)
		}
		if err := nw.Cut("c", "b"); err == nil {
			t.Error("cutting a cut link again: no error")
		}
		reach("link b-c cut", map[[2]string]bool{{"b", "c"}: false, {"c", "b"}: false})
		if err := nw.Cut("a", "c"); err != nil {
			t.Fatal(err)
		}
		reach("links b-c and a-c cut", map[[2]string]bool{{"b", "c"}: false, {"c", "b"}: false, {"a", "c"}: false, {"c", "a"}: false})
		if err := nw.Restore("c", "b"); err != nil {
			t.Fatal(err)
		}
		reach("link b-c restored", map[[2]string]bool{{"a", "c"}: false, {"c", "a"}: false})
		if err := nw.Restore("a", "c"); err != nil {
			t.Fatal(err)
		}
		reach("all restored", nil)
		if err := nw.Restore("a", "c"); err == nil {
			t.Error("restoring a link that is not cut: no error")
		}
	})
	if prefix != "" {
		if left := netnsNamed(prefix); len(left) > 0 {
			t.Errorf("namespaces left after the test: %v", left)
		}
	}
}

// A shaped link carries about its rate, each way, and a new rate applies
// to a connection that is already streaming; the other links keep theirs.
func TestNetworkRate(t *testing.T) { // not parallel: it measures throughput
	nw := NewNetwork(t)
	ips := map[string]string{}
	for _, n := range []string{"a", "b", "c"} {
		ip, err := nw.AddNode(n)
		if err != nil {
			t.Fatal(err)
		}
		ips[n] = ip
	}
	// stream opens a connection from one node to a sink on another and
	// returns a function measuring its rate over d, and one closing it.
	// (Two streams against each other on a slow link would delay each
	// other's acknowledgements.)
	stream := func(from, to string) (func(d time.Duration) float64, func()) {
		path, err := nw.nodeNetns(to)
		if err != nil {
			t.Fatal(err)
		}
		var ln net.Listener
		var lerr error
		if err := inNetns(path, func() { ln, lerr = net.Listen("tcp", ips[to]+":0") }); err != nil || lerr != nil {
			t.Fatalf("listening in %s: %v %v", to, err, lerr)
		}
		t.Cleanup(func() { ln.Close() })
		var got atomic.Int64
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			buf := make([]byte, 1<<16)
			for {
				n, err := c.Read(buf)
				got.Add(int64(n))
				if err != nil {
					return
				}
			}
		}()
		fromNs, err := nw.nodeNetns(from)
		if err != nil {
			t.Fatal(err)
		}
		c, err := dialInNetns(context.Background(), fromNs, "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		go func() {
			buf := make([]byte, 1<<16)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
		measure := func(d time.Duration) float64 {
			time.Sleep(d / 2) // past slow start
			n0, t0 := got.Load(), time.Now()
			time.Sleep(d) // a measurement window, not a wait for a condition
			return float64(got.Load()-n0) * 8 / time.Since(t0).Seconds()
		}
		return measure, func() { c.Close() }
	}
	if err := nw.SetRate("a", "b", 20e6); err != nil {
		t.Fatal(err)
	}
	within := func(what string, got, want float64) {
		t.Logf("%s: %.1f Mbit/s (set %.0f)", what, got/1e6, want/1e6)
		if got < 0.8*want || got > 1.1*want {
			t.Errorf("%s: %.1f Mbit/s, want %.0f within -20%%/+10%%", what, got/1e6, want/1e6)
		}
	}
	ab, stop := stream("a", "b")
	within("a to b at 20 Mbit/s", ab(time.Second), 20e6)
	stop()
	ba, _ := stream("b", "a")
	within("b to a at 20 Mbit/s", ba(time.Second), 20e6)
	if err := nw.SetRate("b", "a", 100e6); err != nil {
		t.Fatal(err)
	}
	within("b to a raised to 100 Mbit/s", ba(time.Second), 100e6)
	if err := nw.SetRate("a", "b", 0); err != nil {
		t.Fatal(err)
	}
	if r := ba(500 * time.Millisecond); r < 300e6 {
		t.Errorf("b to a unshaped again: %.0f Mbit/s, want at least 300", r/1e6)
	}
	ac, stopAC := stream("a", "c")
	if r := ac(500 * time.Millisecond); r < 300e6 {
		t.Errorf("unshaped a to c: %.0f Mbit/s, want at least 300", r/1e6)
	}
	stopAC()
	// The link probe measures the shaped rates, within 20%, in about a
	// tenth of a second.
	srv := probeServer(t, nw, "c", ips["c"])
	for _, rate := range []uint64{20e6, 1e9} {
		if err := nw.SetRate("a", "c", rate); err != nil {
			t.Fatal(err)
		}
		path, _ := nw.nodeNetns("a")
		var r linkprobe.Result
		var perr error
		if err := inNetns(path, func() { r, perr = linkprobe.Measure(context.Background(), srv, linkprobe.Options{}) }); err != nil || perr != nil {
			t.Fatalf("probing c from a: %v %v", err, perr)
		}
		t.Logf("probe a to c at %d Mbit/s: %.1f Mbit/s, RTT %v, %d bytes in %v", rate/1e6, r.BytesPerSec*8/1e6, r.RTT, r.Bytes, r.Took)
		if got := r.BytesPerSec * 8; got < 0.8*float64(rate) || got > 1.2*float64(rate) {
			t.Errorf("probe at %d Mbit/s measured %.1f", rate/1e6, got/1e6)
		}
		if r.Took > time.Second {
			t.Errorf("probe at %d Mbit/s took %v", rate/1e6, r.Took)
		}
	}
	if err := nw.SetRate("a", "a", 1e6); err == nil {
		t.Error("SetRate of a node with itself: no error")
	}
	if err := nw.SetRate("a", "b", 100); err == nil {
		t.Error("SetRate of 100 bit/s: no error")
	}
}

// probeServer runs a link probe server in node name's namespace.
func probeServer(t *testing.T, nw *Network, name, ip string) string {
	t.Helper()
	path, err := nw.nodeNetns(name)
	if err != nil {
		t.Fatal(err)
	}
	var srv *linkprobe.Server
	var lerr error
	if err := inNetns(path, func() { srv, lerr = linkprobe.Listen(ip, portrange.Range{}, nil) }); err != nil || lerr != nil {
		t.Fatalf("probe server in %s: %v %v", name, err, lerr)
	}
	t.Cleanup(func() { srv.Close() })
	return srv.Addr()
}
