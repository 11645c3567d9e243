package simulate

import (
	"slices"

	"github.com/traceops/trace/schemas"
)

// Tools returns the tool schemas of a simulated environment (Airline or
// Retail), as its rollouts carry them; nil for another name. The slice is a
// copy.
func Tools(environment string) []schemas.Tool {
	switch environment {
	case Airline:
		return slices.Clone(airlineTools)
	case Retail:
		return slices.Clone(retailTools)
	}
	return nil
}
