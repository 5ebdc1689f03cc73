"""`python -m transformers_dflash`: the showcase that `make run` starts."""

from .showcase import main

if __name__ == "__main__":
    main()
