"""`python -m asp` is the `asp` command."""

from asp.cli import main

main()
