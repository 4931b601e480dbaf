package nodes

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/trust"
)

// nodeIdentity makes cluster credentials in dir and returns node name's
// identity.
func nodeIdentity(t *testing.T, dir, name string) *trust.Identity {
	t.Helper()
	if err := trust.Init(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := trust.Issue(dir, name, trust.RoleNode, nil); err != nil {
		t.Fatal(err)
	}
	id, err := trust.Load(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// The HTTP API's gate: silent connections from one address beyond PerIP
// are refused, the API answers another address over HTTP/2 and HTTP/1.1,
// and a connection that has sent a request counts as established (it
// outlives the handshake deadline and leaves the address's room free).
func TestHTTPGate(t *testing.T) {
	dir := t.TempDir()
	id := nodeIdentity(t, dir, "a")
	client, err := trust.Load(dir, trust.ClientName)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Start(Config{Name: "a", Bind: "127.0.0.1:0", HTTP: "127.0.0.1:0", Threads: 1, ProfileFor: 20 * time.Millisecond,
		Identity: id, Conns: admit.Limits{PerIP: 8, Handshake: time.Minute}, Logger: testLogger(t), ActorLogLevel: slog.LevelError})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	flooder := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	for range 40 {
		c, err := flooder.Dial("tcp", a.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: client.ClientTLS(),
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}} // HTTP/1.1 only
	for name, hc := range map[string]*http.Client{"HTTP/2": HTTPClient(client), "HTTP/1.1": h1} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := NewClientWith(a.HTTPAddr(), hc).Status(ctx)
		cancel()
		if err != nil || st.Name != "a" {
			t.Fatalf("%s status during the flood: %+v, %v", name, st, err)
		}
	}
	s := a.gates.http.Stats()
	if s.RefusedPerIP != 32 || s.InHandshake != 8 || s.Held-s.InHandshake != 2 {
		t.Fatalf("HTTP gate %+v: want 32 refused, the 8 silent in handshake, the two clients' connections established", s)
	}
}
