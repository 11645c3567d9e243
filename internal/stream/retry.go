package stream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// retry runs op until it returns nil, fatal(err) is true (err is returned),
// or ctx ends (errDrainExpired, wrapping the last error, is returned). An
// error wrapping ErrStopped while the consumer stops ends it at once
// (errGivenUp, wrapping it).
func (c *Consumer[T]) retry(ctx context.Context, op func(context.Context) error, fatal func(error) bool,
	onRetry func(attempt int, err error, wait time.Duration)) error {
	bo := c.newBackOff()
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			// Past the drain deadline nothing new starts. (kafka-go may
			// still commit a request that raced with the cancellation;
			// that is harmless, the batch is durable.)
			return fmt.Errorf("%w: %w", errDrainExpired, err)
		}
		err := op(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", errDrainExpired, err)
		}
		if errors.Is(err, ErrStopped) && stopped(ctx) {
			return fmt.Errorf("%w: %w", errGivenUp, err)
		}
		if fatal != nil && fatal(err) {
			return err
		}
		wait := bo.NextBackOff()
		onRetry(attempt, err, wait)
		if !sleep(ctx, wait) {
			return fmt.Errorf("%w: %w", errDrainExpired, err)
		}
	}
}

// newBackOff is the capped, jittered exponential backoff of every retry:
// BackoffInitial doubling up to BackoffMax, each wait randomized by ±50% and
// then capped at BackoffMax, never giving up.
func (c *Consumer[T]) newBackOff() backoff.BackOff {
	return cappedBackOff{
		b: backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(c.cfg.BackoffInitial),
			backoff.WithMaxInterval(c.cfg.BackoffMax),
			backoff.WithMultiplier(2),
			backoff.WithRandomizationFactor(0.5),
			backoff.WithMaxElapsedTime(0),
		),
		max: c.cfg.BackoffMax,
	}
}

type cappedBackOff struct {
	b   *backoff.ExponentialBackOff
	max time.Duration
}

func (b cappedBackOff) NextBackOff() time.Duration { return min(b.b.NextBackOff(), b.max) }
func (b cappedBackOff) Reset()                     { b.b.Reset() }

// sleep waits d or until ctx ends; false if ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
