"""``python -m helpers``: see helpers.cli.

A worker process of a CLI run imports this module again (as ``__mp_main__``): the CLI, and with it
the whole driver side, is imported only when this runs as the program."""
import sys

if __name__ == "__main__":
    from helpers.cli import main

    sys.exit(main())
