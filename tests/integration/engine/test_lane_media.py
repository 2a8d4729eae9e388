"""Images and speech through the real gateway on the real engine (spec §23).

Two adapters, one per model as ``mistralrs serve diffusion`` and ``serve
speech`` run one: the generated FLUX and the generated Dia + DAC (random
weights, ``mediagen.py``), each a route of its kind behind one gateway. The
callers are the ``openai`` SDK's ``images.generate`` and
``audio.speech.create``, unchanged but for ``base_url`` and the key.
"""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.testing.harness import Gateway, default_policy, write_config
from tests.support.engine import EngineAdapter, running_adapter
from tests.support.engine_stack import EngineStack
from tests.support.stack import issuers

IMAGE_ALIAS, SPEECH_ALIAS = "random-flux", "random-dia"
#: the speech fixture's samples: (audio_length 20 - the 16 delayed frames) x 512
SAMPLES = 2048


@pytest.fixture(scope="module")
def image_adapter() -> Iterator[EngineAdapter]:
    with running_adapter(kind="image") as adapter:
        yield adapter


@pytest.fixture(scope="module")
def speech_adapter() -> Iterator[EngineAdapter]:
    with running_adapter(kind="speech") as adapter:
        yield adapter


@pytest.fixture(scope="module")
def media(
    image_adapter: EngineAdapter,
    speech_adapter: EngineAdapter,
    dev_secret: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[EngineStack]:
    directory: Path = tmp_path_factory.mktemp("lane-media")
    models = {IMAGE_ALIAS: image_adapter.route, SPEECH_ALIAS: speech_adapter.route}
    policy = default_policy(
        "acme", models=models, endpoints=["images", "speech", "models"], modalities=["text"]
    )
    workers = [
        (image_adapter, "image"),
        (speech_adapter, "speech"),
    ]
    config = write_config(
        directory,
        upstream_port=image_adapter.port,
        policies={"acme": policy},
        issuers=issuers(),
        upstreams=[
            {
                "name": kind,
                "base_url": adapter.base_url,
                "routes": [{"route": adapter.route, "kind": kind}],
                # loading and a first call may keep both cores busy
                "readiness_timeout_s": 10,
                "total_timeout_s": 120,
            }
            for adapter, kind in workers
        ],
    )
    with Gateway(config) as gateway:
        assert gateway.wait_ready(), "the gateway never saw the engine adapters ready"
        stack = EngineStack(directory, image_adapter, gateway)
        try:
            yield stack
        finally:
            stack.close_clients()


def test_images_generate_gets_the_engines_png_of_the_requested_size(
    media: EngineStack, image_adapter: EngineAdapter
) -> None:
    before = image_adapter.stats()["images_generated"]
    raw = media.openai().images.with_raw_response.generate(
        model=IMAGE_ALIAS, prompt="a red fox", n=2, size="96x64"
    )
    answer = raw.parse()
    assert image_adapter.stats()["images_generated"] - before == 2  # one engine call per image
    assert answer.data is not None and len(answer.data) == 2
    pngs = []
    for image in answer.data:
        assert image.b64_json is not None and not image.b64_json.startswith("data:")
        png = base64.b64decode(image.b64_json, validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
        assert struct.unpack(">II", png[16:24]) == (96, 64)  # width, height
        pngs.append(png)
    assert answer.to_dict()["usage"] == {"images": 2}
    receipt = media.receipt(raw.headers["x-request-id"])
    assert (receipt["endpoint"], receipt["outcome"]) == ("images", "complete")
    assert receipt["route"] == image_adapter.route
    outputs = receipt["outputs"]
    assert [(o["width"], o["height"]) for o in outputs] == [(96, 64)] * 2
    assert sorted(o["sha256"] for o in outputs) == sorted(
        hashlib.sha256(p).hexdigest() for p in pngs
    )


def test_speech_create_gets_the_engines_samples_as_wav_and_pcm(
    media: EngineStack, speech_adapter: EngineAdapter
) -> None:
    client = media.openai()
    raw = client.audio.speech.with_raw_response.create(
        model=SPEECH_ALIAS, voice="alloy", input="[S1] hello world", response_format="wav"
    )
    wav_bytes = raw.parse().content
    assert raw.headers["content-type"].startswith("audio/wav")
    with wave.open(io.BytesIO(wav_bytes)) as parsed:
        shape = (parsed.getnchannels(), parsed.getsampwidth(), parsed.getframerate())
        assert shape == (1, 2, 44100)
        assert parsed.getnframes() == SAMPLES
        frames = parsed.readframes(SAMPLES)
    receipt = media.receipt(raw.headers["x-request-id"])
    assert (receipt["endpoint"], receipt["outcome"]) == ("speech", "complete")
    assert receipt["usage"]["audio_ms"] == pytest.approx(SAMPLES / 44.1, abs=1)
    assert receipt["outputs"][0]["sha256"] == hashlib.sha256(wav_bytes).hexdigest()
    # Raw PCM: the same samples (the engine's Dia sampler is seeded), the rate in the type.
    pcm = client.audio.speech.with_raw_response.create(
        model=SPEECH_ALIAS, voice="alloy", input="[S1] hello world", response_format="pcm"
    )
    assert pcm.parse().content == frames
    content_type = pcm.headers["content-type"].replace(" ", "")
    assert content_type.startswith("audio/pcm") and "rate=44100" in content_type
    assert speech_adapter.stats()["speech_generated"] >= 2
