package openenv

import "encoding/json"

// Schemas returns GET /schema's body for an environment with these tool
// names: the action is an OpenAI assistant message whose tool calls name
// one of them (or one of openenv's MCP actions), the observation and the
// state are this package's Observation and State.
func Schemas(toolNames []string) SchemaResponse {
	names, _ := json.Marshal(toolNames)
	if toolNames == nil {
		names = []byte("[]")
	}
	action := `{
  "title": "ChatAction",
  "description": "The policy's assistant message in OpenAI chat format: its tool calls are executed in order; a message without tool calls is the final answer. Also openenv's MCP actions {\"type\": \"list_tools\"} and {\"type\": \"call_tool\", \"tool_name\", \"arguments\"}.",
  "anyOf": [
    {
      "type": "object",
      "title": "AssistantMessage",
      "description": "Members not listed are ignored, except calls where they are not read (function_call, tool_call…), which are refused.",
      "anyOf": [{"required": ["role"]}, {"required": ["content"]}, {"required": ["tool_calls"]}],
      "properties": {
        "type": {"type": "null"},
        "function_call": {"type": "null"},
        "role": {"const": "assistant"},
        "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {"type": "object", "properties": {"type": {"const": "text"}, "text": {"type": "string"}}, "required": ["type", "text"]}}]},
        "tool_calls": {"anyOf": [{"type": "null"}, {"type": "array", "items": {
          "type": "object",
          "properties": {
            "id": {"type": "string"},
            "type": {"const": "function"},
            "function": {"type": "object", "properties": {
              "name": {"enum": ` + string(names) + `},
              "arguments": {"anyOf": [{"type": "string", "description": "the arguments object as JSON text"}, {"type": "object"}]}
            }, "required": ["name"]}
          },
          "required": ["function"]
        }}]}
      }
    },
    {"type": "object", "title": "ListToolsAction", "properties": {"type": {"const": "list_tools"}, "metadata": {"type": "object"}}, "required": ["type"], "additionalProperties": false},
    {"type": "object", "title": "CallToolAction", "properties": {"type": {"const": "call_tool"}, "tool_name": {"enum": ` + string(names) + `}, "arguments": {"type": "object"}, "metadata": {"type": "object"}}, "required": ["type", "tool_name"], "additionalProperties": false}
  ]
}`
	message := `{"type": "object", "properties": {
    "role": {"enum": ["system", "user", "assistant", "tool"]},
    "content": {"type": "string"},
    "tool_calls": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "string"}, "type": {"const": "function"}, "function": {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}},
    "tool_call_id": {"type": "string"},
    "name": {"type": "string"}
  }, "required": ["role", "content"]}`
	chatObservation := `{
  "title": "ChatObservation",
  "type": "object",
  "properties": {
    "episode_id": {"type": "string"},
    "seed": {"type": "integer"},
    "step_count": {"type": "integer", "minimum": 0, "description": "assistant turns played"},
    "messages": {"type": "array", "items": ` + message + `, "description": "the transcript so far in OpenAI format"},
    "tools": {"type": "array", "items": {"type": "object"}, "description": "OpenAI function schemas"},
    "tool_results": {"type": "array", "items": ` + message + `, "description": "the tool messages of the last action"},
    "last_tool_result": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "reward_components": {"type": "object", "additionalProperties": {"type": "number"}, "description": "once done"},
    "done_reason": {"enum": ["final", "environment", "max_turns", "timeout", "error"]},
    "error": {"type": "string"}
  },
  "required": ["episode_id", "seed", "step_count", "messages", "tools", "tool_results", "last_tool_result"]
}`
	observation := `{
  "title": "Observation",
  "description": "An assistant message's chat observation; openenv's MCP actions answer the shapes MCPToolClient reads: list_tools the tools, call_tool the tool's CallToolResult.",
  "anyOf": [
    ` + chatObservation + `,
    {"type": "object", "title": "ListToolsObservation", "properties": {"tools": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}, "description": {"type": "string"}, "input_schema": {"type": "object"}}, "required": ["name", "input_schema"]}}}, "required": ["tools"]},
    {"type": "object", "title": "CallToolObservation", "properties": {"tool_name": {"type": "string"}, "result": {"type": "object", "description": "MCP's CallToolResult: content, isError, data, _meta"}, "error": {"anyOf": [{"type": "string"}, {"type": "null"}]}}, "required": ["tool_name", "result"]}
  ]
}`
	state := `{
  "title": "State",
  "type": "object",
  "properties": {
    "episode_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "step_count": {"type": "integer", "minimum": 0},
    "environment": {"type": "string"},
    "session_id": {"type": "string"},
    "seed": {"type": "integer"},
    "done": {"type": "boolean"},
    "reward": {"type": "number"},
    "reward_components": {"type": "object", "additionalProperties": {"type": "number"}}
  },
  "additionalProperties": true
}`
	return SchemaResponse{Action: json.RawMessage(action), Observation: json.RawMessage(observation), State: json.RawMessage(state)}
}
