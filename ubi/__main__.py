from ubi_pipeline.cli import main

raise SystemExit(main())
