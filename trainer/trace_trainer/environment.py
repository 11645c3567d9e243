"""Playing a trace environment through its OpenEnv server with
openenv-core's GenericEnvClient, and the environment class TRL's
GRPOTrainer(environment_factory=...) instantiates: one public method per
tool of the environment (generated from the server's OpenAI function
schemas, so that TRL renders the same schemas into the prompt), reset()
starting the server-side episode of the row's seed."""

import json
import keyword
import os
import threading
import urllib.parse

from openenv.core.generic_client import GenericEnvClient

_PY_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list", "object": "dict"}


def env_url(job: dict) -> str:
    """The job's environment URL, with the bearer token (env_server.token_env
    names the variable holding it) as the URL's password: openenv's
    WebSocket client sets no headers, and trace's server takes Basic auth."""
    es = job["env_server"]
    url = es["base_url"]
    name = es.get("token_env")
    if name:
        token = os.environ.get(name)
        if not token:
            raise ValueError(f"env_server.token_env: the environment variable {name} is not set")
        u = urllib.parse.urlsplit(url)
        # The host and port as written (an IPv6 host keeps its brackets),
        # any user info in the URL replaced.
        netloc = "trace:" + urllib.parse.quote(token, safe="") + "@" + u.netloc.rpartition("@")[2]
        url = urllib.parse.urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))
    return url


class Session:
    """One WebSocket session on the environment (openenv-core's sync client)."""

    def __init__(self, url: str):
        self.client = GenericEnvClient(base_url=url).sync()
        self.client.connect()

    def reset(self, seed: int, hint: bool = False):
        kw = {"seed": int(seed)}
        if hint:
            kw["hint"] = True
        return self.client.reset(**kw)

    def step(self, action: dict):
        return self.client.step(action)

    def close(self):
        try:
            self.client.close()
        except Exception:
            pass


def start_of(url: str, seed: int, hint: bool) -> dict:
    """The episode's start for seed (system prompt, user request, tools), by a
    reset that is never finished (trace records finished episodes only)."""
    s = Session(url)
    try:
        r = s.reset(seed, hint)
        return {"messages": r.observation["messages"], "tools": r.observation["tools"]}
    finally:
        s.close()


class EpisodeLog:
    """What the trainer saw of every episode it finished: its id on the
    server, seed, hint, the tool calls the model made, the reward. Written
    as JSON lines (the smoke test compares it with ClickHouse env_episodes)."""

    def __init__(self, path: str | None):
        self.path = path
        self.lock = threading.Lock()
        self.rows = []
        self.phase = "train"
        self.step = 0

    def add(self, row: dict):
        row = {"phase": self.phase, "step": self.step, **row}
        with self.lock:
            self.rows.append(row)
            if self.path:
                with open(self.path, "a") as f:
                    f.write(json.dumps(row) + "\n")

    def since(self, n: int) -> list:
        with self.lock:
            return self.rows[n:]


def _doc_text(s: str) -> str:
    """s inside a triple-quoted docstring, verbatim: descriptions come from
    programs and rollouts, and a backslash ("C:\\Users", a trailing one)
    or a closing quote made the method a SyntaxError."""
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _method_source(tool: dict) -> tuple[str, str]:
    """Python source of one tool method: typed parameters and a Google-style
    docstring, from which transformers rebuilds the tool's JSON schema."""
    fn = tool["function"]
    name = fn["name"]
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_") or name in ("reset", "get_reward"):
        raise ValueError(f"tool name {name!r} cannot be a Python method")
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    args, docs, names = [], [], []
    for p in sorted(props, key=lambda p: p not in required):  # required first
        if not p.isidentifier() or keyword.iskeyword(p):
            raise ValueError(f"tool {name}: parameter {p!r} cannot be a Python argument")
        spec = props[p]
        t = _PY_TYPES.get(spec.get("type"), "str")
        args.append(f"{p}: {t}" if p in required else f"{p}: {t} = None")
        desc = _doc_text((spec.get("description") or p).replace("\n", " "))
        docs.append(f"            {p}: {desc}")
        names.append(p)
    desc = _doc_text(fn.get("description") or name)
    call = ", ".join(f"{n!r}: {n}" for n in names)
    src = f'''
def {name}(self{", " if args else ""}{", ".join(args)}) -> str:
    """{desc}

    Args:
{chr(10).join(docs) if docs else "        (none)"}
    """
    return self._call({name!r}, {{{call}}})
'''
    if not docs:  # a docstring without Args is what transformers expects for no parameters
        src = f'''
def {name}(self) -> str:
    """{desc}"""
    return self._call({name!r}, {{}})
'''
    return name, src


