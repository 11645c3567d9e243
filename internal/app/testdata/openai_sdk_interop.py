"""Drives trace's routing proxy with the OpenAI Python SDK.

Run by TestRouteRoleOpenAIPythonSDK (route_sdk_test.go) with the python of
a venv holding openai 3.63.0 (TRACE_OPENAI_PYTHON). Input (argv[1], JSON):
the proxy's API root (base_url, ending in /v1), the router's own token
(router_token), the upstream's key (upstream_key) and the environment
(environment). The SDK is used as an agent uses it: api_key is the
upstream's key (sent as Authorization, which the proxy passes on), the
router's token and the environment go in default_headers (X-Trace-Token,
X-Trace-Environment). Output: one JSON object on the last line of stdout
with what the SDK saw and the exact bodies it sent (recorded by an httpx
event hook, nothing else changed); the Go side compares them with what the
upstream received and with route_decisions.
"""

import json
import sys

import openai

MODEL = "gpt-4o-mini"  # any name: the proxy replaces it
SYSTEM = {"role": "system", "content": "You are an airline agent."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_booking",
            "description": "Look a booking up by its id.",
            "parameters": {"type": "object", "properties": {"booking_id": {"type": "string"}}, "required": ["booking_id"]},
        },
    }
]


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    sent = []  # the body of every request the SDK sent, in order

    def record(request):
        sent.append(request.content.decode())

    http_client = openai.DefaultHttpxClient(event_hooks={"request": [record]})
    client = openai.OpenAI(
        base_url=cfg["base_url"],
        api_key=cfg["upstream_key"],
        default_headers={"X-Trace-Token": cfg["router_token"], "X-Trace-Environment": cfg["environment"]},
        http_client=http_client,
        max_retries=0,  # each error is observed once, as the upstream sent it
    )
    conv = {"X-Trace-Conversation-Id": "sdk-1"}
    out = {"version": openai.__version__, "steps": []}

    def step(name, fn):
        n = len(sent)
        obs = {"name": name}
        try:
            obs.update(fn())
        except openai.APIStatusError as e:
            obs["error"] = {"class": type(e).__name__, "status": e.status_code, "message": e.message,
                            "body": e.body, "adapter": e.response.headers.get("x-trace-adapter")}
        obs["sent"] = sent[n:]
        out["steps"].append(obs)

    def user(text):
        return [SYSTEM, {"role": "user", "content": text}]

    # 1. Not streamed: content and usage parsed into the SDK's types.
    def plain():
        c = client.chat.completions.create(model=MODEL, messages=user("change my flight"), temperature=0.3, seed=7,
                                           extra_headers=conv)
        return {"content": c.choices[0].message.content, "finish_reason": c.choices[0].finish_reason,
                "usage": {"prompt": c.usage.prompt_tokens, "completion": c.usage.completion_tokens, "total": c.usage.total_tokens}}

    step("plain", plain)

    # 2. Streamed: the chunks as the SDK iterates them, reassembled.
    def streamed():
        s = client.chat.completions.create(model=MODEL, messages=user("stream it"), stream=True, extra_headers=conv)
        deltas, finish = [], None
        for chunk in s:
            if chunk.choices:
                if chunk.choices[0].delta.content is not None:
                    deltas.append(chunk.choices[0].delta.content)
                finish = chunk.choices[0].finish_reason or finish
        return {"deltas": deltas, "content": "".join(deltas), "finish_reason": finish}

    step("stream", streamed)

    # 3. A tool call parsed into message.tool_calls.
    def tool():
        c = client.chat.completions.create(model=MODEL, messages=user("look up booking ABC123"), tools=TOOLS,
                                           tool_choice="auto", extra_headers=conv)
        m = c.choices[0].message
        return {"content": m.content, "finish_reason": c.choices[0].finish_reason,
                "tool_calls": [{"id": t.id, "type": t.type, "name": t.function.name, "arguments": json.loads(t.function.arguments)}
                               for t in m.tool_calls or []]}

    step("tool", tool)

    # 4. with_raw_response: the proxy's headers, and the parsed completion.
    def raw():
        r = client.chat.completions.with_raw_response.create(model=MODEL, messages=user("raw please"), extra_headers=conv)
        c = r.parse()
        return {"status": r.status_code, "adapter": r.headers.get("x-trace-adapter"), "decision": r.headers.get("x-trace-decision-id"),
                "model_header": r.headers.get("x-trace-model"), "conversation": r.headers.get("x-trace-conversation-id"),
                "content": c.choices[0].message.content}

    step("raw", raw)

    # 5. The header and metadata.conversation_id both: the header wins.
    def both():
        r = client.chat.completions.with_raw_response.create(model=MODEL, messages=user("which id"), extra_headers=conv,
                                                             metadata={"conversation_id": "sdk-meta-ignored"})
        return {"conversation": r.headers.get("x-trace-conversation-id"), "content": r.parse().choices[0].message.content}

    step("header_and_metadata", both)

    # 6. metadata.conversation_id alone names the conversation.
    def meta():
        r = client.chat.completions.with_raw_response.create(model=MODEL, messages=user("metadata only"),
                                                             metadata={"conversation_id": "sdk-meta"})
        return {"conversation": r.headers.get("x-trace-conversation-id"), "adapter": r.headers.get("x-trace-adapter"),
                "content": r.parse().choices[0].message.content}

    step("metadata", meta)

    # 7, 8. The upstream's errors as the SDK's typed exceptions.
    step("rate_limited", lambda: {"content": client.chat.completions.create(model=MODEL, messages=user("rate limit me"), extra_headers=conv).choices[0].message.content})
    step("bad_request", lambda: {"content": client.chat.completions.create(model=MODEL, messages=user("bad request"), extra_headers=conv).choices[0].message.content})

    # 9. Without the router's token: the proxy's own 401.
    anon = openai.OpenAI(base_url=cfg["base_url"], api_key=cfg["upstream_key"], max_retries=0,
                         http_client=openai.DefaultHttpxClient(event_hooks={"request": [record]}))
    step("no_token", lambda: {"content": anon.chat.completions.create(model=MODEL, messages=user("no token"), extra_headers=conv).choices[0].message.content})

    # 10. Routed to an adapter the upstream does not serve (404): the base
    # model answers, a normal completion for the SDK.
    def fallback():
        r = client.chat.completions.with_raw_response.create(model=MODEL, messages=user("fallback please"),
                                                             extra_headers={"X-Trace-Conversation-Id": "sdk-fb"})
        c = r.parse()
        return {"status": r.status_code, "adapter": r.headers.get("x-trace-adapter"), "model_header": r.headers.get("x-trace-model"),
                "content": c.choices[0].message.content}

    step("fallback", fallback)

    # 11. Streamed with stream_options include_usage, as agents stream to
    # count tokens: the last chunk has no choices and the usage.
    def streamed_usage():
        s = client.chat.completions.create(model=MODEL, messages=user("stream with usage"), stream=True,
                                           stream_options={"include_usage": True}, extra_headers=conv)
        deltas, finish, chunks = [], None, []
        for chunk in s:
            chunks.append(chunk)
            if chunk.choices:
                if chunk.choices[0].delta.content is not None:
                    deltas.append(chunk.choices[0].delta.content)
                finish = chunk.choices[0].finish_reason or finish
        last = chunks[-1]
        u = last.usage
        return {"deltas": deltas, "content": "".join(deltas), "finish_reason": finish, "chunks": len(chunks),
                "last_choices": len(last.choices), "usage_chunks": sum(1 for c in chunks if c.usage is not None),
                "usage": {"prompt": u.prompt_tokens, "completion": u.completion_tokens, "total": u.total_tokens} if u else None}

    step("stream_usage", streamed_usage)

    # 12, 13. Not chat: the upstream's other paths pass through unrouted,
    # so the application's one client serves its model list and embeddings.
    step("models", lambda: {"models": [m.id for m in client.models.list()]})

    def embed():
        e = client.embeddings.create(model="embed-1", input=["change my flight"], encoding_format="float")
        return {"model": e.model, "dims": len(e.data[0].embedding), "status": 200}

    step("embeddings", embed)

    print(json.dumps(out))


if __name__ == "__main__":
    main()
