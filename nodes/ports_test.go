package nodes

import (
	"bufio"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/cluster"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/portrange"
)

// With DataPorts, the link probes listen in the range and the stage links
// of a running job connect to ports of it (the ports a firewall opens).
func TestDataPortsAreUsed(t *testing.T) {
	r := freeRange(t, 40)
	var as []*Agent
	for i, name := range []string{"a", "b", "c"} {
		var seeds []string
		if i > 0 {
			seeds = []string{as[0].GossipAddr()}
		}
		a, err := Start(Config{Name: name, Bind: "127.0.0.1:0", Seeds: seeds, HTTP: "127.0.0.1:0", Threads: 1,
			ProfileFor: 20 * time.Millisecond, DataPorts: r, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		as = append(as, a)
	}
	for _, a := range as {
		awaitMembers(t, a, 5*time.Second, "all members", func(ms []cluster.Member) bool { return len(ms) == 3 })
		if p := port(t, a.links.server.Addr()); p < r.Lo || p > r.Hi {
			t.Errorf("%s: link probe on port %d, outside %v", a.Name(), p, r)
		}
	}
	spec := smallSpec()
	spec.ID, spec.Partition = "ports", "uniform"
	spec.Steps, spec.Epochs = 0, 2000
	co, err := as[0].Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	awaitJob(t, co, time.Minute, "3 steps", func(s job.Status) bool { return s.State == job.StateTraining && s.Step >= 3 })
	if n := establishedTo(t, r); n < 2 {
		t.Errorf("%d established connections to ports of %v while the job trains over 3 nodes, want its links (at least 2)", n, r)
	}
	if err := as[0].Cancel(spec.ID); err != nil {
		t.Fatal(err)
	}
}

// freeRange returns n consecutive ports that nothing listens on now.
func freeRange(t *testing.T, n int) portrange.Range {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lo := port(t, ln.Addr().String())
	ln.Close()
	lo = min(lo, 65535-n)
	return portrange.Range{Lo: lo, Hi: lo + n - 1}
}

func port(t *testing.T, addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// establishedTo counts the established IPv4 TCP connections whose local
// port is in r: the accepted ends of links to listeners of r.
func establishedTo(t *testing.T, r portrange.Range) int {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 || fs[3] != "01" { // ESTABLISHED
			continue
		}
		_, hex, ok := strings.Cut(fs[1], ":")
		p, err := strconv.ParseUint(hex, 16, 16)
		if ok && err == nil && int(p) >= r.Lo && int(p) <= r.Hi {
			n++
		}
	}
	return n
}
