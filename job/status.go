package job

import (
	"time"
)

// NodeInfo is a node a job may use, as the cluster describes it.
type NodeInfo struct {
	Name      string  `json:"name"`
	ActorAddr string  `json:"actor_addr"`
	GFLOPS    float64 `json:"gflops,omitempty"`
	Memory    int64   `json:"memory_bytes,omitempty"`
	Threads   int     `json:"threads,omitempty"`
	// ProbeAddr is where the node answers link probes (empty: it does
	// not).
	ProbeAddr string `json:"probe_addr,omitempty"`
}

// State is where a job is in its life.
type State string

// The states of a job.
const (
	StatePlanning   State = "planning"   // submitted: its plan is being made
	StateStarting   State = "starting"   // its first stages are being started
	StateTraining   State = "training"   // running steps (re-plans included)
	StateRecovering State = "recovering" // a failure: going back to the latest cut
	StatePaused     State = "paused"     // waiting (for nodes, or to retry a recovery); see Reason
	StateEvaluating State = "evaluating" // measuring the final weights' accuracy
	StateDone       State = "done"
	StateFailed     State = "failed"
	// StateDiverged: its training loss became NaN or infinite (Error says
	// at which step); its weights are lost, so it has failed.
	StateDiverged State = "diverged"
)

// Ended reports whether a job in state s has stopped for good.
func (s State) Ended() bool { return s == StateDone || s == StateFailed || s == StateDiverged }

// Status is a job's progress, for `ppnode status` and the train client.
type Status struct {
	ID    string `json:"id"`
	State State  `json:"state"`
	// Reason says why a job is paused or recovering; Error why it failed
	// or diverged.
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
	Model  string `json:"model"`
	// Step counts the steps done (of a diverged job: those before the one
	// that diverged, which is step Step counting from 0).
	Step  int `json:"step"`
	Total int `json:"total"`
	// Loss is the last step's mean training loss (a finite one: a
	// diverged job keeps the loss of the step before).
	Loss float64 `json:"loss"`
	// LossName names the loss (Spec.LossName); NoAccuracy says that it
	// counts no predictions (mse, l1, huber): the evaluations give a test
	// loss only.
	LossName   string `json:"loss_name,omitempty"`
	NoAccuracy bool   `json:"no_accuracy,omitempty"`
	// LossHistory is the training loss over the steps, downsampled to at
	// most MaxLossPoints (see LossHistory); JSON [[step, loss], ...].
	LossHistory   []LossPoint `json:"loss_history,omitempty"`
	SamplesPerSec float64     `json:"samples_per_sec"`
	Plan          string      `json:"plan,omitempty"`
	Schedule      string      `json:"schedule,omitempty"`
	MicroBatches  int         `json:"micro_batches,omitempty"`
	// Tied names the tensors that layers on several stages read (tied
	// weights), each with its stages ("tok.weight on s0, s2"): their
	// copies' gradients are exchanged before every step.
	Tied        []string `json:"tied,omitempty"`
	PredictedMS float64  `json:"predicted_step_ms,omitempty"`
	// PredictedBubble is the simulator's idle share of the stages' time.
	PredictedBubble float64 `json:"predicted_bubble,omitempty"`
	// Passes are the newest of LastSteps' compute passes, per stage in
	// the order of Stages, each stage's in the order they ran;
	// PredictedPasses the simulated step's.
	Passes          [][]PassTiming `json:"passes,omitempty"`
	PredictedPasses [][]PassTiming `json:"predicted_passes,omitempty"`
	Stages          []StageStatus  `json:"stages,omitempty"`
	Accuracy        []EvalResult   `json:"accuracy,omitempty"`
	// Evaluation is the test-split evaluation in progress (at an epoch's
	// end or the job's), if one is.
	Evaluation *Evaluation `json:"evaluation,omitempty"`
	Result     *Result     `json:"result,omitempty"`
	Started    time.Time   `json:"started"`
	// LatestCut is the step of the latest consistent cut; Cuts counts them.
	LatestCut int `json:"latest_cut"`
	Cuts      int `json:"cuts"`
	// CheckpointEvery is the interval between cuts in steps (0: not yet
	// chosen), CheckpointMS the pipeline's pause for the last cut,
	// PersistMS its writing and replication in the background and
	// CutCostMS what it measurably cost the steps around it, all of it
	// (automatic interval only).
	CheckpointEvery int        `json:"checkpoint_every,omitempty"`
	CheckpointMS    float64    `json:"checkpoint_ms,omitempty"`
	PersistMS       float64    `json:"persist_ms,omitempty"`
	CutCostMS       float64    `json:"cut_cost_ms,omitempty"`
	Recoveries      []Recovery `json:"recoveries,omitempty"`
	Replans         []Replan   `json:"replans,omitempty"`
	// Links are the links between the job's nodes as it measured them,
	// those that carried its tensors first. ProbeMS is the time the job
	// spent probing nodes and links at plan changes, ProbeTrainMS the
	// time it paused training to probe links between steps.
	Links        []LinkStatus `json:"links,omitempty"`
	ProbeMS      float64      `json:"probe_ms,omitempty"`
	ProbeTrainMS float64      `json:"probe_train_ms,omitempty"`
	// LastSteps are the last steps as measured (at most [LastSteps]),
	// oldest first.
	LastSteps []StepTiming `json:"last_steps,omitempty"`
}

