package nodes

import (
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/ppnode/ppnode/cluster"
	"github.com/ppnode/ppnode/job"
)

// Tags of the gossiped node metadata.
const (
	tagHTTP  = "http"  // the HTTP API's host:port
	tagStore = "store" // "1": the node keeps checkpoints (it can hold cuts)
	tagProbe = "probe" // the link probe server's host:port (linkprobe)
	tagCPUs  = "cpus"  // the CPU limit at the node's start, in CPUs (none: no limit)
)

// members is this node's view of the cluster: the gossip membership, the
// last known HTTP address of every member (a failed one's too), a signal
// at every membership event, and the HTTP client that reaches the
// members' APIs.
type members struct {
	self string
	// node is the gossip membership, set once by Start before anything
	// reads it.
	node *cluster.Node
	hc   *http.Client // calls to other nodes, with this node's certificate

	mu     sync.Mutex // guards httpOf and next
	httpOf map[string]string
	next   chan struct{} // closed and replaced at every membership event
}

func newMembers(self string, hc *http.Client) *members {
	return &members{self: self, hc: hc, httpOf: map[string]string{}, next: make(chan struct{})}
}

// list are the members this node believes alive, itself included.
func (ms *members) list() []cluster.Member { return ms.node.Members() }

// known reports whether name is a member this node believes alive or has
// seen in gossip before (a member declared failed while it was starved of
// CPU still is one).
func (ms *members) known(name string) bool {
	ms.mu.Lock()
	_, seen := ms.httpOf[name]
	ms.mu.Unlock()
	return seen || slices.ContainsFunc(ms.list(), func(m cluster.Member) bool { return m.Name == name })
}

// client is a client of another node's API at addr.
func (ms *members) client(addr string) *Client { return NewClientWith(addr, ms.hc) }

// seen notes the HTTP address a member gossips.
func (ms *members) seen(m cluster.Member) {
	if h := m.Meta.Tags[tagHTTP]; h != "" {
		ms.mu.Lock()
		ms.httpOf[m.Name] = h
		ms.mu.Unlock()
	}
}

// lastHTTP is the last HTTP address member name gossiped, even if it has
// failed since ("": none).
func (ms *members) lastHTTP(name string) string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.httpOf[name]
}

// changed returns a channel closed at the next membership event.
func (ms *members) changed() <-chan struct{} {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.next
}

// notify closes the channel of changed: a membership event happened.
func (ms *members) notify() {
	ms.mu.Lock()
	close(ms.next)
	ms.next = make(chan struct{})
	ms.mu.Unlock()
}

// usable are the members a new job may use: alive, not leaving, with
// valid metadata and an actor address.
func (ms *members) usable() []job.NodeInfo {
	var out []job.NodeInfo
	for _, m := range ms.list() {
		if m.State != cluster.StateAlive || m.Leaving || m.MetaErr != nil || m.Meta.ActorAddr == "" {
			continue
		}
		out = append(out, job.NodeInfo{
			Name: m.Name, ActorAddr: m.Meta.ActorAddr, GFLOPS: m.Meta.Profile.GEMMGFLOPS,
			Memory: int64(min(m.Meta.Profile.MemoryBytes, 1<<62)), Threads: m.Meta.Profile.Threads,
			ProbeAddr: m.Meta.Tags[tagProbe],
		})
	}
	return out
}

// peer is another member that can hold copies of a job.
type peer struct{ name, http string }

// peers are the other members that can hold a job's copies: alive, not
// leaving, with an HTTP API and a checkpoint store; sorted by name.
func (ms *members) peers() []peer {
	var out []peer
	for _, m := range ms.list() {
		if m.Name != ms.self && m.State == cluster.StateAlive && !m.Leaving && m.MetaErr == nil &&
			m.Meta.Tags[tagHTTP] != "" && m.Meta.Tags[tagStore] == "1" {
			out = append(out, peer{m.Name, m.Meta.Tags[tagHTTP]})
		}
	}
	slices.SortFunc(out, func(x, y peer) int { return strings.Compare(x.name, y.name) })
	return out
}

func peerNames(ps []peer) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.name
	}
	return out
}

// httpAddrs returns the HTTP addresses of the members this node believes
// alive, by name.
func (ms *members) httpAddrs() map[string]string {
	out := map[string]string{}
	for _, m := range ms.list() {
		if m.State == cluster.StateAlive && m.MetaErr == nil && m.Meta.Tags[tagHTTP] != "" {
			out[m.Name] = m.Meta.Tags[tagHTTP]
		}
	}
	return out
}

// successors returns, for every member, whether it may take a job over:
// alive, not leaving, with valid metadata.
func (ms *members) successors() map[string]bool {
	out := map[string]bool{}
	for _, m := range ms.list() {
		out[m.Name] = m.State == cluster.StateAlive && !m.Leaving && m.MetaErr == nil
	}
	return out
}

// Profile is a node's measured speed and size.
type Profile struct {
	GFLOPS  float64 `json:"gflops"`
	Memory  uint64  `json:"memory_bytes"`
	Threads int     `json:"threads"`
	// CPULimit is the node's CPU limit in CPUs (its cgroup's quota; 0:
	// none): this node's now, a member's as it was at its start.
	CPULimit float64 `json:"cpu_limit,omitempty"`
}

func toProfile(p cluster.Profile) Profile {
	return Profile{GFLOPS: p.GEMMGFLOPS, Memory: p.MemoryBytes, Threads: p.Threads}
}

// MemberState is what a node sees of a member.
type MemberState string

// The states of a member.
const (
	MemberAlive   MemberState = "alive"
	MemberLeaving MemberState = "leaving" // alive, announced it leaves
	MemberLeft    MemberState = "left"
	MemberFailed  MemberState = "failed"
)

// Usable reports whether a member in state s still runs (alive, or alive
// and leaving).
func (s MemberState) Usable() bool { return s == MemberAlive || s == MemberLeaving }

// MemberStatus is one member as this node sees it.
type MemberStatus struct {
	Name    string      `json:"name"`
	State   MemberState `json:"state"`
	Gossip  string      `json:"gossip"`
	Actors  string      `json:"actors,omitempty"`
	HTTP    string      `json:"http,omitempty"`
	Version string      `json:"version,omitempty"`
	Profile Profile     `json:"profile"`
	Error   string      `json:"error,omitempty"`
}

// statuses are the members as this node sees them (Status.Members).
func (ms *members) statuses() []MemberStatus {
	var out []MemberStatus
	for _, m := range ms.list() {
		st := MemberStatus{Name: m.Name, Gossip: m.Addr, Actors: m.Meta.ActorAddr, HTTP: m.Meta.Tags[tagHTTP],
			Version: m.Meta.Version, Profile: toProfile(m.Meta.Profile)}
		st.Profile.CPULimit = parseCPUs(m.Meta.Tags[tagCPUs])
		switch {
		case m.State == cluster.StateAlive && m.Leaving:
			st.State = MemberLeaving
		case m.State == cluster.StateAlive:
			st.State = MemberAlive
		case m.State == cluster.StateLeft:
			st.State = MemberLeft
		default:
			st.State = MemberFailed
		}
		if m.MetaErr != nil {
			st.Error = m.MetaErr.Error()
		}
		out = append(out, st)
	}
	return out
}
