"""`python -m bench SUBCOMMAND ...` from the repository root (see docs/benchmarks.md)."""

from bench.cli import main

if __name__ == "__main__":
    main()
