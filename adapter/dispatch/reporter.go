package dispatch

import (
	"context"

	"github.com/traceops/trace/schemas"
)

// Reporter records what a backend learns about a job (adapter.Stage).
// HandleEvent applies an event trace makes itself (a webhook's rejection,
// a command backend that cannot relay its events) to the job's status and
// history, outside the ordered events consumer: trainers' events go
// through the consumer (EventRelay). RecordMalformed keeps an event that
// could not be decoded; RecordNote keeps a backend's own history entry
// (type outside training_event/v1, status unchanged). A repeated key
// within a job is one entry.
type Reporter interface {
	HandleEvent(ctx context.Context, e *schemas.TrainingEvent, key string, payload []byte) error
	RecordMalformed(ctx context.Context, jobID, key string, payload []byte, cause error) error
	RecordNote(ctx context.Context, jobID, key, typ string, payload []byte) error
}
