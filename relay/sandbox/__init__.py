"""The sandbox: a local fake of the platform's REST API that calls the app under test back.

One :class:`~relay.sandbox.sandbox.Sandbox` holds all of a sandbox's state; build it from
:class:`~relay.sandbox.settings.SandboxSettings` and serve :func:`~relay.sandbox.app.build_app`.
"""
