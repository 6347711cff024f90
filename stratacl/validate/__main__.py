"""`python -m stratacl.validate`."""

import sys

from stratacl.validate.kernels import main

sys.exit(main())
