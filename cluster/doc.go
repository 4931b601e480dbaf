// Package cluster is ppnode's gossip membership, on hashicorp/memberlist:
// nodes join through seed addresses, gossip small metadata (actor address,
// profile, version), learn of joins, updates, leaves and failures, and can
// encrypt all gossip with a shared key.
//
// # Lifecycle
//
//	n, err := cluster.Start(cluster.Config{
//		Name:     "a",
//		BindAddr: "10.0.0.1:7946",          // port 0: the kernel picks; n.Addr() tells
//		Seeds:    []string{"10.0.0.2:7946"}, // none: first node of a new cluster
//		Meta:     cluster.Meta{ActorAddr: "10.0.0.1:8090", Version: v, Profile: p},
//	})
//	if err != nil { ... }
//	defer n.Close()
//	go func() { for ev := range n.Events() { ... } }() // until Leave or Close
//	<-sigterm
//	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
//	defer cancel()
//	err = n.Leave(ctx) // others see EventLeave; then shuts down as Close does
//
// Close without Leave looks like a crash to the others (EventFailed). The
// caller wires SIGTERM and SIGINT to Leave; the package installs no signal
// handler and keeps no process-global state.
//
// # Failure detection
//
// The defaults ([DefaultProbeInterval] and the others) are tuned for a LAN: probe every 200 ms
// with a 100 ms timeout, suspicion multiplier 2, gossip every 50 ms. A
// crashed member is reported failed in about 0.75 s on loopback (3 nodes),
// where memberlist's stock LAN settings take 5.8-6.8 s. Every value can be
// changed in [Config].
//
// Fast probes also declare failed a member that is only slow to answer
// (starved of CPU by a small cgroup quota, or paused for a moment). With
// [Config].Confirm set, a failure memberlist declares is first checked by
// other means: while Confirm says the member answers, it stays in
// [Node.Members] and no EventFailed is sent; memberlist's refutation then
// brings it back without any event but an update.
//
// # Leave or failure
//
// memberlist reports a clean leave and a failure through one callback,
// and the state it passes there always reads alive (memberlist issue
// #293). So [Node.Leave] first gossips its metadata with a leaving mark
// ([Member].Leaving), then leaves: a member that goes away after its mark
// was seen is reported [EventLeave], any other [EventFailed]. A member that
// missed the mark reports a clean leave as a failure, never the reverse.
//
// # Restarts and names
//
// Names are identities: a process restarted under its old name (on a new
// port) replaces its failed instance at once. If it starts before the
// cluster has declared the old instance failed, memberlist silently
// refuses it for the address conflict; [Node.Join] sees that in the
// seeds' state and joins again until the old instance is declared failed
// (about a second). A name held by another live node makes Start fail
// with [ErrNameTaken].
//
// # Metadata
//
// Each node gossips a [Meta], encoded by [EncodeMeta] into at most
// [MaxMetaSize] (512) bytes, memberlist's limit, 9 of which stay free for
// the leaving mark. memberlist panics on longer metadata; here [Start] and
// [Node.SetMeta] refuse it with [ErrMetaTooLarge] and nothing changes. Metadata received from others is
// decoded and validated; a member whose metadata does not decode is still
// listed, with [Member].MetaErr set.
//
// # Events and concurrency
//
// memberlist calls its event delegate from its own goroutines with its
// node lock held; a delegate that blocks stalls probing, gossip and joins,
// and one that calls back into memberlist deadlocks (memberlist issues
// #23, #237). So the delegate here only copies the member, updates the
// table [Node.Members] reads and appends to an unbounded queue; a
// dispatcher goroutine feeds [Node.Events] from it at the reader's pace.
// [Node.Members] never hands out memberlist's own *Node values, which
// memberlist rewrites in place (issues #250, #306).
//
// All methods of [Node] are safe for concurrent use.
//
// # Encryption
//
// With [Config].SecretKey set (16, 24 or 32 bytes; [ReadKeyFile] reads raw,
// hex or base64 key files), all gossip is encrypted and authenticated with
// AES-GCM. A node whose key differs, or that has none while the cluster
// has one (or the reverse), fails [Start] with an error wrapping both
// [ErrJoin] and [ErrKeyMismatch].
//
// # Logging
//
// memberlist logs through a *log.Logger; this package adapts it to the
// *slog.Logger in [Config].Logger, mapping memberlist's [DEBUG], [INFO],
// [WARN] and [ERR] tags to slog levels. With no logger, nothing is logged.
package cluster
