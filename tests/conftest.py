"""Shared pytest setup. Fixtures that start real servers live in tests/support/."""
