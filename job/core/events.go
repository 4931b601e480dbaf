package core

import (
	"time"

	"github.com/ppnode/ppnode/balance"
	"github.com/ppnode/ppnode/job"
)

// Op numbers an operation the core asked its driver for; the event that
// reports the operation's outcome carries it back. The core ignores the
// outcome of an operation it no longer waits for (one it cancelled by
// stopping its stages).
type Op uint64

// An Event is news for the core: the outcome of an operation it asked for,
// or something that happened in the cluster.
type Event interface{ event() }

// Outcomes of operations.
type (
	// Probed answers [Probe]: the candidates that answered, and the
	// links measured.
	Probed struct {
		Op    Op
		Live  []job.NodeInfo
		Links []LinkMeasure
	}
	// StagesStarted answers [StartStages]: Params are the trainable
	// parameters of each stage.
	StagesStarted struct {
		Op     Op
		Params []int64
		Err    error
	}
	// StateLoaded answers [Restore] and [Move]; a move reports what it
	// sent.
	StateLoaded struct {
		Op    Op
		Moved *Moved
		Err   error
	}
	// StepFinished answers [RunStep]: the step's mean loss and correct
	// predictions (from the loss stage), each stage's timings, and what
	// the coordinator sent to the stages.
	StepFinished struct {
		Op      Op
		Loss    float64
		Correct int64
		Seen    int64
		Timings []StageTiming
		Feeds   []LinkSent
		Err     error
	}
	// CutTaken answers [TakeCut] once the stages' state is gathered: with
	// Evaluate, the test accuracy and loss of its weights and their
	// SHA-256, how long the evaluation took and whether the stages ran it
	// (else the coordinator did).
	CutTaken struct {
		Op            Op
		Accuracy      float64
		TestLoss      float64
		AUC           float64 // under the binary cross-entropy (job.Job.AUC)
		WeightsSHA256 string
		Evaluated     time.Duration
		OnStages      bool
		Err           error
	}
	// Evaluating says how many of the test split's Samples the
	// evaluation of the cut after Step has done. It is not an operation's
	// answer: the coordinator sends it while it evaluates.
	Evaluating struct {
		Step, Done, Samples int
	}
	// CutPersisted says that the cut after Step has been written and
	// copied (Err: or failed to be). It is not an operation's answer: a
	// cut persists in the background while the job trains.
	CutPersisted struct {
		Step int
		Err  error
	}
)

// News from the cluster and from users.
type (
	// Members are the live members the job may use now (not leaving); a
	// node of the plan that is not among them is leaving or gone.
	Members struct{ Nodes []job.NodeInfo }
	// NodeFailed says the cluster confirmed that a node failed.
	NodeFailed struct{ Name string }
	// ReplanRequested asks to move the job to Partition (a partitioner's
	// name or a partition) at the next step boundary; ViaCut moves the
	// state through a cut instead of straight between the stages.
	ReplanRequested struct {
		Partition string
		ViaCut    bool
	}
)

func (Probed) event()          {}
func (StagesStarted) event()   {}
func (StateLoaded) event()     {}
func (StepFinished) event()    {}
func (CutTaken) event()        {}
func (CutPersisted) event()    {}
func (Evaluating) event()      {}
func (Members) event()         {}
func (NodeFailed) event()      {}
func (ReplanRequested) event() {}

// StageTiming is what one stage measured of a step.
type StageTiming struct {
	Forward, Backward, Update, Wait time.Duration
	// Wall is the stage's whole step.
	Wall time.Duration
	// CapacityGFLOPS is the GEMM speed its node's CPU limit allows now (0:
	// no limit), CPUs the CPUs the limit leaves the node's threads (0: no
	// limit), and CPU the CPU time the node's process used during the
	// step (0: unknown).
	CapacityGFLOPS float64
	CPUs           float64
	CPU            time.Duration
	// Links is what it sent to each peer stage, by kind.
	Links []LinkSent
	// Passes are its compute passes as they ran.
	Passes []Pass
}

// Pass is one compute instruction of a stage's step, Start after the
// stage's step began.
type Pass struct {
	Op         balance.Op
	Micro      int
	Start, Dur time.Duration
}

