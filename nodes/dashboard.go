package nodes

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strconv"
	"time"
)

// The dashboard: GET / serves a page that draws what GET /v1/status says
// (the members, and each job this node coordinates: its plan as a stage
// graph, a Gantt chart of its last steps as the stages measured them, its
// loss and accuracy, its samples/s, its timeline of re-plans, recoveries
// and cuts, its links), polled every 2 s while the page is visible. The
// page is plain JavaScript and SVG, embedded in the binary (nodes/web): it
// loads nothing from elsewhere, and works offline.
//
// It has the access of the read-only status: a certificate of the
// cluster in the browser, or a browser on the node's loopback. A node
// does no work for it when nobody watches: there is no goroutine, timer
// or cache behind it, only the files, read once at start.
//
//	GET /            the page (web/index.html)
//	GET /web/{file}  its script and style sheet
//
// The page reads ?poll=MS (at least 250) as its polling interval, for
// tests; window.ppnodeDashboard holds its counters (updates, render
// times) and render(status), which draws a status without fetching it.

//go:embed web
var webFS embed.FS

// webFile is one file of the dashboard, ready to serve.
type webFile struct {
	name  string
	body  []byte
	etag  string
	ctype string
}

// webFiles are the dashboard's files by name, read at start.
var webFiles = loadWebFiles()

func loadWebFiles() map[string]*webFile {
	out := map[string]*webFile{}
	err := fs.WalkDir(webFS, "web", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := webFS.ReadFile(p)
		if err != nil {
			return err
		}
		h := sha256.Sum256(b)
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		name := path.Base(p)
		out[name] = &webFile{name: name, body: b, etag: `"` + hex.EncodeToString(h[:12]) + `"`, ctype: ctype}
		return nil
	})
	if err != nil {
		panic(err) // unreachable: the files are compiled in
	}
	return out
}

// dashboardCSP lets the page run its own script and style and fetch from
// its own node, nothing else.
const dashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// dashboard registers the dashboard's routes on mux.
func (h *api) dashboard(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", h.guard(readOnly, func(w http.ResponseWriter, r *http.Request) {
		serveWeb(w, r, "index.html")
	}))
	mux.HandleFunc("GET /web/{file}", h.guard(readOnly, func(w http.ResponseWriter, r *http.Request) {
		serveWeb(w, r, r.PathValue("file"))
	}))
}

// serveWeb answers with the dashboard's file name (304 to a browser that
// has it), or 404.
func serveWeb(w http.ResponseWriter, r *http.Request, name string) {
	f := webFiles[name]
	if f == nil {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", f.ctype)
	h.Set("ETag", f.etag)
	h.Set("Cache-Control", "no-cache") // revalidated: a new binary serves new files
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(f.body))
}

// formatCPUs writes a CPU limit for the gossip tag tagCPUs.
func formatCPUs(cpus float64) string { return strconv.FormatFloat(cpus, 'g', 4, 64) }

// parseCPUs reads the gossip tag tagCPUs: 0 if absent or not a positive
// finite number (a member's metadata is not trusted to be well formed).
func parseCPUs(s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v > 0) || v > 1e6 {
		return 0
	}
	return v
}
