"""`python -m agent` is `hulk-agent`."""

from agent.cli import main

raise SystemExit(main())
