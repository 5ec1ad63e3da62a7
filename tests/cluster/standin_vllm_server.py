"""A stand-in for vLLM's API server (`python -m vllm.entrypoints.openai.api_server`), run in its place by the fast
tests of cluster/vllm_servers.py: it takes the same command line (it reads `--uds`, or `--host`/`--port`, and
ignores the rest) and answers the routes a VLLMServerPool calls, with canned completions stamped with the version
label it was given. `GET /standin/calls` lists the /collective_rpc calls it received."""

from __future__ import annotations

import argparse
import sys

import uvicorn
from fastapi import FastAPI, Request

state: dict = {"version": "default", "calls": []}
app = FastAPI()


@app.get("/health")
async def health():
    return {}


@app.post("/collective_rpc")
async def collective_rpc(request: Request):
    body = await request.json()
    state["calls"].append(body)
    return {"results": [None]}


@app.get("/standin/calls")
async def calls():
    return state["calls"]


@app.post("/pause")
@app.post("/resume")
@app.post("/reset_prefix_cache")
async def control():
    return {}


@app.post("/update_weight_version")
async def update_weight_version(request: Request):
    state["version"] = (await request.json())["new_version"]
    return {}


@app.get("/weight_info")
async def weight_info():
    return {"weight_version": state["version"]}


@app.post("/inference/v1/generate")
async def generate(request: Request):
    sp = (await request.json())["sampling_params"]
    k = max(1, min(int(sp["max_tokens"]), 3))
    version = state["version"]
    return {
        "choices": [
            {
                "index": i,
                "token_ids": list(range(1, k + 1)),
                "logprobs": {"content": [{"logprob": -0.5}] * k},
                "weight_versions": [{"start": 0, "end": k, "version": version}],
                "finish_reason": "length",
                "text": "x" * k,
            }
            for i in range(int(sp["n"]))
        ]
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--uds")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args, _ = p.parse_known_args(argv)
    if args.uds:
        uvicorn.run(app, uds=args.uds, log_level="warning")
    else:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv[1:])
