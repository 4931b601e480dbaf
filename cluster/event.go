package cluster

import (
	"sync"
	"time"
)

//go:generate stringer -type=EventKind,State -output=kind_string.go

// EventKind says what happened to a member.
type EventKind int

const (
	// EventJoin: the member joined (or came back after leaving or failing).
	// A node sees its own join first.
	EventJoin EventKind = iota + 1
	// EventUpdate: the member changed its metadata.
	EventUpdate
	// EventLeave: the member left cleanly ([Node.Leave]).
	EventLeave
	// EventFailed: the member stopped answering probes and was declared
	// dead (crash, hang, network loss).
	EventFailed
)

// State is a member's state as this node last saw it.
type State int

const (
	// StateAlive: the member is in the cluster. memberlist does not report
	// its intermediate "suspect" state, so a suspected member stays alive
	// here until it refutes or is declared failed.
	StateAlive State = iota + 1
	// StateLeft: the member left cleanly.
	StateLeft
	// StateFailed: the member was declared dead.
	StateFailed
)

// Member is a snapshot of one member of the cluster.
type Member struct {
	Name  string
	Addr  string // gossip address, host:port
	State State
	// Meta is the member's decoded metadata; zero if MetaErr is set.
	Meta Meta
	// MetaErr is set (wrapping [ErrBadMeta]) if the member's metadata
	// could not be decoded, for example from a node of another version.
	MetaErr error
	// Leaving is set once the member has announced that it is leaving
	// ([Node.Announce], [Node.Leave]), in an EventUpdate; it is still
	// alive until its EventLeave.
	Leaving bool
}

// Event is a change in the membership as this node observed it.
type Event struct {
	Kind   EventKind
	Member Member
	Time   time.Time // when this node observed it
}

// eventQueue is an unbounded FIFO between memberlist's callbacks, which
// must never block, and the dispatcher, which may wait on a slow consumer.
// A pending join or update is coalesced with a later update of the same
// member, so metadata churn cannot grow the queue; joins, leaves and
// failures are kept one by one, so it grows by at most one entry per
// membership change while nobody reads.
type eventQueue struct {
	ready chan struct{} // capacity 1: a token when items may be non-empty

	mu     sync.Mutex // guards items and closed
	items  []Event
	closed bool
}

func newEventQueue() *eventQueue {
	return &eventQueue{ready: make(chan struct{}, 1)}
}

// push adds ev; it never blocks beyond a short critical section.
func (q *eventQueue) push(ev Event) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	if ev.Kind == EventUpdate && q.coalesce(ev) {
		q.mu.Unlock()
		return
	}
	q.items = append(q.items, ev)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// coalesce folds the update ev into the member's last pending event if
// that is a join or an update. q.mu must be held.
func (q *eventQueue) coalesce(ev Event) bool {
	for i := len(q.items) - 1; i >= 0; i-- {
		p := &q.items[i]
		if p.Member.Name != ev.Member.Name {
			continue
		}
		if p.Kind != EventJoin && p.Kind != EventUpdate {
			return false
		}
		p.Member = ev.Member
		p.Time = ev.Time
		return true
	}
	return false
}

// pop removes the oldest event, if any.
func (q *eventQueue) pop() (Event, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return Event{}, false
	}
	ev := q.items[0]
	q.items[0] = Event{}
	q.items = q.items[1:]
	if len(q.items) == 0 {
		q.items = nil // let the backing array go
	}
	return ev, true
}

// close drops pending events and makes push a no-op.
func (q *eventQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.items = nil
	q.mu.Unlock()
}

// len reports the number of pending events.
func (q *eventQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}
