package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/ppnode/ppnode/clock"
)

// Node is this process's membership in a cluster. Its methods are safe for
// concurrent use.
type Node struct {
	name     string
	observed func(Event) // Config.observed
	log      *slog.Logger
	ml       *memberlist.Memberlist
	queue    *eventQueue
	events   chan Event    // unbuffered; closed when the dispatcher exits
	done     chan struct{} // closed to stop the dispatcher
	wg       sync.WaitGroup

	metaMu    sync.Mutex // guards meta, metaBytes and announced
	meta      Meta
	metaBytes []byte // what NodeMeta hands memberlist; at most MaxMetaSize
	announced bool   // metaBytes carry the leaving mark

	setMu sync.Mutex // serialises SetMeta, so the last stored is the last announced

	mu      sync.Mutex // guards members, pending, confirmSeq and closing
	members map[string]Member
	pending map[string]uint64 // members whose failure Confirm is checking -> the check's number
	closing bool              // set by stop: no new confirmer

	confirm      func(context.Context, Member) error // Config.Confirm
	confirmEvery time.Duration
	clock        clock.Clock
	confirmSeq   uint64
	stopCtx      context.Context // ends when the node stops: confirmers' context
	cancelStop   context.CancelFunc

	life    sync.RWMutex // write-held by Leave and Close, read-held by calls into a running memberlist
	stopped bool         // guarded by life

	probeInterval time.Duration
	conflict      atomic.Pointer[string] // set by NotifyMerge: how a seed lists another node under our name
}

// Start creates a node, binds its address and, if cfg.Seeds is not empty,
// joins the cluster through them (see [Node.Join]). If the join fails it
// returns an error wrapping [ErrJoin], and [ErrKeyMismatch] or
// [ErrNameTaken] where that is the cause; the node is then already closed
// and holds no socket or goroutine.
func Start(cfg Config) (*Node, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	metaBytes, err := EncodeMeta(cfg.Meta)
	if err != nil {
		return nil, err
	}
	bindIP, bindPort, err := splitIPPort("bind", cfg.BindAddr, "0.0.0.0")
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	n := &Node{
		name:      cfg.Name,
		observed:  cfg.observed,
		log:       logger,
		queue:     newEventQueue(),
		events:    make(chan Event),
		done:      make(chan struct{}),
		meta:      cloneMeta(cfg.Meta),
		metaBytes: metaBytes,
		members:   make(map[string]Member),
		pending:   make(map[string]uint64),

		confirm:      cfg.Confirm,
		confirmEvery: cfg.ConfirmInterval,
		clock:        cfg.Clock,

		probeInterval: cfg.ProbeInterval,
	}
	n.stopCtx, n.cancelStop = context.WithCancel(context.Background())

	std := newStdLogger(logger)
	var transport memberlist.NodeAwareTransport
	port := bindPort
	if cfg.Transport != nil {
		ip, p, err := cfg.Transport.FinalAdvertiseAddr("", 0)
		if err != nil {
			return nil, err
		}
		transport, bindIP, port = cfg.Transport, ip.String(), p
	} else {
		nt, p, err := newTransport(bindIP, bindPort, std)
		if err != nil {
			return nil, err
		}
		transport, port = nt, p
		if cfg.Gate != nil {
			transport = newGatedTransport(nt, cfg.Gate)
		}
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	mc.Transport = transport
	mc.BindAddr = bindIP
	mc.BindPort = port
	mc.AdvertisePort = port
	if cfg.AdvertiseAddr != "" {
		ip, p, err := splitIPPort("advertise", cfg.AdvertiseAddr, "")
		if err != nil {
			_ = transport.Shutdown()
			return nil, err
		}
		mc.AdvertiseAddr = ip
		if p != 0 {
			mc.AdvertisePort = p
		}
	}
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.SuspicionMult = cfg.SuspicionMult
	mc.GossipInterval = cfg.GossipInterval
	mc.TCPTimeout = cfg.TCPTimeout
	mc.PushPullInterval = cfg.PushPullInterval
	mc.DeadNodeReclaimTime = cfg.DeadNodeReclaimTime
	mc.SecretKey = bytes.Clone(cfg.SecretKey)
	mc.Logger = std
	mc.Delegate = delegate{n}
	mc.Events = delegate{n}
	mc.Conflict = delegate{n}
	mc.Merge = delegate{n}

	// Create calls NotifyJoin for this node, so the delegate is live now.
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = transport.Shutdown()
		return nil, fmt.Errorf("cluster: start: %w", err)
	}
	n.ml = ml
	n.wg.Add(1)
	go n.dispatch()

	if len(cfg.Seeds) > 0 {
		if _, err := n.Join(cfg.Seeds...); err != nil {
			_ = n.Close()
			return nil, err
		}
	}
	logger.Info("cluster: node started", "node", n.name, "addr", n.Addr(), "seeds", cfg.Seeds, "encrypted", cfg.SecretKey != nil)
	return n, nil
}

