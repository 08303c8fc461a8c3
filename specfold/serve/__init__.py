"""OpenAI-compatible HTTP server on the engine: `specfold serve --model PATH [engine flags]`.

- protocol.py: request validation, error bodies, response and chunk shapes (no FastAPI);
- runner.py: the engine thread (steps the Engine continuously) and the queues to the handlers;
- app.py: the FastAPI app (/v1/models, /v1/completions, /v1/chat/completions, /health, /metrics);
- limits.py: the body cap, the character bound on prompts, tokenization with the GIL released;
- auth.py: `--api-key` (a plain ASGI middleware on /v1/*);
- metrics.py: the Prometheus series of /metrics (one registry per app).

The engine (method, draft policy, graph, branches, δ, backend, scheduler limits) is fixed by CLI flags
when the server starts; clients choose only what a request may choose (see protocol.py and
docs/SERVING.md). Needs the `serve` extra (fastapi, uvicorn, prometheus-client), imported only when
the server runs.
"""
from __future__ import annotations

import argparse
import os
import sys

from specfold.errors import SpecfoldError
from specfold.extras import require


# SamplingParams fields without a server flag: a request chooses them (a seed is drawn when it gives
# none), the chat endpoint applies the template, stop tokens are the model's; --max-new-tokens and
# --temperature are the defaults of requests that give none (protocol.SAMPLING_FIELDS maps the rest)
PER_REQUEST = ("seed", "stop", "stop_token_ids", "chat_template", "logprobs")


def create_app(*args, **kw):
    """`specfold.serve.app.create_app` (imports FastAPI)."""
    from specfold.serve.app import create_app as make
    return make(*args, **kw)



def api_key(a: argparse.Namespace) -> str | None:
    """--api-key, else $SPECFOLD_API_KEY, else None (no key); an empty key is refused."""
    key = a.api_key if a.api_key is not None else os.environ.get("SPECFOLD_API_KEY")
    if key is not None and not key.strip():
        raise SpecfoldError("the API key (--api-key or SPECFOLD_API_KEY) is empty; give a key or leave both unset")
    return key


def cmd_serve(a: argparse.Namespace) -> int:
    if not 0 <= a.port <= 65535:
        raise SpecfoldError(f"--port {a.port} is not a TCP port; accepted: 0-65535 (0 = any free port)")
    from specfold.args import engine_config_from_args, llm_from_args
    api_key(a)  # a bad key or bad engine flags fail before the model is loaded
    engine_config = engine_config_from_args(a)
    require("serve", "specfold serve")  # also when cmd_serve is called without the CLI's check
    import uvicorn

    from specfold.engine.engine import Engine
    from specfold.serve.app import ServeConfig
    llm = llm_from_args(a)
    engine = Engine(llm, engine_config)
    name = a.served_model_name or str(a.model)
    config = ServeConfig(model_name=name, max_tokens=a.max_new_tokens, temperature=a.temperature,
                         max_body_bytes=a.max_body_bytes, api_key=api_key(a))
    app = create_app(llm, engine, config)
    model = name if name == str(a.model) else f"{name} ({a.model})"
    about = f"{model}, method {engine.config.method}, rule {engine.config.rule}"

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if self.started:  # listening: the address is the bound one (--port 0 picks a free port)
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
                print(f"specfold serve: {about}, on {url}", file=sys.stderr, flush=True)

    # not uvicorn.run, which swallows Ctrl-C: after the graceful shutdown, uvicorn re-raises the
    # signal it caught, so Ctrl-C ends `specfold serve` as every command (130) and SIGTERM too (143)
    Server(uvicorn.Config(app, host=a.host, port=a.port, log_level=a.log_level)).run()
    return 0


def register(sub) -> None:
    from specfold.args import add_model_args, add_settings, positive_int
    from specfold.serve.limits import MAX_BODY_BYTES
    p = sub.add_parser("serve", help="OpenAI-compatible server (/v1/completions, /v1/chat/completions)",
                       description="Engine flags are fixed for the server's life; --max-new-tokens and "
                                   "--temperature are the defaults of requests that give none; a request "
                                   "without a seed gets a random one.")
    add_model_args(p)
    add_settings(p, exclude=PER_REQUEST)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--served-model-name", default=None, help="the `model` clients pass (default: --model as given)")
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    g.add_argument("--api-key", default=None, help="every /v1/* request needs 'Authorization: Bearer KEY' "
                   "(default: $SPECFOLD_API_KEY; unset: no key)")
    g.add_argument("--max-body-bytes", type=positive_int, default=MAX_BODY_BYTES,
                   help=f"larger request bodies get 413 before they are read (default {MAX_BODY_BYTES})")
    p.set_defaults(func=cmd_serve)
