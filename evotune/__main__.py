from evotune.cli import main

raise SystemExit(main())
