"""`python -m project03_capstone_infra.data`: the package's `data` command."""

import sys

if __name__ == "__main__":
    from project03_capstone_infra.__main__ import main

    sys.exit(main(["data", *sys.argv[1:]]))
