"""``python -m gateway.testing.engine``: generate a model, or serve it behind the adapter.

``--kind chat`` (the default) serves a generated Llama (``--model-size``);
``--kind image`` a generated FLUX and ``--kind speech`` a generated Dia + DAC
(``mediagen.py``), one model per adapter, as ``mistralrs serve diffusion``
and ``serve speech`` serve one.

``serve`` prints ``listening on http://127.0.0.1:PORT model=<path>`` once the
model is loaded and the socket is bound (tests poll for that line), and runs
until SIGTERM or SIGINT. The engine's own log goes to stdout too; it is set to
warnings unless ``RUST_LOG`` says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

from gateway.testing.engine import mediagen, modelgen

READY_PREFIX = "listening on http://"
KINDS = ("chat", "image", "speech")  # engine.KINDS (engine.py imports mistralrs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.testing.engine",
        description="An adapter around the mistral.rs engine (test equipment) "
        "serving a generated random-weight model.",
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    generate = verbs.add_parser("generate", help="generate a model; print its folder")
    generate.add_argument("--kind", choices=KINDS, default="chat")
    generate.add_argument("--size", choices=sorted(modelgen.SIZES), default="tiny")
    generate.add_argument("--cache", help=f"models folder (default ${modelgen.CACHE_ENV})")
    serve = verbs.add_parser("serve", help="serve a model on loopback")
    serve.add_argument("--kind", choices=KINDS, default="chat")
    serve.add_argument("--model-size", choices=sorted(modelgen.SIZES), default="tiny")
    serve.add_argument("--cache", help=f"models folder (default ${modelgen.CACHE_ENV})")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0: any free port")
    serve.add_argument("--keepalive-ms", type=float, default=10_000)
    serve.add_argument("--max-seqs", type=int, default=8)
    serve.add_argument(
        "--approval-timeout-s",
        type=float,
        default=300.0,  # the server's APPROVAL_TIMEOUT (agents.DEFAULT_APPROVAL_TIMEOUT_S)
        help="how long an agentic approval is waited for",
    )
    args = parser.parse_args(argv)
    if args.verb == "generate":
        if args.kind == "image":
            print(mediagen.ensure_image(args.cache).root, flush=True)
        elif args.kind == "speech":
            print(mediagen.ensure_speech(args.cache).root, flush=True)
        else:
            print(modelgen.ensure_model(args.size, args.cache), flush=True)
        return 0
    return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    os.environ.setdefault("RUST_LOG", "warn")
    os.environ["HF_HUB_OFFLINE"] = "1"  # never the Hub: everything the engine reads is local
    dac = None
    if args.kind == "image":
        image = mediagen.ensure_image(args.cache)
        # The engine reads FLUX's text encoders from this planted hub cache, offline.
        os.environ["HF_HUB_CACHE"] = str(image.hf_cache)
        folder = image.model_dir
    elif args.kind == "speech":
        speech = mediagen.ensure_speech(args.cache)
        folder, dac = speech.model_dir, speech.dac_dir
    else:
        folder = modelgen.ensure_model(args.model_size, args.cache)
    # mistralrs is imported only now, with the environment above in place.
    from gateway.testing.engine.adapter import Adapter
    from gateway.testing.engine.agents import AgentDesk
    from gateway.testing.engine.engine import Engine

    desk = AgentDesk(approval_timeout_s=args.approval_timeout_s)
    engine = Engine(folder, kind=args.kind, dac=dac, max_seqs=args.max_seqs, desk=desk)
    adapter = Adapter(engine, host=args.host, port=args.port, keepalive_ms=args.keepalive_ms)

    async def run() -> None:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            if task is not None:
                loop.add_signal_handler(signum, task.cancel)
        await adapter.start()
        print(f"{READY_PREFIX}{args.host}:{adapter.port} model={folder}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await adapter.close()

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(run())
    engine.close()
    sys.stdout.flush()
    return 0