class _EnvBase:
    # The class's own state is private (a leading underscore, which no tool
    # name has): every public name of it is the name of a tool, and a tool
    # named url, log, seed or result would replace it or be shadowed by it.
    _url = ""
    _log = None

    def __init__(self):
        self._session = Session(self._url)
        self._result = None
        self._seed = None
        self._hinted = False
        self._tool_calls = 0
        self._tool_errors = 0
        self._n = 0

    def reset(self, **row):
        """Starts the row's episode on the server. The prompt is the row's
        (built from the same seed), so nothing is appended to it."""
        self._seed, self._hinted = int(row["seed"]), bool(row.get("hinted", False))
        self._result = self._session.reset(self._seed, self._hinted)
        self._tool_calls = self._tool_errors = 0
        return None

    def _call(self, name, args):
        args = {k: v for k, v in args.items() if v is not None}
        self._n += 1
        self._tool_calls += 1
        if self._result is not None and self._result.done:
            self._tool_errors += 1
            return "Error: the episode is over"
        action = {"role": "assistant", "content": "",
                  "tool_calls": [{"id": f"call_{self._n}", "type": "function", "function": {"name": name, "arguments": args}}]}
        try:
            self._result = self._session.step(action)
        except RuntimeError as e:  # a protocol error (unknown tool, arguments off the schema): the episode lives on
            self._tool_errors += 1
            return f"Error: {e}"
        return self._result.observation.get("last_tool_result") or ""

    def _finish(self, final_text: str) -> float:
        """Ends the episode with the model's final answer and returns the
        environment's reward (trace computes it; the trainer never does)."""
        if self._result is None:
            raise RuntimeError("finish before reset")
        if not self._result.done:
            self._result = self._session.step({"role": "assistant", "content": final_text or ""})
        reward = float(self._result.reward or 0.0)
        obs = self._result.observation
        if self._log is not None:
            self._log.add({"episode_id": obs.get("episode_id"), "seed": self._seed, "hinted": self._hinted,
                          "tool_calls": self._tool_calls, "tool_errors": self._tool_errors, "reward": reward,
                          "components": obs.get("reward_components"), "done_reason": obs.get("done_reason")})
        return reward


def environment_class(url: str, tools: list, log: EpisodeLog):
    """A class with one method per tool of the environment, for TRL's
    environment_factory."""
    ns = {}
    methods = {"_url": url, "_log": log}
    for tool in tools:
        name, src = _method_source(tool)
        exec(src, ns)  # generated from the server's schema, names checked above
        methods[name] = ns[name]
    return type("TraceEnvironment", (_EnvBase,), methods)


def final_text(completion) -> str:
    """The model's final answer: the content of the last assistant message
    without tool calls (TRL's conversational completion)."""
    if isinstance(completion, str):
        return completion
    for m in reversed(completion):
        if m.get("role") == "assistant":
            if m.get("tool_calls"):
                return ""  # cut off while calling tools: no final answer
            c = m.get("content") or ""
            return c if isinstance(c, str) else " ".join(p.get("text", "") for p in c if isinstance(p, dict))
    return ""
