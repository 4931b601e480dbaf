// Package portrange owns listening on a port from a range an operator
// opened in a firewall ("7950-7999"), for the listeners whose ports are
// otherwise left to the system: the data plane's links and the link probe.
package portrange

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"syscall"
)

// Range is the ports Lo..Hi, both included. The zero Range means any port
// the system picks.
type Range struct{ Lo, Hi int }

// Parse reads "LO-HI" (1 <= LO <= HI <= 65535) or "" (the zero Range).
func Parse(s string) (Range, error) {
	if s == "" {
		return Range{}, nil
	}
	lo, hi, ok := strings.Cut(s, "-")
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	if !ok || err1 != nil || err2 != nil || a < 1 || b > 65535 || a > b {
		return Range{}, fmt.Errorf("port range %q: want LO-HI with 1 <= LO <= HI <= 65535", s)
	}
	return Range{a, b}, nil
}

func (r Range) String() string {
	if r == (Range{}) {
		return "any"
	}
	return fmt.Sprintf("%d-%d", r.Lo, r.Hi)
}

// Listen listens on TCP host:port for a free port of r, trying them from a
// random one on so that listeners opened together rarely collide; the zero
// Range lets the system pick. It fails when every port of r is taken.
func (r Range) Listen(host string) (net.Listener, error) {
	if r == (Range{}) {
		return net.Listen("tcp", net.JoinHostPort(host, "0"))
	}
	n := r.Hi - r.Lo + 1
	first := rand.IntN(n)
	for i := range n {
		port := r.Lo + (first+i)%n
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err == nil {
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("no free TCP port in %s on %s: all %d are in use", r, host, n)
}
