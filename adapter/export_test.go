package adapter

import "time"

// SetRetryDelay makes s wait d between deliveries of a message whose
// handling failed, instead of RetryDelay.
func SetRetryDelay(s *Stage, d time.Duration) { s.retryDelay = func(uint64) time.Duration { return d } }
