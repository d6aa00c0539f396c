"""``python -m fairpipe.flows.cli``: the ``fairpipe`` command."""

from fairpipe.flows.cli import main

main()
