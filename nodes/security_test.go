package nodes

import (
	"errors"
	"net/http/httptest"
	"testing"
)

// A node without credentials refuses to listen beyond loopback unless
// told --insecure.
func TestExposureNeedsCredentials(t *testing.T) {
	for _, cfg := range []Config{
		{Name: "a", Bind: "0.0.0.0:0"},
		{Name: "a", Bind: "127.0.0.1:0", HTTP: "10.1.2.3:8080"},
		{Name: "a", Bind: "127.0.0.1:0", ActorBind: ":0"},
		{Name: "a", Bind: "127.0.0.1:0", Advertise: "10.1.2.3:7946"},
	} {
		if _, err := Start(cfg); !errors.Is(err, errExposed) {
			t.Errorf("%+v: %v, want a refusal", cfg, err)
		}
	}
	cfg := Config{Name: "a", Bind: "0.0.0.0:0", Insecure: true}
	if err := checkExposure(cfg, cfg.Bind); err != nil {
		t.Errorf("--insecure: %v", err)
	}
}

// Host and Origin headers must be this node's.
func TestCheckHost(t *testing.T) {
	a := newAPI(&Agent{cfg: Config{Name: "node-a"}})
	for _, tc := range []struct {
		host, origin string
		ok           bool
	}{
		{"127.0.0.1:8080", "", true},
		{"[::1]:8080", "", true},
		{"localhost:8080", "", true},
		{"node-a:8080", "", true},
		{"10.0.0.1", "", true},
		{"attacker.example:8080", "", false},
		{"127.0.0.1:8080", "http://attacker.example", false},
		{"127.0.0.1:8080", "https://127.0.0.1:8080", true},
	} {
		r := httptest.NewRequest("GET", "/v1/status", nil)
		r.Host = tc.host
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if err := a.checkHost(r); (err == nil) != tc.ok {
			t.Errorf("Host %q Origin %q: %v, want ok %v", tc.host, tc.origin, err, tc.ok)
		}
	}
}
