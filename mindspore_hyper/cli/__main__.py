"""`python -m mindspore_hyper.cli ...` = the `mindspore-hyper` command."""
import sys

from mindspore_hyper.cli import main

sys.exit(main())
