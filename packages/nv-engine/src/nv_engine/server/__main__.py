"""`python -m nv_engine.server MODEL ...` = `nv serve MODEL ...`."""
from nv_engine.server.cli import main

raise SystemExit(main())
