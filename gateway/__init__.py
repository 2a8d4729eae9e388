"""mistralrs-gateway: the authenticating sidecar in front of a mistral.rs worker."""

__version__ = "0.1.0"
