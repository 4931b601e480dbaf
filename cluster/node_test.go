package cluster

import (
	"bytes"
	"context"
	"errors"
	"net"
	"reflect"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/ppnode/ppnode/clock"
)

// converge is how long a membership change may take to reach everyone in
// these tests; with the LAN defaults it takes well under a second.
const converge = 3 * time.Second

// startThree starts a, then b and c through a as the only seed, and waits
// until all three see all three.
func startThree(t *testing.T, mod func(*Config)) (a, b, c *Node) {
	t.Helper()
	a = start(t, "a", testMeta(0), mod)
	b = start(t, "b", testMeta(1), mod, a.Addr())
	c = start(t, "c", testMeta(2), mod, a.Addr())
	for _, n := range []*Node{a, b, c} {
		awaitMembers(t, n, converge, "seeing a, b, c", hasNames("a", "b", "c"))
	}
	return a, b, c
}

// startThreeInMemory is startThree over memberlist's MockNetwork: no
// socket.
func startThreeInMemory(t *testing.T) (a, b, c *Node) {
	t.Helper()
	var mn memberlist.MockNetwork
	tr := map[string]memberlist.NodeAwareTransport{}
	for _, name := range []string{"a", "b", "c"} {
		tr[name] = mn.NewTransport(name)
	}
	with := func(name string) func(*Config) { return func(c *Config) { c.Transport = tr[name] } }
	a = start(t, "a", testMeta(0), with("a"))
	b = start(t, "b", testMeta(1), with("b"), a.Addr())
	c = start(t, "c", testMeta(2), with("c"), a.Addr())
	for _, n := range []*Node{a, b, c} {
		awaitMembers(t, n, converge, "seeing a, b, c", hasNames("a", "b", "c"))
	}
	return a, b, c
}

func TestThreeNodesJoinThroughOneSeed(t *testing.T) {
	a, b, c := startThree(t, nil)
	nodes := []*Node{a, b, c}
	for _, n := range nodes {
		_, port, err := net.SplitHostPort(n.Addr())
		if err != nil || port == "0" || !strings.HasPrefix(n.Addr(), "127.0.0.1:") {
			t.Errorf("%s: Addr() = %q, want 127.0.0.1 and the bound port", n.Name(), n.Addr())
		}
	}
	checkThree(t, nodes)
}

// The same in memory.
func TestThreeNodesJoinInMemory(t *testing.T) {
	a, b, c := startThreeInMemory(t)
	checkThree(t, []*Node{a, b, c})
}

// checkThree checks that each of nodes sees the others with their
// addresses and metadata.
func checkThree(t *testing.T, nodes []*Node) {
	t.Helper()
	for _, n := range nodes {
		for i, m := range n.Members() {
			want := nodes[i]
			if m.Name != want.Name() || m.Addr != want.Addr() || m.State != StateAlive || m.MetaErr != nil {
				t.Errorf("%s sees %+v, want name %s addr %s alive", n.Name(), m, want.Name(), want.Addr())
			}
			if !reflect.DeepEqual(m.Meta, testMeta(i)) {
				t.Errorf("%s sees %s's meta %+v, want %+v", n.Name(), m.Name, m.Meta, testMeta(i))
			}
		}
	}
}

func TestMetaUpdatePropagates(t *testing.T) {
	a, b, c := startThreeInMemory(t)
	m := b.Meta()
	m.Profile = Profile{GEMMGFLOPS: 123.25, MemoryBytes: 7 << 30, Threads: 2}
	m.Version = "test-2"
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	if err := b.SetMeta(ctx, m); err != nil {
		t.Fatalf("SetMeta: %v", err)
	}
	if got := b.Meta(); !reflect.DeepEqual(got, m) {
		t.Errorf("b.Meta() = %+v, want %+v", got, m)
	}
	for _, n := range []*Node{a, c} {
		// b's join may still be queued: the update is then folded into it.
		await(t, n, converge, "b with the new meta", func(ev Event) bool {
			return ev.Member.Name == "b" && (ev.Kind == EventUpdate || ev.Kind == EventJoin) &&
				reflect.DeepEqual(ev.Member.Meta, m)
		})
		if got := n.Members()[1].Meta; !reflect.DeepEqual(got, m) {
			t.Errorf("%s: Members() has b's meta %+v, want %+v", n.Name(), got, m)
		}
	}
}

