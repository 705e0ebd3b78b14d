"""`python -m nv_engine.entrypoints.server MODEL ...` = `nv serve MODEL ...`."""
from nv_engine.entrypoints.server.cli import main

raise SystemExit(main())
