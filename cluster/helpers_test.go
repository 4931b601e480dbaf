package cluster

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

var logLevel = flag.String("cluster.log", "", "write memberlist's logs to stderr at this slog level (debug, info, warn, error); default: none")

func testLogger(t *testing.T) *slog.Logger {
	if *logLevel == "" {
		return slog.New(slog.DiscardHandler)
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*logLevel)); err != nil {
		t.Fatalf("-cluster.log: %v", err)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
}

// testMeta is a node's metadata in these tests; i makes it distinct.
func testMeta(i int) Meta {
	return Meta{
		ActorAddr: fmt.Sprintf("127.0.0.1:%d", 9000+i), // only a string: nothing listens
		Version:   "test",
		Profile:   Profile{GEMMGFLOPS: 10.5 + float64(i), MemoryBytes: uint64(i+1) << 30, Threads: i + 1},
		Tags:      map[string]string{"http": fmt.Sprintf("127.0.0.1:%d", 9100+i)},
	}
}

// start starts a node on 127.0.0.1 with an ephemeral port, closed when the
// test ends.
func start(t *testing.T, name string, meta Meta, mod func(*Config), seeds ...string) *Node {
	t.Helper()
	cfg := Config{Name: name, BindAddr: "127.0.0.1:0", Seeds: seeds, Meta: meta, Logger: testLogger(t)}
	if mod != nil {
		mod(&cfg)
	}
	n, err := Start(cfg)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// await reads n's events until match accepts one, and fails the test if
// none does within d. Events that do not match are dropped.
func await(t *testing.T, n *Node, d time.Duration, what string, match func(Event) bool) Event {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		select {
		case ev, ok := <-n.Events():
			if !ok {
				t.Fatalf("%s: waiting for %s: event channel closed", n.Name(), what)
			}
			if match(ev) {
				return ev
			}
		case <-deadline.C:
			t.Fatalf("%s: no %s within %v; members %v", n.Name(), what, d, names(n.Members()))
		}
	}
}

// awaitMembers waits until ok holds for n's members, checking after each
// event, and fails the test if it does not within d.
func awaitMembers(t *testing.T, n *Node, d time.Duration, what string, ok func([]Member) bool) []Member {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		if ms := n.Members(); ok(ms) {
			return ms
		}
		select {
		case _, open := <-n.Events():
			if !open {
				t.Fatalf("%s: waiting for %s: event channel closed", n.Name(), what)
			}
		case <-deadline.C:
			t.Fatalf("%s: not %s within %v; members %v", n.Name(), what, d, names(n.Members()))
		}
	}
}

func names(ms []Member) []string {
	var s []string
	for _, m := range ms {
		s = append(s, m.Name)
	}
	return s
}

func hasNames(want ...string) func([]Member) bool {
	slices.Sort(want)
	return func(ms []Member) bool { return slices.Equal(names(ms), want) }
}

func is(kind EventKind, name string) func(Event) bool {
	return func(ev Event) bool { return ev.Kind == kind && ev.Member.Name == name }
}

// recorder collects the events a node's memberlist reports, through
// Config.observed, without reading the node's channel. It never blocks
// memberlist.
type recorder struct {
	changed chan struct{} // capacity 1: a token after each event

	mu     sync.Mutex // guards events
	events []Event
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

func (r *recorder) observe(ev Event) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// await waits until ok holds for the events recorded so far.
func (r *recorder) await(t *testing.T, d time.Duration, what string, ok func([]Event) bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		done := ok(r.events)
		r.mu.Unlock()
		if done {
			return
		}
		select {
		case <-r.changed:
		case <-deadline.C:
			t.Fatalf("not %s within %v", what, d)
		}
	}
}
