package nodes

import "github.com/ppnode/ppnode/admit"

// gates bound the connections of a node's listening ports, one gate per
// port (the data plane's ports share one): a flood of one port does not
// take the others' room.
type gates struct {
	actor, data, probe, http *admit.Gate
}

func newGates(l admit.Limits) gates {
	return gates{actor: admit.NewGate(l, nil), data: admit.NewGate(l, nil), probe: admit.NewGate(l, nil), http: admit.NewGate(l, nil)}
}

// portConns is what one port's gate counted, for /metrics.
type portConns struct {
	port  string
	stats admit.Stats
}

// stats returns the gates' counters, by port.
func (g gates) stats() []portConns {
	return []portConns{{"actor", g.actor.Stats()}, {"data", g.data.Stats()}, {"probe", g.probe.Stats()}, {"http", g.http.Stats()}}
}
