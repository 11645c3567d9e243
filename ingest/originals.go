package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// Originals reads messages again by their coordinates, outside any consumer
// group: `trace relabel` and `trace dict apply --backfill` label stored
// rollouts from their original messages (analyzer.OriginalReader).
type Originals struct {
	Brokers         []string
	Dialer          *kafka.Dialer // nil: kafka.DefaultDialer
	MaxMessageBytes int           // default 5 MiB
	// Seek is the gap between two wanted offsets above which the reader
	// seeks instead of reading through (default 1,000 messages).
	Seek int64
}

// Read implements analyzer.OriginalReader. Offsets below the partition's
// first offset or at or after its end are returned as missing without a
// fetch; an offset inside the range that the broker no longer returns
// (compaction) is missing too.
func (o *Originals) Read(ctx context.Context, topic string, partition int, offsets []int64, fn func(offset int64, value []byte) error) ([]int64, error) {
	if len(offsets) == 0 {
		return nil, nil
	}
	dialer := o.Dialer
	if dialer == nil {
		dialer = kafka.DefaultDialer
	}
	first, last, err := o.bounds(ctx, dialer, topic, partition)
	if err != nil {
		return nil, err
	}
	var missing, todo []int64
	for _, off := range offsets {
		if off < first || off >= last {
			missing = append(missing, off)
		} else {
			todo = append(todo, off)
		}
	}
	if len(todo) == 0 {
		return missing, nil
	}
	maxBytes := o.MaxMessageBytes
	if maxBytes <= 0 {
		maxBytes = 5 << 20
	}
	seek := o.Seek
	if seek <= 0 {
		seek = 1000
	}
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: o.Brokers, Topic: topic, Partition: partition, Dialer: dialer,
		MinBytes: 1, MaxBytes: maxBytes, MaxWait: 250 * time.Millisecond})
	defer func() { go rd.Close() }() // Close can idle for a fetch long-poll
	if err := rd.SetOffset(todo[0]); err != nil {
		return nil, fmt.Errorf("partition %d offset %d: %w", partition, todo[0], err)
	}
	for i := 0; i < len(todo); {
		m, err := rd.FetchMessage(ctx)
		if err != nil {
			return nil, fmt.Errorf("partition %d at offset %d: %w", partition, todo[i], err)
		}
		for i < len(todo) && todo[i] < m.Offset {
			missing = append(missing, todo[i]) // not returned: gone
			i++
		}
		if i < len(todo) && todo[i] == m.Offset {
			if err := fn(m.Offset, m.Value); err != nil {
				return nil, err
			}
			i++
		}
		if i < len(todo) && todo[i]-m.Offset > seek {
			if err := rd.SetOffset(todo[i]); err != nil {
				return nil, fmt.Errorf("partition %d offset %d: %w", partition, todo[i], err)
			}
		}
		if m.Offset >= last-1 {
			missing = append(missing, todo[i:]...)
			break
		}
	}
	return missing, nil
}

// bounds returns a partition's first offset and its end (the next offset).
func (o *Originals) bounds(ctx context.Context, dialer *kafka.Dialer, topic string, partition int) (int64, int64, error) {
	var errs []error
	for _, b := range o.Brokers {
		conn, err := dialer.DialLeader(ctx, "tcp", b, topic, partition)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		first, last, err := conn.ReadOffsets()
		conn.Close()
		if err != nil {
			return 0, 0, fmt.Errorf("offsets of %s/%d: %w", topic, partition, err)
		}
		return first, last, nil
	}
	return 0, 0, fmt.Errorf("offsets of %s/%d: %w", topic, partition, errors.Join(errs...))
}
