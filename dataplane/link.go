package dataplane

import (
	"bufio"
	"crypto/cipher"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

// Kind says what a tensor on a link is.
type Kind uint8

// The kinds of tensors on a link.
const (
	KindActivation Kind = 1 // forward: stage i -> stage i+1
	KindGradient   Kind = 2 // backward: stage i+1 -> stage i
	KindInput      Kind = 3 // coordinator -> stage: samples and labels
	KindWeights    Kind = 4 // stage -> coordinator: parameters and buffers
	KindSum        Kind = 5 // replica -> replica of a stage: summed parameter gradients
)

func (k Kind) valid() bool { return k >= KindActivation && k <= KindSum }

func (k Kind) String() string {
	switch k {
	case KindActivation:
		return "activation"
	case KindGradient:
		return "gradient"
	case KindInput:
		return "input"
	case KindWeights:
		return "weights"
	case KindSum:
		return "sum"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Tag identifies a tensor on a link.
type Tag struct {
	MicroBatch uint32 // micro-batch index within the step
	Tensor     uint32 // which tensor of that micro-batch (0 for a single one)
	Kind       Kind
}

// Hello names the link a connection is for: the dialer sends its own, the
// listener compares it with the one it was created with. Without a cluster
// key it is all a dialer has to show (doc.go, "Protection").
type Hello struct {
	JobID      string // at most 255 bytes
	Generation uint64 // plan generation; a re-plan increments it
	Link       uint32 // link id within the plan
	From, To   uint32 // sending and receiving stage of the link
}

// Options tune a link. The zero value is usable.
type Options struct {
	// Codec encodes the tensors this end sends (default raw) unless Auto;
	// it can be changed later with [Link.SetCodec]. Each end chooses its
	// own.
	Codec tensorio.Codec
	// Auto chooses the codec of each kind of tensor this end sends with
	// tensorio's estimates (the lossless codec with the least encode +
	// transfer + decode time) from a sample of that kind and the link's
	// Rate; it samples again every so often (at most 0.05% of the link's
	// time) and chooses again when the rate changes ([Link.SetRate]).
	Auto bool
	// Rate is the link's speed in bytes per second for Auto (default
	// DefaultRate).
	Rate float64
	// Lossy, if a lossy codec (bf16, int8), encodes the activations and
	// gradients this end sends; inputs and weights stay lossless.
	Lossy tensorio.Codec
	// Speeds are the codecs' speeds for Auto (default
	// tensorio.DefaultSpeeds()).
	Speeds tensorio.SpeedTable
	// IOTimeout bounds every Send and every Recv (default 30 s): a peer
	// that stops reading or writing, or a cut link that TCP does not
	// notice, becomes an error instead of a hang. Recv waits at most this
	// long for the next tensor, so it must exceed the longest legitimate
	// pause between two tensors on the link.
	IOTimeout time.Duration
	// HandshakeTimeout bounds the handshake (default 5 s).
	HandshakeTimeout time.Duration
	// MaxElements bounds the tensors Recv accepts (default
	// tensorio.MaxElements); a larger frame header is rejected as corrupt
	// before anything is allocated.
	MaxElements int
}

// WithDefaults returns o with the defaults a link uses in place of its zero
// fields.
func (o Options) WithDefaults() Options {
	if o.IOTimeout <= 0 {
		o.IOTimeout = 30 * time.Second
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 5 * time.Second
	}
	if o.MaxElements <= 0 || o.MaxElements > tensorio.MaxElements {
		o.MaxElements = tensorio.MaxElements
	}
	return o
}

// DataPlane creates stage links. [TCP] is the real one, [Inmem] its
// in-memory twin for tests; both put the same bytes on their connections.
// A DataPlane is safe for concurrent use.
type DataPlane interface {
	// Listen starts listening for the link described by want, on the
	// receiving stage. The returned Listener's Addr is what the sender
	// dials.
	Listen(want Hello, o Options) (Listener, error)
	// Dial connects to a Listener's address and authenticates with h. A
	// refused handshake returns a *RefusedError.
	Dial(addr string, h Hello, o Options) (Link, error)
}

// Listener accepts the links of one Hello. It is safe for concurrent use.
type Listener interface {
	// Addr is the address the sender passes to Dial.
	Addr() string
	// Accept waits for a connection that passes the handshake and returns
	// its link. The handshakes run in the background, concurrently, as
	// connections arrive; those that fail are refused (the dialer is told
	// why) and Accept keeps waiting. After Close it returns ErrClosed.
	Accept() (Link, error)
	// Close stops listening and ends the handshakes in progress; links
	// admitted but not yet accepted are closed, links already accepted
	// stay open.
	Close() error
}

// Link is one end of a stage-to-stage connection.
//
// Concurrency contract: Send and Recv may run at the same time (one
// goroutine sending, one receiving), but Sends must not overlap each other,
// nor Recvs each other. Close, Done, Err and SetCodec are safe from any
// goroutine at any time; Close unblocks a pending Send or Recv, which then
// returns an error. A Link starts no goroutine of its own.
//
// Errors: the first failure of the connection (a peer that closed, a
// timeout, corrupt bytes: errors.Is(err, tensorio.ErrCorrupt)) breaks the
// link: Done is closed, Err returns that error and every later Send and
// Recv return it. The owner learns of a broken link either from the error
// of its own Send or Recv or by waiting on Done (an actor turns that into a
// message to itself).
type Link interface {
	// Send writes t, tagged, as one frame in the link's codec. It
	// allocates nothing in the steady state (raw codec, any shape; other
	// codecs once their buffers have grown).
	Send(tag Tag, t *nn.Tensor) error
	// Recv reads the next tensor into dst when dst has its shape (the
	// steady state: no allocation), into dst reshaped when it has the same
	// number of elements, and into a new tensor otherwise; dst may be nil.
	// It returns io.EOF when the peer closed cleanly between two tensors.
	Recv(dst *nn.Tensor) (Tag, *nn.Tensor, error)
	// RecvTo is Recv with the destination chosen from the tag: pick is
	// called once the tag is read and returns the tensor to read into (or
	// nil). A receiver that keeps one buffer per tag reads without
	// allocating.
	RecvTo(pick func(Tag) *nn.Tensor) (Tag, *nn.Tensor, error)
	// SetCodec fixes the codec of the following Sends (of activations and
	// gradients too, if Lossy was set), ending Auto.
	SetCodec(c tensorio.Codec)
	// SetRate tells an Auto link its speed in bytes per second; the
	// following Sends choose their codecs for it.
	SetRate(bytesPerSec float64)
	// Stats returns what the link has sent so far, by kind.
	Stats() Stats
	// Peer is the Hello of the other end.
	Peer() Hello
	// Done is closed when the link breaks or is closed.
	Done() <-chan struct{}
	// Err is nil until Done is closed, then the reason: ErrClosed after
	// Close, otherwise the connection's first error.
	Err() error
	// Close closes the connection. It is idempotent.
	Close() error
}

// ErrClosed is returned by operations on a closed Link or Listener.
var ErrClosed = errors.New("dataplane: closed")

// RefusedError is the error Dial returns when the listener refused the
// handshake.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "dataplane: link refused: " + e.Reason }

// ---- Link over any net.Conn ----

const (
	tagLen    = 16
	ioBufSize = 64 << 10
)

type link struct {
	c    net.Conn
	peer Hello
	o    Options

	smu sync.Mutex // guards codec changes against a running Send
	bw  *bufio.Writer
	out io.Writer // what bw writes to: tc, or a sealer over it
	w   *tensorio.Writer
	tc  *timedWriter
	stg [tagLen]byte
	ch  *chooser

	stmu  sync.Mutex // guards stats
	stats Stats

	// pc, if set, counts the link's traffic for its data plane's
	// Traffic (set before the link is handed out, as rc.pc).
	pc *peerCounters
	rc *readCounter

	br  *bufio.Reader
	r   *tensorio.Reader
	rtg [tagLen]byte

	once sync.Once
	done chan struct{}
	emu  sync.Mutex
	err  error
}

// newLink makes a link over c. With send and recv (a keyed link without
// TLS), what it sends is sealed under send and what it reads must open
// under recv (seal.go).
func newLink(c net.Conn, peer Hello, o Options, send, recv cipher.AEAD) *link {
	l := &link{c: c, peer: peer, o: o, done: make(chan struct{}), ch: newChooser(o)}
	l.tc = &timedWriter{w: c}
	l.rc = &readCounter{r: c}
	var w io.Writer = l.tc
	var r io.Reader = l.rc
	if send != nil {
		w = &sealer{w: l.tc, aead: send}
		r = newOpener(l.rc, recv)
	}
	l.out = w
	l.bw = bufio.NewWriterSize(w, ioBufSize)
	l.w = tensorio.NewWriter(l.bw, o.Codec)
	l.br = bufio.NewReaderSize(r, ioBufSize)
	l.r = tensorio.NewReader(l.br)
	l.r.SetMaxElements(o.MaxElements)
	if send != nil { // the records' MACs check every byte
		l.w.OmitPayloadChecksums()
		l.r.TrustPayloads()
	}
	return l
}

// metered makes pc count the link's traffic; it must be called before the
// link is handed out.
func (l *link) metered(pc *peerCounters) *link {
	l.pc, l.rc.pc = pc, pc
	return l
}

func (l *link) Peer() Hello           { return l.peer }
func (l *link) Done() <-chan struct{} { return l.done }

func (l *link) Err() error {
	l.emu.Lock()
	defer l.emu.Unlock()
	return l.err
}

func (l *link) SetCodec(c tensorio.Codec) {
	l.smu.Lock()
	l.ch.auto, l.ch.fixed, l.ch.lossy = false, c, tensorio.CodecRaw
	l.smu.Unlock()
}

func (l *link) SetRate(bytesPerSec float64) { l.ch.setRate(bytesPerSec) }

func (l *link) Stats() Stats {
	l.stmu.Lock()
	defer l.stmu.Unlock()
	return l.stats
}

// timedWriter counts the bytes written to the connection and the time its
// writes took.
type timedWriter struct {
	w     io.Writer
	n, ns int64
}

func (t *timedWriter) Write(p []byte) (int, error) {
	t0 := time.Now()
	n, err := t.w.Write(p)
	t.ns += int64(time.Since(t0))
	t.n += int64(n)
	return n, err
}

// fail breaks the link with err (the first error wins) and returns the
// link's error.
func (l *link) fail(err error) error {
	l.once.Do(func() {
		l.emu.Lock()
		l.err = err
		l.emu.Unlock()
		closeConn(l.c)
		close(l.done)
	})
	return l.Err()
}

// closeConn closes c at once: a TLS connection without its close_notify
// alert, whose write could block on a peer that no longer reads.
func closeConn(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	c.Close()
}

func (l *link) Close() error {
	l.fail(ErrClosed)
	return nil
}

func (l *link) Send(tag Tag, t *nn.Tensor) error {
	if err := l.Err(); err != nil {
		return err
	}
	if !tag.Kind.valid() {
		return fmt.Errorf("dataplane: Send: invalid kind %d", tag.Kind)
	}
	if t == nil {
		return errors.New("dataplane: Send: nil tensor")
	}
	l.smu.Lock()
	defer l.smu.Unlock()
	start := time.Now()
	codec, sampled := l.ch.codec(tag.Kind, t, time.Now)
	l.w.SetCodec(codec)
	n0, ns0 := l.tc.n+int64(l.bw.Buffered()), l.tc.ns
	b := l.stg[:]
	b[0], b[1], b[2], b[3] = byte(tag.Kind), 0, 0, 0
	binary.LittleEndian.PutUint32(b[4:], tag.MicroBatch)
	binary.LittleEndian.PutUint32(b[8:], tag.Tensor)
	binary.LittleEndian.PutUint32(b[12:], tensorio.Checksum(b[:12]))
	// A deadline fails only on a closed connection (net.Pipe: either end
	// closed), which the write then reports as it is.
	_ = l.c.SetWriteDeadline(time.Now().Add(l.o.IOTimeout))
	if _, err := l.bw.Write(b); err != nil {
		return l.fail(fmt.Errorf("dataplane: Send: %w", err))
	}
	if err := l.w.WriteTensor(t); err != nil {
		if l.bw.Buffered() == tagLen && !isNetErr(err) {
			// Nothing of the frame went out: a caller error (bad
			// tensor or codec). Drop the tag; the link stays usable.
			l.bw.Reset(l.out)
			return fmt.Errorf("dataplane: Send: %w", err)
		}
		return l.fail(fmt.Errorf("dataplane: Send: %w", err))
	}
	if err := l.bw.Flush(); err != nil {
		return l.fail(fmt.Errorf("dataplane: Send: %w", err))
	}
	took, wrote := int64(time.Since(start)), l.tc.ns-ns0
	l.stmu.Lock()
	ks := &l.stats[tag.Kind]
	ks.Frames++
	ks.RawBytes += RawWireBytes(t.Shape())
	ks.WireBytes += l.tc.n - n0
	ks.WriteNs += wrote
	ks.EncodeNs += took - wrote - int64(sampled)
	ks.SampleNs += int64(sampled)
	ks.Codec = codec
	l.stmu.Unlock()
	if l.pc != nil {
		l.pc.sentFrames.Add(1)
		l.pc.sentBytes.Add(l.tc.n - n0)
	}
	return nil
}

func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrClosedPipe) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, os.ErrDeadlineExceeded)
}

