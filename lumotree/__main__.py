from lumotree.cli import main

raise SystemExit(main())
