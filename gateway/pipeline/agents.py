"""One agentic request's run (spec §22): the gateway's authority over every tool call.

The pure core decides (``gateway/apis/agents``: the event machine, the
approval rules); this carries out what it decides, with the I/O it needs:

* The relay hands every agentic event to :meth:`AgentRun.note` as it is read.
  An approval request, and a file to keep, need I/O before the next event is
  read (the worker waits for the decision; a file is stored before the
  caller hears of it): ``note`` says so, the relay stops reading and awaits
  :meth:`AgentRun.act`, with the §8 idle and total timers paused.
* An approval: the rules (tool, domain, address), the name resolved when a
  fetch needs it (``hostlookup.py``, 2 s), then with ``approval: caller``
  the caller (``event: agent.approval_required`` under the gateway's own
  ``apr_`` id, decided through any replica, within ``approval_timeout_s``);
  then the decision is posted to the worker's ``/v1/agent/approvals/{id}``
  (the only worker admin route the gateway calls; never
  ``remember_for_session``) and told to the machine before the next event.
* A kept file: stored as the tenant's by digest, its type sniffed from its
  bytes, shown as ``event: agent.file`` under a ``file_`` id.
* When the caller goes away or ``max_run_s`` passes, :meth:`deny_pending`
  denies a pending approval at once (``by: cancel``) -- before the worker
  connection is closed (settle), so the worker stops rather than waits.

It keeps what the receipt's ``agent`` object, the non-stream answer's
``agent`` and the metrics say: every call with its decision, who decided,
why, the SHA-256 of its arguments as the worker sent them, and its duration
from ``calling`` to ``complete``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.apis.agents.events import AgentEvents, EventLimits
from gateway.apis.agents.files import FileProduced
from gateway.apis.agents.frames import approval_frame, file_frame, new_approval_id
from gateway.apis.agents.rules import AgentRules, Decision, decide, deny
from gateway.apis.agents.wire import ApprovalRequired, ToolCalling, ToolComplete
from gateway.apis.base import Plan
from gateway.config.agents import AgentFiles, PolicyAgents
from gateway.config.policy import Tenant
from gateway.core.errors import GatewayError
from gateway.observe.metrics import GatewayMetrics
from gateway.pipeline.services import CallerApprovals, Services, TenantFiles
from gateway.upstream.base import WorkerTransport
from gateway.upstream.table import Worker

log = logging.getLogger("gateway.agents")

#: how long the decision's post to the worker may take
POST_S = 5.0
#: how long a denial at the end (caller gone, max_run_s) may take
LAST_DENY_S = 1.0

Emit = Callable[[list[bytes]], Awaitable[None]]


class AgentRun:
    def __init__(
        self,
        *,
        tenant: str,
        request_id: str,
        machine: AgentEvents,
        rules: AgentRules,
        policy: PolicyAgents | None,
        worker: WorkerTransport,
        hosts: Callable[[str], Awaitable[list[Any]]],
        files: TenantFiles | None,
        approvals: CallerApprovals | None,
        metrics: GatewayMetrics,
        session: str,
        events: bool,
    ) -> None:
        self.tenant, self.request_id = tenant, request_id
        self.machine, self.rules, self.policy = machine, rules, policy
        self.worker, self.hosts = worker, hosts
        self.files_store, self.approvals = files, approvals
        self.metrics = metrics
        self.session = session
        #: the caller streams and asked for agent events
        self.events = events
        #: receipt ``agent.calls``, in order (``duration_ms`` filled at complete)
        self.calls: list[dict[str, Any]] = []
        #: the kept files as the caller sees them
        self.files: list[dict[str, Any]] = []
        self._action: ApprovalRequired | FileProduced | None = None
        #: the approval posted to nobody yet (denied at once if the run ends)
        self._pending: ApprovalRequired | None = None
        self._calling_at: dict[int, float] = {}
        self._by_round: dict[int, dict[str, Any]] = {}

    # -- what the relay calls --------------------------------------------------------

    def note(self, item: Any) -> bool:
        """Every item the dialect read; True when :meth:`act` must run before the next."""
        if isinstance(item, ToolCalling):
            self._calling_at[item.round] = time.monotonic()
        elif isinstance(item, ToolComplete):
            self._completed(item)
        elif isinstance(item, ApprovalRequired):
            self._action = item
            return True
        elif isinstance(item, FileProduced):
            if item.data is None:
                self.metrics.child(self.metrics.agent_files_dropped, self.tenant).inc()
                return False
            self._action = item
            return True
        return False

    async def act(self, emit: Emit | None) -> list[bytes]:
        """Carry out what :meth:`note` asked for; the caller's frames for it.
        ``emit`` sends frames now (a stream), or is None (a collected answer)."""
        action, self._action = self._action, None
        if isinstance(action, ApprovalRequired):
            await self._approval(action, emit)
            return []
        if isinstance(action, FileProduced):
            return await self._keep(action)
        return []

    async def deny_pending(self, reason: str) -> None:
        """The run ends (caller gone, ``max_run_s``): deny a pending approval now."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        decision = Decision("deny", None, None)
        self._record(pending, "deny", "cancel", reason)
        try:
            async with asyncio.timeout(LAST_DENY_S):
                await self._post(pending, decision, LAST_DENY_S, message=reason)
        except (GatewayError, TimeoutError):
            # The worker denies by itself after its own wait; the connection closes next.
            log.warning("agent: the last denial did not reach the worker (%s)", reason)

    def summary(self) -> dict[str, Any]:
        """The non-stream answer's ``agent`` (spec §22)."""
        calls = [
            {k: c[k] for k in ("round", "tool", "kind", "decision") if k in c} for c in self.calls
        ]
        return {"rounds": self.machine.rounds, "tool_calls": calls, "files": list(self.files)}

    def receipt(self) -> dict[str, Any]:
        """The receipt's ``agent`` (spec §22)."""
        files = [{k: f[k] for k in ("sha256", "bytes", "mime_type")} for f in self.files]
        return {
            "rounds": self.machine.rounds,
            "calls": list(self.calls),
            "files": files,
            "session": self.session,
        }

    # -- approvals -------------------------------------------------------------------

    async def _approval(self, call: ApprovalRequired, emit: Emit | None) -> None:
        self._pending = call
        decision = decide(self.rules, call)
        if decision.verdict == "resolve":
            assert decision.host is not None
            decision = decide(self.rules, call, await self.hosts(decision.host))
        by = "policy"
        if decision.verdict == "approve" and self._caller_decides():
            decision, by = await self._ask_caller(call, decision, emit)
        self._record(call, decision.verdict, by, decision.reason, decision.kind)
        await self._post(call, decision, POST_S)
        self._pending = None
        self.machine.on_decision(call.round, decision.verdict == "approve")

    def _caller_decides(self) -> bool:
        return self.policy is not None and self.policy.approval == "caller"

    async def _ask_caller(
        self, call: ApprovalRequired, decision: Decision, emit: Emit | None
    ) -> tuple[Decision, str]:
        approvals, policy = self.approvals, self.policy
        assert policy is not None
        if approvals is None or emit is None:
            # Planning refused a caller approval without a stream of events.
            return deny("caller_denied", decision.kind), "caller"
        approval_id = new_approval_id()
        await approvals.open(self.tenant, self.request_id, approval_id)
        try:
            frame = approval_frame(
                approval_id, call.round, decision.kind or "other", call.tool_name, call.arguments
            )
            await emit([frame])
            answer = await approvals.wait(approval_id, policy.approval_timeout_s)
        finally:
            await approvals.close(approval_id)
        if answer is None:
            return deny("approval_timeout", decision.kind), "timeout"
        if answer == "deny":
            return deny("caller_denied", decision.kind), "caller"
        return decision, "caller"

    async def _post(
        self, call: ApprovalRequired, decision: Decision, timeout_s: float, message: str = ""
    ) -> None:
        body = decision.body()
        if message:
            body["message"] = f"Denied by the gateway ({message})."
        status, _ = await self.worker.post_json(
            f"/v1/agent/approvals/{call.approval_id}", body, self.request_id, timeout_s
        )
        if status != 200:
            # The worker no longer waits for it (its own timeout, a restart):
            # what it runs next is judged by the machine as denied.
            log.warning("agent: the worker answered %d to a decision", status)

    def _record(
        self,
        call: ApprovalRequired,
        decision: str,
        by: str,
        reason: str | None,
        kind: str | None = None,
    ) -> None:
        existing = self._by_round.get(call.round)
        if existing is not None:
            # Decided once by the rules, then denied at the end: the end's word stands.
            existing.update(decision=decision, by=by, reason=reason)
            return
        record: dict[str, Any] = {
            "round": call.round,
            "tool": call.tool_name,
            "kind": kind or "other",
            "decision": decision,
            "by": by,
            "reason": reason,
            "arguments_sha256": hashlib.sha256(call.arguments_json).hexdigest(),
            "duration_ms": None,
        }
        self.calls.append(record)
        self._by_round[call.round] = record
        self.metrics.child(
            self.metrics.agent_tool_calls, self.tenant, record["kind"], decision
        ).inc()

    def _completed(self, item: ToolComplete) -> None:
        began = self._calling_at.pop(item.round, None)
        record = self._by_round.get(item.round)
        if record is not None and began is not None:
            record["duration_ms"] = round((time.monotonic() - began) * 1000, 3)

    # -- files -----------------------------------------------------------------------

    async def _keep(self, produced: FileProduced) -> list[bytes]:
        assert produced.data is not None
        if self.files_store is None:
            self.metrics.child(self.metrics.agent_files_dropped, self.tenant).inc()
            return []
        try:
            kept = await self.files_store.put(self.tenant, produced.data, produced.name)
        except GatewayError as exc:
            # The store refused it (quota, a store down): dropped and counted, the run goes on.
            log.warning("agent: a produced file was not kept (%s)", exc.code)
            self.metrics.child(self.metrics.agent_files_dropped, self.tenant).inc()
            return []
        shown = {
            "id": kept.id,
            "name": kept.name,
            "bytes": kept.bytes,
            "sha256": kept.sha256,
            "mime_type": kept.mime_type,
        }
        self.files.append(shown)
        if not self.events:
            return []
        return [file_frame(kept.id, kept.name, kept.bytes, kept.sha256, kept.mime_type)]


