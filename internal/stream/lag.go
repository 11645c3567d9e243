package stream

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/listoffsets"
)

// lagStaleIntervals is how many LagIntervals without a successful read the
// lag series outlive their last reading before they are dropped.
const lagStaleIntervals = 3

// lagLoop refreshes the lag gauge every LagInterval until ctx ends.
//
// kafka-go's group Reader.Stats().Lag is the lag of whichever partition was
// read last (and Reader.ReadLag refuses groups), so the lag is computed the
// way external monitors do it: the partitions' high watermarks (ListOffsets)
// minus the group's committed offsets (OffsetFetch). A partition without a
// committed offset counts from its log start for StartOffset FirstOffset,
// and as 0 for LastOffset. Being based on commits, it includes the batches in
// flight and rises while the sink applies backpressure.
//
// A lag that cannot be read (the brokers unreachable) is not reported as
// the last value read: a gauge left at its last value showed a healthy,
// flat lag through a Kafka outage. Two signals say so, the way Prometheus
// exporters do. Every successful read sets
// trace_consumer_lag_updated_timestamp_seconds to the time of the read (it
// stops advancing while reads fail: alert on time() minus it, the standard
// "last success" pattern), and once reads have failed for
// lagStaleIntervals intervals the lag series are deleted, so that a
// dashboard shows a gap (Prometheus marks the series stale) rather than a
// made-up number; the next successful read brings them back. Deleting
// them alone would make a lag alert resolve during an outage, hence the
// timestamp, which stays.
func (c *Consumer[T]) lagLoop(ctx context.Context, tr *kafka.Transport) {
	if c.cfg.LagInterval < 0 {
		return
	}
	defer c.met.clearLag()
	if c.met.m == nil {
		return
	}
	client := &kafka.Client{Addr: kafka.TCP(c.cfg.Brokers...), Transport: tr, Timeout: 10 * time.Second}
	t := time.NewTicker(c.cfg.LagInterval)
	defer t.Stop()
	staleAfter := lagStaleIntervals * c.cfg.LagInterval
	var lastRead time.Time // of the last successful read; zero before the first
	dropped := false
	for {
		lags, err := c.pollLag(ctx, client, tr)
		switch {
		case err == nil:
			lastRead = time.Now()
			c.met.setLag(lags, lastRead)
			if dropped {
				dropped = false
				c.log.Info("consumer lag readable again")
			}
		case ctx.Err() == nil:
			c.met.error("lag")
			c.log.Debug("lag poll failed", "error", err)
			if !dropped && !lastRead.IsZero() && time.Since(lastRead) >= staleAfter {
				dropped = true
				c.met.dropLag()
				c.log.Warn("consumer lag unreadable; its series are dropped until it is read again",
					"last_read", lastRead.UTC().Format(time.RFC3339), "error", err)
			}
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func (c *Consumer[T]) pollLag(ctx context.Context, client *kafka.Client, tr *kafka.Transport) (map[int]int64, error) {
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{c.cfg.Topic}})
	if err != nil {
		return nil, err
	}
	var parts []int
	for _, t := range md.Topics {
		if t.Name == c.cfg.Topic {
			if t.Error != nil {
				return nil, t.Error
			}
			for _, p := range t.Partitions {
				parts = append(parts, p.ID)
			}
		}
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("topic %q has no partitions", c.cfg.Topic)
	}
	high, err := listOffsets(ctx, client, tr, c.cfg.Topic, parts, kafka.LastOffset)
	if err != nil {
		return nil, err
	}
	var low map[int]int64
	if c.cfg.StartOffset == kafka.FirstOffset {
		if low, err = listOffsets(ctx, client, tr, c.cfg.Topic, parts, kafka.FirstOffset); err != nil {
			return nil, err
		}
	}
	of, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: c.cfg.GroupID, Topics: map[string][]int{c.cfg.Topic: parts}})
	if err != nil {
		return nil, err
	}
	if of.Error != nil {
		return nil, of.Error
	}
	committed := make(map[int]int64, len(parts))
	for _, p := range of.Topics[c.cfg.Topic] {
		if p.Error == nil {
			committed[p.Partition] = p.CommittedOffset
		}
	}
	lags := make(map[int]int64, len(parts))
	for _, p := range parts {
		h, ok := high[p]
		if !ok {
			continue
		}
		from, ok := committed[p]
		if !ok || from < 0 {
			if low == nil {
				lags[p] = 0
				continue
			}
			from = low[p]
		}
		lags[p] = max(h-from, 0)
	}
	return lags, nil
}

// listOffsets asks the partition leaders for the earliest or latest offset of
// each partition. It uses the protocol request directly: kafka.Client's
// ListOffsets files responses by their record timestamp, which brokers set
// to -1 for both earliest and latest.
func listOffsets(ctx context.Context, client *kafka.Client, tr *kafka.Transport, topic string, parts []int, which int64) (map[int]int64, error) {
	req := &listoffsets.Request{ReplicaID: -1, Topics: []listoffsets.RequestTopic{{Topic: topic}}}
	for _, p := range parts {
		req.Topics[0].Partitions = append(req.Topics[0].Partitions,
			listoffsets.RequestPartition{Partition: int32(p), CurrentLeaderEpoch: -1, Timestamp: which})
	}
	rctx, cancel := context.WithTimeout(ctx, client.Timeout)
	defer cancel()
	m, err := tr.RoundTrip(rctx, client.Addr, req)
	if err != nil {
		return nil, err
	}
	res, ok := m.(*listoffsets.Response)
	if !ok {
		return nil, fmt.Errorf("ListOffsets: unexpected response %T", m)
	}
	out := make(map[int]int64, len(parts))
	for _, t := range res.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return nil, fmt.Errorf("ListOffsets %s/%d: %w", topic, p.Partition, kafka.Error(p.ErrorCode))
			}
			out[int(p.Partition)] = p.Offset
		}
	}
	return out, nil
}
