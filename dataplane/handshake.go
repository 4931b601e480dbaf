package dataplane

import (
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/ppnode/ppnode/tensorio"
)

// The handshake on the wire (doc.go says what each mode protects):
//
//	with TLS:  the TLS handshake, then the listener's ready message: a
//	           TLS 1.3 dialer finishes its handshake before the listener
//	           has checked its certificate, and waiting for ready lets it
//	           read a rejection rather than talk over it (on a pipe, that
//	           would deadlock); everything below runs inside TLS
//	dialer:    Hello (encodeHello), version 1 without a key, 2 with one
//	           and TLS, 3 with one and without TLS (the link's frames are
//	           then sealed, seal.go); versions 2 and 3 are followed by the
//	           dialer's 32-byte nonce
//	listener:  messages of status u8, length u8, body (at most 255 bytes):
//	           0 accepted: no body; with a key, the listener's proof
//	           1 refused: the reason
//	           2 challenge (with a key): the listener's nonce, which the
//	             dialer answers with its 32-byte proof; the listener then
//	             sends accepted or refused
//	           3 ready (with TLS): no body
//
// A proof is HMAC-SHA256 under the cluster key over who proves, both
// nonces, the TLS session's exported keying material (none without TLS) and
// the encoded Hello.
const (
	helloMagic  = "PPDL"
	helloPlain  = 1 // Hello version of a dialer without a key (the original handshake)
	helloKeyed  = 2 // Hello version of a dialer with the cluster key and TLS
	helloSealed = 3 // Hello version of a dialer with the cluster key and without TLS: sealed frames
	nonceLen    = 32
	proofLen    = sha256.Size
	minKeyLen   = 16
	maxRecord   = 1<<14 + 2048 // largest TLS record a dialer's first flight may hold
	tlsRecordHS = 0x16         // first byte of a TLS handshake record
)

// The statuses of the listener's messages.
const (
	replyAccepted  = 0
	replyRefused   = 1
	replyChallenge = 2
	replyReady     = 3
)

// Who proves: equal lengths, so the proof's input is unambiguous.
const (
	dialerProves   = "ppnode/dataplane dialer->listener"
	listenerProves = "ppnode/dataplane listener->dialer"
	exporterLabel  = "EXPORTER-ppnode-dataplane"
)

// security is how a data plane protects its links: the cluster key, and
// the TLS configurations of its listening and dialing ends.
type security struct {
	key    []byte
	server *tls.Config // Listen's connections are TLS servers
	client *tls.Config // Dial's connections are TLS clients
}

func (s security) keyed() bool { return len(s.key) > 0 }

func (s security) describe() string {
	switch {
	case s.server != nil && s.keyed():
		return "key and TLS"
	case s.server != nil:
		return "TLS"
	case s.keyed():
		return "key and sealed records"
	}
	return "none"
}

// helloVersion is the Hello version of a dialer (or what a listener
// expects of one) with s.
func (s security) helloVersion(tls bool) byte {
	switch {
	case !s.keyed():
		return helloPlain
	case tls:
		return helloKeyed
	}
	return helloSealed
}

// validate says what is wrong with s for listening (or dialing).
func (s security) validate(listen bool) error {
	if s.keyed() && len(s.key) < minKeyLen {
		return fmt.Errorf("dataplane: cluster key of %d bytes, want at least %d", len(s.key), minKeyLen)
	}
	if c := s.server; listen && c != nil && len(c.Certificates) == 0 && c.GetCertificate == nil && c.GetConfigForClient == nil {
		return errors.New("dataplane: ServerTLS has no certificate")
	}
	return nil
}

// encodeHello is h as a dialer without a key sends it.
func encodeHello(h Hello) ([]byte, error) { return helloBytes(h, helloPlain) }

func helloBytes(h Hello, version byte) ([]byte, error) {
	if len(h.JobID) == 0 || len(h.JobID) > 255 {
		return nil, fmt.Errorf("dataplane: job id of %d bytes, want 1-255", len(h.JobID))
	}
	b := make([]byte, 0, 30+len(h.JobID))
	b = append(b, helloMagic...)
	b = append(b, version, byte(len(h.JobID)))
	b = append(b, h.JobID...)
	b = binary.LittleEndian.AppendUint64(b, h.Generation)
	b = binary.LittleEndian.AppendUint32(b, h.Link)
	b = binary.LittleEndian.AppendUint32(b, h.From)
	b = binary.LittleEndian.AppendUint32(b, h.To)
	b = binary.LittleEndian.AppendUint32(b, tensorio.Checksum(b))
	return b, nil
}

// helloMsg is a dialer's first message.
type helloMsg struct {
	h       Hello
	raw     []byte // the Hello as it came: what the proofs cover
	version byte
	keyed   bool // version 2 or 3: the dialer has a key and sent a nonce
	nonce   [nonceLen]byte
}

