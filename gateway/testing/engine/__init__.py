"""The engine lane: an adapter around the mistral.rs engine (test equipment)."""
