"""``python -m tests.fakegpu COMMAND ...``: the jigsaw-earth CLI with the fake device active in this
process and in every rank it starts (``--device fakegpu`` / ``distributed.device=fakegpu``)."""

from __future__ import annotations

import os
import sys

from jigsaw_earth.cli import main
from jigsaw_earth.device import PLUGIN_ENV

if __name__ == "__main__":
    os.environ[PLUGIN_ENV] = __spec__.parent  # this package, by module name: every rank imports it
    sys.exit(main(sys.argv[1:]))
