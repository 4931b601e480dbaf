package tensorio

import (
	"fmt"
	"io"

	"github.com/ppnode/ppnode/nn"
)

// Writer writes frames to an io.Writer. It keeps its buffers between
// frames, so writing tensors of a steady shape allocates nothing. A Writer
// is not safe for concurrent use.
type Writer struct {
	w     io.Writer
	codec Codec
	buf   []byte // the frame being written (the header alone for raw frames)
	s     scratch
	nocrc bool // raw frames carry 0 for their payload checksum
}

// NewWriter returns a Writer that encodes with codec c.
func NewWriter(w io.Writer, c Codec) *Writer { return &Writer{w: w, codec: c} }

// SetCodec changes the codec of the following frames.
func (w *Writer) SetCodec(c Codec) { w.codec = c }

// OmitPayloadChecksums makes the following raw frames carry 0 for their
// payload checksum, for a stream whose bytes a layer below authenticates
// (whose Reader then trusts payloads): the checksum would only repeat that
// check at about the cost of a copy.
func (w *Writer) OmitPayloadChecksums() { w.nocrc = true }

// Codec returns the codec of the following frames.
func (w *Writer) Codec() Codec { return w.codec }

// WriteTensor writes one frame holding t. Raw frames are written straight
// from the tensor's memory, header first, without a copy.
func (w *Writer) WriteTensor(t *nn.Tensor) error {
	data, shape, err := checkEncodable(t, w.codec)
	if err != nil {
		return err
	}
	if w.codec == CodecRaw {
		if view := f32View(data); view != nil || len(data) == 0 {
			w.buf = resize(w.buf, FrameHeaderLen(len(shape)))
			if w.nocrc {
				putFrameHeaderCRC(w.buf, shape, CodecRaw, len(data), len(view), 0)
			} else {
				putFrameHeader(w.buf, shape, CodecRaw, len(data), view)
			}
			if _, err := w.w.Write(w.buf); err != nil {
				return err
			}
			if len(view) == 0 {
				return nil
			}
			_, err := w.w.Write(view)
			return err
		}
	}
	w.buf = appendFrame(w.buf[:0], data, shape, w.codec, &w.s)
	_, err = w.w.Write(w.buf)
	return err
}

// Reader reads frames from an io.Reader. It keeps its buffers between
// frames, so reading tensors of a steady shape into a reused destination
// allocates nothing. A Reader is not safe for concurrent use.
type Reader struct {
	r        io.Reader
	maxElems int
	hdr      [maxFrameHeader]byte
	buf      []byte // payload of the current frame
	s        scratch
	trusted  bool // payload checksums are not checked
}

// NewReader returns a Reader that accepts frames of up to MaxElements
// elements.
func NewReader(r io.Reader) *Reader { return &Reader{r: r, maxElems: MaxElements} }

// SetMaxElements lowers the largest frame the Reader accepts; a header
// beyond it is rejected before anything is allocated.
func (r *Reader) SetMaxElements(n int) {
	r.maxElems = min(max(n, 0), MaxElements)
}

// TrustPayloads stops checking the payload checksums of the following
// frames, for a stream whose bytes a layer below authenticates (see
// Writer.OmitPayloadChecksums). Headers are checked as before.
func (r *Reader) TrustPayloads() { r.trusted = true }

// ReadTensor reads the next frame and decodes it, reusing dst as
// DecodeFrame does. At a clean end of stream (no byte of a new frame) it
// returns io.EOF; a stream that ends inside a frame gives an error wrapping
// both ErrCorrupt and io.ErrUnexpectedEOF. Errors of the underlying reader
// are returned as they are.
func (r *Reader) ReadTensor(dst *nn.Tensor) (*nn.Tensor, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:framePrefix]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return nil, corruptWrap(err, "stream ends in a frame header")
		}
		return nil, err // io.EOF at a frame boundary, or a read error
	}
	// Check magic, version and rank before trusting the rank: with only
	// the prefix, a good header reports io.ErrUnexpectedEOF.
	if _, _, err := parseFrameHeader(r.hdr[:framePrefix], r.maxElems); err != nil && err != io.ErrUnexpectedEOF {
		return nil, err
	}
	// The prefix is valid so far; read the rest of the header.
	hl := FrameHeaderLen(int(r.hdr[7]))
	if _, err := io.ReadFull(r.r, r.hdr[framePrefix:hl]); err != nil {
		return nil, unexpected(err, "stream ends in a frame header")
	}
	h, _, err := parseFrameHeader(r.hdr[:hl], r.maxElems)
	if err != nil {
		return nil, err
	}
	if h.codec == CodecRaw && h.fits(dst) {
		if view := f32View(nn.F32(dst)); view != nil {
			// The steady state: read straight into the tensor.
			if _, err := io.ReadFull(r.r, view); err != nil {
				return nil, unexpected(err, "stream ends in a frame payload")
			}
			if err := r.checkPayload(view, h.payloadCRC); err != nil {
				return nil, err
			}
			return dst, nil
		}
	}
	// Read and verify the payload before allocating a tensor for it, so
	// that a header lying about its size costs little.
	if err := r.readPayload(h.encLen); err != nil {
		return nil, err
	}
	if err := r.checkPayload(r.buf, h.payloadCRC); err != nil {
		return nil, err
	}
	t := dst
	if !h.fits(t) {
		t = tensorFor(dst, h.shape(), h.n)
	}
	if err := decodePayload(nn.F32(t), r.buf, h.codec, &r.s); err != nil {
		return nil, err
	}
	return t, nil
}

func (r *Reader) checkPayload(b []byte, want uint32) error {
	if r.trusted {
		return nil
	}
	if got := crc(b); got != want {
		return corruptf("frame payload checksum %08x, want %08x", got, want)
	}
	return nil
}

// readPayload reads n bytes into r.buf. A buffer that must grow grows with
// the bytes that actually arrive, so a header that lies about its length
// costs at most twice what the peer sent.
func (r *Reader) readPayload(n int) error {
	if cap(r.buf) >= n {
		r.buf = r.buf[:n]
		if _, err := io.ReadFull(r.r, r.buf); err != nil {
			return unexpected(err, "stream ends in a frame payload")
		}
		return nil
	}
	r.buf = r.buf[:0]
	for len(r.buf) < n {
		old := len(r.buf)
		next := min(n, max(2*old, 1<<20))
		r.buf = grow(r.buf, next-old)[:next]
		if _, err := io.ReadFull(r.r, r.buf[old:]); err != nil {
			return unexpected(err, "stream ends in a frame payload")
		}
	}
	return nil
}

// unexpected turns an EOF inside a frame into a corrupt-input error.
func unexpected(err error, what string) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return corruptWrap(io.ErrUnexpectedEOF, "%s", what)
	}
	return fmt.Errorf("tensorio: %s: %w", what, err)
}
