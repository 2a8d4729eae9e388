"""The engine lane: the adapter around the real mistral.rs engine, the model generator."""
