from fedveil.cli.main import main

raise SystemExit(main())
