package integration

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/job"
)

// The fault-injection scenarios of testdata/scenarios (see the package
// doc, "Scenarios"): stage nodes killed, hung and cut off mid-job, and a
// graceful leave; each job ends with the weights of the run without the
// fault. Run one with -run 'TestScenarios/NAME'.
func TestScenarios(t *testing.T) {
	RunScenarios(t, "testdata/scenarios/*.txt")
}

// The scenario language's reader: words, quotes, comments, and the
// errors a bad script gets.
func TestScenarioParse(t *testing.T) {
	words := []struct {
		line string
		want []string
	}{
		{"", nil},
		{"   # a comment", nil},
		{"at step 50 kill c # the last stage", []string{"at", "step", "50", "kill", "c"}},
		{`train mlp32 partition="fc1-fc16@a; fc17-fc32@b"  steps=10`, []string{"train", "mlp32", "partition=fc1-fc16@a; fc17-fc32@b", "steps=10"}},
		{`wait log c "the stage stops"`, []string{"wait", "log", "c", "the stage stops"}},
		{"\tstart 3\tnetns\r", []string{"start", "3", "netns"}},
	}
	for _, c := range words {
		got, err := splitWords(c.line)
		if err != nil || len(got) != len(c.want) {
			t.Errorf("splitWords(%q) = %q, %v; want %q", c.line, got, err, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("splitWords(%q) = %q; want %q", c.line, got, c.want)
				break
			}
		}
	}
	if _, err := parseScenario("x.txt", "start 3\ntrain \"mlp32\n"); err == nil || err.Error() != "x.txt:2: unterminated quote" {
		t.Errorf("an unterminated quote: %v, want x.txt:2: unterminated quote", err)
	}
	// Statements that fail before touching a cluster.
	bad := []struct{ stmt, want string }{
		{"fly away", `unknown statement "fly"`},
		{"kill c", "no cluster"},
		{"at step x kill c", `step "x"`},
		{"at 5 kill c", "usage: at step N"},
		{"cut link b", "usage: cut link NODE NODE"},
		{"start 0", "want 1 to 26"},
		{"start 3 speed=2", `unknown option "speed=2"`},
		{"wait recovery 1", "no job"},
		{"wait nothing 1", "wait nothing"},
		{"expect done", "no job"},
	}
	for _, c := range bad {
		words, _ := splitWords(c.stmt)
		s := &scenario{t: t, name: "parse"}
		err := s.exec(stmt{line: 1, text: c.stmt, words: words}, words)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.stmt, err, c.want)
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
func TestNetworkCut(t *testing.T) {
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
