"""``python -m runner``: compose the config with Hydra and run the capacity search."""

from runner.cli import main

if __name__ == "__main__":
    main()
