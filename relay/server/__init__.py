"""The deployable process: `relay serve`'s sockets, edge limits and app, and the parts built
from settings."""
