"""`python -m aligner` is the same as the `align` command."""
from aligner.cli import main

if __name__ == "__main__":
    main()