// Evaluation is how far the evaluation of the weights after Step has got:
// Done of the test split's Samples.
type Evaluation struct {
	Step    int `json:"step"`
	Done    int `json:"done"`
	Samples int `json:"samples"`
}

// LinkStatus is one directed link between two nodes.
type LinkStatus struct {
	From string `json:"from"`
	To   string `json:"to"`
	// MbitPerSec and RTTMS are the link's speed and round trip as the
	// planner uses them; Source says where they come from: "probe" (at
	// ProbedAt) or "default" (not measured).
	MbitPerSec float64   `json:"mbit_per_s"`
	RTTMS      float64   `json:"rtt_ms"`
	Source     string    `json:"source"`
	ProbedAt   time.Time `json:"probed_at,omitzero"`
	// TrafficMbitPerSec is the last bound from the traffic: bytes over
	// the time the senders waited for the link (or for the receiver).
	TrafficMbitPerSec float64 `json:"traffic_mbit_per_s,omitempty"`
	// WireBytes is what the job sent over it.
	WireBytes int64      `json:"wire_bytes"`
	Kinds     []LinkKind `json:"kinds,omitempty"`
}

// LinkKind is what a link carried of one kind of tensor.
type LinkKind struct {
	Kind  string `json:"kind"`
	Codec string `json:"codec"` // the current one
	// Ratio is raw bytes over wire bytes (above 1: compressed).
	Ratio     float64 `json:"ratio"`
	Frames    int64   `json:"frames"`
	RawBytes  int64   `json:"raw_bytes"`
	WireBytes int64   `json:"wire_bytes"`
	EncodeMS  float64 `json:"encode_ms"`
	SampleMS  float64 `json:"sample_ms,omitempty"`
}

// StageStatus is one stage of a running job.
type StageStatus struct {
	ID int `json:"id"`
	// Group is the stage of the partition it runs, Replica its index
	// among the group's replicas, MicroBatches how many of each step's it
	// runs (all of them without replicas).
	Group        int    `json:"group"`
	Replica      int    `json:"replica,omitempty"`
	MicroBatches int    `json:"micro_batches"`
	Node         string `json:"node"`
	Layers       string `json:"layers"`
	Params       int64  `json:"params"`
	// To are the stages it sends activations to (none: it computes the
	// loss).
	To []int `json:"to,omitempty"`
	// Recompute is set when the stage recomputes its activations.
	Recompute bool `json:"recompute,omitempty"`
	// Mean milliseconds per step over the last steps.
	ForwardMS  float64 `json:"forward_ms"`
	BackwardMS float64 `json:"backward_ms"`
	UpdateMS   float64 `json:"update_ms"`
	WaitMS     float64 `json:"wait_ms"`
	// WallMS is the stage's whole step, from StepBegin to its end.
	WallMS float64 `json:"wall_ms"`
}

