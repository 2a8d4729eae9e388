"""Where one request's time went (spec §20): the stages a request ran, None for
those it did not, the two upstream stages measured from the send, milliseconds
rounded for the receipt."""

from __future__ import annotations

import time

import pytest

from gateway.pipeline.timings import STAGES, Timings, as_ms, now

T0 = 5000.0


def _full() -> Timings:
    t = Timings(started=T0, auth=0.001, plan=0.02, limits=0.0005, admission=0.3)
    t.add_media(0.04)
    t.sent_at = T0 + 0.5
    t.head_at = T0 + 0.75
    return t


def test_a_full_run_has_every_stage() -> None:
    stages = _full().stages(first_content_at=T0 + 1.5, ended_at=T0 + 4.0)
    assert stages == {
        "auth": 0.001,
        "plan": 0.02,
        "limits": 0.0005,
        "admission": 0.3,
        "media": 0.04,
        "upstream_head": pytest.approx(0.25),
        "first_token": pytest.approx(1.0),
        "total": pytest.approx(4.0),
    }
    assert all(v is not None for v in stages.values())


def test_upstream_stages_count_from_the_send_not_from_the_arrival() -> None:
    t = Timings(started=T0)
    t.sent_at, t.head_at = T0 + 10.0, T0 + 10.5
    stages = t.stages(first_content_at=T0 + 12.0, ended_at=T0 + 13.0)
    assert stages["upstream_head"] == pytest.approx(0.5)
    assert stages["first_token"] == pytest.approx(2.0)  # not 2.0 - 0.5: from sent_at too
    assert stages["total"] == pytest.approx(13.0)


def test_stage_order_is_the_stages_constant() -> None:
    assert tuple(_full().stages(T0 + 1, T0 + 2)) == STAGES
    assert tuple(Timings(started=T0).stages(None, T0)) == STAGES
    assert STAGES == (
        "auth",
        "plan",
        "limits",
        "admission",
        "media",
        "upstream_head",
        "first_token",
        "total",
    )
    assert len(set(STAGES)) == len(STAGES)


def test_rejected_at_auth_has_only_auth_and_total() -> None:
    t = Timings(started=T0, auth=0.002)
    stages = t.stages(first_content_at=None, ended_at=T0 + 0.003)
    assert stages == {
        "auth": 0.002,
        "plan": None,
        "limits": None,
        "admission": None,
        "media": None,
        "upstream_head": None,
        "first_token": None,
        "total": pytest.approx(0.003),
    }


def test_nothing_ran_has_only_total() -> None:
    stages = Timings(started=T0).stages(first_content_at=None, ended_at=T0 + 0.25)
    assert [k for k, v in stages.items() if v is not None] == ["total"]
    assert stages["total"] == pytest.approx(0.25)


def test_rejected_by_limits_stops_before_admission() -> None:
    t = Timings(started=T0, auth=0.001, plan=0.01, limits=0.002)
    stages = t.stages(first_content_at=None, ended_at=T0 + 0.02)
    assert [k for k, v in stages.items() if v is not None] == ["auth", "plan", "limits", "total"]


def test_no_head_from_the_worker_has_no_upstream_head_nor_first_token() -> None:
    # Sent, then the gateway gave up waiting for the head (upstream_timeout).
    t = _full()
    t.head_at = None
    stages = t.stages(first_content_at=None, ended_at=T0 + 30.0)
    assert stages["upstream_head"] is None
    assert stages["first_token"] is None
    assert stages["admission"] == 0.3 and stages["media"] == 0.04
    assert stages["total"] == pytest.approx(30.0)


def test_a_head_but_no_content_has_upstream_head_only() -> None:
    stages = _full().stages(first_content_at=None, ended_at=T0 + 2.0)
    assert stages["upstream_head"] == pytest.approx(0.25)
    assert stages["first_token"] is None


def test_never_sent_has_no_upstream_stages_even_given_a_first_content() -> None:
    t = Timings(started=T0, auth=0.001, plan=0.01, limits=0.001, admission=0.5)
    t.head_at = T0 + 1.0  # without sent_at it measures nothing
    stages = t.stages(first_content_at=T0 + 2.0, ended_at=T0 + 3.0)
    assert stages["upstream_head"] is None
    assert stages["first_token"] is None
    assert stages["admission"] == 0.5
    assert stages["total"] == pytest.approx(3.0)


def test_a_zero_length_stage_is_zero_not_none() -> None:
    t = Timings(started=T0, auth=0.0, admission=0.0)
    t.sent_at = t.head_at = T0 + 1.0
    stages = t.stages(first_content_at=T0 + 1.0, ended_at=T0)
    assert stages["auth"] == 0.0 and stages["admission"] == 0.0
    assert stages["upstream_head"] == 0.0 and stages["first_token"] == 0.0
    assert stages["total"] == 0.0
    assert as_ms(stages)["auth"] == 0.0


def test_add_media_accumulates_from_none() -> None:
    t = Timings(started=T0)
    assert t.media is None
    t.add_media(0.25)
    assert t.media == 0.25
    t.add_media(0.5)
    t.add_media(0.125)
    assert t.media == 0.875
    assert t.stages(None, T0)["media"] == 0.875


def test_add_media_of_zero_marks_the_stage_as_run() -> None:
    t = Timings(started=T0)
    t.add_media(0.0)
    assert t.media == 0.0
    assert t.stages(None, T0)["media"] == 0.0


def test_stages_does_not_change_the_timings() -> None:
    t = _full()
    first = t.stages(T0 + 1.5, T0 + 4.0)
    second = t.stages(T0 + 1.5, T0 + 4.0)
    assert first == second
    assert t.media == 0.04 and t.sent_at == T0 + 0.5 and t.head_at == T0 + 0.75


def test_as_ms_converts_and_rounds_to_microseconds() -> None:
    ms = as_ms(
        {
            "auth": 0.0012345678,
            "plan": 0.123456789,
            "limits": 1.0,
            "admission": 0.0000004,  # 0.0004 ms rounds to 0
            "media": None,
            "upstream_head": 0.0000006,  # 0.0006 ms rounds to 0.001
            "first_token": 2.5,
            "total": 12.3456789,
        }
    )
    assert ms == {
        "auth": 1.235,
        "plan": 123.457,
        "limits": 1000.0,
        "admission": 0.0,
        "media": None,
        "upstream_head": 0.001,
        "first_token": 2500.0,
        "total": 12345.679,
    }


def test_as_ms_keeps_keys_order_and_nones() -> None:
    stages = _full().stages(first_content_at=None, ended_at=T0 + 1.0)
    ms = as_ms(stages)
    assert list(ms) == list(stages) == list(STAGES)
    assert [k for k, v in ms.items() if v is None] == ["first_token"]
    assert ms["upstream_head"] == 250.0
    assert ms["total"] == 1000.0
    assert as_ms({}) == {}


def test_as_ms_of_a_full_run() -> None:
    ms = as_ms(_full().stages(first_content_at=T0 + 1.5, ended_at=T0 + 4.0))
    assert ms == {
        "auth": 1.0,
        "plan": 20.0,
        "limits": 0.5,
        "admission": 300.0,
        "media": 40.0,
        "upstream_head": 250.0,
        "first_token": 1000.0,
        "total": 4000.0,
    }


def test_now_is_the_monotonic_clock() -> None:
    before = time.monotonic()
    at = now()
    after = time.monotonic()
    assert before <= at <= after
