"""``python -m gateway.testing.engine``."""

from gateway.testing.engine.cli import main

raise SystemExit(main())
