package nodes

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ppnode/ppnode/trust"
)

// A Config's defaults fill what is left out and keep what is given.
func TestConfigDefaults(t *testing.T) {
	c, err := Config{Name: "a"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Bind != DefaultBind || c.HTTP != DefaultHTTP || c.ActorBind != "127.0.0.1:0" || c.ProfileFor != DefaultProfileFor ||
		c.Threads != runtime.NumCPU() || c.Logger == nil || c.HTTPTimeout != DefaultHTTPTimeout {
		t.Errorf("defaults: %+v", c)
	}
	given := Config{Name: "a", Bind: "127.0.0.1:0", HTTP: "127.0.0.1:9", ActorBind: "127.0.0.1:7", ProfileFor: time.Second,
		Threads: 3, HTTPTimeout: time.Minute}
	c, err = given.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Bind != given.Bind || c.HTTP != given.HTTP || c.ActorBind != given.ActorBind || c.ProfileFor != given.ProfileFor ||
		c.Threads != given.Threads || c.HTTPTimeout != given.HTTPTimeout {
		t.Errorf("given %+v, got %+v", given, c)
	}
	if c, err := (Config{Name: "a", Bind: "[::1]:7946"}).withDefaults(); err != nil || c.ActorBind != "[::1]:0" {
		t.Errorf("IPv6 bind: actor address %q, %v", c.ActorBind, err)
	}
}

// A Config is refused with an error that says what is wrong, the name
// first, then where it would listen, then its certificate, then its
// addresses.
func TestConfigValidation(t *testing.T) {
	node := &trust.Identity{Name: "a", Role: trust.RoleNode}
	for _, tc := range []struct {
		cfg  Config
		want string // in the error; "" for none
	}{
		{Config{Name: "a"}, ""},
		{Config{Name: "a", Bind: "0.0.0.0:0", Identity: node}, ""},
		{Config{Name: "a", Bind: "0.0.0.0:0", Insecure: true}, ""},
		{Config{Name: ""}, "want 1 to 256 bytes"},
		{Config{Name: "a b", Bind: "0.0.0.0:0"}, "want 1 to 256 bytes"},
		{Config{Name: "a", Bind: "0.0.0.0:0"}, errExposed.Error()},
		{Config{Name: "a", HTTP: ":8080"}, errExposed.Error()},
		{Config{Name: "a", Advertise: "10.0.0.1:7946"}, errExposed.Error()},
		{Config{Name: "a", Bind: "nope"}, errExposed.Error()},
		{Config{Name: "a", Identity: &trust.Identity{Name: "b", Role: trust.RoleNode}}, `the certificate is for "b", not "a"`},
		{Config{Name: "a", Identity: &trust.Identity{Name: "a", Role: trust.RoleClient}}, "a client's, not a node's"},
		{Config{Name: "a", Bind: "nope", Insecure: true}, `gossip address "nope"`},
		{Config{Name: "a", ActorBind: "nope", Insecure: true}, `actor address "nope"`},
		{Config{Name: "a", Advertise: "nope", Insecure: true}, `advertised address "nope"`},
	} {
		_, err := tc.cfg.withDefaults()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: %v, want an error with %q", tc.cfg, err, tc.want)
		case tc.want == errExposed.Error() && !errors.Is(err, errExposed):
			t.Errorf("%+v: %v does not wrap errExposed", tc.cfg, err)
		}
	}
}

// The data plane and the probe server listen on the actor host, or on the
// advertised one if that host is unspecified; the actor system advertises
// its fixed port at the advertised host.
func TestConfigAddrs(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want addrs
	}{
		{Config{Bind: "127.0.0.1:7946"}, addrs{dataHost: "127.0.0.1", probeHost: "127.0.0.1"}},
		{Config{Bind: "0.0.0.0:7946", Advertise: "10.0.0.1:7946"}, addrs{dataHost: "10.0.0.1", probeHost: "10.0.0.1"}},
		{Config{ActorBind: "0.0.0.0:7000", Advertise: "10.0.0.1:7946"},
			addrs{actorAdvertise: "10.0.0.1:7000", dataHost: "10.0.0.1", probeHost: "10.0.0.1"}},
		{Config{ActorBind: "10.0.0.2:7000", Advertise: "10.0.0.1:7946"},
			addrs{actorAdvertise: "10.0.0.1:7000", dataHost: "10.0.0.2", probeHost: "10.0.0.2"}},
		{Config{ActorBind: ":0"}, addrs{probeHost: "127.0.0.1"}},
		{Config{ActorBind: ":0", Advertise: "10.0.0.1:7946"}, addrs{dataHost: "10.0.0.1", probeHost: "10.0.0.1"}},
	} {
		c := tc.cfg
		c.Name, c.Insecure = "a", true
		c, err := c.withDefaults()
		if err != nil {
			t.Fatalf("%+v: %v", tc.cfg, err)
		}
		if got := c.addrs(); got != tc.want {
			t.Errorf("%+v: %+v, want %+v", tc.cfg, got, tc.want)
		}
	}
}