func readHelloMsg(r io.Reader) (*helloMsg, error) {
	var pre [6]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return nil, err
	}
	if string(pre[:4]) != helloMagic || pre[4] < helloPlain || pre[4] > helloSealed || pre[5] == 0 {
		return nil, fmt.Errorf("bad handshake header %q: %w", pre[:], tensorio.ErrCorrupt)
	}
	all := make([]byte, 6+int(pre[5])+24) // at most 285 bytes
	copy(all, pre[:])
	if _, err := io.ReadFull(r, all[6:]); err != nil {
		return nil, err
	}
	n := len(all) - 4
	if tensorio.Checksum(all[:n]) != binary.LittleEndian.Uint32(all[n:]) {
		return nil, fmt.Errorf("handshake checksum mismatch: %w", tensorio.ErrCorrupt)
	}
	j := 6 + int(pre[5])
	m := &helloMsg{raw: all, version: pre[4], keyed: pre[4] >= helloKeyed, h: Hello{
		JobID:      string(all[6:j]),
		Generation: binary.LittleEndian.Uint64(all[j:]),
		Link:       binary.LittleEndian.Uint32(all[j+8:]),
		From:       binary.LittleEndian.Uint32(all[j+12:]),
		To:         binary.LittleEndian.Uint32(all[j+16:]),
	}}
	if m.keyed {
		if _, err := io.ReadFull(r, m.nonce[:]); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// check returns why a listener expecting want refuses got, or "".
func check(want, got Hello) string {
	switch {
	case got.JobID != want.JobID:
		return fmt.Sprintf("job %q, this listener is for job %q", got.JobID, want.JobID)
	case got.Generation < want.Generation:
		return fmt.Sprintf("stale plan generation %d, current is %d", got.Generation, want.Generation)
	case got.Generation > want.Generation:
		return fmt.Sprintf("plan generation %d is newer than this listener's %d", got.Generation, want.Generation)
	case got.Link != want.Link || got.From != want.From || got.To != want.To:
		return fmt.Sprintf("link %d (stage %d->%d), this listener is for link %d (stage %d->%d)",
			got.Link, got.From, got.To, want.Link, want.From, want.To)
	}
	return ""
}

// writeMsg sends a listener's message; a longer body is cut to 255 bytes.
func writeMsg(w io.Writer, status byte, body []byte) error {
	body = body[:min(len(body), 255)]
	_, err := w.Write(append([]byte{status, byte(len(body))}, body...))
	return err
}

func readMsg(r io.Reader) (status byte, body []byte, err error) {
	var b [2]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, nil, err
	}
	if b[0] > replyReady {
		return 0, nil, fmt.Errorf("bad handshake reply %d: %w", b[0], tensorio.ErrCorrupt)
	}
	body = make([]byte, b[1]) // at most 255 bytes
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return b[0], body, nil
}

// readReply reads the verdict on a dialer without a key.
func readReply(r io.Reader) error {
	status, body, err := readMsg(r)
	switch {
	case err != nil:
		return err
	case status == replyRefused:
		return &RefusedError{Reason: string(body)}
	case status == replyChallenge:
		return errors.New("the listener asks for the cluster key; this dialer has none (TCP.Key unset)")
	case status != replyAccepted || len(body) != 0:
		return fmt.Errorf("reply %d of %d bytes, want a verdict: %w", status, len(body), tensorio.ErrCorrupt)
	}
	return nil
}

// proof is one end's proof of the cluster key for this handshake.
func proof(key []byte, who string, nd, nl, binding, hello []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(who))
	m.Write(nd)
	m.Write(nl)
	m.Write([]byte{byte(len(binding))})
	m.Write(binding)
	m.Write(hello)
	return m.Sum(nil)
}

// binding ties the proofs to c's TLS session (keying material exported
// from it; none without TLS), so they cannot be relayed into another one.
func binding(c net.Conn) ([]byte, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil
	}
	cs := tc.ConnectionState()
	b, err := cs.ExportKeyingMaterial(exporterLabel, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("TLS session binding: %w", err)
	}
	return b, nil
}

// ---- Listener side ----