func (l *link) Recv(dst *nn.Tensor) (Tag, *nn.Tensor, error) {
	return l.RecvTo(func(Tag) *nn.Tensor { return dst })
}

func (l *link) RecvTo(pick func(Tag) *nn.Tensor) (Tag, *nn.Tensor, error) {
	if err := l.Err(); err != nil {
		return Tag{}, nil, err
	}
	_ = l.c.SetReadDeadline(time.Now().Add(l.o.IOTimeout)) // as in Send
	b := l.rtg[:]
	if n, err := io.ReadFull(l.br, b); err != nil {
		if err == io.EOF && n == 0 {
			return Tag{}, nil, l.fail(io.EOF)
		}
		if err == io.ErrUnexpectedEOF {
			err = fmt.Errorf("stream ends in a tag: %w (%w)", tensorio.ErrCorrupt, io.ErrUnexpectedEOF)
		}
		return Tag{}, nil, l.fail(fmt.Errorf("dataplane: Recv: %w", err))
	}
	if tensorio.Checksum(b[:12]) != binary.LittleEndian.Uint32(b[12:]) || b[1]|b[2]|b[3] != 0 ||
		!Kind(b[0]).valid() {
		return Tag{}, nil, l.fail(fmt.Errorf("dataplane: Recv: bad tensor tag %x: %w", b, tensorio.ErrCorrupt))
	}
	tag := Tag{
		Kind:       Kind(b[0]),
		MicroBatch: binary.LittleEndian.Uint32(b[4:]),
		Tensor:     binary.LittleEndian.Uint32(b[8:]),
	}
	t, err := l.r.ReadTensor(pick(tag))
	if err != nil {
		if err == io.EOF {
			err = fmt.Errorf("stream ends after a tag: %w (%w)", tensorio.ErrCorrupt, io.ErrUnexpectedEOF)
		}
		return Tag{}, nil, l.fail(fmt.Errorf("dataplane: Recv %v %d/%d: %w", tag.Kind, tag.MicroBatch, tag.Tensor, err))
	}
	if l.pc != nil {
		l.pc.recvFrames.Add(1)
	}
	return tag, t, nil
}

// RawWireBytes is what a link writes for a tensor of the given shape in the
// raw codec: tag, frame header and data.
func RawWireBytes(shape []int) int64 {
	n := int64(4)
	for _, d := range shape {
		n *= int64(d)
	}
	return tagLen + int64(tensorio.FrameHeaderLen(len(shape))) + n
}
