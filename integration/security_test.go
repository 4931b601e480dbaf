package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/cluster"
	"github.com/ppnode/ppnode/job"
	"github.com/ppnode/ppnode/tensorio"
)

// Attacks by someone who reaches the nodes' ports but holds no certificate
// of the cluster (SECURITY.md's threat model): each is refused, and the
// node keeps working.

// anon is an attacker's HTTPS client: it accepts any server and presents
// no certificate.
var anon = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

// attack sends one request and returns its status code.
func attack(t *testing.T, hc *http.Client, scheme, method, addr, path string, body []byte, hdr map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(method, scheme+"://"+addr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	res, err := hc.Do(req)
	if err != nil {
		return -1
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

func TestUnauthenticatedRequestsAreRefused(t *testing.T) {
	t.Parallel()
	c, dirs := failoverCluster(t)
	a := c.Node("a")
	spec := failoverSpec()
	cl := startClient(t, trainArgs(a.HTTP, 2))
	st := waitDurableCut(t, a, cl, 20)
	spec.ID = st.ID
	want := localSHA(t, spec)

	// A real cut (b's copy), zeroed and restamped at a later step: what
	// the attacker would upload.
	steps := cutFiles(t, dirs["b"], spec.ID)
	if len(steps) == 0 {
		t.Fatal("b holds no cut")
	}
	ck, err := tensorio.LoadCheckpoint(filepath.Join(dirs["b"], "checkpoints", spec.ID, fmt.Sprintf("%019d.ckpt", steps[0])))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ck.Params {
		clear(p.T.Data().([]float32))
	}
	ck.Step += 1000
	var forged bytes.Buffer
	if err := tensorio.WriteCheckpoint(&forged, ck); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(map[string]any{"id": spec.ID, "coordinator": "b", "term": 1 << 30})
	specJSON, _ := json.Marshal(failoverSpec())

	for _, n := range c.Nodes() {
		for _, tc := range []struct {
			method, path string
			body         []byte
		}{
			{"POST", "/v1/jobs", specJSON},
			{"DELETE", "/v1/jobs/" + spec.ID, nil},
			{"POST", "/v1/jobs/" + spec.ID + "/replan", []byte(`{"partition":"uniform"}`)},
			{"GET", "/v1/jobs/" + spec.ID + "/weights", nil},
			{"GET", "/v1/jobrecords", nil},
			{"GET", "/v1/jobrecords/" + spec.ID, nil},
			{"PUT", "/v1/jobrecords/" + spec.ID, rec},
			{"GET", "/v1/checkpoints/" + spec.ID, nil},
			{"GET", "/v1/checkpoints/" + spec.ID + "/" + strconv.Itoa(st.LatestCut), nil},
			{"PUT", "/v1/checkpoints/" + spec.ID, forged.Bytes()},
			{"POST", "/v1/links/probe", []byte(`{"to":"a"}`)},
		} {
			if code := attack(t, anon, "https", tc.method, n.HTTP, tc.path, tc.body, nil); code != http.StatusUnauthorized {
				t.Errorf("%s: anonymous %s %s: HTTP %d, want 401", n.Name, tc.method, tc.path, code)
			}
			if code := attack(t, http.DefaultClient, "http", tc.method, n.HTTP, tc.path, tc.body, nil); code/100 == 2 {
				t.Errorf("%s: plain-HTTP %s %s: HTTP %d", n.Name, tc.method, tc.path, code)
			}
		}
		// A web page: a rebound DNS name, a cross-site request; the profiler is off.
		if code := attack(t, n.client, "https", "GET", n.HTTP, "/v1/status", nil, map[string]string{"Host": "attacker.example"}); code != http.StatusForbidden {
			t.Errorf("%s: Host attacker.example: HTTP %d, want 403", n.Name, code)
		}
		if code := attack(t, n.client, "https", "POST", n.HTTP, "/v1/jobs", specJSON, map[string]string{"Origin": "http://attacker.example"}); code != http.StatusForbidden {
			t.Errorf("%s: Origin attacker.example: HTTP %d, want 403", n.Name, code)
		}
		// A client reads job records (how a job ended), and writes none.
		if code := attack(t, n.client, "https", "GET", n.HTTP, "/v1/jobrecords", nil, nil); code != http.StatusOK {
			t.Errorf("%s: a client's GET /v1/jobrecords: HTTP %d, want 200", n.Name, code)
		}
		if code := attack(t, n.client, "https", "PUT", n.HTTP, "/v1/jobrecords/"+spec.ID, rec, nil); code != http.StatusForbidden {
			t.Errorf("%s: a client's PUT /v1/jobrecords: HTTP %d, want 403", n.Name, code)
		}
		if code := attack(t, n.client, "https", "GET", n.HTTP, "/debug/pprof/", nil, nil); code != http.StatusNotFound {
			t.Errorf("%s: /debug/pprof/ without --pprof: HTTP %d, want 404", n.Name, code)
		}
		// Read-only status stays open on loopback.
		if code := attack(t, anon, "https", "GET", n.HTTP, "/v1/status", nil, nil); code != http.StatusOK {
			t.Errorf("%s: anonymous GET /v1/status from loopback: HTTP %d, want 200", n.Name, code)
		}
		// The actor port: no stream without a certificate of the cluster.
		if err := tlsRefused(n.Actors); err != nil {
			t.Errorf("%s: actor port: %v", n.Name, err)
		}
	}

	// A rogue member without the gossip key cannot join.
	rogue, err := cluster.Start(cluster.Config{Name: "rogue", BindAddr: "127.0.0.1:0", Seeds: []string{a.Gossip},
		Meta: cluster.Meta{ActorAddr: "127.0.0.1:1", Profile: cluster.Profile{GEMMGFLOPS: 1e6, MemoryBytes: 1 << 40}}})
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		rogue.Leave(ctx)
		cancel()
		t.Error("a member without the gossip key joined")
	}
	ns, err := a.Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ns.Members {
		if m.Name == "rogue" {
			t.Errorf("a lists the rogue member: %+v", m)
		}
	}

	// The job was not disturbed: its coordinator dies, b takes it over
	// from a genuine cut, and the weights are the fault-free ones.
	c.Kill(a)
	if res := cl.result(t); res.WeightsSHA256 != want {
		t.Errorf("weights %s after the attacks and a takeover, %s without them", res.WeightsSHA256, want)
	}
}

// tlsRefused checks that a TLS client without a certificate cannot use
// the gRPC port: its first read fails.
func tlsRefused(addr string) error {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		return nil // refused in the handshake
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		return fmt.Errorf("a client without a certificate got an answer")
	} else if !strings.Contains(err.Error(), "certificate required") {
		return fmt.Errorf("read: %v, want the server's certificate-required alert", err)
	}
	return nil
}

// rss is a process's resident memory in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// A job too large for the members is refused before anything is
// allocated; 200 connections that never finish their request are closed
// by the HTTP timeouts; the node keeps answering.
func TestLimits(t *testing.T) {
	t.Parallel()
	// --conn-per-ip lets the 200 slow connections below through the HTTP
	// port's gate (which would close most at once, see
	// TestFloodLeavesTheNodeServing): the HTTP timeouts are under test.
	c := StartCluster(t, NodeOptions{Threads: 1, Args: []string{"--http-timeout", "1s", "--conn-per-ip", "256"}})
	a := c.Node("a")
	before := rss(t, a.cmd.Process.Pid)
	spec := job.DefaultSpec()
	spec.Model, spec.Width, spec.Data = "mlp32", 16384, "mnist"
	_, err := a.Submit(spec)
	if err == nil || !strings.Contains(err.Error(), "GiB") {
		t.Errorf("mlp32 width 16384: %v, want a refusal with the memory figures", err)
	}
	if grew := rss(t, a.cmd.Process.Pid) - before; grew > 64<<20 {
		t.Errorf("the node grew by %d MB refusing the job", grew>>20)
	}
	t.Logf("width 16384: %v (resident memory %+d MB)", err, (rss(t, a.cmd.Process.Pid)-before)>>20)

	var conns []net.Conn
	for i := range 200 {
		conn, err := tls.Dial("tcp", a.HTTP, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		defer conn.Close()
		half := "PUT /v1/checkpoints/x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000\r\n"
		if i%2 == 1 {
			half += "\r\nsome"
		}
		conn.Write([]byte(half))
		conns = append(conns, conn)
	}
	start := time.Now()
	for i, conn := range conns {
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.Copy(io.Discard, conn); err != nil && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("connection %d: not closed by the node: %v", i, err)
		}
	}
	t.Logf("200 slow connections closed by the node within %v", time.Since(start).Round(time.Millisecond))
	if _, err := a.Status(); err != nil {
		t.Errorf("the node does not answer after the attacks: %v", err)
	}
}
