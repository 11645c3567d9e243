package app

// Exported for the tests of package app_test.
var (
	LogURL          = logURL
	DecisionTimeout = decisionTimeout
)
