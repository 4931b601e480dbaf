package actors

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"math"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/ppnode/ppnode/trust"
)

// startAs starts a system holding the identity name of the cluster in dir,
// whose port admits only what trust's policy lets a stage controller do,
// and spawns only for the members member reports (nil: any node).
func startAs(t *testing.T, dir, name string, member func(string) bool) *System {
	t.Helper()
	id, err := trust.Load(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(newTestWriter(t), nil))
	s, err := Start(Config{
		Kinds:  map[string]*actor.Props{StageKind: StageProps(&StageHost{Logger: logger})},
		Logger: logger, LogLevel: slog.LevelWarn,
		ServerTLS: id.ServerTLS(true), ClientTLS: id.ClientTLS(),
		Authorize: func(cs *tls.ConnectionState) (string, error) {
			p, err := trust.Authorize(cs, trust.ActStages)
			return p.Name, err
		},
		Member: member,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// awaitRefused waits until s has refused more than n streams or messages.
func awaitRefused(t *testing.T, s *System, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Refused() <= n {
		if time.Now().After(deadline) {
			t.Fatalf("the port refused %d, want more than %d", s.Refused(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A client certificate reaches no actor: its spawn of the newest possible
// generation does not make the coordinator's later spawns stale (nor does
// that of a node certificate whose holder is no member), and its StopStage
// does not stop a stage; nor does another node's, which is not the stage's
// coordinator. The coordinator's own messages get through.
func TestActorPortRoles(t *testing.T) {
	dir := t.TempDir()
	if err := trust.Init(dir); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"host", "coord", "other", "stranger"} {
		if _, err := trust.Issue(dir, n, trust.RoleNode, nil); err != nil {
			t.Fatal(err)
		}
	}
	member := func(name string) bool { return name != "stranger" }
	host, coord := startAs(t, dir, "host", member), startAs(t, dir, "coord", nil)
	other, stranger := startAs(t, dir, "other", nil), startAs(t, dir, "stranger", nil)
	// The attacker runs a system with the CLI's client certificate.
	client, err := trust.Load(dir, trust.ClientName)
	if err != nil {
		t.Fatal(err)
	}
	attacker, err := Start(Config{ServerTLS: client.ServerTLS(true), ClientTLS: client.ClientTLS(),
		Logger: slog.New(slog.NewTextHandler(newTestWriter(t), nil)), LogLevel: slog.LevelError})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(attacker.Stop)

	h := &Header{JobId: "j", Generation: 5}
	stage, err := coord.Spawn(host.Address(), &SpawnStage{Header: h, Kind: StageKind}, testTimeout)
	if err != nil {
		t.Fatal(err)
	}

	n := host.Refused()
	poison := &SpawnStage{Header: &Header{JobId: "j", Generation: math.MaxUint64}, Kind: StageKind}
	if _, err := attacker.Spawn(host.Address(), poison, time.Second); err == nil {
		t.Error("a client certificate spawned an actor")
	}
	awaitRefused(t, host, n)
	// A node certificate of no member: refused at once, before its
	// generation counts.
	var se *SpawnError
	if _, err := stranger.Spawn(host.Address(), poison, testTimeout); !errors.As(err, &se) || se.Status != SpawnStatus_SPAWN_STATUS_ERROR {
		t.Errorf("a spawn from a node that is no member: %v, want SPAWN_STATUS_ERROR", err)
	}
	n = host.Refused()
	if err := attacker.Send(stage, &StopStage{Header: h}); err != nil {
		t.Fatal(err)
	}
	awaitRefused(t, host, n)
	n = host.Refused()
	if err := other.Send(stage, &StopStage{Header: h}); err != nil {
		t.Fatal(err)
	}
	awaitRefused(t, host, n)

	if _, err := coord.Spawn(host.Address(), &SpawnStage{Header: &Header{JobId: "j", Generation: 6}, Kind: StageKind}, testTimeout); err != nil {
		t.Errorf("the coordinator's spawn after a client's: %v", err)
	}
	res, err := coord.Request(stage, &StopStage{Header: h}, testTimeout)
	if err != nil {
		t.Fatalf("the stage did not answer its coordinator (stopped by another?): %v", err)
	}
	if a, ok := res.(*Ack); !ok || a.GetError() != "" {
		t.Errorf("StopStage from the coordinator: %v", res)
	}
}
