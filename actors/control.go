package actors

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/protobuf/proto"
)

// Control carries a coordinator's control messages to the nodes and the
// stages of its job: the protobuf messages of ppnode.proto, each a few
// hundred bytes (tensors take the data plane). [*System] is the real one, over protoactor
// remote; [InmemControl] its in-memory twin. Implementations are safe for
// concurrent use.
type Control interface {
	// Spawn starts a stage actor on the node at addr.
	Spawn(addr string, req *SpawnStage, timeout time.Duration) (StageRef, error)
	// Request sends msg to a stage and waits up to timeout for its reply.
	Request(to StageRef, msg proto.Message, timeout time.Duration) (proto.Message, error)
	// Send sends msg to a stage without waiting.
	Send(to StageRef, msg proto.Message) error
	// Ping reports whether the node at addr answers within timeout (or
	// until ctx ends).
	Ping(ctx context.Context, addr string, timeout time.Duration) error
	// Forget drops what is kept about the node at addr: it is gone.
	Forget(addr string)
}

var _ Control = (*System)(nil)

// StageRef names a stage actor: the address of its node and its id there.
type StageRef struct{ Addr, ID string }

func (r StageRef) String() string { return r.Addr + "/" + r.ID }

func (r StageRef) pid() *actor.PID { return actor.NewPID(r.Addr, r.ID) }
