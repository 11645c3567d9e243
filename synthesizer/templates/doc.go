// Package templates holds trace's built-in environment templates, for users
// without a generation model (issue 13): for a capability of a known family
// the synthesizer instantiates a template instead of asking an LLM.
//
// The six families are the five of the shipped rules dictionary
// (precondition_verification, argument_grounding, multi_step_completion,
// tool_error_recovery, user_confirmation) and TRACE's
// structured_data_reasoning. Each is a parameterised Starlark program
// (star/<family>.star on a shared star/lib.star, embedded) completed by a
// CONFIG that Instantiate derives from the target's real tool schemas: the
// tools the family needs are picked by role (a read tool of a record, a
// write tool on it, a user lookup), matched by name pattern
// (get_*/find_*/search_*, cancel_*/update_*/modify_*/book_*/return_*/
// exchange_*) and parameter names (reservation_id, order_id, user_id, any
// *_id), and used verbatim; a target lacking a role yields a *RoleError
// naming it. Every program ships a reference solution, a hint, a
// multi-level reward (0.5 × complete + 0.3 × share of required outcomes +
// 0.2 × communication) and a 3–5 sentence rationale as its docstring.
//
// Match maps a capability to a family (its exact name, a declared
// `family:`, or keywords of its name and definition). Knobs (records,
// steps, distractors, hint share) set an instance's difficulty; Tune walks
// a family's knob ladder until a calibration (package calibrate) lands
// inside the bands.
package templates
