"""`python -m specfold ...`: the same command line as `specfold ...`."""
import sys

from specfold.cli import main

sys.exit(main())
