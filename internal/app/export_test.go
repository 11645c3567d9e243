package app

// Exported for the tests of package app_test.
var (
	LogURL          = logURL
	DecisionTimeout = decisionTimeout
)

// Bearer is the serve role's token check.
var Bearer = bearer

// OpenStore is Start's wait for ClickHouse; OpenStoreWithin with its
// overall deadline.
var (
	OpenStore       = openStore
	OpenStoreWithin = openStoreWithin
)

// OpenBusWithin is Start's wait for NATS with its overall deadline.
var OpenBusWithin = openBusWithin
