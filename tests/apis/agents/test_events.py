"""The agentic event machine (spec §22 "Events", §24): each rule, then whole
generated runs and every kind of breach of them."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.apis.agents import (
    AgentEvents,
    ApprovalRequired,
    EventLimits,
    FileProduced,
    RoundState,
    ToolCalling,
    ToolComplete,
    line_bound,
)
from gateway.core.errors import GatewayError
from tests.apis.agents.worker import (
    EXTRACT,
    MCP,
    PYTHON,
    READ_FILE,
    SEARCH,
    SESSION,
    approval,
    calling,
    complete,
    denial,
    dumps,
    produced,
)


def machine(**limits: Any) -> AgentEvents:
    settings = {
        "max_tool_rounds": 4,
        "files_max_bytes": 1000,
        "files_max_count": 3,
        "session_id": SESSION,
        **limits,
    }
    return AgentEvents(EventLimits(**settings))


def feed(m: AgentEvents, event: tuple[str, str]) -> Any:
    return m.on_event(*event)


def breach(m: AgentEvents, event: tuple[str, str], message: str) -> GatewayError:
    with pytest.raises(GatewayError, match=message) as caught:
        feed(m, event)
    assert caught.value.code == "upstream_protocol_error"
    assert caught.value.outcome == "protocol_error"
    return caught.value


def approved_round(m: AgentEvents, round: int, tool: Any = PYTHON) -> None:
    feed(m, calling(round, tool))
    feed(m, approval(round, tool))
    m.on_decision(round, True)


# --- one whole round ----------------------------------------------------------------


def test_an_approved_python_round_gives_typed_events() -> None:
    m = machine()
    m.on_content()
    call = feed(m, calling(0, PYTHON))
    assert call == ToolCalling(0, "mistralrs_execute_python", "code_execution", code="print(2 + 2)")
    ask = feed(m, approval(0, PYTHON, arguments_json='{"code": "print(2 + 2)" }'))
    assert isinstance(ask, ApprovalRequired)
    assert (ask.approval_id, ask.round, ask.kind, ask.label, ask.source) == (
        f"appr_{0:032x}",
        0,
        "code_execution",
        "Python code",
        "built_in",
    )
    assert ask.arguments == {"code": "print(2 + 2)"}
    assert ask.arguments_json == b'{"code": "print(2 + 2)" }'  # as sent, spaces and all
    assert hashlib.sha256(ask.arguments_json).hexdigest()
    m.on_decision(0, True)
    f = feed(m, produced(0, "out/plot.png", b"\x89PNG\r\n\x1a\n"))
    assert f == FileProduced(0, "plot.png", None, b"\x89PNG\r\n\x1a\n", None)
    done = feed(m, complete(0, PYTHON))
    assert done == ToolComplete(0, "mistralrs_execute_python", "code_execution", denied=False)
    m.on_content()
    m.finish()
    assert (m.state, m.rounds, m.files_kept, m.bytes_kept) == (RoundState.FINISHED, 1, 1, 8)


def test_web_search_complete_carries_only_its_sources() -> None:
    m = machine()
    approved_round(m, 0, SEARCH)
    done = feed(m, complete(0, SEARCH))
    assert done == ToolComplete(
        0,
        "mistralrs_search_the_web",
        "web_search",
        denied=False,
        sources=("docs.rs", "en.wikipedia.org"),
        results_count=2,
    )


@pytest.mark.parametrize("tool", [PYTHON, SEARCH, EXTRACT, MCP, READ_FILE])
def test_a_denied_call_is_reported_in_the_workers_denial_shape(tool: Any) -> None:
    m = machine()
    feed(m, calling(0, tool))
    feed(m, approval(0, tool))
    m.on_decision(0, False)
    done = feed(m, complete(0, tool, denial(tool)))
    assert isinstance(done, ToolComplete) and done.denied and done.sources == ()
    m.finish()


def test_a_round_the_worker_denied_itself_needs_no_approval_event() -> None:
    m = machine()
    feed(m, calling(0, MCP))
    assert feed(m, complete(0, MCP, denial(MCP, "Approval timed out."))).denied


def test_rounds_may_skip_indexes_but_never_reach_the_forwarded_maximum() -> None:
    m = machine(max_tool_rounds=4)
    for r in (0, 2, 3):
        feed(m, calling(r, MCP))
        feed(m, complete(r, MCP, denial(MCP)))
    breach(m, calling(4, MCP), "more tool rounds")


def test_line_bound_grows_for_files_only() -> None:
    assert line_bound(1_048_576, 1000) == 1_048_576
    assert line_bound(1_048_576, 8 * 1024 * 1024) == 8 * 1024 * 1024 * 4 // 3 + 4096


# --- each breach ----------------------------------------------------------------------


def test_unknown_event_names() -> None:
    for name in ("error", "agentic_tool_call", "response.created", "file"):
        breach(machine(), (name, "{}"), "unknown named event")


def test_a_complete_for_a_round_never_seen_calling() -> None:
    breach(machine(), complete(0, PYTHON, denial(PYTHON)), "never announced")


def test_a_complete_of_another_round_or_tool() -> None:
    m = machine()
    feed(m, calling(1, MCP))
    breach(m, complete(0, MCP, denial(MCP)), "another round")
    m = machine()
    feed(m, calling(1, MCP))
    breach(m, complete(1, READ_FILE, denial(READ_FILE)), "another tool")


def test_rounds_must_strictly_increase() -> None:
    m = machine()
    feed(m, calling(1, MCP))
    feed(m, complete(1, MCP, denial(MCP)))
    breach(m, calling(1, MCP), "strictly increase")


def test_content_inside_a_round() -> None:
    m = machine()
    feed(m, calling(0, MCP))
    with pytest.raises(GatewayError, match="content inside a tool round"):
        m.on_content()


def test_a_second_approval_and_one_after_files() -> None:
    m = machine()
    approved_round(m, 0)
    breach(m, approval(0, PYTHON, approval_id="appr_" + "1" * 32), "second approval")
    m = machine()
    approved_round(m, 0)
    feed(m, produced(0, "a.txt", "a"))
    breach(m, approval(0, PYTHON), "second approval, or one after files")


def test_an_approval_outside_a_round_or_of_another_round() -> None:
    breach(machine(), approval(0, PYTHON), "outside a tool round")
    m = machine()
    feed(m, calling(0, PYTHON))
    breach(m, approval(1, PYTHON), "another round")


def test_output_after_the_gateway_denied() -> None:
    for tool in (PYTHON, SEARCH, MCP):
        m = machine()
        feed(m, calling(0, tool))
        feed(m, approval(0, tool))
        m.on_decision(0, False)
        breach(m, complete(0, tool), "did not approve")


def test_output_while_the_decision_is_pending_or_never_asked() -> None:
    m = machine()
    feed(m, calling(0, PYTHON))
    feed(m, approval(0, PYTHON))
    breach(m, complete(0, PYTHON), "did not approve")
    m = machine()
    feed(m, calling(0, PYTHON))
    breach(m, complete(0, PYTHON), "did not approve")


def test_files_of_a_tool_not_approved() -> None:
    m = machine()
    feed(m, calling(0, PYTHON))
    breach(m, produced(0, "a.txt", "x"), "did not approve")
    m = machine()
    feed(m, calling(0, PYTHON))
    feed(m, approval(0, PYTHON))
    m.on_decision(0, False)
    breach(m, produced(0, "a.txt", "x"), "did not approve")


@pytest.mark.parametrize(
    "data",
    [
        # a denial shape with output beside it
        {"tool_type": "code_execution", "exception": "Denied", "stdout": "4"},
        {"tool_type": "custom", "content": '{"status":"denied"}', "arguments": "{}"},
        {"tool_type": "custom", "content": '{"status":"ok"}'},
        {"tool_type": "custom", "content": "not json"},
        {"tool_type": "web_search", "sources": []},
    ],
)
def test_only_the_exact_denial_shape_counts_as_a_denial(data: dict[str, Any]) -> None:
    m = machine()
    feed(m, calling(0, PYTHON))
    feed(m, approval(0, PYTHON))
    m.on_decision(0, False)
    breach(m, complete(0, PYTHON, data), "did not approve")


def test_ending_inside_a_round() -> None:
    m = machine()
    feed(m, calling(0, PYTHON))
    with pytest.raises(GatewayError, match="inside a tool round") as caught:
        m.finish()
    assert caught.value.code == "upstream_protocol_error"


def test_nothing_agentic_after_the_end() -> None:
    m = machine()
    m.finish()
    breach(m, calling(0, PYTHON), "after its stream's end")


def test_the_first_breach_is_the_one_error_sink() -> None:
    m = machine()
    first = breach(m, complete(0, PYTHON, denial(PYTHON)), "never announced")
    for again in (lambda: feed(m, calling(0, PYTHON)), m.on_content, m.finish):
        with pytest.raises(GatewayError) as caught:
            again()
        assert caught.value is first
    assert m.state is RoundState.ERROR


def test_decisions_out_of_turn_are_the_relays_bug() -> None:
    m = machine()
    with pytest.raises(RuntimeError):
        m.on_decision(0, True)
    approved_round(m, 0)
    with pytest.raises(RuntimeError):
        m.on_decision(0, True)


# --- payload shapes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (("agentic_tool_call_progress", "[]"), "not a JSON object"),
        (("agentic_tool_call_progress", "{"), "not a JSON object"),
        (("agentic_tool_call_progress", '{"round": NaN}'), "not a JSON object"),
        (("agentic_tool_call_progress", '{"a":1} {"b":2}'), "not a JSON object"),
        (("agentic_tool_call_progress", "[" * 100_000), "not a JSON object"),
        (calling(-1, PYTHON), "round index"),
        (
            (
                "agentic_tool_call_progress",
                dumps({"round": True, "tool_name": "x", "phase": "calling", "data": {}}),
            ),
            "unknown phase|known tool data|round index",
        ),
        (
            (
                "agentic_tool_call_progress",
                dumps(
                    {
                        "round": 0,
                        "tool_name": "x",
                        "phase": "running",
                        "data": {"tool_type": "custom"},
                    }
                ),
            ),
            "unknown phase",
        ),
        (
            (
                "agentic_tool_call_progress",
                dumps(
                    {"round": 0, "tool_name": "x", "phase": "calling", "data": {"tool_type": "sql"}}
                ),
            ),
            "known tool data",
        ),
        (
            (
                "agentic_tool_call_progress",
                dumps(
                    {
                        "round": 0,
                        "tool_name": "mistralrs_execute_python",
                        "phase": "calling",
                        "data": {"tool_type": "custom"},
                    }
                ),
            ),
            "type does not fit",
        ),
        (
            (
                "agentic_tool_call_progress",
                dumps(
                    {
                        "type": "file_produced",
                        "round": 0,
                        "tool_name": "x",
                        "phase": "calling",
                        "data": {"tool_type": "custom"},
                    }
                ),
            ),
            "type is not its name",
        ),
    ],
)
def test_malformed_progress(event: tuple[str, str], message: str) -> None:
    breach(machine(), event, message)


def test_oversized_arguments_and_code() -> None:
    m = machine(max_argument_bytes=64)
    big = dict(PYTHON.calling, code="x" * 65)
    event = (
        "agentic_tool_call_progress",
        dumps({"round": 0, "tool_name": PYTHON.name, "phase": "calling", "data": big}),
    )
    breach(m, event, "code is malformed or too long")
    m = machine(max_argument_bytes=64)
    feed(m, calling(0, PYTHON))
    breach(m, approval(0, PYTHON, arguments_json=dumps({"code": "é" * 40})), "over the size limit")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"approval_id": "appr_../../v1/models/unload"}, "approval id"),
        ({"approval_id": "appr_" + "A" * 32}, "approval id"),
        ({"session": "someone-elses-session"}, "another session"),
    ],
)
def test_approval_ids_and_sessions(edit: dict[str, str], message: str) -> None:
    m = machine()
    feed(m, calling(0, PYTHON))
    breach(m, approval(0, PYTHON, **edit), message)


def test_an_approval_whose_tool_does_not_fit_the_call() -> None:
    m = machine()
    feed(m, calling(0, PYTHON))
    breach(m, approval(0, SEARCH), "kind does not fit")
    m = machine()
    feed(m, calling(0, MCP))
    name, data = approval(0, MCP)
    breach(m, (name, data.replace('"label":"docs_search"', '"label":"docs_other"')), "another tool")


def test_an_approval_of_an_unknown_kind_is_read_for_the_rules_to_deny() -> None:
    m = machine()
    feed(m, calling(0, MCP))
    name, data = approval(0, MCP)
    ask = feed(m, (name, data.replace('"kind":"custom"', '"kind":"teleport"')))
    assert isinstance(ask, ApprovalRequired) and ask.kind == "teleport"


def test_arguments_that_are_not_json_arrive_as_the_raw_string() -> None:
    m = machine()
    feed(m, calling(0, MCP))
    ask = feed(m, approval(0, MCP, arguments_json='"{not json"'))
    assert ask.arguments == "{not json" and ask.arguments_json == b'"{not json"'


# --- files ---------------------------------------------------------------------------------


def test_files_are_kept_within_count_and_bytes_then_dropped_and_counted() -> None:
    m = machine(files_max_bytes=10, files_max_count=2)
    approved_round(m, 0)
    first = feed(m, produced(0, "a.bin", b"123456"))
    too_large = feed(m, produced(0, "b.bin", b"12345"))  # 6 + 5 > 10
    second = feed(m, produced(0, "c.txt", "1234"))
    too_many = feed(m, produced(0, "d.txt", ""))
    assert [f.dropped for f in (first, too_large, second, too_many)] == [
        None,
        "too_large",
        None,
        "too_many",
    ]
    assert too_large.data is None and second.data == b"1234"
    assert (m.files_kept, m.files_dropped, m.bytes_kept) == (2, 2, 10)
    assert not feed(m, complete(0, PYTHON)).denied


def test_elided_and_placeholder_files_are_dropped() -> None:
    m = machine()
    approved_round(m, 0)
    elided = feed(m, produced(0, "big.parquet", None, declared=9_000_000))
    assert (elided.dropped, elided.data) == ("elided", None)
    name, data = produced(0, "report.csv", None)
    placeholder = data[:-1] + ',"code":"file_not_written","message":"no file"}'
    assert feed(m, (name, placeholder)).dropped == "placeholder"
    assert m.files_dropped == 2


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (produced(0, "a.bin", b"abc", declared=4), "size is not the one it declared"),
        (
            ("file_produced", produced(0, "a.bin", b"abcd")[1].replace("YWJjZA==", "YWJj?A==")),
            "base64",
        ),
        (
            ("file_produced", produced(0, "a.bin", b"abcd")[1].replace("YWJjZA==", "YWJjZA=")),
            "base64",
        ),
        (produced(1, "a.bin", b"a"), "another round"),
        (("file_produced", dumps({"name": "a", "bytes": 1, "text": "a"})), "without its source"),
        (
            ("file_produced", dumps({"name": "a", "text": "a", "source": {"round": 0}})),
            "without its size",
        ),
    ],
)
def test_broken_files_are_violations(event: tuple[str, str], message: str) -> None:
    m = machine()
    approved_round(m, 0)
    breach(m, event, message)


def test_a_body_that_cannot_fit_is_not_decoded() -> None:
    m = machine(files_max_bytes=3)
    approved_round(m, 0)
    # Invalid base64, but over the bound by its length alone: dropped, never decoded.
    name, data = produced(0, "a.bin", b"abcdef")
    assert feed(m, (name, data.replace("YWJjZGVm", "!!!!!!!!"))).dropped == "too_large"


@pytest.mark.parametrize(
    ("name", "plain"),
    [
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\x\\report.csv", "report.csv"),
        ("a\nb\x00c.txt", "a_b_c.txt"),
        ("..", "file"),
        ("dir/", "file"),
        ("x" * 300, "x" * 255),
    ],
)
def test_file_names_are_plain(name: str, plain: str) -> None:
    m = machine()
    approved_round(m, 0)
    assert feed(m, produced(0, name, "x")).name == plain


def test_one_end_and_a_usage_chunk_after_it() -> None:
    m = machine()
    m.finish()
    m.on_content()  # OpenAI's usage-only chunk after the terminal one
    m.finish()  # then [DONE] or EOF: the same end
    assert m.state is RoundState.FINISHED
