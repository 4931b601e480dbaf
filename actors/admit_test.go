package actors

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ppnode/ppnode/admit"
	"github.com/ppnode/ppnode/job"
)

// A flood of silent connections to the actor port from one address takes
// at most the gate's PerIP of its handshakes; the rest are closed at once,
// and another system's requests go through. The peer's connection counts as
// established once it has sent gRPC's preface.
func TestActorPortFlood(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(newTestWriter(t), nil))
	gate := admit.NewGate(admit.Limits{PerIP: 8, Handshake: time.Minute}, nil)
	b, err := Start(Config{Logger: logger, LogLevel: slog.LevelWarn, Gate: gate})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	a, err := Start(Config{Logger: logger, LogLevel: slog.LevelWarn})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()

	flooder := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	const flood = 200
	for range flood {
		c, err := flooder.Dial("tcp", b.Address())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// The gate has seen the whole flood once a.Ping's connection, which
	// comes after it, has got through.
	if err := a.Ping(context.Background(), b.Address(), 5*time.Second); err != nil {
		t.Fatalf("ping during the flood: %v", err)
	}
	// Under load a may have another connection still in its handshake
	// when the ping returns: the flood's are the 8 others.
	s := gate.Stats()
	if s.RefusedPerIP != flood-8 || s.InHandshake < 8 || s.InHandshake > 9 || s.Held-s.InHandshake < 1 {
		t.Fatalf("gate %+v: want %d refused, 8 silent in handshake and a's connection established", s, flood-8)
	}
}

// A stage answers its job's requests of an older plan at once, with the
// reply type their sender waits for, and drops another job's unanswered.
func TestStaleRequestAnswered(t *testing.T) {
	cs, err := job.Check(smallSpec("mlp32"))
	if err != nil {
		t.Fatal(err)
	}
	a := &stageActor{host: &StageHost{}, eng: &stageEngine{spec: StageSpec{Job: cs}}, gate: NewGate(cs.ID(), 3)}
	for _, tc := range []struct {
		msg  JobMessage
		want string // the reply's type, or "" for none
	}{
		{&EvalBegin{Header: &Header{JobId: cs.ID(), Generation: 2}}, "*actors.StepDone"},
		{&StepBegin{Header: &Header{JobId: cs.ID(), Generation: 1}}, "*actors.StepDone"},
		{&ConnectStage{Header: &Header{JobId: cs.ID(), Generation: 2}}, "*actors.Ack"},
		{&ClipGrads{Header: &Header{JobId: cs.ID(), Generation: 2}}, "*actors.Ack"},
		{&SendState{Header: &Header{JobId: cs.ID(), Generation: 2}}, "*actors.StateMoved"},
		{&GatherWeights{Header: &Header{JobId: cs.ID(), Generation: 2}}, "*actors.StepDone"},
		{&EvalBegin{Header: &Header{JobId: "another", Generation: 2}}, ""},
	} {
		var got proto.Message
		if a.admit(tc.msg, func(m proto.Message) { got = m }) {
			t.Fatalf("%T of generation %d admitted at generation 3", tc.msg, tc.msg.GetHeader().GetGeneration())
		}
		switch {
		case tc.want == "" && got != nil:
			t.Errorf("%v answered with %v", tc.msg, got)
		case tc.want != "" && (got == nil || fmt.Sprintf("%T", got) != tc.want):
			t.Errorf("%T: reply %T, want %s", tc.msg, got, tc.want)
		case tc.want != "" && !strings.Contains(fmt.Sprint(got), "stage is at generation 3 (a newer plan)"):
			t.Errorf("%T: reply %v does not say why", tc.msg, got)
		}
	}
}
