"""``lightning-rl gateway serve``: run the OpenAI-compatible gateway as its own process.

Kept free of heavy imports: FastAPI, uvicorn, torch and transformers load only when the command
runs, so ``lightning-rl --help`` stays instant.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

__all__ = ["register", "TOKEN_ENV", "ADMIN_TOKEN_ENV"]

TOKEN_ENV = "LIGHTNING_GATEWAY_TOKEN"
ADMIN_TOKEN_ENV = "LIGHTNING_GATEWAY_ADMIN_TOKEN"


def register(subparsers: Any) -> None:
    """Add ``gateway serve`` to the ``lightning-rl`` parser."""
    gateway: argparse.ArgumentParser = subparsers.add_parser("gateway", help="Run the OpenAI-compatible gateway.")
    sub = gateway.add_subparsers(dest="gateway_command", required=True, metavar="GATEWAY_COMMAND")
    serve = sub.add_parser(
        "serve",
        help="Serve a model over the OpenAI API and record every call of a rollout to a store.",
        description="Serve a model over the OpenAI API. Agents use URL/v1 (not recorded) or "
        "URL/rollouts/ROLLOUT/attempts/ATTEMPT/key/KEY/v1 (recorded as llm.call spans in --store; KEY is the "
        "attempt's gateway_key, which the runner puts in the agent's base URL).",
    )
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model",
        help="'tiny' (the offline tiny model, built once and cached), 'smollm2-135m' (SmolLM2-135M-Instruct, "
        "extra smollm2), a .gguf file or a Hugging Face model folder.",
    )
    source.add_argument("--upstream-url", help="An OpenAI-compatible server to forward to (vLLM keeps tokens exact).")
    serve.add_argument("--upstream-api-key", help="API key for the upstream server.")
    serve.add_argument("--upstream-model", help="Upstream model name (default: its first model).")
    serve.add_argument("--store", help="Where to record calls: a store URL (http://…, postgresql://…) or SQLite path.")
    serve.add_argument("--host", default="127.0.0.1", help="Address to bind; anything but loopback needs --token.")
    serve.add_argument("--port", type=int, default=4748, help="Port to bind (0 picks a free one).")
    serve.add_argument("--token", help=f"Bearer token (API key) every request must carry (default: ${TOKEN_ENV}).")
    serve.add_argument("--store-token", help="Bearer token of an HTTP store (default: $LIGHTNING_STORE_TOKEN[_FILE]).")
    serve.add_argument("--device", help="Torch device of the embedded engine (default: cuda if available).")
    serve.add_argument("--max-n", type=int, default=16, help="Most choices per call.")
    serve.add_argument("--max-tokens", type=int, default=8192, help="Most completion tokens a client may ask for.")
    serve.add_argument(
        "--max-body-mb", type=float, default=16.0, help="Largest request body in MiB; larger ones get a 413 unread."
    )
    serve.add_argument("--weights-dir", help="The only folder POST /admin/weights may load weights files from.")
    serve.add_argument(
        "--admin-token-file",
        help=f"A file holding the token /admin/* requires (default: ${ADMIN_TOKEN_ENV}; unset: /admin/* is off). "
        "It must differ from the agents' --token.",
    )
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from lightning_rl.credentials import refuse_exposed_without_token
    from lightning_rl.extras import require_extra

    # Before anything is imported: a missing extra is one line naming the pip command.
    require_extra("server", *(["train"] if args.model else []), feature="lightning-rl gateway serve")
    token: str | None = args.token or os.environ.get(TOKEN_ENV) or None
    risk = "use the model and write spans into your rollouts"
    refuse_exposed_without_token(args.host, token, "the gateway", risk, f"Pass --token SECRET (or set {TOKEN_ENV})")
    from lightning_rl.gateway.server import run_server

    run_server(_run(args, token))
    return 0


def _engine(model: str, device: str | None) -> Any:
    """Load the embedded engine (heavy imports happen here)."""
    try:
        from lightning_rl.engine import hf
    except ImportError as exc:
        raise ImportError(
            "the embedded engine needs torch and transformers: pip install 'lightning-rl[train]'"
        ) from exc
    if model == "tiny":
        from lightning_rl.engine.tiny import default_tiny_model

        model = str(default_tiny_model())
    elif model == "smollm2-135m" or model.lower().endswith(".gguf"):
        pass  # located and converted once to a cached folder by from_pretrained (lightning_rl.engine.models)
    elif not os.path.isdir(model):
        raise ValueError(
            f"--model {model!r} is neither 'tiny', 'smollm2-135m', a .gguf file nor a folder holding a Hugging Face "
            "model."
        )
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return hf.TransformersEngine.from_pretrained(model, device=device)


async def _run(args: argparse.Namespace, token: str | None) -> None:
    import uvicorn

    from lightning_rl.gateway.app import GatewayConfig, create_gateway_app
    from lightning_rl.gateway.server import freeze_startup_heap, uvicorn_config
    from lightning_rl.gateway.upstreams import EngineBackend, GatewayBackend, UpstreamBackend

    store = None
    if args.store:
        from lightning_rl.credentials import STORE_TOKEN_ENV, resolve_token
        from lightning_rl.store import open_store

        store = await open_store(args.store, token=resolve_token(STORE_TOKEN_ENV, flag=args.store_token))
    backend: GatewayBackend
    if args.upstream_url:
        backend = UpstreamBackend(args.upstream_url, args.upstream_api_key, model=args.upstream_model)
    else:
        engine = await asyncio.to_thread(_engine, args.model, args.device)
        backend = EngineBackend(engine, owns_engine=True)
    config = GatewayConfig(
        max_n=args.max_n,
        max_tokens_limit=args.max_tokens,
        max_body_bytes=int(args.max_body_mb * 1024 * 1024),
        weights_dir=args.weights_dir,
    )
    admin_token = os.environ.get(ADMIN_TOKEN_ENV) or None
    if args.admin_token_file:
        with open(args.admin_token_file, encoding="utf-8") as f:
            admin_token = f.read().strip() or None
    app = create_gateway_app(backend, store=store, token=token, admin_token=admin_token, config=config)
    server = uvicorn.Server(uvicorn_config(app, args.host, args.port, log_level="info"))
    freeze_startup_heap()
    try:
        await server.serve()
    finally:
        if store is not None:
            await store.close()
