"""`python -m entrypoint ...` is the same as `distrain ...`."""

from .cli import main

main()
