// Package dataplane owns the stage-to-stage links: it moves activations and
// gradients between pipeline stages as tensorio frames over one direct
// connection per stage link, while the actors carry only control (an
// actor message through protoactor's gRPC costs several times the CPU per
// byte that a raw TCP stream does). [TCP] is the real data plane and
// [Inmem] its in-memory twin.
//
// A link is set up in three steps:
//
//  1. The receiving stage calls [DataPlane.Listen] with the [Hello] it
//     expects and sends [Listener.Addr] to the sending stage through its
//     actor.
//  2. The sending stage calls [DataPlane.Dial] with that address and its own
//     Hello. The listener admits the connection only if the protection
//     below passes and job id, plan generation and link id match;
//     otherwise the dialer gets a [*RefusedError] saying why (or, for a
//     TLS failure, the TLS error), and the listener keeps listening.
//  3. [Listener.Accept] returns the link on the receiving side, Dial on the
//     sending side. Both ends may Send and Recv (activations flow forward,
//     gradients back, over the same connection).
//
// A listener runs the handshakes of its connections concurrently, each
// within [Options.HandshakeTimeout], as they arrive, and queues the admitted
// links for Accept: a connection that says nothing, or says it slowly,
// delays nobody else. The listeners of a [TCP] take their connections
// through its admit gate (TCP.Gate), which bounds the connections in their
// handshake per peer address and in all, and closes those over a bound at
// once: a flood from one address does not turn away a dialer from another.
// Each listener also holds at most 64 handshakes (and admitted links not
// yet accepted) at once; a connection over that bound is closed at once
// and its dialer is told "the listener hung up". Close ends the handshakes
// in progress and returns once their goroutines are gone.
//
// # Protection
//
// The data plane's fields (TCP's and Inmem's alike; every node of a
// cluster sets the same, the links' Options do not change) choose what
// protects the links:
//
//   - Nothing (the zero value): anyone who can reach a listener's port and
//     knows or guesses its Hello gets the link; anyone on the path reads
//     and can change the Hello and the tensors.
//   - Key, the cluster's secret: both ends prove they know it. The dialer
//     sends its Hello and a 32-byte random nonce; the listener answers with
//     its own nonce; the dialer sends HMAC-SHA256 under the key of
//     ("dialer->listener", both nonces, its encoded Hello); the listener,
//     if that is right and the Hello is its own, accepts with the
//     HMAC of ("listener->dialer", the same), which the dialer checks.
//     Fresh nonces at both ends mean a recorded handshake does not pass
//     again; the Hello under the MAC means a proof does not carry over to
//     another job, plan generation or link, nor a listener's proof pass as
//     a dialer's. MACs are compared in constant time. Then each end seals
//     what it sends (seal.go): records of at most 1 MiB, each with an
//     AES-GMAC tag under a key of the link and direction derived from the
//     cluster key and both nonces, its number as nonce; the receiver
//     passes on only bytes whose record checks, so a record altered,
//     dropped, replayed or reordered on the path breaks the link. The
//     tensors stay readable to an eavesdropper. The records' tags stand
//     in for the frames' payload CRC-32C, which such links omit.
//   - ServerTLS and ClientTLS: the connection is TLS, and the Hello, the
//     key's proofs and every tensor run inside it: nothing can be read or
//     changed on the path, and the ends authenticate each other by
//     certificate (with the cluster's CA on both sides and client
//     certificates required, only the holders of one of its certificates
//     connect). With the Key as well, the proofs also cover keying material
//     exported from the TLS session, so they cannot be relayed into another
//     session, and a certificate alone does not open a link.
//
// Neither end falls back to the other's mode. A listener with a key
// refuses a dialer without one and the other way round; a listener with
// TLS refuses, in plaintext, a dialer without it; a dialer with TLS that
// gets a plaintext answer reports a refusal. No mode protects against an
// attacker on the path cutting links (a denial of service).
//
// Each end chooses the codec of what it sends ([Options]): a fixed one, or
// Auto, which picks per kind of tensor (activations and gradients compress
// differently) the lossless codec with the least encode + transfer +
// decode time for the link's rate, from sampled tensors. A lossy codec
// (bf16, int8) is opt-in and applies to activations and gradients only.
// [Link.Stats] counts what was sent, raw and on the wire (with TLS: what
// was handed to TLS; its records add about 0.15%), and the
// time spent encoding and waiting for the link.
//
// On the wire, after the handshake (handshake.go), every tensor is a
// 16-byte tag (kind u8, 3 zero bytes, micro-batch u32, tensor id u32,
// CRC-32C of the first 12 bytes u32; little-endian) followed by one tensorio
// frame; with the key and without TLS, inside sealed records; with TLS,
// inside its records.
package dataplane
