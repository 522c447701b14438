"""``python -m parlab``: the same command as the ``parlab`` console script.

Run from a source tree (``PYTHONPATH=src python3 -m parlab ...``) it needs parlab's
dependencies installed; where one is missing it says which, in one line (status 3).
"""

import sys

try:
    from parlab.cli import main
except ModuleNotFoundError as exc:  # typer, rich, ...: not installed where this runs
    if exc.name is None or exc.name.startswith("parlab"):
        raise
    print(
        f"parlab: error: {exc.name} is not installed here: install parlab's dependencies "
        "(pip install -e . in the source tree, or make setup)",
        file=sys.stderr,
    )
    sys.exit(3)

if __name__ == "__main__":
    main()
