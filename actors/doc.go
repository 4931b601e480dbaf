// Package actors is the runtime around a job's pure core (core.Core): the
// actor system that carries control between nodes (tensors take the data
// plane, package dataplane), the stage actors that run a plan's stages, and
// the coordinator that drives the core by doing the I/O it asks for.
//
// # Control
//
// Control messages are the protobuf types of proto/ppnode.proto, each a
// few hundred bytes, every one carrying a Header with the job id and the
// plan generation. A [Control] sends them: [System] over protoactor remote
// (gRPC), with the workarounds its doc lists, or [InmemControl], its
// in-memory twin for tests, which can kill a node and cut it off (its
// messages are then lost). A stage admits only messages of its job and of its
// generation or a newer one ([Gate]); a node's spawner refuses to start a
// stage of a generation older than one it has started ([SpawnError]).
//
// # Stages
//
// A stage actor ([StageKind], hosted by a node's [StageHost]) sets up one
// stage of a plan from its StageSpec, listens for the data-plane links it
// receives on, dials those it sends on, and runs its part of each step:
// the program of balance.StagePlan (forward and backward passes, sends and
// receives, the optimizer step at the flush), on a goroutine of its own so
// that its mailbox stays free for StopStage. It gathers its state to the
// coordinator for a cut, restores it from one, and hands it straight to
// the stages of a new plan (migrate.go). A stage whose link to its
// coordinator breaks stops by itself. The stages one node holds of an
// interleaved plan (its chunks) take turns in the node's order (turn.go),
// so that the node runs one pass at a time, as the schedule says.
//
// # The coordinator
//
// [Coordinator] runs one job on the node that accepted it: it profiles
// the model, builds the core, and then loops: it carries out the core's
// actions (probe the nodes, start stages, restore or move state, run a
// step, take a cut, stop stages), one operation at a time on a goroutine
// of its own, and gives the core their outcomes and the cluster's news
// (Members, NodeFailed, RequestReplan) as events. It feeds the
// micro-batches (inputs to the entry stages, labels to the loss stage),
// holds the latest cut in its own copy of the model, and writes cuts in
// the background and hands them to a [Replicator] (a node's, which sends
// them to the job's record holders, or [InmemReplicas] in tests): what it
// asks of its node goes through small interfaces (Control, Replicator,
// LinkProber). Stopping a generation's stages cancels the operation
// running on them.
package actors