// EvalResult is an evaluation of the test split: the accuracy and loss of
// the weights after a step: an epoch's last (Spec.EvalEachEpoch), every
// Spec.EvalEvery steps, or the job's last; Epoch is the epoch that step
// ends or falls in (Job.EpochOf).
type EvalResult struct {
	Step     int     `json:"step"`
	Epoch    int     `json:"epoch"`
	Accuracy float64 `json:"accuracy"`
	TestLoss float64 `json:"test_loss"`
	// Perplexity is exp(TestLoss) for a language model (Job.Perplexity);
	// AUC the outputs' under the binary cross-entropy (Job.AUC).
	Perplexity float64 `json:"perplexity,omitempty"`
	AUC        float64 `json:"auc,omitempty"`
}

// Recovery is one recovery of a job from a failure.
type Recovery struct {
	Cause string `json:"cause"`
	// Step is the step that failed; From where the state came from:
	// FromCut (the latest cut; Replayed is the steps run again) or
	// FromSurvivors (the stages that survived, replicas of the lost ones:
	// only the failed step runs again).
	Step     int    `json:"step"`
	From     string `json:"from"`
	Replayed int    `json:"replayed"`
	// DetectMS is the time from the failed step's start to its failure
	// being known; RestoreMS from then to the new plan's stages holding
	// the cut's state.
	DetectMS  float64   `json:"detect_ms"`
	RestoreMS float64   `json:"restore_ms"`
	Plan      string    `json:"plan"`
	At        time.Time `json:"at"`
}

// Where a recovery took the job's state from (Recovery.From).
const (
	FromCut       = "cut"
	FromSurvivors = "survivors"
)

// Trigger is what made the plan change: a re-plan (Replan.Trigger), a
// recovery, or the job's start.
type Trigger string

// The triggers of a plan change.
const (
	TriggerStart     Trigger = "start"     // the job starts, from its seed or a stored cut
	TriggerTakeover  Trigger = "takeover"  // a successor resumes a job whose coordinator died
	TriggerFailure   Trigger = "failure"   // a node of the plan failed, or a step did
	TriggerSpeeds    Trigger = "speeds"    // the measured speeds
	TriggerLinks     Trigger = "links"     // the measured links
	TriggerJoined    Trigger = "joined"    // a node that joined makes a better plan
	TriggerLeaving   Trigger = "leaving"   // a node of the plan is leaving
	TriggerRequested Trigger = "requested" // a user asked for another partition
)

// Replan is one change of a running job's plan.
type Replan struct {
	Step    int     `json:"step"`
	Reason  string  `json:"reason"`
	Trigger Trigger `json:"trigger"` // speeds, links, joined, leaving or requested
	// Gain is the predicted fraction of step time saved; BeforeMS and
	// AfterMS the predicted step times at the measured speeds.
	Gain     float64 `json:"gain"`
	BeforeMS float64 `json:"before_ms"`
	AfterMS  float64 `json:"after_ms"`
	// MeasuredBeforeMS is the median of the last replanWindow steps
	// before the re-plan, MeasuredAfterMS of the first replanWindow
	// steps after it (0 until they have run, or if a recovery or another
	// re-plan came first): whether the prediction held.
	MeasuredBeforeMS float64 `json:"measured_before_ms,omitempty"`
	MeasuredAfterMS  float64 `json:"measured_after_ms,omitempty"`
	// CostMS is the predicted cost of moving, MovedMS what it took.
	CostMS  float64            `json:"cost_ms"`
	MovedMS float64            `json:"moved_ms"`
	Plan    string             `json:"plan"`
	Speeds  map[string]float64 `json:"speeds"`
	// Method is how the state moved: "direct" (each layer's from its old
	// owner to its new one) or "cut" (gathered into the coordinator and
	// restored from it).
	Method string `json:"method"`
	// StateBytes is the state (parameters and optimizer state) of the
	// layers that changed node: what has to cross the network. MovedBytes
	// is the tensor data the move sent over data-plane links, counted on
	// them as it was written (direct: per link in Links; cut: the whole
	// state in and out of the coordinator), WireBytes the same with tags
	// and frame headers. LocalBytes is the state handed over within a
	// node.
	StateBytes int64       `json:"state_bytes"`
	MovedBytes int64       `json:"moved_bytes"`
	WireBytes  int64       `json:"wire_bytes,omitempty"`
	LocalBytes int64       `json:"local_bytes,omitempty"`
	Links      []MovedLink `json:"links,omitempty"`
	// PhasesMS splits MovedMS: direct: start (the new stages), transfer
	// (the old stages are stopped after); cut: cut, start, restore.
	PhasesMS map[string]float64 `json:"phases_ms,omitempty"`
}

