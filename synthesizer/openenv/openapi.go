package openenv

import (
	"encoding/json"
	"slices"
)

// APIVersion is the version of OpenEnv's HTTP API that trace's server
// implements, as openenv-core's own servers (0.3.0) declare it in their
// OpenAPI document's info.version; `openenv validate --url` reads it there
// and checks a runtime against the profile of its major version
// (openenv-http/1.x).
const APIVersion = "1.0.0"

// OpenAPI is the OpenAPI 3.1 document of one environment's HTTP API (GET
// …/openapi.json), relative to the environment's base URL, as openenv's
// FastAPI servers publish theirs: the endpoints /reset, /step, /state,
// /metadata, /health, /schema and /mcp, with the environment's action,
// observation and state schemas (s, as GET /schema serves them) as
// components. sessionHeader is the header naming a stateful HTTP session;
// auth says that the server wants a bearer token (everywhere but /health).
// The WebSocket endpoints (/ws, and /mcp upgraded) are named in the
// description, which OpenAPI has no operation for.
//
// Each operation lists every status trace's server answers it with (all
// but 200 with the HTTPError body): 401 without the token (when auth),
// 404 for an unknown session or an environment no longer served, 503 for
// an environment that cannot be opened (FACTORY_ERROR), and on /reset,
// /step and /state 500 for a failed execution (EXECUTION_ERROR: a program
// error, a limit, an observation over env.max_observation_bytes), on
// /reset and /step 400, 413 and 422 for the body. CAPACITY_REACHED is not
// among them: no HTTP request takes a session's slot but
// openenv/session/create on /mcp, which answers it in JSON-RPC (HTTP 200).
func OpenAPI(name, doc, sessionHeader string, s SchemaResponse, auth bool) []byte {
	ref := func(name string) map[string]any { return map[string]any{"$ref": "#/components/schemas/" + name} }
	jsonBody := func(schema map[string]any) map[string]any {
		return map[string]any{"application/json": map[string]any{"schema": schema}}
	}
	answer := func(desc, schema string) map[string]any {
		return map[string]any{"description": desc, "content": jsonBody(ref(schema))}
	}
	failure := func(desc string) map[string]any { return answer(desc, "HTTPError") }
	body := map[string]any{
		"400": failure("The body could not be read"),
		"413": failure("A body over env.max_message_bytes (code VALIDATION_ERROR)"),
		"422": failure("A request that breaks its schema (code VALIDATION_ERROR or INVALID_JSON; detail lists the fields)"),
	}
	execution := map[string]any{
		"500": failure("The execution failed (code EXECUTION_ERROR): the program's error, a limit (env.step_timeout, memory), an observation over env.max_observation_bytes, no episode or one that is over; the message says how to go on"),
	}
	sessionGone := failure("No such session (code SESSION_ERROR: unknown, closed or evicted when idle), or the environment is no longer served")
	envGone := failure("The environment is no longer served")
	unavailable := failure("The environment cannot be opened (code FACTORY_ERROR: its record or program does not load, or the catalog cannot be read); retried after a few seconds")
	unauthorized := map[string]any{
		"description": "No or a wrong bearer token",
		"headers":     map[string]any{"WWW-Authenticate": map[string]any{"schema": map[string]any{"type": "string"}}},
		"content":     jsonBody(ref("HTTPError")),
	}
	// with is an operation's responses: ok (200), the 404 and the 503 of
	// every environment's path, the 401 of every protected one, and more.
	with := func(ok, notFound map[string]any, protected bool, more ...map[string]any) map[string]any {
		out := map[string]any{"200": ok, "404": notFound, "503": unavailable}
		if auth && protected {
			out["401"] = unauthorized
		}
		for _, m := range more {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	session := []any{map[string]any{
		"name": sessionHeader, "in": "header", "required": false,
		"description": "A stateful HTTP session (create one with openenv/session/create on /mcp); without it a request plays a fresh environment, as OpenEnv's HTTP endpoints do",
		"schema":      map[string]any{"type": "string"},
	}}
	paths := map[string]any{
		"/reset": map[string]any{"post": map[string]any{
			"summary": "Reset the environment", "operationId": "reset",
			"parameters":  session,
			"requestBody": map[string]any{"required": false, "content": jsonBody(ref("ResetRequest"))},
			"responses":   with(answer("The first observation", "StepResponse"), sessionGone, true, body, execution),
		}},
		"/step": map[string]any{"post": map[string]any{
			"summary": "Execute an action in the environment", "operationId": "step",
			"parameters":  session,
			"requestBody": map[string]any{"required": true, "content": jsonBody(ref("StepRequest"))},
			"responses":   with(answer("The observation, reward and done after the action", "StepResponse"), sessionGone, true, body, execution),
		}},
		"/state": map[string]any{"get": map[string]any{
			"summary": "Get current environment state", "operationId": "state",
			"parameters": append(slices.Clone(session), map[string]any{
				"name": "session_id", "in": "query", "required": false,
				"description": "The session, as the " + sessionHeader + " header (GET has no body to carry it)",
				"schema":      map[string]any{"type": "string"},
			}),
			"responses": with(answer("The episode's state", "State"), sessionGone, true, execution),
		}},
		"/metadata": map[string]any{"get": map[string]any{
			"summary": "Get environment metadata", "operationId": "metadata",
			"responses": with(answer("Name, description and version of the environment", "EnvironmentMetadata"), envGone, true),
		}},
		"/health": map[string]any{"get": map[string]any{
			"summary": "Health check", "operationId": "health", "security": []any{}, // open
			"responses": with(answer("Healthy", "HealthResponse"), envGone, false),
		}},
		"/schema": map[string]any{"get": map[string]any{
			"summary": "Get all JSON schemas", "operationId": "schema",
			"responses": with(answer("JSON Schemas of the action, the observation and the state", "SchemaResponse"), envGone, true),
		}},
		"/mcp": map[string]any{"post": map[string]any{
			"summary": "MCP (JSON-RPC 2.0): tools/list, tools/call, openenv/session/create and close", "operationId": "mcp",
			"requestBody": map[string]any{"required": true, "content": jsonBody(map[string]any{"type": "object"})},
			"responses": with(map[string]any{"description": "A JSON-RPC response (errors too, a body over env.max_message_bytes and CAPACITY_REACHED among them: HTTP 200 with a JSON-RPC error)", "content": jsonBody(map[string]any{"type": "object"})},
				envGone, true, map[string]any{"400": body["400"]}),
		}},
	}
	seed := map[string]any{"type": "integer", "minimum": -(1 << 63), "maximum": 1<<63 - 1}
	components := map[string]any{
		"Action":      s.Action,
		"Observation": s.Observation,
		"State":       s.State,
		"ResetRequest": map[string]any{"type": "object", "additionalProperties": true, "properties": map[string]any{
			"seed":       seed,
			"episode_id": map[string]any{"type": "string"},
			"hint":       map[string]any{"type": "boolean", "description": "the program's expert guidance in the system prompt (trace's extension)"},
			"session_id": map[string]any{"type": "string", "description": "a stateful HTTP session, as the " + sessionHeader + " header"},
		}},
		"StepRequest": map[string]any{"type": "object", "required": []string{"action"}, "additionalProperties": true, "properties": map[string]any{
			"action":     ref("Action"),
			"timeout_s":  map[string]any{"type": "number", "exclusiveMinimum": 0},
			"request_id": map[string]any{"type": "string"},
			"seed":       seed,
			"session_id": map[string]any{"type": "string", "description": "a stateful HTTP session, as the " + sessionHeader + " header"},
		}},
		"StepResponse": map[string]any{"type": "object", "required": []string{"observation", "reward", "done"}, "properties": map[string]any{
			"observation": ref("Observation"),
			"reward":      map[string]any{"anyOf": []any{map[string]any{"type": "number"}, map[string]any{"type": "null"}}},
			"done":        map[string]any{"type": "boolean"},
		}},
		"EnvironmentMetadata": map[string]any{"type": "object", "required": []string{"name", "description"}, "properties": map[string]any{
			"name": map[string]any{"type": "string"}, "description": map[string]any{"type": "string"},
			"readme_content": nullable("string"), "version": nullable("string"), "author": nullable("string"), "documentation_url": nullable("string"),
		}},
		"HealthResponse": map[string]any{"type": "object", "required": []string{"status"}, "properties": map[string]any{
			"status": map[string]any{"type": "string", "enum": []string{"healthy"}},
		}},
		"SchemaResponse": map[string]any{"type": "object", "required": []string{"action", "observation", "state"}, "properties": map[string]any{
			"action": map[string]any{"type": "object"}, "observation": map[string]any{"type": "object"}, "state": map[string]any{"type": "object"},
		}},
		"HTTPError": map[string]any{"type": "object", "required": []string{"detail"}, "properties": map[string]any{
			"detail": map[string]any{"description": "a message, or for 422 a list of validation errors"},
			"code":   map[string]any{"type": "string", "description": "the OpenEnv error code: VALIDATION_ERROR, INVALID_JSON, EXECUTION_ERROR, SESSION_ERROR, FACTORY_ERROR; absent on 400, 401 and a 404 for a path or environment unknown"},
		}},
	}
	description := doc
	if description != "" {
		description += "\n\n"
	}
	description += "Served by trace over OpenEnv's protocol. Stateful episodes: the WebSocket at ./ws " +
		"(frames {\"type\": \"reset\" | \"step\" | \"state\" | \"close\", \"data\": …}), and MCP over a WebSocket at ./mcp. " +
		"Every endpoint but /health needs the server's bearer token when one is configured."
	document := map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":       "OpenEnv environment " + name,
			"description": description,
			"version":     APIVersion,
		},
		"paths":      paths,
		"components": map[string]any{"schemas": components},
	}
	if auth {
		document["components"].(map[string]any)["securitySchemes"] = map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}}
		document["security"] = []any{map[string]any{"bearer": []any{}}}
	}
	out, err := json.Marshal(document)
	if err != nil { // only maps, strings and the schemas' own JSON: cannot fail
		panic("openenv: OpenAPI document: " + err.Error())
	}
	return out
}

func nullable(typ string) map[string]any {
	return map[string]any{"anyOf": []any{map[string]any{"type": typ}, map[string]any{"type": "null"}}}
}
