package dataplane

import (
	"cmp"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
)

// PeerTraffic is what a data plane's links carried to and from one peer
// since the data plane was created ([TCP.Traffic]): the tensors (frames)
// sent and received, and the bytes of their tags and frames as written to
// and read from the connections after the handshake (with TLS: handed to
// and read from TLS, without its records' overhead).
type PeerTraffic struct {
	// Peer is the remote end's IP address: the host of the address a
	// link dialed, or the remote address of a connection a listener
	// accepted. Links to every node of one machine share it.
	Peer                  string
	SentFrames, SentBytes int64
	RecvFrames, RecvBytes int64
}

// meter counts the traffic of a data plane's links by peer. Its zero
// value is ready; it is safe for concurrent use. A nil *meter counts
// nothing.
type meter struct {
	mu    sync.Mutex // guards peers
	peers map[string]*peerCounters
}

// peerCounters are one peer's counters, shared by its links.
type peerCounters struct {
	sentFrames, sentBytes, recvFrames, recvBytes atomic.Int64
}

// peer returns the counters of the peer at addr (host:port or host).
func (m *meter) peer(addr string) *peerCounters {
	if m == nil {
		return nil
	}
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.peers == nil {
		m.peers = map[string]*peerCounters{}
	}
	pc := m.peers[host]
	if pc == nil {
		pc = &peerCounters{}
		m.peers[host] = pc
	}
	return pc
}

// traffic returns the counters by peer, sorted by peer.
func (m *meter) traffic() []PeerTraffic {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PeerTraffic, 0, len(m.peers))
	for host, pc := range m.peers {
		out = append(out, PeerTraffic{Peer: host, SentFrames: pc.sentFrames.Load(), SentBytes: pc.sentBytes.Load(),
			RecvFrames: pc.recvFrames.Load(), RecvBytes: pc.recvBytes.Load()})
	}
	slices.SortFunc(out, func(a, b PeerTraffic) int { return cmp.Compare(a.Peer, b.Peer) })
	return out
}

// readCounter counts the bytes read from a link's connection into its
// peer's counters (none until the link is metered).
type readCounter struct {
	r  io.Reader
	pc *peerCounters
}

func (rc *readCounter) Read(p []byte) (int, error) {
	n, err := rc.r.Read(p)
	if rc.pc != nil && n > 0 {
		rc.pc.recvBytes.Add(int64(n))
	}
	return n, err
}