// MovedLink is one transfer of a plan change: the state of some layers
// from a stage of the old plan to a stage of the new one.
type MovedLink struct {
	FromStage int    `json:"from_stage"`
	ToStage   int    `json:"to_stage"`
	From      string `json:"from"` // nodes
	To        string `json:"to"`
	Layers    string `json:"layers"`
	// Local: handed over within the node, no network.
	Local   bool  `json:"local,omitempty"`
	Tensors int64 `json:"tensors"`
	// Bytes is the tensor data moved; WireBytes what the sender wrote to
	// the data-plane link for it (tags and frame headers included; 0 for
	// a local handoff).
	Bytes     int64 `json:"bytes"`
	WireBytes int64 `json:"wire_bytes,omitempty"`
}

// LastSteps is how many steps Status.LastSteps keeps.
const LastSteps = 8

// StepTiming is one step of a job as measured, for a Gantt chart of the
// last steps: when the coordinator started it, how long it waited for it,
// and what each stage of the plan measured of it.
type StepTiming struct {
	// Step counts the steps done with this one (as Status.Step).
	Step int `json:"step"`
	// AtMS is the step's start in milliseconds after Status.Started;
	// WallMS runs from there to the last stage's answer. A gap between
	// steps is time spent between them (a cut, probing links).
	AtMS   float64 `json:"at_ms"`
	WallMS float64 `json:"wall_ms"`
	// Stages are in the order of the plan's stages at that step.
	Stages []StageStepTiming `json:"stages"`
}

// StageStepTiming is what one stage measured of one step, in
// milliseconds, summed over the step's micro-batches (not smoothed, unlike
// StageStatus).
type StageStepTiming struct {
	ForwardMS  float64 `json:"forward_ms"`
	BackwardMS float64 `json:"backward_ms"`
	UpdateMS   float64 `json:"update_ms"`
	// WaitMS is the time the stage was blocked on the data plane: for a
	// peer's tensors, or for its own to leave at the step's end.
	WaitMS float64 `json:"wait_ms"`
	// SendMS is the time its links spent encoding and writing what it
	// sent; they do it on their own goroutines, so it overlaps the rest.
	SendMS float64 `json:"send_ms"`
	// WallMS is the stage's whole step.
	WallMS float64 `json:"wall_ms"`
}

// PassTiming is one compute pass of a stage in a step: Op is the plan's
// instruction (forward, loss, backward, backward_input, weight,
// recompute, or step for the optimizer's update), Micro its micro-batch,
// StartMS when it began after the stage's step began (after the step's
// start, simulated).
type PassTiming struct {
	Op      string  `json:"op"`
	Micro   int     `json:"micro"`
	StartMS float64 `json:"start_ms"`
	MS      float64 `json:"ms"`
}

// Millis is d in milliseconds, to the microsecond: the unit of the *MS
// figures of a Status and a Result.
func Millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