func TestLeaveIsSeenAsLeave(t *testing.T) {
	a, b, c := startThree(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	t0 := time.Now()
	if err := c.Announce(ctx); err != nil {
		t.Fatalf("Announce: %v", err)
	}
	for _, n := range []*Node{a, b} {
		// c's join may still be queued: the mark is then folded into it.
		await(t, n, 2*time.Second, "c's leaving mark", func(ev Event) bool {
			return ev.Member.Name == "c" && (ev.Kind == EventUpdate || ev.Kind == EventJoin) && ev.Member.Leaving
		})
		if ms := n.Members(); len(ms) != 3 || !ms[2].Leaving || ms[2].State != StateAlive {
			t.Errorf("%s: members after the mark %+v, want c alive and leaving", n.Name(), ms)
		}
	}
	if err := c.SetMeta(ctx, testMeta(2)); err != nil {
		t.Fatalf("SetMeta: %v", err)
	}
	if err := c.Leave(ctx); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	for _, n := range []*Node{a, b} {
		ev := await(t, n, 2*time.Second, "leave of c", func(ev Event) bool {
			if ev.Member.Name == "c" && ev.Kind == EventFailed {
				t.Errorf("%s: c reported failed after a clean leave", n.Name())
			}
			return is(EventLeave, "c")(ev)
		})
		if ev.Member.State != StateLeft || !ev.Member.Leaving || !reflect.DeepEqual(ev.Member.Meta, testMeta(2)) {
			t.Errorf("%s: leave event %+v, want StateLeft, Leaving and c's meta", n.Name(), ev.Member)
		}
		t.Logf("%s saw c leave after %v", n.Name(), ev.Time.Sub(t0).Round(time.Millisecond))
		if got := names(n.Members()); !slices.Equal(got, []string{"a", "b"}) {
			t.Errorf("%s: members after leave %v, want [a b]", n.Name(), got)
		}
	}
	if _, open := <-c.Events(); open {
		t.Errorf("c: event channel open after Leave")
	}
	if err := c.Leave(ctx); err != nil {
		t.Errorf("second Leave: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close after Leave: %v", err)
	}
	if err := c.SetMeta(ctx, Meta{}); !errors.Is(err, ErrClosed) {
		t.Errorf("SetMeta after Leave: %v, want ErrClosed", err)
	}
}

// TestCrashIsDetected stops a node without leaving, as a crash would, and
// measures how long the two others take to report it failed.
func TestCrashIsDetected(t *testing.T) {
	const runs = 5
	var times []time.Duration
	for run := range runs {
		a, b, c := startThree(t, nil)
		t0 := time.Now()
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		var worst time.Duration
		for _, n := range []*Node{a, b} {
			ev := await(t, n, 5*time.Second, "failure of c", is(EventFailed, "c"))
			if ev.Member.State != StateFailed {
				t.Errorf("%s: failure event state %v", n.Name(), ev.Member.State)
			}
			worst = max(worst, ev.Time.Sub(t0))
		}
		t.Logf("run %d: both survivors reported c failed after %v", run, worst.Round(time.Millisecond))
		times = append(times, worst)
		_ = a.Close()
		_ = b.Close()
	}
	slices.Sort(times)
	median := times[runs/2]
	t.Logf("crash detection: median %v of %d runs (min %v, max %v)",
		median.Round(time.Millisecond), runs, times[0].Round(time.Millisecond), times[runs-1].Round(time.Millisecond))
	if median > 2*time.Second {
		t.Errorf("median crash detection %v, want at most 2 s", median)
	}
}

func TestRestartedNodeRejoinsUnderItsName(t *testing.T) {
	a, b, c := startThree(t, nil)
	oldAddr := c.Addr()
	_ = c.Close()
	for _, n := range []*Node{a, b} {
		await(t, n, 5*time.Second, "failure of c", is(EventFailed, "c"))
	}
	// A restart binds a new port; memberlist lets it take the dead
	// member's name once DeadNodeReclaimTime has passed.
	c2 := start(t, "c", testMeta(3), nil, a.Addr())
	if c2.Addr() == oldAddr {
		t.Fatalf("restart got the same address %s", oldAddr)
	}
	for _, n := range []*Node{a, b} {
		ev := await(t, n, converge, "c's rejoin", is(EventJoin, "c"))
		if ev.Member.Addr != c2.Addr() || !reflect.DeepEqual(ev.Member.Meta, testMeta(3)) {
			t.Errorf("%s: c rejoined as %+v, want addr %s", n.Name(), ev.Member, c2.Addr())
		}
	}
}

// TestQuickRestartRejoins restarts a node under its name before the
// cluster has noticed that the old instance died: memberlist refuses the
// new address while the old one looks alive, and Join retries until the
// old instance is declared failed.
func TestQuickRestartRejoins(t *testing.T) {
	a, b, c := startThree(t, nil)
	_ = c.Close()
	t0 := time.Now()
	c2 := start(t, "c", testMeta(3), nil, a.Addr())
	t.Logf("restarted c joined after %v", time.Since(t0).Round(time.Millisecond))
	for _, n := range []*Node{a, b} {
		await(t, n, converge, "c's new instance", func(ev Event) bool {
			return ev.Kind == EventJoin && ev.Member.Name == "c" && ev.Member.Addr == c2.Addr()
		})
	}
	t.Logf("a and b saw the new instance after %v", time.Since(t0).Round(time.Millisecond))
	awaitMembers(t, c2, converge, "seeing a, b, c", hasNames("a", "b", "c"))
}

func TestDuplicateNameIsRefused(t *testing.T) {
	fast := func(c *Config) { c.ProbeInterval, c.ProbeTimeout = 40*time.Millisecond, 20*time.Millisecond }
	a := start(t, "a", testMeta(0), fast)
	cfg := Config{Name: "a", BindAddr: "127.0.0.1:0", Seeds: []string{a.Addr()}, Logger: testLogger(t)}
	fast(&cfg)
	n, err := Start(cfg)
	if err == nil {
		_ = n.Close()
		t.Fatal("a second live node named a joined")
	}
	if !errors.Is(err, ErrJoin) || !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), a.Addr()) {
		t.Errorf("error %v, want ErrJoin and ErrNameTaken naming %s", err, a.Addr())
	}
	t.Logf("error: %v", err)
	if ms := a.Members(); len(ms) != 1 || ms[0].Addr != a.Addr() {
		t.Errorf("a's members: %+v", ms)
	}
}

