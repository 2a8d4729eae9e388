"""``python -m gateway.simulator``."""

from gateway.simulator.server import main

raise SystemExit(main())
