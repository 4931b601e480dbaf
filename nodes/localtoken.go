package nodes

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/ppnode/ppnode/trust"
)

// Without cluster credentials, the HTTP API takes requests only from
// holders of the node's local token (Config.Token, made by
// trust.LocalToken): in an "Authorization: Bearer" header (the CLI, the
// nodes of the cluster), or in the cookie a browser gets by opening the
// dashboard at /?token=TOKEN once.

// tokenCookie is the dashboard's cookie holding the token.
const tokenCookie = "ppnode_token"

// tokenAllows reports whether r carries the node's token. A dashboard
// opened with a valid ?token= gets the cookie for its later requests.
func (h *api) tokenAllows(w http.ResponseWriter, r *http.Request) bool {
	want := h.a.cfg.Token
	if got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && trust.TokenMatches(got, want) {
		return true
	}
	if c, err := r.Cookie(tokenCookie); err == nil && trust.TokenMatches(c.Value, want) {
		return true
	}
	if q := r.URL.Query().Get("token"); q != "" && trust.TokenMatches(q, want) {
		http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: want, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		return true
	}
	return false
}

// errNoToken is the answer to a request without the node's token.
func errNoToken(r *http.Request) error {
	return fmt.Errorf("nodes: %s %s needs this node's local token (the node has no cluster credentials): "+
		"run the CLI as the node's user, or give it the node's token file with --token-file (SECURITY.md)", r.Method, r.URL.Path)
}

// TokenClient is the HTTP client of a caller holding a node's local
// token: plain HTTP with the token in every request.
func TokenClient(token string) *http.Client {
	return &http.Client{Transport: tokenTransport{token: token, base: http.DefaultTransport}}
}

type tokenTransport struct {
	token string
	base  http.RoundTripper
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.base.RoundTrip(r)
}

// httpClient is the client of the node's calls to the others: its
// certificate, or its local token without one.
func (c Config) httpClient() *http.Client {
	if c.Identity == nil && c.Token != "" {
		return TokenClient(c.Token)
	}
	return HTTPClient(c.Identity)
}
