"""``python -m flows.cli``: the ``fairpipe`` command."""

from flows.cli import main

main()