// newTransport binds TCP and UDP on ip:port. With port 0 the kernel picks
// the TCP port and UDP must get the same one, which another socket may
// hold: retry a few times as memberlist itself does.
func newTransport(ip string, port int, logger *log.Logger) (*memberlist.NetTransport, int, error) {
	tries := 1
	if port == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var t *memberlist.NetTransport
		t, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{ip},
			BindPort:  port,
			Logger:    logger,
		})
		if err == nil {
			return t, t.GetAutoBindPort(), nil
		}
	}
	return nil, 0, fmt.Errorf("cluster: bind %s: %w", net.JoinHostPort(ip, strconv.Itoa(port)), err)
}

// Join contacts the given host:port seeds and merges their view of the
// cluster into this node's. It returns how many seeds answered; the error,
// wrapping [ErrJoin], is set only if none did. Start joins cfg.Seeds
// already; Join is for retrying or joining more.
//
// A node restarted under its old name while its old instance still looks
// alive (or suspect) to the cluster is refused by memberlist, since the
// address conflicts, without any error to the joiner; it would stay
// outside until a push/pull repaired it. So Join checks each seed's view
// of this node's name and joins again every probe interval until the
// seeds list this node at its own address or the old instance as failed,
// for at most 25 probe intervals (5 s by default); if another node still
// holds the name by then, Join returns an error wrapping [ErrNameTaken].
func (n *Node) Join(seeds ...string) (int, error) {
	if len(seeds) == 0 {
		return 0, fmt.Errorf("%w: no seeds given", ErrJoin)
	}
	deadline := time.Now().Add(25 * n.probeInterval)
	for {
		count, other, err := n.joinOnce(seeds)
		if err != nil || other == "" {
			return count, err
		}
		if time.Now().After(deadline) {
			return count, &joinFailure{
				msg: fmt.Sprintf("cluster: join via %s failed: node name %q is in use by %s (another node, or this one's old instance not yet declared failed)",
					strings.Join(seeds, ","), n.name, other),
				cause: ErrNameTaken,
			}
		}
		n.log.Debug("cluster: name held by another instance; joining again", "node", n.name, "other", other)
		t := time.NewTimer(n.probeInterval)
		select {
		case <-t.C:
		case <-n.done:
			t.Stop()
			return count, ErrClosed
		}
	}
}

// joinOnce runs one memberlist join and reports another node with this
// node's name, alive or suspect, if a seed's state showed one.
func (n *Node) joinOnce(seeds []string) (int, string, error) {
	n.life.RLock()
	defer n.life.RUnlock()
	if n.stopped {
		return 0, "", ErrClosed
	}
	n.conflict.Store(nil)
	count, err := n.ml.Join(seeds)
	if err != nil {
		return count, "", joinError(seeds, err)
	}
	if p := n.conflict.Load(); p != nil {
		return count, *p, nil
	}
	return count, "", nil
}

// joinError classifies memberlist's join errors, which for a key mismatch
// read only "no installed keys could decrypt the message" or name the
// side without encryption (the case of the first changed in memberlist
// v0.7: match without case).
func joinError(seeds []string, err error) error {
	f := &joinFailure{err: err}
	keyMismatch := false
	var parts []string
	if me, ok := err.(interface{ WrappedErrors() []error }); ok { // memberlist's multierror
		for _, e := range me.WrappedErrors() {
			parts = append(parts, e.Error())
		}
	} else {
		parts = append(parts, err.Error())
	}
	detail := strings.Join(parts, "; ")
	lower := strings.ToLower(detail)
	for _, s := range []string{
		"no installed keys could decrypt",
		"encryption is configured but remote state is not encrypted",
		"remote state is encrypted and encryption is not configured",
	} {
		if strings.Contains(lower, s) {
			keyMismatch = true
		}
	}
	if keyMismatch {
		f.cause = ErrKeyMismatch
		detail = "gossip encryption keys differ (every node needs the same key file, or none): " + detail
	}
	f.msg = fmt.Sprintf("cluster: join via %s failed: %s", strings.Join(seeds, ","), detail)
	return f
}

