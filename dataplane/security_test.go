package dataplane

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ppnode/ppnode/nn"
	"github.com/ppnode/ppnode/tensorio"
)

var (
	testKey  = []byte("the cluster's secret, 32 bytes..")
	otherKey = []byte("another cluster's secret key....")
)

// testPKI is a throwaway cluster CA and one node certificate, valid for
// 127.0.0.1 and "inmem" (the host of Inmem's addresses).
type testPKI struct {
	pool *x509.CertPool
	cert tls.Certificate
}

func newPKI(t testing.TB) testPKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test cluster CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		t.Fatal(err)
	}
	nodeKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	node := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"inmem"}}
	nodeDER, err := x509.CreateCertificate(rand.Reader, node, ca, &nodeKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return testPKI{pool: pool, cert: tls.Certificate{Certificate: [][]byte{nodeDER}, PrivateKey: nodeKey}}
}

// server and client are a node's TLS configurations: its certificate, and
// the cluster's CA for the other end's.
func (k testPKI) server() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{k.cert}, ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs: k.pool, MinVersion: tls.VersionTLS13}
}

func (k testPKI) client() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{k.cert}, RootCAs: k.pool, MinVersion: tls.VersionTLS13}
}

// conf is one end's protection.
type conf struct {
	key            []byte
	server, client *tls.Config
}

// configure sets p's protection for its next Listen or Dial (a listener
// keeps what it was created with).
func configure(p DataPlane, c conf) {
	switch p := p.(type) {
	case *TCP:
		p.Key, p.ServerTLS, p.ClientTLS = c.key, c.server, c.client
	case *Inmem:
		p.Key, p.ServerTLS, p.ClientTLS = c.key, c.server, c.client
	}
}

