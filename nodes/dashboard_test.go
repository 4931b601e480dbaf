package nodes

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// The dashboard's files are served from the binary with their types, an
// ETag that answers 304, and a policy that lets the page load nothing
// from elsewhere; other paths under /web/ are 404.
func TestDashboardFiles(t *testing.T) {
	h := newAPI(&Agent{cfg: Config{Name: "a"}}).handler()
	get := func(path, etag string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		r.RemoteAddr, r.Host = "127.0.0.1:1234", "127.0.0.1:8080"
		if etag != "" {
			r.Header.Set("If-None-Match", etag)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, tc := range []struct{ path, ctype, contains string }{
		{"/", "text/html", `src="/web/dashboard.js"`},
		{"/web/dashboard.js", "javascript", "/v1/status"},
		{"/web/dashboard.css", "text/css", "svg"},
	} {
		w := get(tc.path, "")
		if w.Code != http.StatusOK || !strings.Contains(w.Header().Get("Content-Type"), tc.ctype) || !strings.Contains(w.Body.String(), tc.contains) {
			t.Errorf("GET %s: %d %q, body has %q: %v", tc.path, w.Code, w.Header().Get("Content-Type"), tc.contains, strings.Contains(w.Body.String(), tc.contains))
			continue
		}
		if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
			t.Errorf("GET %s: Content-Security-Policy %q", tc.path, csp)
		}
		etag := w.Header().Get("ETag")
		if w2 := get(tc.path, etag); etag == "" || w2.Code != http.StatusNotModified {
			t.Errorf("GET %s with If-None-Match %s: %d, want 304", tc.path, etag, w2.Code)
		}
	}
	for _, p := range []string{"/web/", "/web/nope.js", "/web/..%2fdashboard.go", "/index.html"} {
		if w := get(p, ""); w.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, w.Code)
		}
	}
}

// The page works offline: no file refers to another host, and the
// script uses no inline style (the policy forbids it).
func TestDashboardIsSelfContained(t *testing.T) {
	if len(webFiles) != 3 {
		t.Errorf("embedded files %v, want index.html, dashboard.js and dashboard.css", keys(webFiles))
	}
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|<iframe`)
	for name, f := range webFiles {
		if m := external.Find(f.body); m != nil {
			t.Errorf("%s refers to %q: the dashboard must load nothing from elsewhere", name, m)
		}
		if strings.Contains(string(f.body), "style=") || strings.Contains(string(f.body), "<script>") {
			t.Errorf("%s has an inline style or script, which the page's policy refuses", name)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// The dashboard has the access of the read-only status: with cluster
// credentials, a browser without a certificate may read it on loopback
// only; the Host must be the node's.
func TestDashboardAccess(t *testing.T) {
	dir := t.TempDir()
	id := nodeIdentity(t, dir, "a")
	h := newAPI(&Agent{cfg: Config{Name: "a", Identity: id}}).handler()
	for _, tc := range []struct {
		remote, host string
		code         int
	}{
		{"127.0.0.1:5000", "127.0.0.1:8080", http.StatusOK},
		{"[::1]:5000", "localhost:8080", http.StatusOK},
		{"10.0.0.7:5000", "10.0.0.1:8080", http.StatusUnauthorized},
		{"127.0.0.1:5000", "attacker.example:8080", http.StatusForbidden},
	} {
		for _, path := range []string{"/", "/web/dashboard.js"} {
			r := httptest.NewRequest("GET", path, nil)
			r.RemoteAddr, r.Host = tc.remote, tc.host
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.code {
				t.Errorf("GET %s from %s as Host %s: %d, want %d", path, tc.remote, tc.host, w.Code, tc.code)
			}
		}
	}
}

// A member's CPU limit comes through gossip as text; anything but a
// positive number is no limit.
func TestParseCPUs(t *testing.T) {
	for s, want := range map[string]float64{"": 0, "0.7": 0.7, formatCPUs(1.5): 1.5, "-1": 0, "NaN": 0, "+Inf": 0, "1e300": 0, "x": 0} {
		if got := parseCPUs(s); got != want {
			t.Errorf("parseCPUs(%q) = %v, want %v", s, got, want)
		}
	}
}
