"""What operators see of a running relay: logs (secrets masked), metrics, progress bars."""
