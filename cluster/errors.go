package cluster

import "errors"

// ErrMetaTooLarge reports metadata that would exceed [MaxMetaSize] once
// encoded. The node's metadata is left as it was.
var ErrMetaTooLarge = errors.New("cluster: metadata too large")

// ErrBadMeta reports metadata that is not valid or could not be decoded.
var ErrBadMeta = errors.New("cluster: bad metadata")

// ErrBadKey reports a gossip encryption key that is not 16, 24 or 32
// bytes, or a key file that holds none.
var ErrBadKey = errors.New("cluster: bad encryption key")

// ErrJoin reports that no seed could be joined.
var ErrJoin = errors.New("cluster: join failed")

// ErrKeyMismatch reports, along with [ErrJoin], that a seed answered but
// the two nodes do not share a gossip encryption key (different keys, or
// encryption on one side only).
var ErrKeyMismatch = errors.New("cluster: gossip encryption keys differ")

// ErrNameTaken reports, along with [ErrJoin], that the cluster kept
// another live node under this node's name, at another address, for
// longer than a crashed instance takes to be declared failed.
var ErrNameTaken = errors.New("cluster: node name in use")

// ErrClosed reports a call on a node that has left or been closed.
var ErrClosed = errors.New("cluster: node closed")
