"""The operator console: server-rendered pages at ``/console`` over the store and the outbox.

``relay.console.app.console_app`` builds it; ``relay.server.runtime`` mounts it into `relay serve`.
"""
