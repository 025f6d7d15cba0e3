"""``python -m carpool`` is the ``carpool`` command."""

from carpool.cli import main

raise SystemExit(main())
