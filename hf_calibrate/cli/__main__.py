"""``python -m hf_calibrate.cli`` (and ``torchrun ... -m hf_calibrate.cli``): the ``hf-calibrate`` command."""

import sys

from .entry import main

sys.exit(main())
