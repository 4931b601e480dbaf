package admit

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/ppnode/ppnode/clock"
)

// Limits bound the connections of a [Gate]. A zero field takes its
// default.
type Limits struct {
	// PerIP bounds the connections in their handshake from one peer
	// address (IPv6: one /64).
	PerIP int
	// Handshakes bounds the connections in their handshake from all
	// peers.
	Handshakes int
	// Conns bounds the connections held at once, in their handshake or
	// past it.
	Conns int
	// Handshake is how long a connection may take to complete its
	// handshake.
	Handshake time.Duration
}

// Defaults of [Limits]: a cluster's peers open a few connections each
// (one gRPC connection per node, one per stage link, short HTTP
// requests), far below these.
const (
	DefaultPerIP      = 32
	DefaultHandshakes = 256
	DefaultConns      = 1024
	DefaultHandshake  = 5 * time.Second
)

// WithDefaults returns l with its zero fields set to their defaults.
func (l Limits) WithDefaults() Limits {
	if l.PerIP <= 0 {
		l.PerIP = DefaultPerIP
	}
	if l.Handshakes <= 0 {
		l.Handshakes = DefaultHandshakes
	}
	if l.Conns <= 0 {
		l.Conns = DefaultConns
	}
	if l.Handshake <= 0 {
		l.Handshake = DefaultHandshake
	}
	return l
}

// Validate refuses negative limits (zero means the default).
func (l Limits) Validate() error {
	if l.PerIP < 0 || l.Handshakes < 0 || l.Conns < 0 || l.Handshake < 0 {
		return fmt.Errorf("admit: negative limit in %+v", l)
	}
	return nil
}

// Stats are a gate's counters since it was made, and what it holds now.
type Stats struct {
	// Accepted counts the connections taken.
	Accepted uint64
	// RefusedPerIP, RefusedHandshakes and RefusedConns count the
	// connections closed at once because PerIP, Handshakes or Conns was
	// reached.
	RefusedPerIP, RefusedHandshakes, RefusedConns uint64
	// TimedOut counts the connections closed because their handshake took
	// longer than Handshake.
	TimedOut uint64
	// InHandshake and Held are the connections in their handshake and in
	// all, now.
	InHandshake, Held int
}

// Refused is the sum of the refusals.
func (s Stats) Refused() uint64 { return s.RefusedPerIP + s.RefusedHandshakes + s.RefusedConns }

// A Gate decides which connections its listeners take. It is safe for
// concurrent use; one gate may serve several listeners, which then share
// its limits.
type Gate struct {
	lim   Limits
	clock clock.Clock // times the handshakes

	mu      sync.Mutex           // guards pending and stats
	pending map[netip.Prefix]int // connections in handshake, by peer block
	stats   Stats
}

// NewGate returns a gate with limits l (zero fields: defaults) that
// times handshakes with c (nil: the wall clock).
func NewGate(l Limits, c clock.Clock) *Gate {
	return &Gate{lim: l.WithDefaults(), clock: clock.Or(c), pending: map[netip.Prefix]int{}}
}

// Limits are the gate's limits, defaults filled in.
func (g *Gate) Limits() Limits { return g.lim }

// Stats returns the gate's counters.
func (g *Gate) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stats
}

// reason a connection is refused; "" when it is taken.
type reason string

const (
	admitted       reason = ""
	overPerIP      reason = "per_ip"
	overHandshakes reason = "handshakes"
	overConns      reason = "conns"
)

// admit takes a connection from peer into its handshake, or says which
// limit refuses it.
func (g *Gate) admit(peer netip.Prefix) reason {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.stats.Held >= g.lim.Conns:
		g.stats.RefusedConns++
		return overConns
	case g.stats.InHandshake >= g.lim.Handshakes:
		g.stats.RefusedHandshakes++
		return overHandshakes
	case g.pending[peer] >= g.lim.PerIP:
		g.stats.RefusedPerIP++
		return overPerIP
	}
	g.pending[peer]++
	g.stats.InHandshake++
	g.stats.Held++
	g.stats.Accepted++
	return admitted
}

// establish moves a connection of peer out of its handshake.
func (g *Gate) establish(peer netip.Prefix) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.unpend(peer)
}

// release forgets a closed connection of peer; inHandshake says whether
// it was still in its handshake, timedOut whether the deadline closed it.
func (g *Gate) release(peer netip.Prefix, inHandshake, timedOut bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if inHandshake {
		g.unpend(peer)
	}
	if timedOut {
		g.stats.TimedOut++
	}
	g.stats.Held--
}

func (g *Gate) unpend(peer netip.Prefix) {
	g.stats.InHandshake--
	if g.pending[peer]--; g.pending[peer] <= 0 {
		delete(g.pending, peer)
	}
}

// peerOf is the block a connection's limits count it in: its IPv4
// address, or its IPv6 address's /64. An address that is not IP (a pipe,
// a Unix socket) counts as one block.
func peerOf(a net.Addr) netip.Prefix {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	case *net.UDPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	}
	ip = ip.Unmap()
	bits := 32
	switch {
	case !ip.IsValid():
		return netip.Prefix{}
	case ip.Is6():
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}
