"""Drives trace's environment server with openenv-core's own clients.

Run by TestOpenEnvInterop (interop_test.go) with openenv-core 0.3.0's
python. Input (argv[1], JSON): the environment's base URL (with the token
as the URL's password), the WebSocket episode's seed and reference actions
(OpenAI assistant messages), and the same for the HTTP episode. Output:
one JSON object on the last line of stdout with what the clients saw; the
Go side compares it with the in-process play and with ClickHouse.
"""

import asyncio
import json
import sys

import httpx
from openenv.core.env_server.types import (
    EnvironmentMetadata,
    HealthResponse,
    ResetResponse,
    SchemaResponse,
    State,
    StepResponse,
)
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient


def websocket_episode(base_url, seed, actions):
    """GenericEnvClient over /ws: reset with a seed, the tool steps, a
    malformed step in between (the session survives it), the final answer."""
    out = {"tool_results": [], "errors": []}
    with GenericEnvClient(base_url=base_url).sync() as env:
        r = env.reset(seed=seed)
        out["reset_messages"] = r.observation["messages"]
        out["reset_done"] = r.done
        out["tools"] = [t["function"]["name"] for t in r.observation["tools"]]
        for i, a in enumerate(actions):
            if i == 1:
                # An unknown tool and arguments of the wrong type: protocol
                # errors, raised by the client as RuntimeError with the code.
                for bad in (
                    {"role": "assistant", "tool_calls": [{"id": "b1", "type": "function", "function": {"name": "book_flight", "arguments": "{}"}}]},
                    {"role": "assistant", "tool_calls": [{"id": "b2", "type": "function", "function": {"name": "get_user_details", "arguments": {"user_id": 7}}}]},
                ):
                    try:
                        env.step(bad)
                        out["errors"].append("no error")
                    except RuntimeError as e:
                        out["errors"].append(str(e))
            if i == 0 and a.get("tool_calls"):
                # Arguments as an object on the first turn (a string after).
                a = json.loads(json.dumps(a))
                for c in a["tool_calls"]:
                    c["function"]["arguments"] = json.loads(c["function"]["arguments"])
            r = env.step(a)
            out["tool_results"].append([m["content"] for m in r.observation["tool_results"]])
        out["done"] = r.done
        out["reward"] = r.reward
        out["components"] = r.observation.get("reward_components")
        out["episode_id"] = r.observation["episode_id"]
        st = env.state()
        out["state"] = st
    return out


async def mcp_over_ws(base_url, seed, call):
    """MCPToolClient's default path: list_tools and call_tool as step
    actions over /ws, after a reset."""
    async with MCPToolClient(base_url=base_url) as env:
        await env.reset(seed=seed)
        tools = await env.list_tools()
        result = await env.call_tool(call["function"]["name"], **json.loads(call["function"]["arguments"]))
        return {"tools": [t.name for t in tools], "schemas": [t.input_schema for t in tools], "result": result}


async def mcp_over_http(base_url, seed, actions):
    """The HTTP path: MCPToolClient in production mode (openenv/session/create,
    tools/list and tools/call on POST /mcp, in one session), the session's
    episode reset with a seed and finished by POST /step with its session id;
    and OpenEnv's stateless HTTP endpoints, answers validated with
    openenv-core's own response models."""
    out = {"call_results": []}
    async with httpx.AsyncClient(base_url=base_url) as http:
        out["health"] = HealthResponse.model_validate((await http.get("/health")).json()).status.value
        schema = SchemaResponse.model_validate((await http.get("/schema")).json())
        out["schema_has_tools"] = "get_reservation_details" in json.dumps(schema.action)
        meta = EnvironmentMetadata.model_validate((await http.get("/metadata")).json())
        out["metadata_name"] = meta.name
        r = ResetResponse.model_validate((await http.post("/reset", json={"seed": seed})).json())
        out["stateless_reset_user"] = r.observation["messages"][1]["content"]
        st = State.model_validate((await http.get("/state")).json())
        out["stateless_state_episode"] = st.episode_id

        client = MCPToolClient(base_url=base_url)
        client.use_production_mode = True
        try:
            sid = await client._ensure_production_session()
            out["session_id"] = sid
            r = ResetResponse.model_validate((await http.post("/reset", json={"seed": seed, "session_id": sid})).json())
            out["reset_user"] = r.observation["messages"][1]["content"]
            tools = await client.list_tools(use_cache=False)
            out["tools"] = [t.name for t in tools]
            for a in actions[:-1]:
                for c in a["tool_calls"]:
                    res = await client.call_tool(c["function"]["name"], **json.loads(c["function"]["arguments"]))
                    out["call_results"].append(res)
            resp = await http.post("/step", json={"action": actions[-1], "session_id": sid})
            final = StepResponse.model_validate(resp.json())
            out["done"] = final.done
            out["reward"] = final.reward
            out["components"] = final.observation.get("reward_components")
            out["episode_id"] = final.observation["episode_id"]
            st = State.model_validate((await http.get("/state", params={"session_id": sid})).json())
            out["state_reward"] = st.model_dump().get("reward")
            try:
                await client.call_tool("book_flight", flight="x")
                out["unknown_tool"] = "no error"
            except RuntimeError as e:
                out["unknown_tool"] = str(e)
        finally:
            await client.close()
        bad = (await http.post("/step", json={"action": "not an object"}))
        out["bad_step_status"] = bad.status_code
        out["bad_step_code"] = bad.json().get("code")
    return out


def main():
    cfg = json.loads(open(sys.argv[1]).read())
    base = cfg["base_url"]
    result = {
        "ws": websocket_episode(base, cfg["ws_seed"], cfg["ws_actions"]),
        "mcp_ws": asyncio.run(mcp_over_ws(base, cfg["ws_seed"], cfg["ws_actions"][0]["tool_calls"][0])),
        "http": asyncio.run(mcp_over_http(base, cfg["http_seed"], cfg["http_actions"])),
    }
    # Without the token (the URL's password removed): refused.
    plain = base.replace(cfg["userinfo"] + "@", "")
    try:
        with GenericEnvClient(base_url=plain).sync() as env:
            env.reset(seed=1)
        result["no_token"] = "accepted"
    except Exception as e:  # the handshake fails with HTTP 401
        result["no_token"] = type(e).__name__ + ": " + str(e)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
