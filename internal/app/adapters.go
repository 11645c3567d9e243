package app

import (
	"context"

	"github.com/traceops/trace/analyzer"
	"github.com/traceops/trace/internal/bus"
	"github.com/traceops/trace/schemas"
)

// BusPublisher adapts the NATS bus to the analyzer's Publisher (the analyzer
// does not import internal/bus).
type BusPublisher struct{ Bus *bus.Bus }

// PublishSynthesis implements analyzer.Publisher with Bus.PublishSynthesis.
func (p BusPublisher) PublishSynthesis(ctx context.Context, req *schemas.SynthesisRequest) (analyzer.PublishResult, error) {
	res, err := p.Bus.PublishSynthesis(ctx, req)
	return analyzer.PublishResult(res), err
}

// announcer is b as the registry's Announcer, or nil (announce nothing)
// without a bus.
func announcer(b *bus.Bus) analyzer.Announcer {
	if b == nil {
		return nil
	}
	return b
}
