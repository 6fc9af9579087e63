from ubi.cli import main

raise SystemExit(main())
