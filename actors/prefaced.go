package actors

import (
	"net"

	"github.com/ppnode/ppnode/admit"
	"google.golang.org/grpc/credentials"
)

// grpcPreface is the length of the client preface of HTTP/2 ("PRI *
// HTTP/2.0\r\n\r\nSM\r\n\r\n"), which a gRPC client sends first.
const grpcPreface = 24

// prefaced are the gRPC server's credentials with the end of a
// connection's handshake reported to its admit gate: once the peer has
// passed the security handshake (TLS with a cluster certificate, or none)
// and sent the HTTP/2 client preface over it. Until then the connection
// counts as one in its handshake, bounded per peer and in time.
type prefaced struct {
	credentials.TransportCredentials
}

func (p prefaced) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, info, err := p.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	return &prefaceConn{Conn: c, raw: raw, left: grpcPreface}, info, nil
}

func (p prefaced) Clone() credentials.TransportCredentials {
	return prefaced{p.TransportCredentials.Clone()}
}

// prefaceConn reports raw established once left more bytes have been
// read. gRPC reads a connection from one goroutine.
type prefaceConn struct {
	net.Conn
	raw  net.Conn // the connection the gate took
	left int
}

func (c *prefaceConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.left > 0 {
		if c.left -= n; c.left <= 0 {
			admit.Established(c.raw)
		}
	}
	return n, err
}
