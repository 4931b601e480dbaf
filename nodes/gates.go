package nodes

import "github.com/ppnode/ppnode/admit"

// gates bound the connections of a node's listening ports, one gate per
// port (the data plane's ports share one): a flood of one port does not
// take the others' room.
type gates struct {
	actor, data, probe, http, gossip *admit.Gate
}

func newGates(l admit.Limits) gates {
	return gates{actor: admit.NewGate(l, nil), data: admit.NewGate(l, nil), probe: admit.NewGate(l, nil), http: admit.NewGate(l, nil), gossip: admit.NewGate(l, nil)}
}

// portConns is what one port's gate counted, for /metrics; roles, on the
// actor port, the streams, calls and messages it refused by role.
type portConns struct {
	port  string
	stats admit.Stats
	roles uint64
}

// stats returns the gates' counters, by port, with the actor port's
// refusals by role.
func (g gates) stats(actorRoles uint64) []portConns {
	return []portConns{{"actor", g.actor.Stats(), actorRoles}, {"data", g.data.Stats(), 0}, {"probe", g.probe.Stats(), 0}, {"http", g.http.Stats(), 0}, {"gossip", g.gossip.Stats(), 0}}
}
