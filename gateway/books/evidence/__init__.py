"""Staged evidence: sniffed media (``sniff``), digest-addressed files (``store``),
records (``records``; their catalogs are the state backends', ``gateway/books/state``),
the service the app and the CLI both go through (``service``), a request's
leases (``leases``) and the forwarded body's media (``encode``). No HTTP here.
"""
