"""The store of received events: tables, engine set-up and the group-commit writer."""
