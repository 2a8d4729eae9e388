"""Agents under the gateway's authority (spec §22, §24): the pure core.

The worker runs tools itself; the gateway decides about every call. This
package decides and never does I/O (no socket, no clock, no resolver): the
pipeline feeds it values and carries out what it returns.

* ``rewrite`` -- the request: which agentic fields a tenant may send, what
  the worker gets instead (``request`` its inputs and result, ``options``
  the fields' shapes, ``session`` the worker's session ids);
* ``events`` -- the worker's agentic events on one stream, a sans-I/O state
  machine beside the chat chunk grammar (``stream`` puts both under the SSE
  framing; ``wire`` the payloads, ``files`` produced files, ``jsonspans``
  the exact bytes of approval arguments);
* ``rules`` -- the decision on each approval (``webtarget`` where a web call
  would fetch, ``addresses`` which addresses are public);
* ``frames`` -- what callers with ``x-agent-events: 1`` see.
"""

from gateway.apis.agents.events import (
    AGENT_EVENT_NAMES,
    AgentEvent,
    AgentEvents,
    EventLimits,
    RoundState,
    line_bound,
)
from gateway.apis.agents.files import FileProduced
from gateway.apis.agents.frames import (
    approval_frame,
    file_frame,
    new_approval_id,
    new_file_id,
    tool_call_frame,
)
from gateway.apis.agents.request import AgentContext, AgentRequest
from gateway.apis.agents.rewrite import rewrite_chat, rewrite_messages
from gateway.apis.agents.rules import AgentRules, Decision, PolicyTool, Reason, decide, deny
from gateway.apis.agents.session import fresh_session_id, worker_session_id
from gateway.apis.agents.stream import AgentStream
from gateway.apis.agents.wire import ApprovalRequired, ToolCalling, ToolComplete

__all__ = [
    "AGENT_EVENT_NAMES",
    "AgentContext",
    "AgentEvent",
    "AgentEvents",
    "AgentRequest",
    "AgentRules",
    "AgentStream",
    "ApprovalRequired",
    "Decision",
    "EventLimits",
    "FileProduced",
    "PolicyTool",
    "Reason",
    "RoundState",
    "ToolCalling",
    "ToolComplete",
    "approval_frame",
    "decide",
    "deny",
    "file_frame",
    "fresh_session_id",
    "line_bound",
    "new_approval_id",
    "new_file_id",
    "rewrite_chat",
    "rewrite_messages",
    "tool_call_frame",
    "worker_session_id",
]
