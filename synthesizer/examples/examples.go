// Package examples holds hand-written environment programs shipped with
// trace (docs/environments.md). They are trusted: tests, `trace env` and
// the demo run them in-process with envprog.Load.
package examples

import _ "embed"

// PreconditionAirline is precondition verification over a seeded airline
// reservation store, with the τ²-bench airline tools get_user_details,
// get_reservation_details, cancel_reservation and
// update_reservation_baggages (names, parameters and types as the target's).
//
//go:embed precondition_airline.star
var PreconditionAirline []byte

// PreconditionAirlineName is the file name of PreconditionAirline.
const PreconditionAirlineName = "precondition_airline.star"
