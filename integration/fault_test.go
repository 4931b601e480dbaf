package integration

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/ppnode/ppnode/job"
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
