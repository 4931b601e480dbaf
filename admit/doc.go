// Package admit bounds the connections a node's listeners take, so that a
// flood of connections (silent ones, or ones that never finish their
// handshake) costs the node a bounded number of sockets and goroutines and
// leaves it serving everyone else.
//
// A [Gate] counts the connections of one or more listeners and decides,
// when one arrives, whether to take it; [Gate.Listen] wraps a
// [net.Listener] with it. A connection is first in its handshake (TLS,
// ppnode's own protocol, an HTTP request's headers): the server that owns
// it calls [Established] once the handshake is done. Until then
//
//   - it counts against [Limits.PerIP] for its peer's address (an IPv6
//     address's /64, the block one host usually holds) and against
//     [Limits.Handshakes] for all peers;
//   - it is closed if it is still in its handshake [Limits.Handshake]
//     after it was accepted.
//
// Every connection, in its handshake or past it, counts against
// [Limits.Conns] until it is closed. A connection beyond a limit is
// closed as soon as it is accepted, before any byte is read, so that the
// kernel's backlog keeps draining; the server never sees it. [Gate.Stats]
// counts what was refused and why.
//
// The counting core (admit, establish, release) is pure; the listener
// adds the accept loop and one timer per connection in handshake, from a
// [clock.Clock].
package admit
