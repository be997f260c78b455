"""`python -m project03_capstone_infra.cost`: the package's `cost` command."""

import sys

if __name__ == "__main__":
    from project03_capstone_infra.__main__ import main

    sys.exit(main(["cost", *sys.argv[1:]]))
