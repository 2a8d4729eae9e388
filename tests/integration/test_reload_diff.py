"""SIGHUP with an edited gateway.yaml: the warning names the changed keys (a real process)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import orjson
import yaml

from gateway.testing.harness import write_config
from tests.support.process import metric, serve, sim_running, wait_ready, wait_until
from tests.support.stack import issuers, policies


def test_sighup_names_the_keys_that_need_a_restart(tmp_path: Path) -> None:
    with sim_running() as sim:
        config = write_config(
            tmp_path, upstream_port=sim.port, policies=policies(), issuers=issuers()
        )
        with serve(config, tmp_path) as gw, httpx.Client(base_url=gw.url) as client:
            wait_ready(client)
            data = yaml.safe_load(config.read_text())
            data["upstream"]["idle_timeout_s"] = 7
            data["limits"] = {"max_body_bytes": 524288}
            data["auth"]["issuers"][0]["leeway_s"] = 5
            config.write_text(yaml.safe_dump(data, sort_keys=False))
            gw.signal(signal.SIGHUP)
            wait_until(
                lambda: metric(client, "gateway_reloads_total", result="applied") == 1,
                5,
                "reload applied",
            )
        stderr = gw.stderr_text()
    entries = [orjson.loads(line) for line in stderr.splitlines() if line.strip()]
    warnings = [e["msg"] for e in entries if e["msg"].startswith("reload: ")]
    assert warnings == [
        "reload: gateway.yaml changed at upstream.idle_timeout_s, auth.issuers[0].leeway_s, "
        "limits.max_body_bytes; these need a restart"
    ]
    assert "524288" not in stderr
