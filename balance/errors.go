package balance

import "errors"

// Errors of partition descriptions and plans. Every error the package
// returns for bad input wraps one of them (test with errors.Is); the
// message names the layer, node or stage at fault.
var (
	// ErrSyntax: a partition description that does not parse.
	ErrSyntax = errors.New("balance: bad partition syntax")
	// ErrUnknownLayer: a name that is not a layer of the model.
	ErrUnknownLayer = errors.New("balance: unknown layer")
	// ErrMissingLayer: a layer that is in no stage.
	ErrMissingLayer = errors.New("balance: layer in no stage")
	// ErrDuplicateLayer: a layer that is in two stages (or twice in one).
	ErrDuplicateLayer = errors.New("balance: layer in two stages")
	// ErrUnknownNode: a stage placed on a node that is not in the cluster.
	ErrUnknownNode = errors.New("balance: unknown node")
	// ErrNodeReused: two stages placed on the same node.
	ErrNodeReused = errors.New("balance: node holds two stages")
	// ErrEmptyStage: a stage with no layers.
	ErrEmptyStage = errors.New("balance: empty stage")
	// ErrCycle: stages that depend on each other in a cycle.
	ErrCycle = errors.New("balance: stage graph has a cycle")
	// ErrGradientOrder: a partition under which the gradients of a tensor
	// with several consumers cannot be summed in single-process order, so
	// that pipelined training would not be bit-identical.
	ErrGradientOrder = errors.New("balance: gradient order differs from single-process training")
	// ErrProfile: a model or node profile that does not fit the model or
	// the cluster, or has impossible values.
	ErrProfile = errors.New("balance: bad profile")
	// ErrCluster: a cluster description with impossible values.
	ErrCluster = errors.New("balance: bad cluster")
	// ErrPlan: a plan that is inconsistent (wrong programs, stage inputs
	// or outputs, micro-batch counts).
	ErrPlan = errors.New("balance: bad plan")
	// ErrDeadlock: a plan whose programs wait for each other forever.
	ErrDeadlock = errors.New("balance: plan deadlocks")
	// ErrNoFit: no partition, schedule and micro-batch count fits the
	// nodes' memory.
	ErrNoFit = errors.New("balance: model does not fit the nodes' memory")
)
