"""``python -m gateway.testing.simulator``."""

from gateway.testing.simulator.server import main

raise SystemExit(main())
