"""``python -m flows.cli``: the ``fairpipe`` command."""

from flows.cli import app

app(prog_name="fairpipe")
