"""The `relay` subcommands, one module per area."""
