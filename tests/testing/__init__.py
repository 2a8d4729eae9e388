"""Tests of the test and demo equipment (gateway/testing)."""
