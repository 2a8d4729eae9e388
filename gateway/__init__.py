"""mistralrs-gateway: the authenticating sidecar in front of a mistral.rs worker."""

from gateway import native as _native

__version__ = "0.1.0"

# The compiled hot core when its build is current, else the pure-Python modules
# (``GATEWAY_PURE=1`` forces them): ``gateway/native.py``.
_native.select()
