"""python -m mtl_decoder ... (the same as the mtl-decoder command)."""

import sys

from mtl_decoder.cli import main

sys.exit(main())
