"""``python -m gateway.testing.simulator`` / ``mistralrs-gateway simulator``.

Flags map onto the :class:`~server.Simulator` constructor (the knobs are
described in knobs.py):

* routes: ``--model-id ID`` a chat route, ``--embeddings-model ID``,
  ``--image-model ID`` (``/v1/images/generations``), ``--speech-model ID``
  (``/v1/audio/speech``); each may repeat, in any mix, and the first given is
  the default route;
* answers: ``--chunks``, ``--delay-ms``, ``--first-delay-ms``,
  ``--keepalive-ms``, ``--reasoning``, ``--dims``; ``--text TEXT`` makes every
  answer that text instead of the labelled filler (e.g. JSON that satisfies a
  ``response_format`` schema); ``--tool-name NAME`` ends every answer in a call
  of that tool, with ``--tool-arguments JSON`` (default ``{"q":1}``);
* agentic chat: ``--agent PLAN`` the tool each round calls (agent_plan.py:
  ``web:QUERY,url:URL,python[:CODE],mcp:NAME,tool:NAME,file[:read|list],shell[:CMD]``)
  on a request the worker runs agentically, ``--agent-permission`` the
  worker's own ``auto|ask|deny``, ``--files N``, ``--file-bytes N``,
  ``--file-mime TYPE`` the files each approved round produces,
  ``--approval-timeout-s`` how long an approval is waited for;
* ``--id-seed``, ``--no-directives``, ``--host`` (loopback only), ``--port``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from typing import Any

from gateway.testing.simulator.knobs import DEFAULT_MODEL_ID, PERMISSIONS
from gateway.testing.simulator.server import Simulator, loop_factory

_DEFAULT = " (default: %(default)s)"


class _Route(argparse.Action):
    """Append ``(model id, kind)`` to ``routes``, so the order of mixed flags is kept."""

    def __init__(self, option_strings: Sequence[str], dest: str, kind: str, **kw: Any) -> None:
        super().__init__(option_strings, "routes", **kw)
        self.kind = kind

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        routes = list(getattr(namespace, "routes", None) or [])
        routes.append((values, self.kind))
        namespace.routes = routes


def build_parser(prog: str = "python -m gateway.testing.simulator") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="mistral.rs protocol simulator (test equipment; generates no real text)",
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="loopback address to bind" + _DEFAULT)
    add("--port", type=int, default=0, help="port to listen on (0: any free port)" + _DEFAULT)
    add(
        "--model-id",
        action=_Route,
        kind="chat",
        metavar="ID",
        help=f"a route to serve; repeat for several, the first is the default "
        f"(default: {DEFAULT_MODEL_ID})",
    )
    for kind, what in (
        ("embeddings", "an embeddings-only route"),
        ("image", "an image route (a diffusion model: /v1/images/generations)"),
        ("speech", "a speech route (/v1/audio/speech)"),
    ):
        add(f"--{kind}-model", action=_Route, kind=kind, metavar="ID", help=what + "; may repeat")
    add("--chunks", type=int, default=8, help="text chunks per answer" + _DEFAULT)
    add("--delay-ms", type=float, default=0.0, help="pause between chunks" + _DEFAULT)
    add(
        "--keepalive-ms",
        type=float,
        default=10_000.0,
        help="idle time before a keep-alive" + _DEFAULT,
    )
    add("--first-delay-ms", type=float, default=0.0, help="pause before the first chunk" + _DEFAULT)
    add("--reasoning", type=int, default=0, help="reasoning chunks before the text" + _DEFAULT)
    add("--dims", type=int, default=8, help="embedding dimensions" + _DEFAULT)
    add("--text", default=None, help="every answer's text, cut into --chunks pieces (e.g. JSON)")
    add("--tool-name", default=None, metavar="NAME", help="end every answer in a call of NAME")
    add(
        "--tool-arguments",
        default='{"q":1}',
        metavar="JSON",
        help="the arguments of that call" + _DEFAULT,
    )
    add(
        "--agent",
        default="",
        metavar="PLAN",
        help="the tool of each round of an agentic chat request: "
        "web:QUERY,url:URL,python[:CODE],mcp:NAME,tool:NAME,file[:read|list],shell[:CMD]",
    )
    add(
        "--agent-permission",
        choices=sorted(PERMISSIONS),
        default="auto",
        help="the worker's own --agent-permission" + _DEFAULT,
    )
    add("--files", type=int, default=0, help="files each approved round produces" + _DEFAULT)
    add("--file-bytes", type=int, default=1024, help="size of each file" + _DEFAULT)
    add("--file-mime", default="image/png", help="declared type of the files" + _DEFAULT)
    add(
        "--approval-timeout-s",
        type=float,
        default=300.0,
        help="how long an approval is waited for" + _DEFAULT,
    )
    add("--id-seed", type=int, default=None, help="seed of the Responses ids (default: random)")
    add("--no-directives", action="store_true", help="ignore [[sim ...]] directives")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = build_parser(prog) if prog else build_parser()
    args = parser.parse_args(argv)
    try:
        sim = Simulator(
            host=args.host,
            port=args.port,
            model_ids=getattr(args, "routes", None) or [DEFAULT_MODEL_ID],
            chunks=args.chunks,
            delay_ms=args.delay_ms,
            keepalive_ms=args.keepalive_ms,
            first_delay_ms=args.first_delay_ms,
            reasoning=args.reasoning,
            dims=args.dims,
            text=args.text,
            tool_call=args.tool_name is not None,
            tool_name=args.tool_name,
            tool_arguments=args.tool_arguments,
            agent=args.agent,
            agent_permission=args.agent_permission,
            files=args.files,
            file_bytes=args.file_bytes,
            file_mime=args.file_mime,
            approval_timeout_s=args.approval_timeout_s,
            id_seed=args.id_seed,
            directives=not args.no_directives,
        )
    except ValueError as exc:
        print(f"simulator: {exc}", file=sys.stderr)
        return 2

    async def run() -> None:
        bound = await sim._bind()
        print(f"simulator listening on {sim.base_url}", flush=True)
        serving = asyncio.ensure_future(sim._serve(*bound))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, serving.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serving

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(run())
    return 0
