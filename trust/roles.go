package trust

import (
	"crypto/tls"
	"fmt"
	"slices"
)

// Action is what a peer asks of a node, as the role policy names it
// (SECURITY.md's table lists the same).
type Action int

const (
	// ActRead reads status: GET /v1/status, /v1/jobs, /v1/jobs/{id}.
	ActRead Action = iota
	// ActUse uses the cluster through the HTTP API: submit, cancel and
	// re-plan jobs, download weights, profile a node.
	ActUse
	// ActMember is the nodes' own HTTP traffic: job records, checkpoint
	// copies, link probes.
	ActMember
	// ActStages is the actor port: ping, spawn, set up, step, stop or
	// move stages. Besides the role, a stage obeys only the node that
	// spawned it (its job's coordinator), which the actor system checks.
	ActStages
)

// policy says which roles may do what: the one place that decides.
var policy = map[Action][]string{
	ActRead:   {RoleNode, RoleClient},
	ActUse:    {RoleNode, RoleClient},
	ActMember: {RoleNode},
	ActStages: {RoleNode},
}

// May reports whether a certificate of role may do a.
func May(role string, a Action) bool { return slices.Contains(policy[a], role) }

// String names an action for errors and logs.
func (a Action) String() string {
	switch a {
	case ActRead:
		return "read status"
	case ActUse:
		return "use the cluster"
	case ActMember:
		return "node traffic"
	case ActStages:
		return "control stages"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Authorize returns the peer a verified TLS connection state names if its
// role may do a, and an error otherwise.
func Authorize(cs *tls.ConnectionState, a Action) (Peer, error) {
	p, ok := PeerOf(cs)
	if !ok {
		return Peer{}, fmt.Errorf("trust: %s needs a certificate of the cluster", a)
	}
	if !May(p.Role, a) {
		return p, fmt.Errorf("trust: %q holds a %s certificate, which may not %s", p.Name, p.Role, a)
	}
	return p, nil
}
