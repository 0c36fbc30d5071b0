"""`python -m entrypoint ...` is the same as `distrain ...` (how `launch` starts its workers)."""

from .console import main

main()
