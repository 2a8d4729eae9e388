"""``POST /v1/audio/speech`` (spec §23): ``api`` (the descriptor, the request's
planning and the answer relayed as the worker's own bytes) and ``audio`` (the
RIFF/WAVE and raw PCM checks, before a byte reaches the caller)."""
