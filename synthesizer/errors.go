package synthesizer

import "fmt"

// errorf wraps sentinel with a formatted detail.
func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