func TestWrongKeyFailsToJoin(t *testing.T) {
	key1 := bytes.Repeat([]byte{1}, 32)
	key2 := bytes.Repeat([]byte{2}, 32)
	withKey := func(k []byte) func(*Config) { return func(c *Config) { c.SecretKey = k } }
	seed := start(t, "seed", testMeta(0), withKey(key1))
	plain := start(t, "plain", testMeta(1), nil)

	for _, tc := range []struct {
		name string
		key  []byte
		seed *Node
	}{
		{"other key", key2, seed},
		{"no key, cluster has one", nil, seed},
		{"key, cluster has none", key1, plain},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Name: "intruder", BindAddr: "127.0.0.1:0", Seeds: []string{tc.seed.Addr()},
				SecretKey: tc.key, Logger: testLogger(t)}
			n, err := Start(cfg)
			if err == nil {
				_ = n.Close()
				t.Fatal("joined with a mismatched key")
			}
			if !errors.Is(err, ErrJoin) || !errors.Is(err, ErrKeyMismatch) {
				t.Errorf("error %v, want ErrJoin and ErrKeyMismatch", err)
			}
			t.Logf("error: %v", err)
			if got := names(tc.seed.Members()); len(got) != 1 {
				t.Errorf("seed lists %v", got)
			}
		})
	}

	// The right key joins, and the encrypted cluster works.
	n := start(t, "friend", testMeta(2), withKey(key1), seed.Addr())
	awaitMembers(t, seed, converge, "seeing friend", hasNames("friend", "seed"))
	awaitMembers(t, n, converge, "seeing seed", hasNames("friend", "seed"))
}

