"""``POST /v1/images/generations`` (spec §23): ``api`` (the descriptor and the
request's planning: n worker calls, explicit size, ``B64Json`` always),
``answer`` (each worker answer checked and the caller's one answer assembled)
and ``png`` (the image checked from its base64, in pieces)."""
