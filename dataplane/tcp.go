package dataplane

import (
	"crypto/tls"
	"net"
	"sync"
	"time"

	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/portrange"
)

// TCP is the data plane over TCP. Its zero value listens on 127.0.0.1 with
// a port chosen by the system and protects nothing: anyone who can reach
// the port and knows a listener's Hello gets its link, and the tensors
// cross in the clear. A node sets Key, ServerTLS and ClientTLS once; the
// links' Options do not change with them. doc.go says what each protects.
type TCP struct {
	// Host is the address Listen binds (default 127.0.0.1).
	Host string
	// Ports, if not zero, is the range Listen takes its ports from (one
	// a firewall lets through); otherwise the system picks.
	Ports portrange.Range
	// Key, if not empty, is the cluster's secret (at least 16 bytes, the
	// same on every node): both ends of every link prove they know it,
	// bound to the link's Hello and to fresh nonces from both ends, and a
	// listener refuses a dialer without it (and the other way round). It
	// authenticates; on its own it does not encrypt.
	Key []byte
	// ServerTLS, if set, makes the connections Listen accepts TLS servers:
	// the Hello, the key's proofs and every tensor then cross encrypted. It
	// should hold the node's certificate and require client certificates
	// of the cluster's CA (ClientAuth tls.RequireAndVerifyClientCert,
	// ClientCAs); a listener with it refuses a dialer without TLS.
	ServerTLS *tls.Config
	// ClientTLS, if set, makes Dial's connections TLS clients: it should
	// hold the node's certificate and the cluster's CA (RootCAs). An empty
	// ServerName is taken from the dialed address's host, as tls.Dial does,
	// so the listener's certificate must name its host (an IP address SAN
	// for a numeric Host); certificates that share one name instead set
	// ServerName to it.
	ClientTLS *tls.Config
	// Gate bounds the connections of all of Listen's listeners together
	// (admit; default: a gate of its own with admit's default limits).
	// A connection's handshake ends when the link is admitted.
	Gate *admit.Gate

	gateOnce sync.Once // sets Gate if it is nil
	meter    meter     // the links' traffic by peer (Traffic)
}

var _ DataPlane = (*TCP)(nil)

func (p *TCP) security() security {
	return security{key: p.Key, server: p.ServerTLS, client: p.ClientTLS}
}

// Protection says in a few words what protects p's links: "none", "key
// and sealed records" or "key and TLS" (doc.go).
func (p *TCP) Protection() string { return p.security().describe() }

// Listen binds a port of Host (from Ports) and returns a listener for want.
func (p *TCP) Listen(want Hello, o Options) (Listener, error) {
	if _, err := encodeHello(want); err != nil {
		return nil, err
	}
	sec := p.security()
	if err := sec.validate(true); err != nil {
		return nil, err
	}
	host := p.Host
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := p.Ports.Listen(host)
	if err != nil {
		return nil, err
	}
	p.gateOnce.Do(func() {
		if p.Gate == nil {
			p.Gate = admit.NewGate(admit.Limits{}, nil)
		}
	})
	return newListener(p.Gate.Listen(ln), ln.Addr().String(), want, o, sec, &p.meter), nil
}

// Dial connects to addr (host:port) and authenticates with h.
func (p *TCP) Dial(addr string, h Hello, o Options) (Link, error) {
	o = o.WithDefaults()
	if _, err := encodeHello(h); err != nil {
		return nil, err
	}
	sec := p.security()
	if err := sec.validate(false); err != nil {
		return nil, err
	}
	c, err := net.DialTimeout("tcp", addr, o.HandshakeTimeout)
	if err != nil {
		return nil, err
	}
	tuneTCP(c.(*net.TCPConn))
	lk, err := clientHandshake(c, addr, h, o, sec)
	if err != nil {
		c.Close()
		return nil, err
	}
	return lk.metered(p.meter.peer(addr)), nil
}

// Traffic returns what the links of this data plane have carried, by
// peer, since it was created (the links' own [Link.Stats] count what each
// sent, by kind). It is safe to call at any time.
func (p *TCP) Traffic() []PeerTraffic { return p.meter.traffic() }

// Keepalive of the data plane's connections: a peer that stops answering
// (its machine gone, the link cut: TCP itself notices neither while the
// connection is idle) breaks an idle link within about
// keepAliveIdle + keepAliveCount*keepAliveInterval (10 s), not the
// system's default of minutes. A stopped or busy process's kernel still
// answers: only the machine or the network failing breaks the link. A
// stage cut off from its coordinator learns so from its idle coordinator
// link and frees itself.
const (
	keepAliveIdle     = 5 * time.Second
	keepAliveInterval = time.Second
	keepAliveCount    = 5
)

// userTimeout bounds how long sent data may stay unacknowledged (Linux's
// TCP_USER_TIMEOUT) as the keepalive bounds an idle link: a link cut while
// a tensor is in flight is not idle, and without it breaks only when the
// retransmissions give up, minutes later. A busy peer's kernel acknowledges
// (a zero window included), so only a dead machine or network breaks it.
const userTimeout = keepAliveIdle + keepAliveCount*keepAliveInterval

// tuneTCP sets a data-plane connection's options: no Nagle delay (tensors
// are flushed whole), the keepalive and the user timeout above.
func tuneTCP(tc *net.TCPConn) {
	tc.SetNoDelay(true)
	tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount})
	setUserTimeout(tc, userTimeout)
}
