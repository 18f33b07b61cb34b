from agentgrad.cli import main

raise SystemExit(main())
