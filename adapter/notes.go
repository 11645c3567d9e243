package adapter

import (
	"context"

	"github.com/traceops/trace/sink"
)

// RecordNote records a backend's own entry in a job's history (the
// command backend's exit, the webhook's acceptance): typ is not a trainer
// event type, so the job's status is unchanged. key identifies the entry
// within the job (a repeated key is one entry).
func (s *Stage) RecordNote(ctx context.Context, jobID, key, typ string, payload []byte) error {
	now := s.cfg.Now().UTC()
	return s.cfg.Store.InsertTrainingEvents(ctx, []sink.TrainingEventRow{{JobID: jobID, Key: key, Type: typ, At: now, Iteration: -1,
		Payload: truncate(string(payload), 64<<10), ReceivedAt: now}})
}
