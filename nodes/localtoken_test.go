package nodes

import (
	"context"
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/ppnode/ppnode/trust"
)

// Nodes without credentials that share a token file send it to each
// other: a job runs over both, and its cut reaches the other node's store;
// a browser gets the token's cookie from /?token= and nothing without it.
func TestLocalTokenBetweenNodes(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "http-token")
	var as []*Agent
	for _, name := range []string{"a", "b"} {
		cfg := Config{Name: name, Bind: "127.0.0.1:0", HTTP: "127.0.0.1:0", Threads: 1, ProfileFor: 20 * time.Millisecond,
			DataDir: t.TempDir(), TokenFile: tokenFile, Files: t.TempDir(), Logger: testLogger(t), ActorLogLevel: slog.LevelError}
		if len(as) > 0 {
			cfg.Seeds = []string{as[0].GossipAddr()}
		}
		a, err := Start(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		as = append(as, a)
	}
	tok, err := trust.ReadToken(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := NewClientWith(as[1].HTTPAddr(), TokenClient(tok))
	spec := smallSpec()
	spec.Partition = "uniform"
	sub, err := c.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	st, err := as[1].Wait(ctx, sub.ID)
	if err != nil || st.Error != "" || len(st.Stages) != 2 {
		t.Fatalf("job: %+v, %v", st, err)
	}
	if ck, err := as[0].Store().Latest(sub.ID); err != nil || ck.Step != int64(st.Total) {
		t.Fatalf("the cut on node a: %v (%v), want step %d", ck, err, st.Total)
	}

	base := "http://" + as[0].HTTPAddr()
	get := func(url string, cookie *http.Cookie) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if cookie != nil {
			req.AddCookie(cookie)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	wrong := map[bool]string{true: "1", false: "0"}[tok[0] == '0'] + tok[1:]
	if res := get(base+"/?token="+wrong, nil); res.StatusCode != http.StatusUnauthorized || len(res.Cookies()) != 0 {
		t.Fatalf("the dashboard with a wrong token: %s, cookies %v", res.Status, res.Cookies())
	}
	res := get(base+"/?token="+tok, nil)
	if res.StatusCode != http.StatusOK || len(res.Cookies()) != 1 || !res.Cookies()[0].HttpOnly {
		t.Fatalf("the dashboard with the token: %s, cookies %v", res.Status, res.Cookies())
	}
	if res := get(base+"/v1/status", res.Cookies()[0]); res.StatusCode != http.StatusOK {
		t.Fatalf("status with the cookie: %s", res.Status)
	}
	if res := get(base+"/v1/status", &http.Cookie{Name: tokenCookie, Value: "x"}); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status with a wrong cookie: %s", res.Status)
	}
}
