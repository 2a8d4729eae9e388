"""Tenant files (spec §22 "Files"): what a file is, from its bytes (``sniff``),
its record and id (``records``; the catalogs are the state backends',
``gateway/books/state``), and the book the HTTP routes and the pipeline go
through (``book``: put, get, read, delete, expiry and the sweep). No HTTP here.
"""
