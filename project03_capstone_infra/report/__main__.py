"""`python -m project03_capstone_infra.report`: the package's `report` command."""

import sys

if __name__ == "__main__":
    from project03_capstone_infra.__main__ import main

    sys.exit(main(["report", *sys.argv[1:]]))