// LinkSent is what a sender put on its link to one peer during a step, of
// one kind of tensor, as the link counted it.
type LinkSent struct {
	// Peer is the receiving stage (balance.Coordinator: the coordinator).
	Peer int
	// Kind is activation, gradient, input or weights; Codec that of the
	// last frame.
	Kind, Codec string
	Frames      int64
	// RawBytes is what raw frames would have been, WireBytes what was
	// written.
	RawBytes, WireBytes int64
	// Encode is the time spent encoding, Write in the connection's writes
	// (waiting for the link once its buffers are full), Sample choosing
	// codecs.
	Encode, Write, Sample time.Duration
}

// LinkMeasure is a probe of the link from one node to another.
type LinkMeasure struct {
	From, To    string
	BytesPerSec float64
	RTT         time.Duration
}

// Moved is what a direct move sent.
type Moved struct {
	Links []job.MovedLink
	// Bytes is the tensor data sent over data-plane links, WireBytes the
	// same with tags and frame headers.
	Bytes, WireBytes int64
}

// An Action is an operation the core asks its driver to carry out. The
// driver carries them out in order; an operation (every action with an
// Op) ends with exactly one event carrying its Op.
type Action interface{ action() }

type (
	// Probe asks which of Nodes answer, and measures the links between
	// the pairs of Links (From, To: node names) that answer: at once if
	// Fresh, else a measurement of the last LinkMaxAge will do. Answer:
	// [Probed].
	Probe struct {
		Op    Op
		Nodes []job.NodeInfo
		Links [][2]string
		Fresh bool
	}
	// StartStages spawns, sets up and connects the stages of Plan under
	// generation Gen, stage k on the node at actor address Addrs[k].
	// Sources, for a direct move, say where each stage's layers' state
	// will come from (the stages listen for it). Rates are the links'
	// speeds, as in RunStep. Answer: [StagesStarted].
	StartStages struct {
		Op      Op
		Gen     uint64
		Plan    *balance.Plan
		Addrs   []string
		Sources [][]StateSource
		Rates   map[[2]int]float64
	}
	// Restore loads the latest cut, the state after Step steps, into the
	// stages of generation Gen. Answer: [StateLoaded].
	Restore struct {
		Op   Op
		Gen  uint64
		Step int
	}
	// Move hands each layer's state after Step steps from its stage of
	// generation From straight to its stage of generation Gen, as Sources
	// (per stage of Gen) say. Answer: [StateLoaded].
	Move struct {
		Op      Op
		Gen     uint64
		From    uint64
		Step    int
		Sources [][]StateSource
	}
	// RunStep runs step Step on the stages of generation Gen at learning
	// rate LR; a step not done within Timeout fails. Rates are the speeds
	// (bytes/s) of the links between stages (balance.Coordinator: the
	// coordinator), by sender and receiver, for their codecs. Answer:
	// [StepFinished].
	RunStep struct {
		Op      Op
		Gen     uint64
		Step    int
		LR      float64
		Timeout time.Duration
		Rates   map[[2]int]float64
	}
	// TakeCut gathers the state of the stages of generation Gen after Step
	// steps into the latest cut, with the progress so far; if the job's
	// cuts persist, they are then written and copied in the background
	// (reported by [CutPersisted]). With Evaluate it also measures the
	// test accuracy of the weights. Answer: [CutTaken].
	TakeCut struct {
		Op       Op
		Gen      uint64
		Step     int
		Progress Progress
		Evaluate bool
	}
	// StopStages stops the stages of generation Gen, the one way stages
	// are stopped: with Wait, each is asked to stop and waited for
	// (bounded) before its links close; without, its links close at once
	// and it is told to stop (abandoned stages, whose plan failed). An
	// operation running on those stages is cancelled; its answer comes
	// and is ignored.
	StopStages struct {
		Gen  uint64
		Wait bool
	}
	// Wake asks for a Tick at At: a paused job tries again then.
	Wake struct{ At time.Time }
	// Finish says the job has ended: its Result, or Err.
	Finish struct {
		Result *job.Result
		Err    error
	}
)

func (Probe) action()       {}
func (StartStages) action() {}
func (Restore) action()     {}
func (Move) action()        {}
func (RunStep) action()     {}
func (TakeCut) action()     {}
func (StopStages) action()  {}
func (Wake) action()        {}
func (Finish) action()      {}

// StateSource says where a stage of a new plan gets the state of some of
// its layers: from stage From of the previous plan, handed over within the
// node if Local, else over a data-plane link the new stage listens for.
type StateSource struct {
	From   int      `json:"from"`
	Layers []string `json:"layers"`
	Local  bool     `json:"local,omitempty"`
}
