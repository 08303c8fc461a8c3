"""OpenAI-compatible HTTP server: `specfold serve --model PATH [decode flags]`.

Endpoints: GET /v1/models, POST /v1/completions, POST /v1/chat/completions (non-streaming and
`stream: true` as server-sent events with one chunk per request, since a diffusion block is decided
as a whole). Request fields map onto DecodeParams (`max_tokens`, `temperature`, `seed`, plus the
specfold fields `method`, `rule`, `threshold`, `block_size`, ... passed through as extra body fields).
Decoding runs one request at a time behind a lock, in a worker thread. Unknown or impossible fields
answer 400 with the engine's message. Needs the `serve` extra (fastapi, uvicorn).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import threading
import time
import uuid

from specfold.errors import SpecfoldError
from specfold.params import DecodeParams

_PASSTHROUGH = {f.name for f in dataclasses.fields(DecodeParams)} - {"max_new_tokens", "chat_template"}


def _params(base: DecodeParams, body: dict, chat: bool) -> DecodeParams:
    kw = {k: body[k] for k in _PASSTHROUGH if k in body}
    if body.get("max_tokens") is not None:
        kw["max_new_tokens"] = int(body["max_tokens"])
    return dataclasses.replace(base, chat_template=chat, **kw)


def create_app(llm, base: DecodeParams, model_name: str):
    from fastapi import FastAPI, HTTPException
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    app = FastAPI(title="specfold")
    lock = threading.Lock()

    def run(prompt, params):
        with lock:
            return llm.generate([prompt], params)[0]

    def usage(out) -> dict:
        return {"prompt_tokens": len(out.prompt_token_ids), "completion_tokens": len(out.token_ids),
                "total_tokens": len(out.prompt_token_ids) + len(out.token_ids),
                "specfold": out.stats.to_dict()}

    async def decode(body: dict, chat: bool):
        try:
            params = _params(base, body, chat)
            if chat:
                msgs = body.get("messages")
                if not isinstance(msgs, list) or not msgs:
                    raise SpecfoldError("'messages' must be a non-empty list")
                if llm.tokenizer is None:
                    raise SpecfoldError("this checkpoint has no tokenizer: chat is unavailable")
                prompt = llm.tokenizer.apply_chat_template(msgs)
                params = dataclasses.replace(params, chat_template=False)
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                    prompt = prompt[0]
                if not prompt:
                    raise SpecfoldError("'prompt' must be a non-empty string or list of token ids")
            return await run_in_threadpool(run, prompt, params)
        except (SpecfoldError, TypeError, ValueError) as e:
            raise HTTPException(status_code=400, detail=str(e)) from None

    def respond(out, chat: bool, stream: bool):
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        created = int(time.time())
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": out.text},
                      "finish_reason": out.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": out.text, "finish_reason": out.finish_reason}
            obj = "text_completion"
        body = {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice],
                "usage": usage(out)}
        if not stream:
            return JSONResponse(body)
        if chat:
            chunk_choice = {"index": 0, "delta": {"role": "assistant", "content": out.text},
                            "finish_reason": out.finish_reason}
            body = dict(body, object="chat.completion.chunk", choices=[chunk_choice])

        def events():
            yield f"data: {json.dumps(body)}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "specfold"}]}

    @app.post("/v1/completions")
    async def completions(body: dict):
        out = await decode(body, chat=False)
        return respond(out, False, bool(body.get("stream")))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: dict):
        out = await decode(body, chat=True)
        return respond(out, True, bool(body.get("stream")))

    return app


def cmd_serve(a: argparse.Namespace) -> int:
    import uvicorn

    from specfold.cli import llm_from_args, params_from_args
    llm = llm_from_args(a)
    app = create_app(llm, params_from_args(a), a.served_model_name or str(a.model))
    uvicorn.run(app, host=a.host, port=a.port, log_level="info")
    return 0


def register(sub) -> None:
    from specfold.cli import add_decode_args, add_model_args
    p = sub.add_parser("serve", help="OpenAI-compatible server (/v1/completions, /v1/chat/completions)")
    add_model_args(p)
    add_decode_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.set_defaults(func=cmd_serve)
