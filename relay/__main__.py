"""``python -m relay`` is the `relay` command."""

from relay.cli import main

main()
