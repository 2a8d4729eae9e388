#!/usr/bin/env bash
# `make bench-overhead` measures the LiteLLM proxy beside the gateway when it
# can be installed: into its own venv, bench/.litellm (gitignored), never the
# project's. `litellm[proxy]` of the current releases needs `litellm-proxy`,
# which the registry does not serve; 1.80.0 is the version pinned here: its
# proxy ships inside the `litellm` package. When the install fails the bench
# skips the column and says so.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.litellm"
version="${LITELLM_VERSION:-1.80.0}"
if [ -x "$venv/bin/litellm" ]; then
  exit 0
fi
echo "installing litellm[proxy]==$version into bench/.litellm (the overhead bench's optional column)"
python3 -m venv "$venv" || { echo "no venv: the litellm column is skipped" >&2; exit 0; }
if ! "$venv/bin/python" -m pip install -q "litellm[proxy]==$version"; then
  echo "litellm[proxy]==$version could not be installed: the litellm column is skipped" >&2
  rm -rf "$venv"
fi
exit 0