// serverHandshake admits a freshly accepted connection, or refuses it and
// says why.
func serverHandshake(raw net.Conn, want Hello, o Options, s security) (*link, error) {
	raw.SetDeadline(time.Now().Add(o.HandshakeTimeout))
	c, err := s.serverConn(raw)
	if err != nil {
		return nil, err
	}
	m, err := readHelloMsg(c)
	if err != nil {
		return nil, fmt.Errorf("dataplane: handshake: %w", err)
	}
	reason, body, nl, err := s.admit(c, m, want)
	if err != nil {
		return nil, fmt.Errorf("dataplane: handshake: %w", err)
	}
	status := byte(replyAccepted)
	if reason != "" {
		status, body = replyRefused, []byte(reason)
	}
	if err := writeMsg(c, status, body); err != nil {
		return nil, fmt.Errorf("dataplane: handshake: %w", err)
	}
	if reason != "" {
		return nil, &RefusedError{Reason: reason}
	}
	raw.SetDeadline(time.Time{})
	var send, recv cipher.AEAD
	if m.version == helloSealed {
		recv, send = frameKeys(s.key, m.nonce[:], nl, m.raw)
	}
	return newLink(c, m.h, o, send, recv), nil
}

// serverConn is the connection the handshake runs on: TLS if this
// listener has ServerTLS, raw otherwise. It tells the two from the
// dialer's first byte and refuses, in plaintext, a dialer in the other
// mode.
func (s security) serverConn(raw net.Conn) (net.Conn, error) {
	var first [1]byte
	if _, err := io.ReadFull(raw, first[:]); err != nil {
		return nil, fmt.Errorf("dataplane: handshake: %w", err)
	}
	pc := &prefixConn{Conn: raw, pre: first[:]}
	switch {
	case s.server == nil && first[0] == tlsRecordHS:
		return nil, refuseTLSDialer(raw)
	case s.server != nil && first[0] == helloMagic[0]:
		readHelloMsg(pc) // all of it: unread bytes would turn the close into a reset
		return nil, refuse(pc, "this listener requires TLS; the dialer has none (TCP.ClientTLS unset)")
	case s.server == nil:
		return pc, nil
	}
	tc := tls.Server(pc, s.server)
	if err := tc.Handshake(); err != nil {
		return nil, fmt.Errorf("dataplane: handshake: TLS: %w", err)
	}
	if err := writeMsg(tc, replyReady, nil); err != nil {
		return nil, fmt.Errorf("dataplane: handshake: %w", err)
	}
	return tc, nil
}

// refuseTLSDialer refuses, in plaintext, a dialer that started TLS, once
// its first record is read (unread, it would turn the close into a reset
// that may overtake the refusal).
func refuseTLSDialer(c net.Conn) error {
	var h [4]byte // the record header after its first byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return fmt.Errorf("dataplane: handshake: %w", err)
	}
	if n := int64(binary.BigEndian.Uint16(h[2:])); n <= maxRecord {
		io.CopyN(io.Discard, c, n)
	}
	return refuse(c, "this listener does not use TLS; the dialer does (TCP.ServerTLS unset)")
}

func refuse(c net.Conn, reason string) error {
	writeMsg(c, replyRefused, []byte(reason))
	return &RefusedError{Reason: reason}
}

// admit decides on a dialer: its key first (proved, or absent on both
// ends), then its Hello. It returns why the dialer is refused ("" if it is
// not), the body of the acceptance (the listener's proof, with a key) and
// the listener's nonce (with a key).
func (s security) admit(c net.Conn, m *helloMsg, want Hello) (reason string, body, nl []byte, err error) {
	if !s.keyed() {
		if m.keyed {
			return "this listener has no cluster key; the dialer has one (TCP.Key unset here)", nil, nil, nil
		}
		return check(want, m.h), nil, nil, nil
	}
	if !m.keyed {
		return "this listener requires the cluster key; the dialer has none (TCP.Key unset)", nil, nil, nil
	}
	if v := s.helloVersion(s.server != nil); m.version != v {
		return fmt.Sprintf("handshake version %d, this listener's is %d: every node needs the same ppnode version", m.version, v), nil, nil, nil
	}
	reason, lp, nl, err := s.challenge(c, m)
	if reason != "" || err != nil {
		return reason, nil, nil, err
	}
	return check(want, m.h), lp, nl, nil
}

// challenge sends a keyed dialer a fresh nonce and checks its proof. It
// returns "", the listener's own proof and its nonce if the dialer has the
// key.
func (s security) challenge(c net.Conn, m *helloMsg) (string, []byte, []byte, error) {
	nl := make([]byte, nonceLen)
	rand.Read(nl)
	if err := writeMsg(c, replyChallenge, nl); err != nil {
		return "", nil, nil, err
	}
	var dp [proofLen]byte
	if _, err := io.ReadFull(c, dp[:]); err != nil {
		return "", nil, nil, err
	}
	bind, err := binding(c)
	if err != nil {
		return "", nil, nil, err
	}
	if !hmac.Equal(dp[:], proof(s.key, dialerProves, m.nonce[:], nl, bind, m.raw)) {
		return "authentication failed: the dialer's proof does not match this listener's cluster key", nil, nil, nil
	}
	return "", proof(s.key, listenerProves, m.nonce[:], nl, bind, m.raw), nl, nil
}