def agentic(plan: Plan, worker: Worker, tool_loop: str) -> bool:
    """Whether this worker call is an agentic run: the request asked for tools,
    or its worker offers MCP tools on every governed request (reference §3.1:
    MCP tools are always active), whoever asks."""
    if plan.agent is not None:
        return True
    route = worker.config.agents
    return route is not None and route.mcp_config is not None and tool_loop == "governed"


def start_run(
    services: Services, tenant: Tenant, request_id: str, worker: Worker, plan: Plan
) -> AgentRun:
    """The run of one agentic worker call: its event machine and its authority."""
    policy = tenant.policy.agents
    route = worker.config.agents
    assert route is not None
    agent = plan.agent
    files = policy.files if policy is not None else AgentFiles()
    limits = EventLimits(
        max_tool_rounds=agent.rounds if agent is not None else route.max_tool_rounds,
        files_max_bytes=files.max_bytes,
        files_max_count=files.max_count,
        session_id=agent.worker_session_id if agent is not None else None,
    )
    # A tenant without agents still has the worker's MCP tools offered: every call denied.
    rules = AgentRules.build(policy, route) if policy is not None else AgentRules(())
    return AgentRun(
        tenant=tenant.name,
        request_id=request_id,
        machine=AgentEvents(limits),
        rules=rules,
        policy=policy,
        worker=worker.client,
        hosts=services.hosts.addresses,
        files=services.files,
        approvals=services.approvals,
        metrics=services.metrics,
        session=agent.worker_session_id if agent is not None else "",
        events=plan.agent_events,
    )
