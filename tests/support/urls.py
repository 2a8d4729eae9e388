"""Every way a caller can write a media URL that is not an evidence reference.

One list for the rewriter's unit tests, the end-to-end evidence tests and the
rewrite fuzzer (which adds malformed evidence references of its own).
"""

from __future__ import annotations

PNG_DATA_URL = "data:image/png;base64,iVBORw0KGgo="

CALLER_URLS = [
    "http://169.254.169.254/latest/meta-data",
    "https://example.com/a.png",
    "HTTPS://EXAMPLE.COM/a.png",
    "file:///etc/passwd",
    "FILE:///etc/passwd",
    "FiLe:///etc/shadow",
    " file:///etc/passwd",
    "/etc/passwd",
    "../../etc/passwd",
    "//host/a.png",
    "gopher://x",
    PNG_DATA_URL,
    " DATA:image/png;base64,iVBORw0KGgo=",
    "da\nta:image/png;base64,AAAA",
    "evidence: ev_x",
    " EVIDENCE:ev_x",
]
