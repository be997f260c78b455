"""`python -m project03_capstone_infra.tune`: the package's `tune` command."""

import sys

if __name__ == "__main__":
    from project03_capstone_infra.__main__ import main

    sys.exit(main(["tune", *sys.argv[1:]]))