// joinFailure is Join's error: it is [ErrJoin], and its cause
// ([ErrKeyMismatch], [ErrNameTaken]) where known.
type joinFailure struct {
	msg   string
	cause error // nil or a sentinel
	err   error // memberlist's, if any
}

func (f *joinFailure) Error() string { return f.msg }
func (f *joinFailure) Unwrap() error { return f.err }
func (f *joinFailure) Is(target error) bool {
	return target == ErrJoin || (f.cause != nil && target == f.cause)
}

// Name returns the node's name.
func (n *Node) Name() string { return n.name }

// Addr returns the node's advertised gossip address, host:port, with the
// port the kernel picked if it bound port 0. Seeds of other nodes use it.
func (n *Node) Addr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.members[n.name].Addr
}

// Meta returns the node's own metadata as last set.
func (n *Node) Meta() Meta {
	n.metaMu.Lock()
	defer n.metaMu.Unlock()
	return cloneMeta(n.meta)
}

// SetMeta replaces the node's metadata and gossips it; other nodes see an
// [EventUpdate]. Metadata over [MaxMetaSize] is refused with an error
// wrapping [ErrMetaTooLarge] and the old metadata stays. SetMeta waits
// until the update has been handed to the other members (at most until
// ctx's deadline, or 5 s if it has none); if that times out it returns an
// error, but the update is in place and gossip carries it on.
func (n *Node) SetMeta(ctx context.Context, m Meta) error {
	if _, err := EncodeMeta(m); err != nil {
		return err
	}
	n.setMu.Lock()
	defer n.setMu.Unlock()
	n.life.RLock()
	defer n.life.RUnlock()
	if n.stopped {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	n.metaMu.Lock()
	b, err := encodeMeta(m, n.announced) // a leaving node stays marked
	if err == nil {
		n.meta, n.metaBytes = cloneMeta(m), b
	}
	n.metaMu.Unlock()
	if err != nil {
		return err
	}
	if err := n.ml.UpdateNode(waitFor(ctx)); err != nil {
		return fmt.Errorf("cluster: metadata update: %w", err)
	}
	return nil
}

// Members returns the members this node believes alive, itself included,
// sorted by name, with their decoded metadata. It may be ahead of the
// events not yet received from [Node.Events].
func (n *Node) Members() []Member {
	n.mu.Lock()
	ms := slices.Collect(maps.Values(n.members))
	n.mu.Unlock()
	for i := range ms {
		ms[i].Meta = cloneMeta(ms[i].Meta)
	}
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return ms
}

// Events returns the channel of membership changes, in the order this node
// observed them; the node's own join comes first. The same channel is
// returned on every call; use one reader. Events wait in an unbounded
// queue (pending metadata updates of a member coalesce) so a slow reader
// never blocks memberlist. The channel is closed by Leave or Close;
// events not yet received then are dropped.
func (n *Node) Events() <-chan Event { return n.events }

// Announce gossips that this node is leaving, without leaving yet: the
// others see an [EventUpdate] with Member.Leaving set (their jobs can
// move work away) while it
// still serves. It waits until the mark has gone out, at most until ctx's
// deadline (5 s if it has none). Leave announces too; calling Announce
// first only brings the mark forward.
func (n *Node) Announce(ctx context.Context) error {
	n.life.Lock()
	defer n.life.Unlock()
	if n.stopped {
		return nil
	}
	return n.announce(ctx)
}

// announce is Announce with n.life held.
func (n *Node) announce(ctx context.Context) error {
	n.metaMu.Lock()
	if n.announced {
		n.metaMu.Unlock()
		return nil
	}
	b, err := encodeMeta(n.meta, true) // fits: EncodeMeta kept room for it
	if err == nil {
		n.metaBytes = b
		n.announced = true
	}
	n.metaMu.Unlock()
	if err == nil {
		err = n.ml.UpdateNode(waitFor(ctx))
	}
	if err != nil {
		return fmt.Errorf("cluster: leave: announcing: %w", err)
	}
	return nil
}

// Leave announces to the cluster that this node is leaving, waits until
// the announcement has gone out (at most until ctx's deadline, or 5 s if
// it has none), then shuts the node down as Close does. Others see an
// [EventLeave] rather than an [EventFailed]; one that missed the
// announcement sees an EventFailed. A node that has left cannot rejoin;
// start a new one. Calling Leave after Leave or Close does nothing.
func (n *Node) Leave(ctx context.Context) error {
	n.life.Lock()
	defer n.life.Unlock()
	if n.stopped {
		return nil
	}
	// First the leaving mark (see observe), then memberlist's leave. If
	// the mark times out, leave all the same: it may still get through.
	errs := []error{n.announce(ctx)}
	if err := n.ml.Leave(waitFor(ctx)); err != nil {
		errs = append(errs, fmt.Errorf("cluster: leave: %w", err))
	}
	err := errors.Join(errs...)
	n.log.Info("cluster: node left", "node", n.name, "err", err)
	return errors.Join(err, n.stop())
}

// Close shuts the node down without announcing it: to the others it looks
// like a crash, detected within about a second with the default config.
// It closes the sockets, stops delivering events and waits for the node's
// own goroutines. Calling Close after Leave or Close does nothing.
func (n *Node) Close() error {
	n.life.Lock()
	defer n.life.Unlock()
	if n.stopped {
		return nil
	}
	return n.stop()
}

// stop shuts memberlist down and the dispatcher with it. n.life must be
// write-held. (memberlist's Leave panics after Shutdown: stopped guards.)
func (n *Node) stop() error {
	n.stopped = true
	n.mu.Lock()
	n.closing = true
	n.mu.Unlock()
	n.cancelStop()
	err := n.ml.Shutdown()
	n.queue.close()
	close(n.done)
	n.wg.Wait()
	if err != nil {
		return fmt.Errorf("cluster: shutdown: %w", err)
	}
	return nil
}

// dispatch moves events from the queue to the channel, waiting on the
// reader as long as it takes.
func (n *Node) dispatch() {
	defer n.wg.Done()
	defer close(n.events)
	for {
		ev, ok := n.queue.pop()
		if !ok {
			select {
			case <-n.queue.ready:
				continue
			case <-n.done:
				return
			}
		}
		select {
		case n.events <- ev:
		case <-n.done:
			return
		}
	}
}

// change is what memberlist reported about a member.
type change int

const (
	changeJoin   change = iota // NotifyJoin
	changeUpdate               // NotifyUpdate
	changeGone                 // NotifyLeave: left or failed
)

// observe records a change reported by memberlist. memberlist calls it
// with its node lock held, the only moment the *memberlist.Node may be
// read without racing (its fields are rewritten in place; memberlist
// issues #250, #306), so observe copies what it needs and never blocks.
//
// memberlist reports a clean leave and a failure through the same
// callback, and the node's State it passes is always alive (the state it
// tracks shadows that field; memberlist issue #293, fix pending in its PR
// #321). So Leave first gossips metadata with a leaving mark, and a member
// that goes away after its mark was seen has left; one that goes away
// without it failed.
func (n *Node) observe(c change, mn *memberlist.Node) {
	m := Member{
		Name:  mn.Name,
		Addr:  net.JoinHostPort(mn.Addr.String(), strconv.Itoa(int(mn.Port))),
		State: StateAlive,
	}
	m.Meta, m.Leaving, m.MetaErr = decodeMeta(mn.Meta)
	var kind EventKind
	var note string // logged once n.mu is released
	n.mu.Lock()
	prev, known := n.members[m.Name]
	_, vouched := n.pending[m.Name]
	delete(n.pending, m.Name) // memberlist's news supersedes a running check
	switch c {
	case changeJoin:
		kind = EventJoin
		if vouched {
			// Refuted a failure that was never reported: to the
			// reader it was alive all along.
			kind = EventUpdate
			note = "cluster: a member memberlist declared failed is back; its failure was not reported"
		}
		n.members[m.Name] = m
	case changeUpdate:
		kind = EventUpdate // the leaving mark too: Member.Leaving says so
		n.members[m.Name] = m
	case changeGone:
		kind, m.State = EventFailed, StateFailed
		if prev.Leaving || mn.State == memberlist.StateLeft {
			kind, m.State = EventLeave, StateLeft
		}
		m.Leaving = prev.Leaving
		if kind == EventFailed && n.confirm != nil && known && !n.closing {
			// Reported only once Confirm fails; until then it stays
			// listed as it was.
			n.confirmSeq++
			n.pending[m.Name] = n.confirmSeq
			n.wg.Add(1)
			go n.confirmFailure(prev, m, n.confirmSeq)
			note, kind = "cluster: memberlist declared a member failed; checking it", 0
			break
		}
		delete(n.members, m.Name)
	}
	n.mu.Unlock()
	if note != "" {
		n.log.Info(note, "member", m.Name)
	}
	if kind == 0 {
		return
	}
	n.report(kind, m)
}

// report queues an event about m.
func (n *Node) report(kind EventKind, m Member) {
	ev := Event{Kind: kind, Member: m, Time: n.clock.Now()}
	ev.Member.Meta = cloneMeta(m.Meta) // the table keeps m's Tags map
	n.queue.push(ev)
	if n.observed != nil {
		n.observed(ev)
	}
}

// confirmFailure asks Config.Confirm about a member memberlist declared
// failed (listed as prev; gone is the failure to report) until the
// member answers no more (the failure is reported), memberlist reports it
// again (seq is then no longer pending: a refutation or a leave decides)
// or the node stops.
func (n *Node) confirmFailure(prev, gone Member, seq uint64) {
	defer n.wg.Done()
	wait := time.Duration(0)
	for first := true; ; first = false {
		t := n.clock.NewTimer(wait)
		select {
		case <-n.stopCtx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		if !n.checking(prev.Name, seq) {
			return
		}
		err := n.confirm(n.stopCtx, prev)
		n.mu.Lock()
		if n.pending[prev.Name] != seq || n.stopCtx.Err() != nil {
			n.mu.Unlock()
			return
		}
		if err != nil {
			delete(n.pending, prev.Name)
			delete(n.members, prev.Name)
			n.mu.Unlock()
			n.log.Info("cluster: member failed, confirmed", "member", prev.Name, "err", err)
			n.report(EventFailed, gone)
			return
		}
		n.mu.Unlock()
		if first {
			n.log.Warn("cluster: a member memberlist declared failed answers; still listed", "member", prev.Name)
		}
		wait = n.confirmEvery
	}
}

// checking reports whether check seq of member name still runs: memberlist
// has not reported the member since, and the node runs.
func (n *Node) checking(name string, seq uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pending[name] == seq && n.stopCtx.Err() == nil
}

// waitFor turns ctx's deadline into memberlist's timeout, where 0 means
// forever: never pass 0.
func waitFor(ctx context.Context) time.Duration {
	d := defaultWait
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
	}
	return max(d, time.Millisecond)
}

func cloneMeta(m Meta) Meta {
	m.Tags = maps.Clone(m.Tags)
	return m
}

// delegate implements memberlist's Delegate and EventDelegate for a Node,
// keeping those methods off Node's API. memberlist calls them from its own
// goroutines, some with its node lock held: they must not block and must
// not call back into memberlist.
type delegate struct{ n *Node }

var (
	_ memberlist.Delegate         = delegate{}
	_ memberlist.EventDelegate    = delegate{}
	_ memberlist.ConflictDelegate = delegate{}
	_ memberlist.MergeDelegate    = delegate{}
)

// NodeMeta returns the encoded metadata, which SetMeta and Start keep
// within MaxMetaSize (memberlist panics above it).
func (d delegate) NodeMeta(limit int) []byte {
	d.n.metaMu.Lock()
	defer d.n.metaMu.Unlock()
	if len(d.n.metaBytes) > limit {
		return nil // unreachable: EncodeMeta guards the size
	}
	return d.n.metaBytes
}

func (delegate) NotifyMsg([]byte)                           {}
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}

