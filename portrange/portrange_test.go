package portrange

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for s, want := range map[string]Range{"": {}, "7950-7999": {7950, 7999}, "8000-8000": {8000, 8000}} {
		if got, err := Parse(s); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"7950", "7999-7950", "0-10", "1-65536", "a-b", "-5", "5-", "1-2-3"} {
		if _, err := Parse(s); err == nil || !strings.Contains(err.Error(), "LO-HI") {
			t.Errorf("Parse(%q): err %v, want a LO-HI error", s, err)
		}
	}
}

// Listeners take distinct ports of the range until it is used up, then a
// clear error; closing one frees its port.
func TestListenStaysInTheRange(t *testing.T) {
	probe, err := net.Listen("tcp", "127.0.0.1:0") // a free neighbourhood, most likely
	if err != nil {
		t.Fatal(err)
	}
	base := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	r := Range{base, base + 3}
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	seen := map[int]bool{}
	for range 4 {
		ln, err := r.Listen("127.0.0.1")
		if err != nil {
			t.Skipf("a port of %v is taken by another process: %v", r, err)
		}
		lns = append(lns, ln)
		p := ln.Addr().(*net.TCPAddr).Port
		if p < r.Lo || p > r.Hi || seen[p] {
			t.Fatalf("port %d: outside %v or taken twice", p, r)
		}
		seen[p] = true
	}
	if _, err := r.Listen("127.0.0.1"); err == nil || !strings.Contains(err.Error(), "no free TCP port in "+r.String()) {
		t.Fatalf("a fifth listener: err %v, want the range used up", err)
	}
	freed := lns[2].Addr().(*net.TCPAddr).Port
	lns[2].Close()
	ln, err := r.Listen("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	lns[2] = ln
	if got := ln.Addr().(*net.TCPAddr).Port; got != freed {
		t.Fatalf("got port %d, want the freed %d", got, freed)
	}
	if ln, err := (Range{}).Listen("127.0.0.1"); err != nil {
		t.Fatal(err)
	} else {
		ln.Close()
	}
	if _, err := r.Listen("127.0.0.1:" + strconv.Itoa(base)); err == nil {
		t.Fatal("a bad host: no error")
	}
}
