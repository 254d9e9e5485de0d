"""``python -m fencepost``: the ``fencepost`` command, for environments without the console script."""

from fencepost.cli import main

if __name__ == "__main__":
    main()