// NotifyMerge is called on a join with the other side's view of the
// cluster, states included (unlike EventDelegate's). It records whether
// that view holds another live or suspect node under this node's name;
// a failed or left one is fine, memberlist lets this node replace it.
func (d delegate) NotifyMerge(peers []*memberlist.Node) error {
	self := d.n.Addr()
	for _, p := range peers {
		if p.Name != d.n.name {
			continue
		}
		addr := net.JoinHostPort(p.Addr.String(), strconv.Itoa(int(p.Port)))
		if addr != self && (p.State == memberlist.StateAlive || p.State == memberlist.StateSuspect) {
			other := addr
			if p.State == memberlist.StateSuspect {
				other += " (suspect)"
			}
			d.n.conflict.Store(&other)
		}
	}
	return nil
}

// NotifyConflict is called when gossip names a known node at another
// address; memberlist keeps the known one.
func (d delegate) NotifyConflict(existing, other *memberlist.Node) {
	d.n.log.Warn("cluster: two nodes share a name; ignoring the newer",
		"name", existing.Name, "known", existing.Address(), "other", other.Address())
}

func (d delegate) NotifyJoin(mn *memberlist.Node)   { d.n.observe(changeJoin, mn) }
func (d delegate) NotifyUpdate(mn *memberlist.Node) { d.n.observe(changeUpdate, mn) }
func (d delegate) NotifyLeave(mn *memberlist.Node)  { d.n.observe(changeGone, mn) }
