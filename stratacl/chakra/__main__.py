"""`python -m stratacl.chakra`."""

import sys

from stratacl.chakra.import_et import main

sys.exit(main())
