"""callback-relay's relaying face: settings, the `relay` CLI, and (soon) the relay worker."""
