package remote

import (
	"context"
	"net"

	"github.com/asynkron/protoactor-go/actor"
	"google.golang.org/grpc"
)

type ConfigOption func(config *Config)

// WithEndpointWriterBatchSize sets the batch size for the endpoint writer
func WithEndpointWriterBatchSize(batchSize int) ConfigOption {
	return func(config *Config) {
		config.EndpointWriterBatchSize = batchSize
	}
}

// WithEndpointWriterQueueSize sets the queue size for the endpoint writer
func WithEndpointWriterQueueSize(queueSize int) ConfigOption {
	return func(config *Config) {
		config.EndpointWriterQueueSize = queueSize
	}
}

// WithEndpointManagerBatchSize sets the batch size for the endpoint manager
func WithEndpointManagerBatchSize(batchSize int) ConfigOption {
	return func(config *Config) {
		config.EndpointManagerBatchSize = batchSize
	}
}

// WithEndpointManagerQueueSize sets the queue size for the endpoint manager
func WithEndpointManagerQueueSize(queueSize int) ConfigOption {
	return func(config *Config) {
		config.EndpointManagerQueueSize = queueSize
	}
}

// WithDialOptions sets the dial options for the remote
func WithDialOptions(options ...grpc.DialOption) ConfigOption {
	return func(config *Config) {
		config.DialOptions = options
	}
}

// WithServerOptions sets the server options for the remote
func WithServerOptions(options ...grpc.ServerOption) ConfigOption {
	return func(config *Config) {
		config.ServerOptions = options
	}
}

// WithCallOptions sets the call options for the remote
func WithCallOptions(options ...grpc.CallOption) ConfigOption {
	return func(config *Config) {
		config.CallOptions = options
	}
}

// WithAdvertisedHost sets the advertised host for the remote
func WithAdvertisedHost(address string) ConfigOption {
	return func(config *Config) {
		config.AdvertisedHost = address
	}
}

// WithKinds adds the kinds to the remote
func WithKinds(kinds ...*Kind) ConfigOption {
	return func(config *Config) {
		for _, k := range kinds {
			config.Kinds[k.Kind] = k.Props
		}
	}
}

// WithMaxRetryCount sets how often an endpoint writer tries to connect
// before it reports the endpoint terminated (default 5). ppnode patch.
func WithMaxRetryCount(n int) ConfigOption {
	return func(config *Config) {
		config.MaxRetryCount = n
	}
}

// PeerHeader is the message header key under which the endpoint reader
// passes the peer that Inbound.Authorize named to the target actor,
// replacing any value the sender put there. ppnode patch.
const PeerHeader = "ppnode-peer"

// Inbound authorises the streams and messages that reach this node's gRPC
// port. ppnode patch: upstream delivered whatever any caller sent.
type Inbound struct {
	// Authorize is called once per stream with its context (which holds
	// the peer's TLS state): an error refuses the stream; otherwise the
	// name it returns is the peer of every message of the stream.
	Authorize func(ctx context.Context) (peer string, err error)
	// Admit is called for every message of an authorised stream, system
	// messages included; false drops it. It must be safe for concurrent
	// use.
	Admit func(peer string, target *actor.PID, message interface{}) bool
}

// WithInbound authorises the streams and messages of the gRPC port
// (see Inbound). ppnode patch.
func WithInbound(in *Inbound) ConfigOption {
	return func(config *Config) {
		config.Inbound = in
	}
}

// WithListener makes the remote serve ln (which it closes on shutdown)
// instead of listening on its host and port. ppnode patch.
func WithListener(ln net.Listener) ConfigOption {
	return func(config *Config) {
		config.Listener = ln
	}
}
