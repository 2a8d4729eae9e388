# mistralrs-gateway: the authenticating sidecar in front of a pinned
# mistral.rs worker. Build: docker build -t mistralrs-gateway:0.1.0 .
# Pin the base by digest in your registry mirror; the tag is the floor here.

FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# A C compiler in this stage only, for the compiled hot core (mypyc,
# gateway/native.py); the image below gets the extension modules, not gcc.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY . .
# Runtime dependencies only (no [test] extra), into a venv that is copied
# whole, so the final image carries no build context. The core is compiled in
# the source tree (mypy reads the project's config there), its extension
# modules and stamp copied beside the installed sources (the stamp's digest is
# of those same files), mypy removed again; the build must be the one loaded.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install . \
 && /opt/venv/bin/pip install 'mypy>=2.4' \
 && /opt/venv/bin/python -m gateway.tools.build_native \
 && cp --parents $(find gateway -name '*.so') gateway/_native.json \
      "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && /opt/venv/bin/pip uninstall -y mypy librt pathspec ast-serialize \
 && cd / \
 && test "$(/opt/venv/bin/python -m gateway.tools.build_native --which)" = "mypyc built" \
 && /opt/venv/bin/python -c "import gateway"

FROM python:3.11-slim-bookworm
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# A numeric uid so Kubernetes can verify runAsNonRoot without a passwd lookup.
RUN groupadd --system --gid 10001 gateway \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin gateway \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/mistralrs-gateway
# The only writable path (evidence, catalog, receipts); config, keys and
# policies are mounted read-only at /etc/mistralrs-gateway at run time.
VOLUME ["/var/lib/mistralrs-gateway"]
USER 10001:10001
EXPOSE 8443
# slim has no curl. Loopback self-check: the served certificate names the
# Service, not 127.0.0.1, so it is not verified here. Override the URL for a
# plain-HTTP or other-port config (Kubernetes ignores HEALTHCHECK and uses
# the probes in deploy/k8s.yaml).
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os, ssl, urllib.request as u; c = ssl.create_default_context(); c.check_hostname = False; c.verify_mode = ssl.CERT_NONE; u.urlopen(os.environ.get('GATEWAY_LIVEZ_URL', 'https://127.0.0.1:8443/livez'), timeout=2, context=c)"]
ENTRYPOINT ["mistralrs-gateway", "serve"]
CMD ["--config", "/etc/mistralrs-gateway/gateway.yaml"]
