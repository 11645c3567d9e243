"""Connects openenv-core's GenericEnvClient to an environment at capacity.

Run by TestOpenEnvCapacityInterop (interop_test.go): argv[1] is the
environment's base URL, whose one session is held. For each delay between
connecting and the reset (at once, as `with client:` then `reset()` does;
and a while after), what the reset raised, as one JSON object on stdout.
"""

import json
import sys
import time

from openenv.core.generic_client import GenericEnvClient


def main():
    out = {}
    for delay in (0, 0.3):
        env = GenericEnvClient(base_url=sys.argv[1]).sync()
        try:
            env.connect()
            time.sleep(delay)
            env.reset(seed=1)
            out[str(delay)] = "no error"
        except Exception as e:
            out[str(delay)] = f"{type(e).__name__}: {e}"
        finally:
            try:
                env.close()
            except Exception:
                pass
    print(json.dumps(out))


if __name__ == "__main__":
    main()