// prefixConn is a connection whose first bytes were already read.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pre) == 0 {
		return c.Conn.Read(p)
	}
	n := copy(p, c.pre)
	c.pre = c.pre[n:]
	return n, nil
}

// ---- Dialer side ----

// clientHandshake authenticates raw, dialed at addr, as h and waits for the
// listener's verdict.
func clientHandshake(raw net.Conn, addr string, h Hello, o Options, s security) (*link, error) {
	version := s.helloVersion(s.client != nil)
	hb, err := helloBytes(h, version)
	if err != nil {
		return nil, err
	}
	raw.SetDeadline(time.Now().Add(o.HandshakeTimeout))
	c, err := s.clientConn(raw, addr)
	if err != nil {
		return nil, dialErr(err)
	}
	var nd [nonceLen]byte
	msg := hb
	if s.keyed() {
		rand.Read(nd[:])
		msg = append(hb[:len(hb):len(hb)], nd[:]...)
	}
	if _, err := c.Write(msg); err != nil {
		return nil, dialErr(err)
	}
	var nl []byte
	if s.keyed() {
		nl, err = s.answer(c, hb, nd[:])
	} else {
		err = readReply(c)
	}
	if err != nil {
		return nil, dialErr(err)
	}
	raw.SetDeadline(time.Time{})
	var send, recv cipher.AEAD
	if version == helloSealed {
		send, recv = frameKeys(s.key, nd[:], nl, hb)
	}
	return newLink(c, h, o, send, recv), nil
}

// clientConn is the connection the handshake runs on: TLS if this dialer
// has ClientTLS (the listener's name, if unset, is addr's host), raw
// otherwise.
func (s security) clientConn(raw net.Conn, addr string) (net.Conn, error) {
	if s.client == nil {
		return raw, nil
	}
	cfg := s.client
	if cfg.ServerName == "" {
		cfg = cfg.Clone()
		cfg.ServerName = addr
		if host, _, err := net.SplitHostPort(addr); err == nil {
			cfg.ServerName = host
		}
	}
	tc := tls.Client(raw, cfg)
	if err := tc.Handshake(); err != nil {
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) {
			return nil, &RefusedError{Reason: "the listener answered in plaintext: it does not use TLS (TCP.ServerTLS unset), this dialer does"}
		}
		return nil, fmt.Errorf("TLS: %w", err)
	}
	status, body, err := readMsg(tc)
	switch {
	case err != nil:
		return nil, err
	case status == replyRefused:
		return nil, &RefusedError{Reason: string(body)}
	case status != replyReady || len(body) != 0:
		return nil, fmt.Errorf("reply %d of %d bytes, want the listener ready: %w", status, len(body), tensorio.ErrCorrupt)
	}
	return tc, nil
}

// answer proves the cluster key to the listener's challenge and checks the
// listener's proof of it. It returns the listener's nonce.
func (s security) answer(c net.Conn, hb, nd []byte) ([]byte, error) {
	status, nl, err := readMsg(c)
	switch {
	case err != nil:
		return nil, err
	case status == replyRefused:
		return nil, &RefusedError{Reason: string(nl)}
	case status != replyChallenge || len(nl) != nonceLen:
		return nil, fmt.Errorf("the listener sent no challenge (reply %d of %d bytes): it does not check the cluster key", status, len(nl))
	}
	bind, err := binding(c)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(proof(s.key, dialerProves, nd, nl, bind, hb)); err != nil {
		return nil, err
	}
	status, lp, err := readMsg(c)
	switch {
	case err != nil:
		return nil, err
	case status == replyRefused:
		return nil, &RefusedError{Reason: string(lp)}
	case status != replyAccepted || len(lp) != proofLen:
		return nil, fmt.Errorf("reply %d of %d bytes, want the listener's proof: %w", status, len(lp), tensorio.ErrCorrupt)
	case !hmac.Equal(lp, proof(s.key, listenerProves, nd, nl, bind, hb)):
		return nil, errors.New("the listener's proof does not match this dialer's cluster key: it is not a member of this cluster")
	}
	return nl, nil
}

// dialErr describes a failed handshake to the dialer; a refusal stays a
// *RefusedError.
func dialErr(err error) error {
	var re *RefusedError
	if errors.As(err, &re) {
		return err
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.ErrClosedPipe) ||
		errors.Is(err, syscall.ECONNRESET) {
		return fmt.Errorf("dataplane: handshake: the listener hung up (over its %d handshakes in progress, or its gate's bounds? not a data plane listener?): %w", maxHandshakes, err)
	}
	return fmt.Errorf("dataplane: handshake: %w", err)
}