// exchange sends a tensor each way over a fresh link and checks both.
func exchange(t *testing.T, snd, rcv Link) {
	t.Helper()
	x := nn.FromData([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	go snd.Send(Tag{Kind: KindActivation, MicroBatch: 1}, x)
	if _, got, err := rcv.Recv(nil); err != nil || !sameBits(got, x) {
		t.Fatalf("forward: %v %v", got, err)
	}
	go rcv.Send(Tag{Kind: KindGradient, MicroBatch: 1}, x)
	if _, got, err := snd.Recv(nil); err != nil || !sameBits(got, x) {
		t.Fatalf("backward: %v %v", got, err)
	}
}

// dialCase dials a listener configured as lc from an end configured as dc
// with Hello h; want is "" for success or a substring of the error, which
// must be a *RefusedError if refused is set. The listener must then still
// admit a dialer configured as lc.
type dialCase struct {
	name    string
	lc, dc  conf
	h       Hello
	want    string
	refused bool
}

func runDialCases(t *testing.T, cases []dialCase) {
	for name, mk := range planes() {
		for _, c := range cases {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				checkNoLeak(t)
				p := mk()
				configure(p, c.lc)
				ln, err := p.Listen(hello, Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				accepted := acceptAsync(ln)
				configure(p, c.dc)
				l, err := p.Dial(ln.Addr(), c.h, Options{IOTimeout: 5 * time.Second})
				if c.want == "" {
					if err != nil {
						t.Fatal(err)
					}
					defer l.Close()
					a := <-accepted
					defer a.Close()
					exchange(t, l, a)
					return
				}
				var re *RefusedError
				if err == nil || !strings.Contains(err.Error(), c.want) || c.refused != errors.As(err, &re) {
					t.Fatalf("Dial = %v; want an error containing %q (refused: %v)", err, c.want, c.refused)
				}
				t.Log(err)
				// The listener goes on: a correct dialer gets its link.
				configure(p, c.lc)
				l, err = p.Dial(ln.Addr(), hello, Options{})
				if err != nil {
					t.Fatalf("correct Dial after a refusal: %v", err)
				}
				l.Close()
				if a := <-accepted; a != nil {
					a.Close()
				}
			})
		}
	}
}

// TestKey: with the cluster key both ends prove it; a wrong key, or a key on
// one end only, is refused with a clear reason; a Hello is still checked
// once the dialer proved the key.
func TestKey(t *testing.T) {
	keyed := conf{key: testKey}
	stale := hello
	stale.Generation--
	runDialCases(t, []dialCase{
		{name: "same key", lc: keyed, dc: keyed, h: hello},
		{name: "wrong key", lc: keyed, dc: conf{key: otherKey}, h: hello, want: "proof does not match this listener's cluster key", refused: true},
		{name: "dialer without key", lc: keyed, h: hello, want: "requires the cluster key; the dialer has none", refused: true},
		{name: "listener without key", dc: keyed, h: hello, want: "no cluster key; the dialer has one", refused: true},
		{name: "stale generation", lc: keyed, dc: keyed, h: stale, want: "stale plan generation 2", refused: true},
	})
	for _, p := range []DataPlane{&TCP{Key: []byte("short")}, &Inmem{Key: []byte("short")}} {
		if _, err := p.Listen(hello, Options{}); err == nil || !strings.Contains(err.Error(), "at least 16") {
			t.Errorf("%T.Listen with a 5-byte key: %v", p, err)
		}
		if _, err := p.Dial("127.0.0.1:1", hello, Options{}); err == nil || !strings.Contains(err.Error(), "at least 16") {
			t.Errorf("%T.Dial with a 5-byte key: %v", p, err)
		}
	}
}

// TestTLS: links over mutual TLS (with and without the key), and what a
// mismatch or a certificate of another CA gets.
func TestTLS(t *testing.T) {
	k, other := newPKI(t), newPKI(t)
	tlsConf := conf{server: k.server(), client: k.client()}
	both := conf{key: testKey, server: k.server(), client: k.client()}
	noCert := k.client()
	noCert.Certificates = nil
	foreign := k.client() // trusts the cluster's CA, shows another's certificate
	foreign.Certificates = other.client().Certificates
	runDialCases(t, []dialCase{
		{name: "tls", lc: tlsConf, dc: tlsConf, h: hello},
		{name: "tls and key", lc: both, dc: both, h: hello},
		{name: "tls, wrong key", lc: both, dc: conf{key: otherKey, server: k.server(), client: k.client()}, h: hello, want: "proof does not match", refused: true},
		{name: "dialer without tls", lc: tlsConf, h: hello, want: "requires TLS; the dialer has none", refused: true},
		{name: "listener without tls", lc: conf{}, dc: tlsConf, h: hello, want: "does not use TLS", refused: true},
		{name: "dialer of another CA", lc: tlsConf, dc: conf{client: foreign}, h: hello, want: "remote error: tls: unknown certificate authority"},
		{name: "dialer without certificate", lc: tlsConf, dc: conf{client: noCert}, h: hello, want: "remote error: tls: certificate required"},
		{name: "listener of another CA", lc: conf{server: other.server(), client: other.client()}, dc: tlsConf, h: hello, want: "certificate signed by unknown authority"},
	})
	for _, p := range []DataPlane{&TCP{ServerTLS: &tls.Config{}}, &Inmem{ServerTLS: &tls.Config{}}} {
		if _, err := p.Listen(hello, Options{}); err == nil || !strings.Contains(err.Error(), "no certificate") {
			t.Errorf("%T.Listen with a certificate-less ServerTLS: %v", p, err)
		}
	}
	for name, mk := range planes() {
		t.Run(name+"/session", func(t *testing.T) {
			p := mk()
			configure(p, tlsConf)
			snd, rcv := pair(t, p, Options{IOTimeout: 5 * time.Second})
			for _, l := range []Link{snd, rcv} {
				tc, ok := l.(*link).c.(*tls.Conn)
				if !ok {
					t.Fatalf("link over %T, want *tls.Conn", l.(*link).c)
				}
				cs := tc.ConnectionState()
				if cs.Version != tls.VersionTLS13 || len(cs.PeerCertificates) == 0 {
					t.Errorf("TLS version %x, %d peer certificates", cs.Version, len(cs.PeerCertificates))
				}
				t.Log(tls.CipherSuiteName(cs.CipherSuite))
			}
			stream(t, snd, rcv, KindActivation, 3, 24)
			snd.Close()
			if _, _, err := rcv.Recv(nil); err != io.EOF {
				t.Errorf("Recv after the peer's Close: %v, want io.EOF", err)
			}
		})
	}
}

// manualDialer plays a keyed dialer by hand on a TCP connection to addr:
// it sends Hello hb and a nonce, reads the challenge, sends whatever
// answer makes of it, and returns the listener's last message.
func manualDialer(t *testing.T, addr string, first []byte, answer func(nd, nl []byte) []byte) (byte, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(first); err != nil {
		t.Fatal(err)
	}
	status, nl, err := readMsg(c)
	if err != nil || status != replyChallenge {
		t.Fatalf("challenge: %d %v", status, err)
	}
	if _, err := c.Write(answer(first[len(first)-nonceLen:], nl)); err != nil {
		t.Fatal(err)
	}
	status, body, err := readMsg(c)
	if err != nil {
		t.Fatal(err)
	}
	return status, string(body)
}

// TestKeyReplay: a recorded handshake cannot be replayed (the listener's
// nonce is fresh), a proof does not carry over to another Hello (another
// generation), and the listener's proof cannot be reflected as the
// dialer's.
func TestKeyReplay(t *testing.T) {
	checkNoLeak(t)
	ln, err := (&TCP{Key: testKey}).Listen(hello, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hb, _ := helloBytes(hello, helloSealed)
	nd := make([]byte, nonceLen)
	rand.Read(nd)
	first := append(clone(hb), nd...)
	var recorded []byte
	status, body := manualDialer(t, ln.Addr(), first, func(nd, nl []byte) []byte {
		recorded = proof(testKey, dialerProves, nd, nl, nil, hb)
		return recorded
	})
	if status != replyAccepted || len(body) != proofLen {
		t.Fatalf("honest handshake: %d %q", status, body)
	}
	if l, err := ln.Accept(); err != nil {
		t.Fatal(err)
	} else {
		l.Close()
	}
	old := hello
	old.Generation = 2
	oldHB, _ := helloBytes(old, helloSealed)
	cases := []struct {
		name   string
		answer func(nd, nl []byte) []byte
	}{
		{"replayed proof", func(nd, nl []byte) []byte { return recorded }},
		{"proof of another generation's Hello", func(nd, nl []byte) []byte { return proof(testKey, dialerProves, nd, nl, nil, oldHB) }},
		{"listener's proof reflected", func(nd, nl []byte) []byte { return proof(testKey, listenerProves, nd, nl, nil, hb) }},
		{"no proof", func(nd, nl []byte) []byte { return make([]byte, proofLen) }},
	}
	for _, c := range cases {
		status, body := manualDialer(t, ln.Addr(), first, c.answer)
		if status != replyRefused || !strings.Contains(body, "authentication failed") {
			t.Errorf("%s: listener answered %d %q, want a refusal", c.name, status, body)
		}
	}
}

// TestFakeListener: a listener that does not know the key cannot pass as
// one: the dialer checks the listener's proof.
func TestFakeListener(t *testing.T) {
	fake, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	go func() {
		c, err := fake.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := readHelloMsg(c); err != nil {
			return
		}
		nl := make([]byte, nonceLen)
		writeMsg(c, replyChallenge, nl)
		io.ReadFull(c, make([]byte, proofLen))
		writeMsg(c, replyAccepted, make([]byte, proofLen)) // a guess
	}()
	_, err = (&TCP{Key: testKey}).Dial(fake.Addr().String(), hello, Options{})
	if err == nil || !strings.Contains(err.Error(), "listener's proof does not match") {
		t.Fatalf("Dial to a fake listener: %v", err)
	}
}

// tap is a TCP proxy in front of addr that records every byte it forwards.
type tap struct {
	ln   net.Listener
	mu   sync.Mutex
	wire []byte
}

func newTap(t *testing.T, addr string) *tap {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", addr)
		if err != nil {
			c.Close()
			return
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		go tp.copy(s, c)
		tp.copy(c, s)
	}()
	return tp
}

func (tp *tap) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		tp.mu.Lock()
		tp.wire = append(tp.wire, buf[:n]...)
		tp.mu.Unlock()
		if err != nil {
			dst.Close()
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (tp *tap) contains(b []byte) bool {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return bytes.Contains(tp.wire, b)
}

// TestOnTheWire: what an eavesdropper sees: the Hello's job id and the
// tensors in the clear without TLS (with the key too), neither with TLS.
func TestOnTheWire(t *testing.T) {
	k := newPKI(t)
	marker := nn.New(256)
	for i := range nn.F32(marker) {
		nn.F32(marker)[i] = math.Float32frombits(0x4c504450) // "PDPL"
	}
	pattern := bytes.Repeat([]byte("PDPL"), 64)
	for _, c := range []struct {
		name  string
		conf  conf
		clear bool
	}{
		{"plain", conf{}, true},
		{"key", conf{key: testKey}, true},
		{"tls", conf{key: testKey, server: k.server(), client: k.client()}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &TCP{}
			configure(p, c.conf)
			ln, err := p.Listen(hello, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			tp := newTap(t, ln.Addr())
			accepted := acceptAsync(ln)
			snd, err := p.Dial(tp.ln.Addr().String(), hello, Options{IOTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer snd.Close()
			rcv := <-accepted
			defer rcv.Close()
			go snd.Send(Tag{Kind: KindActivation}, marker)
			if _, _, err := rcv.Recv(nil); err != nil {
				t.Fatal(err)
			}
			job, tensor := tp.contains([]byte(hello.JobID)), tp.contains(pattern)
			if job != c.clear || tensor != c.clear {
				t.Errorf("job id on the wire: %v, tensor on the wire: %v; want %v", job, tensor, c.clear)
			}
		})
	}
}

// rewriter is a relay in front of addr that forwards the dialer's first
// hs bytes (its handshake) as they come, then reads its next frame bytes
// whole, rewrites the first float32 1.0 of the tensor to 1000.0, fixes the
// frame's CRC-32Cs as an attacker on the path can, and forwards the rest.
// The listener's answers pass unchanged.
func rewriter(t *testing.T, addr string, hs, frame int, sealed bool) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", addr)
		if err != nil {
			c.Close()
			return
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		go io.Copy(c, s)
		if _, err := io.CopyN(s, c, int64(hs)); err != nil {
			return
		}
		b := make([]byte, frame)
		if _, err := io.ReadFull(c, b); err != nil {
			return
		}
		f := b[tagLen:] // the tensorio frame after the link's tag
		if sealed {
			f = b[sealHdr+tagLen : len(b)-sealTag]
		}
		const rank = 1
		payload := f[32+4*rank:]
		i := bytes.Index(payload, []byte{0, 0, 0x80, 0x3f}) // 1.0
		binary.LittleEndian.PutUint32(payload[i:], math.Float32bits(1000))
		binary.LittleEndian.PutUint32(f[24+4*rank:], tensorio.Checksum(payload))
		binary.LittleEndian.PutUint32(f[28+4*rank:], tensorio.Checksum(f[:28+4*rank]))
		s.Write(b)
		io.Copy(s, c)
	}()
	return ln
}

// TestRelayRewritesTensor: an attacker on the path changes a tensor value
// and fixes the frame's checksums. Without a key the receiver takes it;
// with the cluster key the link's sealed records refuse it.
func TestRelayRewritesTensor(t *testing.T) {
	x := nn.FromData([]float32{0.5, 1, 2, 3})
	hb, _ := encodeHello(hello)
	frame := int(RawWireBytes(x.Shape()))
	for _, c := range []struct {
		name   string
		key    []byte
		hs     int
		sealed bool
	}{
		{"plain", nil, len(hb), false},
		{"key", testKey, len(hb) + nonceLen + proofLen, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := &TCP{Key: c.key}
			ln, err := p.Listen(hello, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			wire := frame
			if c.sealed {
				wire += sealHdr + sealTag
			}
			relay := rewriter(t, ln.Addr(), c.hs, wire, c.sealed)
			accepted := acceptAsync(ln)
			snd, err := p.Dial(relay.Addr().String(), hello, Options{Codec: tensorio.CodecRaw, IOTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer snd.Close()
			rcv := <-accepted
			defer rcv.Close()
			go snd.Send(Tag{Kind: KindActivation}, x)
			_, got, err := rcv.Recv(nil)
			if !c.sealed {
				if err != nil || nn.F32(got)[1] != 1000 {
					t.Fatalf("the relay's rewrite should pass an unkeyed link: %v %v", got, err)
				}
				return
			}
			if err == nil || !errors.Is(err, tensorio.ErrCorrupt) || !strings.Contains(err.Error(), "authentication") {
				t.Fatalf("a rewritten tensor on a keyed link: got %v, err %v; want an authentication failure", got, err)
			}
		})
	}
}
