package trust

import (
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func cluster(t *testing.T, nodes ...string) string {
	t.Helper()
	dir := t.TempDir()
	if err := Init(dir); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if _, err := Issue(dir, n, RoleNode, []string{"10.0.0.1"}); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestInitIssueLoad(t *testing.T) {
	dir := cluster(t, "a")
	for _, f := range []string{CAKey, GossipKey, "a.key", "client.key"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", f, fi.Mode().Perm(), err)
		}
	}
	id, err := Load(dir, "a")
	if err != nil {
		t.Fatal(err)
	}
	if id.Name != "a" || id.Role != RoleNode || len(id.Gossip) != 32 {
		t.Errorf("node identity %q %q, gossip %d bytes", id.Name, id.Role, len(id.Gossip))
	}
	cl, err := Load(dir, ClientName)
	if err != nil || cl.Role != RoleClient || cl.Gossip != nil {
		t.Errorf("client identity %+v, %v", cl, err)
	}
	if err := Init(dir); err == nil {
		t.Error("a second Init in the same dir succeeded")
	}
	if _, err := Issue(dir, "bad\nname", RoleNode, nil); err == nil {
		t.Error("a name with a newline was issued")
	}
	if _, err := Issue(dir, strings.Repeat("x", 5000), RoleNode, nil); err == nil {
		t.Error("a 5000-byte name was issued")
	}
}

// handshake runs a TLS handshake between server and client configs and
// returns the peer the server saw.
func handshake(t *testing.T, srv, cli *tls.Config) (Peer, bool, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		p   Peer
		ok  bool
		err error
	}
	done := make(chan res, 1)
	go func() {
		s := tls.Server(a, srv)
		err := s.Handshake()
		cs := s.ConnectionState()
		p, ok := PeerOf(&cs)
		if err == nil {
			io.ReadAll(s) // until the client closes
		}
		a.Close()
		done <- res{p, ok, err}
	}()
	c := tls.Client(b, cli)
	err = c.Handshake()
	c.Close()
	r := <-done
	if err == nil {
		err = r.err
	}
	return r.p, r.ok, err
}

func TestMutualTLS(t *testing.T) {
	dir := cluster(t, "a", "b")
	a, _ := Load(dir, "a")
	b, _ := Load(dir, "b")
	cl, _ := Load(dir, ClientName)
	if p, ok, err := handshake(t, a.ServerTLS(true), b.ClientTLS()); err != nil || !ok || p != (Peer{"b", RoleNode}) {
		t.Errorf("node b to node a: %+v %v %v", p, ok, err)
	}
	if p, ok, err := handshake(t, a.ServerTLS(false), cl.ClientTLS()); err != nil || !ok || p != (Peer{ClientName, RoleClient}) {
		t.Errorf("client to node a: %+v %v %v", p, ok, err)
	}
	anon := &tls.Config{InsecureSkipVerify: true}
	if _, ok, err := handshake(t, a.ServerTLS(false), anon); err != nil || ok {
		t.Errorf("anonymous client, certificate optional: verified %v, %v", ok, err)
	}
	if _, _, err := handshake(t, a.ServerTLS(true), anon); err == nil {
		t.Error("anonymous client, certificate required: handshake succeeded")
	}
	other := cluster(t, "a")
	x, _ := Load(other, "a")
	if _, _, err := handshake(t, a.ServerTLS(true), x.ClientTLS()); err == nil {
		t.Error("another cluster's node was accepted by a")
	}
	if _, _, err := handshake(t, x.ServerTLS(true), b.ClientTLS()); err == nil {
		t.Error("b accepted another cluster's node as a server")
	}
	// A client certificate cannot serve as a node.
	if _, _, err := handshake(t, cl.ServerTLS(false), b.ClientTLS()); err == nil {
		t.Error("b accepted a client certificate as a node")
	}
}
