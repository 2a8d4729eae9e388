"""``python -m gateway.testing.simulator``."""

from gateway.testing.simulator.cli import main

raise SystemExit(main())
