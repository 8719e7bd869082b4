"""``python -m tether``: the command-line interface."""

from tether._cli import main

if __name__ == "__main__":
    main()
