package nodes

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/trust"
)

// Who may call an endpoint of the HTTP API: trust.May decides from the
// certificate's role (SECURITY.md). Without cluster credentials every
// endpoint needs the node's local token (localtoken.go).
type access = trust.Action

const (
	// readOnly: a certificate of the cluster, or a client on loopback.
	readOnly = trust.ActRead
	// user: a client or node certificate of the cluster.
	user = trust.ActUse
	// member: a node certificate of the cluster.
	member = trust.ActMember
)

// guard wraps next with the checks every request passes: a Host header
// that names this node (not a DNS name a web page could rebind), no
// foreign Origin, and the peer's certificate for the access level.
func (h *api) guard(level access, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h.checkHost(r); err != nil {
			writeError(w, http.StatusForbidden, err)
			return
		}
		if h.a.cfg.Identity == nil {
			if h.a.cfg.Token == "" || h.tokenAllows(w, r) {
				next(w, r)
			} else {
				writeError(w, http.StatusUnauthorized, errNoToken(r))
			}
			return
		}
		peer, ok := trust.PeerOf(r.TLS)
		switch {
		case ok && trust.May(peer.Role, level):
			next(w, r)
		case level == readOnly && loopback(r.RemoteAddr):
			next(w, r)
		case ok:
			writeError(w, http.StatusForbidden, fmt.Errorf("nodes: %s %s is for the cluster's nodes; %q is a %s", r.Method, r.URL.Path, peer.Name, peer.Role))
		default:
			writeError(w, http.StatusUnauthorized, fmt.Errorf("nodes: %s %s needs a certificate of the cluster (ppnode init, ppnode cert; --creds)", r.Method, r.URL.Path))
		}
	}
}

// peerName is the name on the request's verified certificate, or "".
func peerName(r *http.Request) string {
	p, _ := trust.PeerOf(r.TLS)
	return p.Name
}

func loopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	ip := net.ParseIP(host)
	return err == nil && ip != nil && ip.IsLoopback()
}

// checkHost refuses a Host header that is a DNS name other than localhost,
// this node's name or a name in its certificate, and an Origin header of
// another host: a web page cannot drive a node through DNS rebinding or a
// cross-site request.
func (h *api) checkHost(r *http.Request) error {
	host := r.Host
	if name, _, err := net.SplitHostPort(host); err == nil {
		host = name
	}
	host = strings.Trim(host, "[]")
	if !h.hostAllowed(host) {
		return fmt.Errorf("nodes: Host %q is not this node's (an IP address, localhost or the node's name)", r.Host)
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return fmt.Errorf("nodes: requests from the web page at %q are refused", o)
		}
	}
	return nil
}

func (h *api) hostAllowed(host string) bool {
	if net.ParseIP(host) != nil || strings.EqualFold(host, "localhost") || strings.EqualFold(host, h.a.cfg.Name) {
		return true
	}
	if id := h.a.cfg.Identity; id != nil && id.Cert.Leaf != nil {
		for _, n := range id.Cert.Leaf.DNSNames {
			if strings.EqualFold(n, host) {
				return true
			}
		}
	}
	return false
}

// HTTP server limits (Config.HTTPTimeout scales them down in tests).
const (
	// DefaultHTTPTimeout bounds reading a request and writing an answer,
	// and the silence within a checkpoint's transfer.
	DefaultHTTPTimeout = 30 * time.Second
	// MaxUploads bounds the checkpoint uploads received at once; more wait
	// for a slot as long as their request may last.
	MaxUploads = 4
)

// newServer is the node's HTTP server with its timeouts.
func (h *api) newServer() *http.Server {
	t := h.a.cfg.HTTPTimeout
	srv := &http.Server{Handler: h.handler(), ReadHeaderTimeout: min(10*time.Second, t), ReadTimeout: t, WriteTimeout: 2 * t,
		IdleTimeout: 4 * t, MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(h.a.log.Handler(), slog.LevelWarn),
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateActive { // a request's headers have come (over TLS): its gate's handshake is done
				admit.Established(c)
			}
		}}
	if h.a.cfg.Identity != nil {
		srv.TLSConfig = h.a.cfg.Identity.ServerTLS(false)
	}
	return srv
}

// streaming lifts the request's whole-request deadlines for a long
// transfer: instead, every read and write must make progress within the
// HTTP timeout.
func (h *api) streaming(w http.ResponseWriter, r *http.Request) (http.ResponseWriter, *http.Request) {
	rc := http.NewResponseController(w)
	t := h.a.cfg.HTTPTimeout
	rc.SetReadDeadline(time.Now().Add(t))
	rc.SetWriteDeadline(time.Now().Add(2 * t))
	r.Body = &progressReader{r: r.Body, rc: rc, t: t}
	return &progressWriter{ResponseWriter: w, rc: rc, t: 2 * t}, r
}

type progressReader struct {
	r  io.ReadCloser
	rc *http.ResponseController
	t  time.Duration
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.rc.SetReadDeadline(time.Now().Add(p.t))
	}
	return n, err
}

func (p *progressReader) Close() error { return p.r.Close() }

type progressWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	t  time.Duration
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.rc.SetWriteDeadline(time.Now().Add(p.t))
	return p.ResponseWriter.Write(b)
}

// checkExposure refuses to serve beyond loopback without cluster
// credentials, unless the operator said --insecure.
func checkExposure(cfg Config, addrs ...string) error {
	if cfg.Identity != nil || cfg.Insecure {
		return nil
	}
	for _, addr := range addrs {
		if addr == "" { // derived from another
			continue
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil || host == "" {
			return fmt.Errorf("nodes: %q listens on every interface without cluster credentials: %w", addr, errExposed)
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			if host != "localhost" {
				return fmt.Errorf("nodes: %s is not a loopback address and the node has no cluster credentials: %w", host, errExposed)
			}
		}
	}
	return nil
}

var errExposed = errors.New("anyone who reaches it could submit, cancel and poison jobs; create credentials with `ppnode init` and `ppnode cert NAME` (SECURITY.md) and pass --creds, or pass --insecure to run without them")

// HTTPClient is the HTTP client of a caller holding id (a node calling
// others, the CLI): mutual TLS with it; nil: plain HTTP.
func HTTPClient(id *trust.Identity) *http.Client {
	if id == nil {
		return http.DefaultClient
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: id.ClientTLS(), ForceAttemptHTTP2: true,
		MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute, TLSHandshakeTimeout: 10 * time.Second}}
}

// cutOf returns the record held here of a job whose cut peer sends: a
// node keeps cuts only of a job whose record it holds (a cut of anything
// else would only fill its disk), and with cluster credentials only from
// the coordinator that record names.
func (h *api) cutOf(job, peer string) (JobRecord, error) {
	rec, ok := h.a.jobs.heldRecord(job)
	if !ok {
		return JobRecord{}, fmt.Errorf("nodes: a cut of job %q, whose record this node does not hold", job)
	}
	if h.a.cfg.Identity != nil && rec.Coordinator != peer {
		return JobRecord{}, fmt.Errorf("nodes: a cut of job %q from %q: its coordinator is %q", job, peer, rec.Coordinator)
	}
	return rec, nil
}