func TestMetaOverLimitIsRefused(t *testing.T) {
	big := testMeta(0)
	big.Tags["blob"] = strings.Repeat("x", MaxMetaSize)
	_, err := Start(Config{Name: "big", BindAddr: "127.0.0.1:0", Meta: big, Logger: testLogger(t)})
	if !errors.Is(err, ErrMetaTooLarge) {
		t.Fatalf("Start with %d-byte tag: %v, want ErrMetaTooLarge", MaxMetaSize, err)
	}

	rec := newRecorder()
	a := start(t, "a", testMeta(0), func(c *Config) { c.observed = rec.observe })
	b := start(t, "b", testMeta(1), nil, a.Addr())
	awaitMembers(t, a, converge, "seeing b", hasNames("a", "b"))
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	if err := b.SetMeta(ctx, big); !errors.Is(err, ErrMetaTooLarge) {
		t.Fatalf("SetMeta over the limit: %v, want ErrMetaTooLarge", err)
	}
	if got := b.Meta(); !reflect.DeepEqual(got, testMeta(1)) {
		t.Errorf("b's meta changed to %+v after a refused update", got)
	}
	// A later valid update is the only one a sees.
	ok := testMeta(5)
	if err := b.SetMeta(ctx, ok); err != nil {
		t.Fatalf("SetMeta: %v", err)
	}
	rec.await(t, converge, "a sees b's update", func(evs []Event) bool {
		return slices.ContainsFunc(evs, is(EventUpdate, "b"))
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, ev := range rec.events {
		if ev.Kind == EventUpdate && !reflect.DeepEqual(ev.Member.Meta, ok) {
			t.Errorf("a saw b update to %+v", ev.Member.Meta)
		}
	}
}

// TestSlowReaderDoesNotBlockMemberlist holds a's event reader back while
// three nodes join through a and one updates its metadata. memberlist
// calls the event delegate with its node lock held, so a delegate that
// waited on the reader would stall a and the joins through it.
func TestSlowReaderDoesNotBlockMemberlist(t *testing.T) {
	rec := newRecorder()
	a := start(t, "a", testMeta(0), func(c *Config) { c.observed = rec.observe })
	t0 := time.Now()
	b := start(t, "b", testMeta(1), nil, a.Addr())
	start(t, "c", testMeta(2), nil, a.Addr())
	d := start(t, "d", testMeta(3), nil, a.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	if err := b.SetMeta(ctx, testMeta(4)); err != nil {
		t.Fatalf("SetMeta: %v", err)
	}
	awaitMembers(t, d, converge, "seeing all four", hasNames("a", "b", "c", "d"))
	rec.await(t, converge, "a's memberlist reporting the joins and b's update", func(evs []Event) bool {
		return slices.ContainsFunc(evs, is(EventJoin, "d")) && slices.ContainsFunc(evs, is(EventUpdate, "b"))
	})
	if got := a.Members()[1].Meta; !reflect.DeepEqual(got, testMeta(4)) {
		t.Errorf("a sees b's meta %+v, want the update", got)
	}
	t.Logf("three joins and an update went through a in %v with its reader stalled; %d events queued",
		time.Since(t0).Round(time.Millisecond), a.queue.len())

	// Now read: one join per member (memberlist may learn of c and d in
	// either order when they join at once), b's join carrying its updated
	// metadata (the pending update coalesced into it).
	var got []string
	for range 4 {
		ev := await(t, a, converge, "a join", func(Event) bool { return true })
		if ev.Kind != EventJoin {
			t.Fatalf("got %v of %s, want joins only", ev.Kind, ev.Member.Name)
		}
		if ev.Member.Name == "b" && !reflect.DeepEqual(ev.Member.Meta, testMeta(4)) {
			t.Errorf("join of b carries %+v, want the updated meta", ev.Member.Meta)
		}
		got = append(got, ev.Member.Name)
	}
	if slices.Sort(got); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Fatalf("joins of %v, want a, b, c and d once each", got)
	}
	if n := a.queue.len(); n != 0 {
		t.Errorf("%d events left after the joins", n)
	}
}

// TestNoGoroutineLeak runs the whole lifecycle, failures included, and
// checks that the goroutine count returns to where it was.
func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		key := bytes.Repeat([]byte{7}, 16)
		cfg := func(name string, i int, seeds ...string) Config {
			return Config{Name: name, BindAddr: "127.0.0.1:0", Seeds: seeds, Meta: testMeta(i), SecretKey: key, Logger: testLogger(t)}
		}
		a, err := Start(cfg("a", 0))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := Start(cfg("b", 1, a.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		c, err := Start(cfg("c", 2, a.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		awaitMembers(t, a, converge, "seeing a, b, c", hasNames("a", "b", "c"))
		if _, err := Start(Config{Name: "x", BindAddr: "127.0.0.1:0", Seeds: []string{a.Addr()}, Logger: testLogger(t)}); err == nil {
			t.Fatal("joined without the key")
		}
		ctx, cancel := context.WithTimeout(context.Background(), converge)
		defer cancel()
		if err := b.SetMeta(ctx, testMeta(9)); err != nil {
			t.Fatal(err)
		}
		if err := c.Leave(ctx); err != nil {
			t.Fatal(err)
		}
		// No one reads b's events: Close must not wait for a reader.
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}()
	// memberlist's Shutdown does not wait for all of its goroutines (an
	// in-flight probe ends at its deadline); allow them a moment.
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			var buf bytes.Buffer
			_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf.String())
		}
		<-tick.C
	}
}

func TestStartRefusesBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no name", Config{BindAddr: "127.0.0.1:0"}, "name is required"},
		{"probe timeout", Config{Name: "a", ProbeInterval: time.Second, ProbeTimeout: time.Second}, "ProbeTimeout"},
		{"short key", Config{Name: "a", SecretKey: []byte("short")}, "want 16, 24 or 32"},
		{"bind host name", Config{Name: "a", BindAddr: "localhost:0"}, "must be an IP"},
		{"bind no port", Config{Name: "a", BindAddr: "127.0.0.1"}, "bind address"},
		{"advertise", Config{Name: "a", AdvertiseAddr: "nowhere:1"}, "must be an IP"},
		{"bad actor addr", Config{Name: "a", Meta: Meta{ActorAddr: "no port"}}, "actor address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Logger = testLogger(t)
			n, err := Start(tc.cfg)
			if err == nil {
				_ = n.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestAdvertiseAddr(t *testing.T) {
	// Port 0 in the advertised address means the bound port.
	a := start(t, "a", testMeta(0), func(c *Config) { c.AdvertiseAddr = "127.0.0.1:0" })
	if _, port, _ := net.SplitHostPort(a.Addr()); port == "0" {
		t.Errorf("Addr() = %s", a.Addr())
	}
	b := start(t, "b", testMeta(1), nil, a.Addr())
	awaitMembers(t, b, converge, "seeing a", hasNames("a", "b"))
}

func TestJoinErrors(t *testing.T) {
	a := start(t, "a", testMeta(0), nil)
	if _, err := a.Join(); !errors.Is(err, ErrJoin) {
		t.Errorf("Join(): %v, want ErrJoin", err)
	}
	// A port that nothing listens on: bind one, note it, close it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	_, err = Start(Config{Name: "b", BindAddr: "127.0.0.1:0", Seeds: []string{dead}, Logger: testLogger(t)})
	if !errors.Is(err, ErrJoin) || errors.Is(err, ErrKeyMismatch) {
		t.Errorf("join via a closed port: %v, want ErrJoin only", err)
	}
	_ = a.Close()
	if _, err := a.Join("127.0.0.1:1"); !errors.Is(err, ErrClosed) {
		t.Errorf("Join after Close: %v, want ErrClosed", err)
	}
}

// confirmer is a Config.Confirm whose answer the test sets; every call is
// signalled on asked.
type confirmer struct {
	answers atomic.Bool // true: the member answers
	asked   chan string // the asked member's name, dropped when full
}

func newConfirmer() *confirmer { return &confirmer{asked: make(chan string, 16)} }

func (cf *confirmer) confirm(ctx context.Context, m Member) error {
	select {
	case cf.asked <- m.Name:
	default:
	}
	if cf.answers.Load() {
		return nil
	}
	return errors.New("does not answer")
}

// TestConfirmHoldsBackAFailure: a member memberlist declares failed that
// Confirm vouches for stays listed and is not reported failed, Confirm is
// asked again, and once it says no the failure is reported.
func TestConfirmHoldsBackAFailure(t *testing.T) {
	cf := newConfirmer()
	cf.answers.Store(true)
	rec := newRecorder()
	clk := clock.NewFake(time.Now())
	a := start(t, "a", testMeta(0), func(cfg *Config) {
		cfg.Confirm, cfg.ConfirmInterval, cfg.Clock, cfg.observed = cf.confirm, time.Minute, clk, rec.observe
	})
	c := start(t, "c", testMeta(2), nil, a.Addr())
	awaitMembers(t, a, converge, "seeing a, c", hasNames("a", "c"))
	_ = c.Close()
	for i := range 3 { // the first check, then one each time the interval passes
		if i > 0 {
			clk.BlockUntil(1)
			clk.Advance(time.Minute)
		}
		select {
		case name := <-cf.asked:
			if name != "c" {
				t.Fatalf("Confirm asked about %s, want c", name)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Confirm not asked about the crashed member")
		}
	}
	if got := names(a.Members()); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("members while Confirm vouches: %v, want a and c", got)
	}
	rec.mu.Lock()
	for _, ev := range rec.events {
		if ev.Kind == EventFailed {
			t.Errorf("reported %v while Confirm vouches", ev)
		}
	}
	rec.mu.Unlock()
	cf.answers.Store(false)
	clk.BlockUntil(1)
	clk.Advance(time.Minute)
	ev := await(t, a, 2*time.Second, "failure of c", is(EventFailed, "c"))
	if ev.Member.State != StateFailed {
		t.Errorf("failure event state %v", ev.Member.State)
	}
	awaitMembers(t, a, converge, "seeing only a", hasNames("a"))
}

// TestConfirmEndsWhenTheMemberComesBack: while Confirm vouches for a
// member memberlist declared failed, the member's return (here a restart
// under its name) is an update, never a failure and a join.
func TestConfirmEndsWhenTheMemberComesBack(t *testing.T) {
	cf := newConfirmer()
	cf.answers.Store(true)
	rec := newRecorder()
	a := start(t, "a", testMeta(0), func(cfg *Config) {
		cfg.Confirm, cfg.ConfirmInterval, cfg.observed = cf.confirm, 50*time.Millisecond, rec.observe
	})
	c := start(t, "c", testMeta(2), nil, a.Addr())
	awaitMembers(t, a, converge, "seeing a, c", hasNames("a", "c"))
	_ = c.Close()
	select {
	case <-cf.asked:
	case <-time.After(5 * time.Second):
		t.Fatal("Confirm not asked about the crashed member")
	}
	c2 := start(t, "c", testMeta(3), nil, a.Addr())
	// The recorder sees events as reported (the channel may merge an
	// update into an unread join).
	var back Event
	rec.await(t, converge, "c's return", func(evs []Event) bool {
		i := slices.IndexFunc(evs, func(ev Event) bool { return ev.Member.Name == "c" && ev.Member.Addr == c2.Addr() })
		if i >= 0 {
			back = evs[i]
		}
		return i >= 0
	})
	if back.Kind != EventUpdate {
		t.Errorf("c's return reported as %v, want EventUpdate", back.Kind)
	}
	// Confirm is no longer asked once the member is back.
	for len(cf.asked) > 0 {
		<-cf.asked
	}
	select {
	case <-cf.asked:
		// One check may have been in flight when c came back.
		select {
		case <-cf.asked:
			t.Error("Confirm still asked after the member came back")
		case <-time.After(300 * time.Millisecond):
		}
	case <-time.After(300 * time.Millisecond):
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, ev := range rec.events {
		if ev.Member.Name == "c" && ev.Kind != EventJoin && ev.Kind != EventUpdate {
			t.Errorf("reported %v about c", ev.Kind)
		}
	}
}
