"""`python -m inferfleet.cli`: the same command line as the `inferfleet` entry point."""

from inferfleet.cli import main

main()
