// Package dataplane owns the stage-to-stage links: it moves activations and
// gradients between pipeline stages as tensorio frames over one direct
// connection per stage link, while the actors carry only control
// (DESIGN.md, "Transport: control through actors, tensors through a data
// plane"). [TCP] is the real data plane and [Inmem] its in-memory twin.
//
// A link is set up in three steps:
//
//  1. The receiving stage calls [DataPlane.Listen] with the [Hello] it
//     expects and sends [Listener.Addr] to the sending stage through its
//     actor.
//  2. The sending stage calls [DataPlane.Dial] with that address and its own
//     Hello. The listener accepts the connection only if job id, plan
//     generation and link id match; otherwise the dialer gets a
//     [*RefusedError] saying why, and the listener keeps listening.
//  3. [Listener.Accept] returns the link on the receiving side, Dial on the
//     sending side. Both ends may Send and Recv (activations flow forward,
//     gradients back, over the same connection).
//
// Each end chooses the codec of what it sends ([Options]): a fixed one, or
// Auto, which picks per kind of tensor (activations and gradients compress
// differently) the lossless codec with the least encode + transfer +
// decode time for the link's rate, from sampled tensors. A lossy codec
// (bf16, int8) is opt-in and applies to activations and gradients only.
// [Link.Stats] counts what was sent, raw and on the wire, and the time
// spent encoding and waiting for the link.
//
// On the wire, after the handshake, every tensor is a 16-byte tag
// (kind u8, 3 zero bytes, micro-batch u32, tensor id u32, CRC-32C of the
// first 12 bytes u32; little-endian) followed by one tensorio frame.
package dataplane
