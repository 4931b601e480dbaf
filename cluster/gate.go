package cluster

import (
	"net"
	"sync"

	"github.com/hashicorp/memberlist"

	"github.com/ppnode/ppnode/admit"
)

// gatedTransport passes the streams memberlist's TCP listener accepts
// (joins and push/pulls) through an admit gate: a stream over a bound is
// closed at once, the others count as in their handshake until memberlist
// closes them (after one exchange, within its TCP timeout).
type gatedTransport struct {
	*memberlist.NetTransport
	gate *admit.Gate
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func newGatedTransport(t *memberlist.NetTransport, g *admit.Gate) *gatedTransport {
	gt := &gatedTransport{NetTransport: t, gate: g, ch: make(chan net.Conn), done: make(chan struct{})}
	gt.wg.Add(1)
	go gt.forward()
	return gt
}

func (t *gatedTransport) forward() {
	defer t.wg.Done()
	in := t.NetTransport.StreamCh()
	for {
		select {
		case c := <-in:
			gc, ok := t.gate.Take(c)
			if !ok {
				continue
			}
			select {
			case t.ch <- gc:
			case <-t.done:
				gc.Close()
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *gatedTransport) StreamCh() <-chan net.Conn { return t.ch }

func (t *gatedTransport) Shutdown() error {
	err := t.NetTransport.Shutdown()
	t.once.Do(func() { close(t.done) })
	t.wg.Wait()
	return err
}
